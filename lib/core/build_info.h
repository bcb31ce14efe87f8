// build_info.h — what this binary is: ptqkit's version, the git commit it was built from, the
// compiler and the instruction set it was compiled for, and its GPU support. `ptqkit --version`
// prints it and report.json records it, because the same recipe gives the same bytes only from the
// same code compiled for the same instruction set (GCC contracts a * b + c into FMAs and vectorizes
// per -march: docs/architecture.md).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace ptq {

struct BuildInfo {
  std::string version;      // the project's version (CMakeLists.txt), e.g. "0.1.0"
  std::string commit;       // 12 hex digits of HEAD, "-dirty" when tracked files differed; "unknown"
  std::string build_type;   // CMake's: Release, Debug, ...
  std::string compiler;     // e.g. "GCC 12.2.0"
  std::string march;        // the -march the build asked for ("native", "x86-64-v3") or "default"
  std::string isa;          // what the compiler targeted, from its predefined macros: "x86-64 avx2 fma ..."
  std::string cuda;         // the toolkit and GPU architectures, "13.0.88, sm_90", or "no"
  bool nccl = false;        // `quantize --gpus N` available
};

const BuildInfo& build_info();
// "ptqkit 0.1.0 (git 7045926abcde)" and the lines after it, the last without its newline
// (`ptqkit --version`: CLI11 ends it).
std::string describe_build();
nlohmann::json build_json();   // every field, for report.json's "build"
// "git 7045926abcde, x86-64 avx2 fma f16c" of a recorded build (build_json's form): what tells
// two builds' outputs apart ("?" where a field is missing).
std::string build_label(const nlohmann::json& build);

}  // namespace ptq
