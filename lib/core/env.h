// env.h — developer switches read from the environment (sweeps, A/Bs, traces), parsed strictly:
// a value that is not what the switch takes is refused with an error naming the variable
// (Errc::usage), never read as a default or as "on", so that a run's log cannot say one arm while
// the run timed another. Host code, in every build (the CUDA kernels' switches and the CPU
// pipeline's alike).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ptq {

// An integer switch: its value, or dflt where unset or empty; anything but one integer (an
// optional '-' and digits, in range of int) is refused.
int env_int(const char* name, int dflt);
// An on/off switch: dflt where unset or empty, "0" off, "1" on; anything else is refused, where a
// typo ("off", "no", "true") would read as on.
bool env_switch(const char* name, bool dflt);
// A list switch, "e,e,...", each entry min_fields..max_fields integers separated by `first`
// (between the first two) and ':' (after them); `form` names the entry's shape for the error
// ("NxK:bits[:stages[:slices]]"). Unset or empty: no entries. A malformed entry is refused, naming
// the variable and the entry, not skipped.
std::vector<std::vector<int64_t>> env_int_list(const char* name, const char* form, char first, int min_fields, int max_fields);
// A list switch of names, "a,b,...", each one of `choices`: each entry's index in choices, in order.
// Unset or empty: no entries. An entry not among them is refused, naming the variable and the entry.
std::vector<int> env_name_list(const char* name, const std::vector<std::string>& choices);

}  // namespace ptq
