// error.h — ptqkit's one error type: what went wrong, in which file, at which field.
#pragma once
#include <stdexcept>
#include <string>

namespace ptq {

// Debug builds (no NDEBUG) run extra self-checks (`if constexpr (kDebugChecks)`), e.g. that GPTQ's
// output error never exceeds RTN's.
#ifdef NDEBUG
inline constexpr bool kDebugChecks = false;
#else
inline constexpr bool kDebugChecks = true;
#endif

// Each kind maps to a distinct CLI exit code (apps/main.cpp), so batch jobs can tell them apart.
enum class Errc {
  usage = 2,     // bad command line or recipe
  io = 3,        // a file that cannot be read or written
  format = 4,    // a file whose contents are malformed (safetensors header, JSON, tokenizer)
  config = 5,    // a model config or recipe that is inconsistent
  input = 6,     // data that cannot be used (empty text, window longer than the context)
  numeric = 7,   // NaN/Inf in a weight, a factorization that cannot be repaired
  exists = 8,    // the output exists and --force was not given
  gate = 10,     // a regression gate threshold was crossed
};

struct Error : std::runtime_error {
  Errc code;
  std::string file;   // the file (or recipe path) involved; may be empty
  std::string field;  // the field or tensor name inside it; may be empty
  std::string message;  // what went wrong, without the file and field (what() has all three)
  Error(Errc c, std::string f, std::string fld, const std::string& msg)
      : std::runtime_error(compose(f, fld, msg)), code(c), file(std::move(f)), field(std::move(fld)), message(msg) {}
  static std::string compose(const std::string& f, const std::string& fld, const std::string& msg) {
    std::string s;
    if (!f.empty()) s += f + ": ";
    if (!fld.empty()) s += fld + ": ";
    return s + msg;
  }
};

[[noreturn]] inline void fail(Errc c, const std::string& file, const std::string& field, const std::string& msg) {
  throw Error(c, file, field, msg);
}

}  // namespace ptq
