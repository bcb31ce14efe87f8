// The reader is checked against hand-built files: a header written out by hand, and one broken
// file per validation rule. The writer is checked byte for byte against a hand-written file.
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/safetensors.h"
#include "testing.h"

using namespace ptq;

namespace {
std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char(n >> (8 * i));
  return s;
}
std::string make_file(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }
// Expects SafetensorsFile(bytes) to fail with Errc::format and a message containing `what`.
void expect_bad_safetensors(const std::string& bytes, const std::string& what) {
  ptqtest::expect_format_error<SafetensorsFile>(bytes, "bad.safetensors", what);
}
const std::string k8(8, '\x01');
}  // namespace

TEST_CASE("reads a hand-written file") {
  ptqtest::TempDir d;
  float v[2] = {1.5f, -2.0f};
  std::string data(reinterpret_cast<char*>(v), 8);
  data += std::string("\x01\x02", 2);
  write_file_atomic(d / "a.safetensors",
                  make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[1,2],"data_offsets":[8,10]},"__metadata__":{"format":"pt"}})", data));
  SafetensorsFile f(d / "a.safetensors");
  CHECK(f.names() == std::vector<std::string>{"a", "b"});
  CHECK(f.metadata().at("format") == "pt");
  auto a = tensor_to_f32(f.get("a"));
  CHECK(a == std::vector<float>{1.5f, -2.0f});
  CHECK(f.get("b").shape == Shape{1, 2});
  CHECK(f.get("b").data[1] == 2);
}

TEST_CASE("writer produces the exact bytes of the format") {
  ptqtest::TempDir d;
  float v[2] = {1.0f, 2.0f};
  std::vector<NamedTensor> ts;
  ts.push_back({"a", tensor_from_f32(v, {2}, DType::F32)});
  write_safetensors(d / "w.safetensors", ts);
  std::string header = R"({"__metadata__":{"format":"pt"},"a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})";
  while ((header.size() + 8) % 8) header += ' ';
  const std::string expect = make_file(header, std::string(reinterpret_cast<char*>(v), 8));
  CHECK(read_text_file(d / "w.safetensors") == expect);
}

TEST_CASE("sharded checkpoints round-trip through the index") {
  ptqtest::TempDir d;
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 5; ++i) specs.push_back({"t" + std::to_string(i), DType::F16, {4, 8}});   // 64 bytes each
  auto produce = [](const TensorSpec& s) {
    std::vector<float> x(size_t(numel(s.shape)));
    for (size_t k = 0; k < x.size(); ++k) x[k] = float(k) + float(s.name[1] - '0') * 100;
    return tensor_from_f32(x.data(), s.shape, s.dtype);
  };
  auto files = write_checkpoint_tensors(d.path.string(), specs, produce, 130);   // two tensors per shard
  REQUIRE(files.size() == 4);
  CHECK(files[0] == "model-00001-of-00003.safetensors");
  CHECK(files[3] == "model.safetensors.index.json");
  Checkpoint ck(d.path.string());
  CHECK(ck.names().size() == 5);
  auto t4 = tensor_to_f32(ck.get("t4"));
  CHECK(t4[3] == 403.0f);
  CHECK(ck.file_of("t4").find("model-00003-of-00003") != std::string::npos);
  auto index = nlohmann::json::parse(read_text_file(d / "model.safetensors.index.json"));
  CHECK(index["metadata"]["total_size"] == 320);
}

TEST_CASE("bad files are refused with the file and the field named") {
  expect_bad_safetensors("abc", "truncated");
  expect_bad_safetensors(le64(1000) + "{}", "runs past the end");
  expect_bad_safetensors(make_file("{\"a\":", ""), "malformed JSON");
  expect_bad_safetensors(make_file(R"({"a":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}})", k8), "a.dtype: unknown dtype 'F12'");
  expect_bad_safetensors(make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", k8), "a.data_offsets: byte range of 8 bytes does not match shape [3]");
  expect_bad_safetensors(make_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", k8), "lies outside the data section");
  expect_bad_safetensors(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", k8),
                         "overlaps the byte range of a");
  expect_bad_safetensors(make_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}})", k8), "a.shape");
  expect_bad_safetensors(make_file(R"({"a":{"dtype":"F32","shape":[2]}})", k8), "a.data_offsets");
  expect_bad_safetensors(make_file(R"([1,2])", ""), "not an object");
}

TEST_CASE("a missing tensor and a missing shard are named") {
  ptqtest::TempDir d;
  std::vector<NamedTensor> ts;
  float v[2] = {1, 2};
  ts.push_back({"a", tensor_from_f32(v, {2}, DType::F32)});
  write_safetensors(d / "model.safetensors", ts);
  Checkpoint ck(d.path.string());
  try {
    ck.get("model.norm.weight");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("model.norm.weight") != std::string::npos);
  }
  write_file_atomic(d / "model.safetensors.index.json", R"({"weight_map":{"a":"model.safetensors","b":"model-2.safetensors"}})");
  try {
    Checkpoint c2(d.path.string());
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code == Errc::io);
    CHECK(std::string(e.what()).find("model-2.safetensors") != std::string::npos);
  }
  write_file_atomic(d / "model.safetensors.index.json", R"({"weight_map":{"a":"model.safetensors","zz":"model.safetensors"}})");
  try {
    Checkpoint c3(d.path.string());
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("zz: listed in the index but not in this shard") != std::string::npos);
  }
}
