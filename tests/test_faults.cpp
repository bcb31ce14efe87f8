// Faults a batch job meets: a full disk, a permission denied, a corrupted input shard, SIGTERM.
// Each must give a clear message naming the file, a non-zero exit code of its kind, and leave
// nothing that looks like a finished output.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/fsutil.h"
#include "testing.h"

using ptqtest::run_ptqkit;
namespace fs = std::filesystem;

namespace {
bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }
const char* kRecipe = "calibration: {dataset: random, samples: 16, seq_len: 64, seed: 1}\nquantization: {bits: 4, group_size: 32}\n";
// A tiny model and a recipe in a temporary folder that other users may read (for the setpriv case).
struct Setup {
  ptqtest::TempDir d;
  Setup(const std::string& preset = "tiny", const std::string& extra = "") {
    fs::permissions(d.path, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
    REQUIRE(run_ptqkit("synth --preset " + preset + " --seed 5 --output " + d / "m " + extra).code == 0);
    ptq::write_file_atomic(d / "r.yaml", kRecipe);
    std::system(("chmod -R a+rX " + d.path.string()).c_str());
  }
  std::string quantize(const std::string& out) const { return std::string(PTQKIT_BIN) + " -q quantize " + d / "r.yaml" + " --model " + d / "m" + " --output " + out; }
};
ptqtest::RunResult sh(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}
}  // namespace

TEST_CASE("faults: a full disk (a small tmpfs) is an io error, before calibration where the least the run writes cannot fit, at the write where it can, and the output folder is left empty") {
  Setup s;
  // A private mount namespace with a small tmpfs: real ENOSPC, without touching the machine's disks.
  if (sh("unshare -m true").code != 0) PTQ_SKIP("unshare -m is not permitted here (needs root or user namespaces)");
  const std::string mnt = s.d / "full";
  fs::create_directory(mnt);
  auto in_tmpfs = [&](int64_t bytes) {
    return sh("unshare -m sh -c 'mount -t tmpfs -o size=" + std::to_string(bytes) + " none " + mnt + " && " + s.quantize(mnt + "/out") +
              "; echo \"exit=$?\"; echo \"left=[$(ls -A " + mnt + ")]\"'");
  };
  // 256 KiB: less than the least the run writes, refused by the check before calibration
  auto r = in_tmpfs(256 * 1024);
  INFO(r.out);
  CHECK(contains(r.out, "exit=3"));
  CHECK(contains(r.out, mnt + "/out.partial: needs at least "));
  CHECK(contains(r.out, "its file system has 256.00 KiB free"));
  CHECK(contains(r.out, "left=[]"));               // no output, no staging folder, no lock
  // The run's own lower bound (its report on a roomy disk) and 2% more: the check passes, and the
  // scales, headers and small files' pages it leaves out fill the disk at a write
  REQUIRE(run_ptqkit(std::string("-q quantize ") + s.d / "r.yaml" + " --model " + s.d / "m" + " --output " + s.d / "roomy").code == 0);
  const nlohmann::json need = nlohmann::json::parse(ptq::read_text_file(s.d / "roomy/report.json"))["disk_min_bytes"];
  const int64_t bound = need["store"].get<int64_t>() + need["exports"].get<int64_t>();
  r = in_tmpfs((bound + bound / 50 + 4095) / 4096 * 4096);
  INFO(r.out);
  CHECK(contains(r.out, "exit=3"));
  CHECK(contains(r.out, "No space left on device"));
  CHECK(contains(r.out, mnt + "/out.partial/"));   // names the file it could not write
  CHECK(contains(r.out, "left=[]"));
}

TEST_CASE("faults: a file size limit (EFBIG) mid-export is an io error, nothing is left") {
  Setup s;
  // RLIMIT_FSIZE with SIGXFSZ ignored: write() fails with EFBIG once a file reaches 128 KiB.
  auto r = sh("sh -c \"trap '' XFSZ; ulimit -f 128; exec " + s.quantize(s.d / "out") + "\"");
  INFO(r.out);
  CHECK(r.code == 3);
  CHECK(contains(r.out, "File too large"));
  CHECK_FALSE(fs::exists(s.d / "out"));
  CHECK_FALSE(fs::exists(s.d / "out.partial"));
  CHECK_FALSE(fs::exists(s.d / "out.partial.lock"));
}

TEST_CASE("faults: permission denied on the output folder and on an input file") {
  Setup s;
  if (::geteuid() != 0) PTQ_SKIP("needs root to run as another user (setpriv)");
  if (sh("setpriv --reuid=65534 --regid=65534 --clear-groups true").code != 0) PTQ_SKIP("setpriv cannot switch to nobody here");
  const std::string nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups ";
  if (sh(nobody + PTQKIT_BIN + " --help").code != 0) PTQ_SKIP("the ptqkit binary is not readable by nobody (build folder permissions)");
  fs::create_directory(s.d / "ro");
  fs::permissions(s.d / "ro", fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read | fs::perms::group_exec |
                                  fs::perms::others_read | fs::perms::others_exec);
  auto r = sh(nobody + s.quantize(s.d / "ro/out"));
  INFO(r.out);
  CHECK(r.code == 3);
  CHECK(contains(r.out, "Permission denied"));
  CHECK(contains(r.out, s.d / "ro/out"));
  CHECK(fs::is_empty(s.d / "ro"));
  fs::create_directory(s.d / "w");
  fs::permissions(s.d / "w", fs::perms::all);                              // nobody may write here
  fs::permissions(s.d / "m/model.safetensors", fs::perms::owner_read);   // but not read the weights
  r = sh(nobody + s.quantize(s.d / "w/out"));
  INFO(r.out);
  CHECK(r.code == 3);
  CHECK(contains(r.out, s.d / "m/model.safetensors"));
  CHECK(contains(r.out, "Permission denied"));
  CHECK(fs::is_empty(s.d / "w"));
}

TEST_CASE("faults: a corrupted or truncated input shard is named, nothing is written") {
  Setup s("small", "--max-shard-mb 4");
  std::vector<std::string> shards;
  for (auto& e : fs::directory_iterator(s.d / "m"))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path().string());
  std::sort(shards.begin(), shards.end());
  REQUIRE(shards.size() >= 2);
  const std::string victim = shards[1], saved = s.d / "saved.safetensors";
  fs::copy_file(victim, saved);
  {   // garbage in the JSON header
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12);
    f.write("\xff\xfe{{{[[", 7);
  }
  auto r = sh(s.quantize(s.d / "out"));
  INFO(r.out);
  CHECK(r.code == 4);
  CHECK(contains(r.out, victim));
  CHECK_FALSE(fs::exists(s.d / "out"));
  CHECK_FALSE(fs::exists(s.d / "out.partial"));
  // truncated: the last bytes of the data section are missing
  fs::copy_file(saved, victim, fs::copy_options::overwrite_existing);
  fs::resize_file(victim, fs::file_size(victim) - 1000);
  r = sh(s.quantize(s.d / "out"));
  INFO(r.out);
  CHECK(r.code == 4);
  CHECK(contains(r.out, victim));
  CHECK_FALSE(fs::exists(s.d / "out"));
  r = run_ptqkit("eval --model " + s.d / "m" + " --data " + s.d / "r.yaml");
  CHECK(r.code == 4);
  CHECK(contains(r.out, victim));
}

TEST_CASE("faults: SIGTERM mid-run says what is left, exits 143, and --resume finishes the job") {
  Setup s("small");
  ptq::write_file_atomic(s.d / "r.yaml", "calibration: {dataset: random, samples: 64, seq_len: 256, seed: 1}\nquantization: {bits: 4, group_size: 128}\n");
  const std::string first = s.d / "out.partial/.layers/layer-00000.safetensors";
  auto r = sh(s.quantize(s.d / "out") + " 2>" + s.d / "err.txt & pid=$!; for i in $(seq 1000); do [ -f " + first +
              " ] && break; sleep 0.01; done; kill -TERM $pid; wait $pid; echo \"exit=$?\"");
  INFO(r.out);
  const std::string err = ptq::read_text_file(s.d / "err.txt");
  INFO(err);
  CHECK(contains(r.out, "exit=143"));
  CHECK(contains(err, "interrupted"));
  CHECK(contains(err, "--resume"));
  CHECK_FALSE(fs::exists(s.d / "out"));
  REQUIRE(fs::exists(first));
  r = sh(s.quantize(s.d / "out") + " --resume");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(fs::exists(s.d / "out/model.safetensors"));
}
