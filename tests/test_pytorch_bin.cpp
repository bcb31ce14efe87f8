// The torch.save reader is checked against files we did not write with it: llama2xs's shards as
// transformers' torch.save wrote them (zip) and its first shard in the legacy layout, each tensor
// compared byte for byte with the same model's model.safetensors; the hostile files must be refused
// before anything runs. Small files built here, opcode by opcode as the pickle protocol and
// torch.save's layouts define them, pin strides, offsets, bf16 and parameters to known values.
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/pytorch_bin.h"
#include "core/safetensors.h"
#include "testing.h"

using namespace ptq;
namespace fs = std::filesystem;

namespace {
// Expects PytorchBinFile(bytes) to fail with Errc::format and a message containing `what`.
void expect_bad_bin(const std::string& bytes, const std::string& what) { ptqtest::expect_format_error<PytorchBinFile>(bytes, "bad.bin", what); }

// ---- fixtures: torch.save files written by hand ----
// Pickle opcodes (protocol 2): each tensor is
//   GLOBAL torch._utils._rebuild_tensor_v2, then the argument tuple (persistent id
//   ('storage', torch.<Type>Storage, key, 'cpu', numel[, None]), offset, size, stride, False,
//   OrderedDict()), REDUCE.
std::string le(uint64_t v, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += char(v >> (8 * i));
  return s;
}
std::string str(const std::string& x) { return "X" + le(x.size(), 4) + x; }   // BINUNICODE
std::string small(int v) { return "K" + std::string(1, char(v)); }            // BININT1
std::string ints(std::vector<int> v) {                                        // MARK ... TUPLE
  std::string s = "(";
  for (int x : v) s += small(x);
  return s + "t";
}
struct FixtureTensor { std::string name, storage, type; int numel, offset; std::vector<int> size, stride; bool parameter = false; };
std::string tensor_pickle(const FixtureTensor& t, bool legacy) {
  std::string pid = "(" + str("storage") + "ctorch\n" + t.type + "\n" + str(t.storage) + str("cpu") + small(t.numel) + (legacy ? "N" : "") + "t";
  std::string x = "ctorch._utils\n_rebuild_tensor_v2\n(" + pid + "Q" + small(t.offset) + ints(t.size) + ints(t.stride) + "\x89" +
                  "ccollections\nOrderedDict\n)R" + "tR";
  if (t.parameter) x = "ctorch._utils\n_rebuild_parameter\n(" + x + "\x88" + "ccollections\nOrderedDict\n)RtR";   // True, OrderedDict()
  return x;
}
std::string state_dict_pickle(const std::vector<FixtureTensor>& ts, bool legacy) {
  std::string s = "\x80\x02}(";
  for (auto& t : ts) s += str(t.name) + tensor_pickle(t, legacy);
  return s + "u.";
}
// CRC-32 (the zip polynomial 0xEDB88320, bit by bit).
uint32_t crc32(const std::string& d) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : d) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}
// A zip of stored entries (Python's zipfile reads it, CRCs included).
std::string stored_zip(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string body, dir;
  for (auto& [name, data] : entries) {
    const uint64_t at = body.size();
    const std::string crc = le(crc32(data), 4);
    body += le(0x04034b50, 4) + le(20, 2) + le(0, 2) + le(0, 2) + le(0, 4) + crc + le(data.size(), 4) + le(data.size(), 4) + le(name.size(), 2) +
            le(0, 2) + name + data;
    dir += le(0x02014b50, 4) + le(20, 2) + le(20, 2) + le(0, 2) + le(0, 2) + le(0, 4) + crc + le(data.size(), 4) + le(data.size(), 4) +
           le(name.size(), 2) + le(0, 2) + le(0, 2) + le(0, 2) + le(0, 2) + le(0, 4) + le(at, 4) + name;
  }
  return body + dir + le(0x06054b50, 4) + le(0, 2) + le(0, 2) + le(entries.size(), 2) + le(entries.size(), 2) + le(dir.size(), 4) + le(body.size(), 4) +
         le(0, 2);
}
std::string f32s(std::vector<float> v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4); }
const std::string kBf16 = std::string("\xc0\x3f\x00\xc0", 4);   // bf16 1.5, -2.0
// "a" = 0..5 as [2, 3]; "t" its transpose on the same storage (stride [1, 3]); "h" bf16; "o" the
// last 2 elements of storage 0 (offset 4); "p" a Parameter wrapping 7..12 as [2, 3].
const std::vector<FixtureTensor> kStrided = {{"a", "0", "FloatStorage", 6, 0, {2, 3}, {3, 1}},      {"t", "0", "FloatStorage", 6, 0, {3, 2}, {1, 3}},
                                             {"h", "1", "BFloat16Storage", 2, 0, {2}, {1}},         {"o", "0", "FloatStorage", 6, 4, {2}, {1}},
                                             {"p", "2", "FloatStorage", 6, 0, {2, 3}, {3, 1}, true}};
std::string zip_fixture() {
  return stored_zip({{"archive/data.pkl", state_dict_pickle(kStrided, false)}, {"archive/byteorder", "little"},
                     {"archive/data/0", f32s({0, 1, 2, 3, 4, 5})}, {"archive/data/1", kBf16}, {"archive/data/2", f32s({7, 8, 9, 10, 11, 12})}});
}
// Legacy: magic number (LONG1, 10 bytes), protocol 1001 (BININT2), system info, the state dict
// (persistent ids with a view of None), the storage keys; then each storage as u64 numel + bytes.
std::string legacy_fixture() {
  const std::vector<FixtureTensor> ts = {kStrided[0], kStrided[2]};
  return std::string("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", 15) + "\x80\x02M\xe9\x03." + "\x80\x02}." +
         state_dict_pickle(ts, true) + "\x80\x02](" + str("0") + str("1") + "e." + le(6, 8) + f32s({0, 1, 2, 3, 4, 5}) + le(2, 8) + kBf16;
}

std::vector<float> floats(const TensorView& t) { return tensor_to_f32(t); }

void check_same_as_safetensors(const Checkpoint& bin, const SafetensorsFile& st, size_t want) {
  size_t compared = 0;
  for (const std::string& n : bin.names()) {
    INFO(n);
    REQUIRE(st.has(n));
    const TensorView a = bin.get(n), b = st.get(n);
    CHECK(a.dtype == b.dtype);
    CHECK(a.shape == b.shape);
    REQUIRE(a.nbytes == b.nbytes);
    CHECK(std::memcmp(a.data, b.data, a.nbytes) == 0);
    ++compared;
  }
  CHECK(compared == want);
}
}  // namespace

TEST_CASE("pytorch_model.bin shards read exactly as the model's safetensors") {
  PTQ_REQUIRE_ASSETS();
  const std::string a = ptqtest::assets() + "/models/";
  const Checkpoint bin(a + "llama2xs-bin");   // pytorch_model.bin.index.json + 2 zip shards
  const SafetensorsFile st(a + "llama2xs/model.safetensors");
  check_same_as_safetensors(bin, st, st.names().size());
  CHECK(bin.names().size() == st.names().size());
  CHECK(bin.file_of("model.norm.weight").find("pytorch_model-0000") != std::string::npos);
}

TEST_CASE("the legacy (pre-1.6) serialization reads exactly as the safetensors") {
  PTQ_REQUIRE_ASSETS();
  const Checkpoint bin(ptqtest::assets() + "/bad/legacy-ok.bin");
  const SafetensorsFile st(ptqtest::assets() + "/models/llama2xs/model.safetensors");
  check_same_as_safetensors(bin, st, 23);
}

TEST_CASE("a pickle that would run a shell command is refused, naming the global, and runs nothing") {
  PTQ_REQUIRE_ASSETS();
  const std::string marker = "/tmp/ptqkit-pwned";   // what the payload's `echo` would write
  std::error_code ec;
  fs::remove(marker, ec);
  for (const char* f : {"evil.bin", "evil-legacy.bin"}) {
    INFO(f);
    try {
      PytorchBinFile b(ptqtest::assets() + "/bad/" + f);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.code == Errc::format);
      CHECK(std::string(e.what()).find("'posix.system'") != std::string::npos);
      CHECK(std::string(e.what()).find(f) != std::string::npos);
    }
    // Through the CLI too: a clear error and a non-zero exit.
    const auto r = ptqtest::run_ptqkit("inspect " + ptqtest::assets() + "/bad/" + f);
    CHECK(r.code == int(Errc::format));
    CHECK(r.out.find("posix.system") != std::string::npos);
    CHECK_FALSE(fs::exists(marker));
  }
}

TEST_CASE("strides, offsets, bf16 and parameters are rebuilt as torch would") {
  ptqtest::TempDir d;
  write_file_atomic(d / "zip.bin", zip_fixture());
  write_file_atomic(d / "legacy.bin", legacy_fixture());
  const PytorchBinFile z(d / "zip.bin");
  CHECK_FALSE(z.legacy());
  CHECK(z.names() == std::vector<std::string>{"a", "t", "h", "o", "p"});
  CHECK(floats(z.get("a")) == std::vector<float>{0, 1, 2, 3, 4, 5});
  CHECK(z.get("t").shape == Shape{3, 2});
  CHECK(floats(z.get("t")) == std::vector<float>{0, 3, 1, 4, 2, 5});   // the transpose, gathered
  CHECK(z.get("h").dtype == DType::BF16);
  CHECK(floats(z.get("h")) == std::vector<float>{1.5f, -2.0f});
  CHECK(floats(z.get("o")) == std::vector<float>{4, 5});
  CHECK(floats(z.get("p")) == std::vector<float>{7, 8, 9, 10, 11, 12});
  const PytorchBinFile l(d / "legacy.bin");
  CHECK(l.legacy());
  CHECK(floats(l.get("a")) == std::vector<float>{0, 1, 2, 3, 4, 5});
  CHECK(floats(l.get("h")) == std::vector<float>{1.5f, -2.0f});
}

TEST_CASE("bad torch.save files are refused with the file and the field named") {
  PTQ_REQUIRE_ASSETS();
  const std::string good = read_text_file(ptqtest::assets() + "/models/llama2xs-bin/pytorch_model-00002-of-00002.bin");
  // A truncated zip: its end record is gone.
  expect_bad_bin(good.substr(0, good.size() / 2), "no end-of-central-directory record");
  expect_bad_bin("PK\x03\x04", "truncated");
  // A storage of the wrong size: the first tensor's persistent id says 63 elements, its entry holds 64.
  std::string wrong = good;
  const std::string pid = std::string("X\x03\x00\x00\x00" "cpuq\x06K@t", 13);
  const size_t at = wrong.find(pid);
  REQUIRE(at != std::string::npos);
  wrong[at + 11] = '?';
  expect_bad_bin(wrong, "holds 256 bytes, but its pickle says 63 elements of 4 bytes");
  // A tensor reaching past its storage: size [64] at offset 1 (BININT1 0 -> BININT1 1 after BINPERSID).
  std::string past = good;
  const size_t q = past.find(std::string("Q" "K\x00" "K@", 5));
  REQUIRE(q != std::string::npos);
  past[q + 2] = '\x01';
  expect_bad_bin(past, "reach outside its storage of 64 elements");
  // Not a pickle torch writes.
  expect_bad_bin(std::string("\x80\x02" "cos\nsystem\n", 14), "legacy pickle: the pickle names the global 'os.system'");
  expect_bad_bin(std::string("\x80\x02\x8a\x01\x05.", 6), "neither a zip nor starts with torch's legacy magic number");
  expect_bad_bin(std::string("\x80\x02" "]q\x00", 5), "truncated pickle");
  expect_bad_bin(std::string("\x80\x02" "d.", 4), "unsupported pickle opcode 0x64");
}

TEST_CASE("a folder with pytorch_model.bin quantizes to the same bytes as its safetensors twin") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string a = ptqtest::assets();
  const std::string common = " --scheme W8A16 --dataset " + a + "/text/tinystories/calib.txt --set calibration.samples=4 --set calibration.seq_len=64 -o ";
  auto r1 = ptqtest::run_ptqkit("-q quantize --model " + a + "/models/llama2xs-bin" + common + d / "from-bin");
  INFO(r1.out);
  REQUIRE(r1.code == 0);
  auto r2 = ptqtest::run_ptqkit("-q quantize --model " + a + "/models/llama2xs" + common + d / "from-st");
  INFO(r2.out);
  REQUIRE(r2.code == 0);
  CHECK(sha256_file(d / "from-bin/model.safetensors") == sha256_file(d / "from-st/model.safetensors"));
}
