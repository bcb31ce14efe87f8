// testing.h — helpers shared by the tests: where the shared assets are, skipping cleanly when
// they (or a GPU) are absent, temporary folders, running the CLI.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include "core/error.h"
#include "core/fsutil.h"

namespace ptqtest {

inline std::string assets() {
  const char* e = std::getenv("PTQKIT_ASSETS");
  return e && *e ? e : PTQKIT_DEFAULT_ASSETS;
}
inline bool have_assets() { return std::filesystem::exists(assets() + "/golden/golden.json"); }

// Prints the marker CTest turns into "skipped" (SKIP_REGULAR_EXPRESSION) and leaves the test.
#define PTQ_SKIP(why)                                   \
  do {                                                  \
    std::cout << "PTQKIT_SKIP: " << (why) << std::endl; \
    return;                                             \
  } while (0)
#define PTQ_REQUIRE_ASSETS() \
  if (!ptqtest::have_assets()) PTQ_SKIP("shared assets not found at " + ptqtest::assets() + " (set PTQKIT_ASSETS)")

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "ptqkit-test-XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() { std::error_code ec; std::filesystem::remove_all(path, ec); }
  std::string operator/(const std::string& s) const { return (path / s).string(); }
};

struct RunResult { int code; std::string out; };
// Runs a shell command, stdout+stderr captured.
inline RunResult run_command(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}
// The ptqkit CLI: $PTQKIT_BIN where set (a test binary run away from its build folder), else the build's.
inline std::string ptqkit_bin() {
  const char* e = std::getenv("PTQKIT_BIN");
  return e && *e ? e : PTQKIT_BIN;
}
// Runs `ptqkit ARGS`.
inline RunResult run_ptqkit(const std::string& args) { return run_command(ptqkit_bin() + " " + args); }

// Expects Reader(a file named `name` holding `bytes`) to fail with ptq::Errc::format, its message
// naming the file and containing `what`.
template <class Reader>
void expect_format_error(const std::string& bytes, const std::string& name, const std::string& what) {
  TempDir d;
  ptq::write_file_atomic(d / name, bytes);
  try {
    Reader r(d / name);
    FAIL("accepted a bad file; expected: " + what);
  } catch (const ptq::Error& e) {
    INFO(e.what());
    CHECK(e.code == ptq::Errc::format);
    CHECK(std::string(e.what()).find(what) != std::string::npos);
    CHECK(std::string(e.what()).find(name) != std::string::npos);
  }
}

}  // namespace ptqtest
