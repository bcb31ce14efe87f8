// core/env.h: the developer switches read from the environment. Each value is checked against
// what was written by hand (the integer, on/off or list it spells), and every malformed form is
// refused with Errc::usage naming the variable: never read as the default, never as "on".
#include <cstdlib>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "testing.h"

using namespace ptq;

namespace {
// Runs f with var set to value and expects the refusal naming var, whose message contains want.
template <class F>
void check_refused(const char* var, const char* value, const char* want, F f) {
  INFO(var << "='" << value << "'");
  ::setenv(var, value, 1);
  try {
    f();
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.code == Errc::usage);
    CHECK(e.field == var);
    CHECK(std::string(e.what()).find(want) != std::string::npos);
  }
}
}  // namespace

TEST_CASE("env switches: an integer reads as written or its default, anything else is refused naming the variable") {
  const char* v = "PTQKIT_TEST_ENV_INT";   // a name no code reads
  ::unsetenv(v);
  CHECK(env_int(v, 8) == 8);
  ::setenv(v, "", 1);
  CHECK(env_int(v, 8) == 8);
  ::setenv(v, "12", 1);
  CHECK(env_int(v, 8) == 12);
  ::setenv(v, "-1", 1);
  CHECK(env_int(v, 8) == -1);
  ::setenv(v, "2147483647", 1);
  CHECK(env_int(v, 8) == 2147483647);
  for (const char* bad : {"1x", "abc", " 3", "+3", "1,2", "2147483648", "99999999999", "-"})
    check_refused(v, bad, "want an integer", [&] { (void)env_int(v, 8); });
  ::unsetenv(v);
}

TEST_CASE("env switches: on/off is 0 or 1 or its default, anything else is refused naming the variable") {
  const char* v = "PTQKIT_TEST_ENV_SWITCH";
  ::unsetenv(v);
  CHECK(env_switch(v, true));
  CHECK_FALSE(env_switch(v, false));
  ::setenv(v, "", 1);
  CHECK(env_switch(v, true));
  ::setenv(v, "0", 1);
  CHECK_FALSE(env_switch(v, true));
  ::setenv(v, "1", 1);
  CHECK(env_switch(v, false));
  for (const char* bad : {"off", "no", "00", "2", "1 ", "-1", "true", "yes"})   // each read as on before the switches were strict
    check_refused(v, bad, "want 0 or 1", [&] { (void)env_switch(v, false); });
  ::unsetenv(v);
}

TEST_CASE("env switches: a list of names gives each entry's place among the choices, an unknown or empty one is refused naming the variable and the entry") {
  const char* v = "PTQKIT_TEST_ENV_NAMES";
  const std::vector<std::string> choices{"mma", "shared_x", "wgmma", "dequant"};
  ::unsetenv(v);
  CHECK(env_name_list(v, choices).empty());
  ::setenv(v, "", 1);
  CHECK(env_name_list(v, choices).empty());
  ::setenv(v, "wgmma,mma,wgmma", 1);
  CHECK(env_name_list(v, choices) == std::vector<int>{2, 0, 2});
  for (const char* bad : {"wgmm", "mma,", ",mma", "mma,,dequant", "MMA", " mma", "mma wgmma"})
    check_refused(v, bad, "want names among mma, shared_x, wgmma, dequant", [&] { (void)env_name_list(v, choices); });
  ::unsetenv(v);
}

TEST_CASE("env switches: a list gives each entry's fields as written, a malformed entry is refused naming the variable and the entry") {
  const char* v = "PTQKIT_TEST_ENV_LIST";
  ::unsetenv(v);
  CHECK(env_int_list(v, "NxK[:a]", 'x', 2, 3).empty());
  ::setenv(v, "", 1);
  CHECK(env_int_list(v, "NxK[:a]", 'x', 2, 3).empty());
  ::setenv(v, "4096x11008:-1,3x4", 1);
  const std::vector<std::vector<int64_t>> l = env_int_list(v, "NxK[:a]", 'x', 2, 3);
  CHECK(l == std::vector<std::vector<int64_t>>{{4096, 11008, -1}, {3, 4}});
  for (const char* bad : {"4096", "4096x", "4096x4096:", "4096x4096:1:2", "4096:4096", "4096x4096,,", ",4096x4096", "4096x 4096", "axb",
                          "99999999999999999999x1"})
    check_refused(v, bad, "want NxK[:a] (integers)", [&] { (void)env_int_list(v, "NxK[:a]", 'x', 2, 3); });
  ::unsetenv(v);
}
