#include "core/build_info.h"

#include "ptqkit_git_commit.h"   // PTQKIT_GIT_COMMIT, written at build time by cmake/git_commit.cmake

namespace ptq {

namespace {
// The instruction-set extensions the compiler was allowed to use for this file, as the rest of the
// library is compiled with the same flags. The names are /proc/cpuinfo's.
std::string compiled_isa() {
  std::string s;
#if defined(__x86_64__)
  s = "x86-64";
#elif defined(__aarch64__)
  s = "aarch64";
#else
  s = "unknown";
#endif
#ifdef __AVX2__
  s += " avx2";
#endif
#ifdef __FMA__
  s += " fma";
#endif
#ifdef __F16C__
  s += " f16c";
#endif
#ifdef __AVX512F__
  s += " avx512f";
#endif
#ifdef __AVX512BW__
  s += " avx512bw";
#endif
#ifdef __AVX512VL__
  s += " avx512vl";
#endif
#ifdef __AVX512VNNI__
  s += " avx512_vnni";
#endif
#ifdef __AVX512BF16__
  s += " avx512_bf16";
#endif
  return s;
}

std::string compiler() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("GCC ") + __VERSION__;
#else
  return "unknown";
#endif
}
}  // namespace

const BuildInfo& build_info() {
  static const BuildInfo b = [] {
    BuildInfo x;
    x.version = PTQKIT_VERSION;
    x.commit = PTQKIT_GIT_COMMIT;
    x.build_type = PTQKIT_BUILD_TYPE;
    x.compiler = compiler();
    x.march = PTQKIT_BUILD_MARCH;
    x.isa = compiled_isa();
    x.cuda = PTQKIT_BUILD_CUDA;
    x.nccl = PTQKIT_BUILD_NCCL;
    return x;
  }();
  return b;
}

std::string describe_build() {
  const BuildInfo& b = build_info();
  return "ptqkit " + b.version + " (git " + b.commit + ")\n" +
         "build: " + b.build_type + ", " + b.compiler + ", -march=" + b.march + " (" + b.isa + ")\n" +
         "CUDA: " + b.cuda + (b.cuda == "no" ? "" : std::string("; NCCL: ") + (b.nccl ? "yes" : "no"));
}

nlohmann::json build_json() {
  const BuildInfo& b = build_info();
  return {{"version", b.version}, {"commit", b.commit},   {"build_type", b.build_type}, {"compiler", b.compiler},
          {"march", b.march},     {"isa", b.isa},         {"cuda", b.cuda},             {"nccl", b.nccl}};
}

std::string build_label(const nlohmann::json& build) {
  auto field = [&](const char* k) { return build.contains(k) && build[k].is_string() ? build[k].get<std::string>() : std::string("?"); };
  return "git " + field("commit") + ", " + field("isa");
}

}  // namespace ptq
