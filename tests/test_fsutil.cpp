#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/fsutil.h"
#include "testing.h"

using namespace ptq;
namespace fs = std::filesystem;

TEST_CASE("sha256 matches the FIPS 180-2 test vector") {
  CHECK(sha256_bytes("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_bytes("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  ptqtest::TempDir d;
  write_file_atomic(d / "f", "abc");
  CHECK(sha256_file(d / "f") == sha256_bytes("abc"));
}

TEST_CASE("atomic write leaves no temporary file") {
  ptqtest::TempDir d;
  write_file_atomic(d / "a.txt", "hello");
  write_file_atomic(d / "a.txt", "world");
  CHECK(read_text_file(d / "a.txt") == "world");
  int n = 0;
  for (auto& e : fs::directory_iterator(d.path)) { (void)e; ++n; }
  CHECK(n == 1);
}

TEST_CASE("write to a folder that does not exist is an io error naming the file") {
  try {
    write_file_atomic("/nonexistent-dir/x.json", "{}");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code == Errc::io);
    CHECK(std::string(e.what()).find("/nonexistent-dir/x.json") != std::string::npos);
  }
}

TEST_CASE("OutputDir: refuses an existing output, commits atomically, cleans up when abandoned") {
  ptqtest::TempDir d;
  const std::string out = d / "out";
  {
    OutputDir o(out, false);
    write_file_atomic(o.file("x"), "1");
    CHECK_FALSE(fs::exists(out));                  // nothing at the final path until commit
    o.commit();
  }
  CHECK(read_text_file(out + "/x") == "1");
  try {
    OutputDir o(out, false);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code == Errc::exists);
    CHECK(std::string(e.what()).find("--force") != std::string::npos);
  }
  {
    OutputDir o(out, true);
    write_file_atomic(o.file("y"), "2");
    // abandoned: no commit
  }
  CHECK(fs::exists(out + "/x"));                   // the old output is untouched
  CHECK_FALSE(fs::exists(out + "/y"));
  for (auto& e : fs::directory_iterator(d.path)) CHECK(e.path().filename() == "out");   // no .partial left
  {
    OutputDir o(out, true);
    write_file_atomic(o.file("y"), "2");
    o.commit();
  }
  CHECK(fs::exists(out + "/y"));
  CHECK_FALSE(fs::exists(out + "/x"));
}

TEST_CASE("OutputDir: an output under folders that do not exist yet makes them, as mkdir -p") {
  ptqtest::TempDir d;
  const std::string out = d / "runs/new/q";
  {
    OutputDir o(out, false);
    write_file_atomic(o.file("x"), "1");
    o.commit();
  }
  CHECK(std::filesystem::exists(out + "/x"));
  CHECK_FALSE(std::filesystem::exists(out + ".partial"));
}
