#include "core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/progress.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace ptq {

namespace {
constexpr uint64_t kMaxHeader = 100u << 20;   // the reference implementation's limit

uint64_t read_u64le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : map_(path) {
  const size_t size = map_.size();
  if (size < 8) fail(Errc::format, path, "header", "truncated: " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  const uint64_t n = read_u64le(map_.data());
  if (n > size - 8)
    fail(Errc::format, path, "header", "header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(size) + " bytes)");
  if (n > kMaxHeader) fail(Errc::format, path, "header", "header length " + std::to_string(n) + " exceeds 100 MiB");
  json h;
  try {
    h = json::parse(map_.data() + 8, map_.data() + 8 + n);
  } catch (const json::exception& e) {
    fail(Errc::format, path, "header", std::string("malformed JSON: ") + e.what());
  }
  if (!h.is_object()) fail(Errc::format, path, "header", "JSON header is not an object");
  const uint8_t* base = map_.data() + 8 + n;
  const uint64_t data_size = size - 8 - n;
  struct Range { uint64_t b, e; std::string name; };
  std::vector<Range> ranges;
  for (auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail(Errc::format, path, "__metadata__", "must be an object of strings");
      for (auto& [k, s] : v.items()) {
        if (!s.is_string()) fail(Errc::format, path, "__metadata__." + k, "must be a string");
        metadata_[k] = s.get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) fail(Errc::format, path, name, "tensor entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) fail(Errc::format, path, name + ".dtype", "missing or not a string");
    TensorView t;
    const std::string ds = v["dtype"].get<std::string>();
    if (!parse_dtype(ds, &t.dtype)) fail(Errc::format, path, name + ".dtype", "unknown dtype '" + ds + "'");
    if (!v.contains("shape") || !v["shape"].is_array()) fail(Errc::format, path, name + ".shape", "missing or not an array");
    for (auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) fail(Errc::format, path, name + ".shape", "dimensions must be non-negative integers");
      t.shape.push_back(d.get<int64_t>());
    }
    auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(Errc::format, path, name + ".data_offsets", "must be [begin, end] of non-negative integers");
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e) fail(Errc::format, path, name + ".data_offsets", "begin > end");
    if (e > data_size)
      fail(Errc::format, path, name + ".data_offsets", "range [" + std::to_string(b) + ", " + std::to_string(e) +
                                                        ") lies outside the data section (" + std::to_string(data_size) + " bytes)");
    const uint64_t want = uint64_t(numel(t.shape)) * dtype_size(t.dtype);
    if (e - b != want)
      fail(Errc::format, path, name + ".data_offsets", "byte range of " + std::to_string(e - b) + " bytes does not match shape " +
                                                        shape_str(t.shape) + " x " + std::string(dtype_name(t.dtype)) + " = " + std::to_string(want));
    t.data = base + b;
    t.nbytes = e - b;
    index_[name] = t;
    ranges.push_back({b, e, name});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.b < b.b || (a.b == b.b && a.e < b.e); });
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].b < ranges[i - 1].e && ranges[i].e > ranges[i].b)
      fail(Errc::format, path, ranges[i].name + ".data_offsets", "overlaps the byte range of " + ranges[i - 1].name);
  for (auto& r : ranges) names_.push_back(r.name);
}

TensorView SafetensorsFile::get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail(Errc::format, path(), name, "tensor not found");
  return it->second;
}

namespace {
class FileWriter {
 public:
  explicit FileWriter(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp-" + std::to_string(::getpid())) {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd_ < 0) fail(Errc::io, path_, "", std::string("cannot create: ") + std::strerror(errno));
  }
  ~FileWriter() {
    if (fd_ >= 0) { ::close(fd_); ::unlink(tmp_.c_str()); }
  }
  void write(const void* p, size_t n) {
    auto c = static_cast<const char*>(p);
    while (n) {
      ssize_t w = ::write(fd_, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) fail(Errc::io, path_, "", std::string("write failed: ") + std::strerror(errno));
      c += w; n -= size_t(w);
    }
  }
  void commit() {
    if (::fsync(fd_) != 0) fail(Errc::io, path_, "", std::string("fsync failed: ") + std::strerror(errno));
    ::close(fd_);
    fd_ = -1;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      ::unlink(tmp_.c_str());
      fail(Errc::io, path_, "", std::string("rename failed: ") + std::strerror(errno));
    }
  }
 private:
  std::string path_, tmp_;
  int fd_{-1};
};
}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorSpec>& specs, const TensorProducer& produce,
                       const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (auto& s : specs) {
    if (h.contains(s.name)) fail(Errc::format, path, s.name, "duplicate tensor name");
    h[s.name] = {{"dtype", std::string(dtype_name(s.dtype))}, {"shape", s.shape}, {"data_offsets", {off, off + s.nbytes()}}};
    off += s.nbytes();
  }
  std::string hs = h.dump();
  while ((8 + hs.size()) % 8) hs += ' ';   // align the data section to 8 bytes
  FileWriter w(path);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(hs.size()) >> (8 * i));
  w.write(len, 8);
  w.write(hs.data(), hs.size());
  for (auto& s : specs) {
    Tensor t = produce(s);
    if (t.dtype != s.dtype || t.shape != s.shape)
      fail(Errc::format, path, s.name, "produced tensor does not match its spec " + shape_str(s.shape));
    w.write(t.bytes.data(), t.bytes.size());
  }
  w.commit();
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  std::map<std::string, const Tensor*> by_name;
  for (auto& t : tensors) { specs.push_back({t.name, t.tensor.dtype, t.tensor.shape}); by_name[t.name] = &t.tensor; }
  write_safetensors(path, specs, [&](const TensorSpec& s) { return *by_name.at(s.name); }, metadata);
}

std::vector<std::string> write_checkpoint_tensors(const std::string& dir, const std::vector<TensorSpec>& specs,
                                                  const TensorProducer& produce, size_t max_shard_bytes) {
  std::vector<std::vector<TensorSpec>> shards(1);
  size_t cur = 0, total = 0;
  for (auto& s : specs) {
    if (cur > 0 && cur + s.nbytes() > max_shard_bytes) { shards.emplace_back(); cur = 0; }
    shards.back().push_back(s);
    cur += s.nbytes();
    total += s.nbytes();
  }
  std::vector<std::string> files;
  Progress bar("write " + std::filesystem::path(dir).filename().string(), double(total) / (1 << 20), "MiB");
  size_t written = 0;
  const TensorProducer counted = [&](const TensorSpec& s) {
    Tensor t = produce(s);
    written += s.nbytes();
    bar.update(double(written) / (1 << 20), s.name);
    return t;
  };
  if (shards.size() == 1) {
    write_safetensors(dir + "/model.safetensors", specs, counted);
    return {"model.safetensors"};
  }
  json wm = json::object();
  char buf[64];
  for (size_t i = 0; i < shards.size(); ++i) {
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_safetensors(dir + "/" + buf, shards[i], counted);
    for (auto& s : shards[i]) wm[s.name] = buf;
    files.push_back(buf);
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", wm}};
  write_file_atomic(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
  files.push_back("model.safetensors.index.json");
  return files;
}

}  // namespace ptq
