// safetensors.h — reading (over mmap, validated) and writing (streamed, atomic, sharded) of
// safetensors files and Hugging Face checkpoint folders.
//
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets:
// [begin, end]}, "__metadata__": {str: str}}, then the data section; offsets are relative to it.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/checkpoint.h"
#include "core/fsutil.h"
#include "core/tensor.h"

namespace ptq {

class SafetensorsFile final : public TensorFile {
 public:
  // Maps and validates: header length against the file size, the JSON, dtypes, shape x dtype
  // size = byte range, ranges inside the data section and not overlapping. Errc::format naming
  // the file and the field on any violation.
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const override { return map_.path(); }
  bool has(const std::string& name) const override { return index_.count(name) != 0; }
  TensorView get(const std::string& name) const override;
  const std::vector<std::string>& names() const override { return names_; }   // in data order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  void release(const TensorView& t) const override { map_.release(t.data, t.nbytes); }
 private:
  MappedFile map_;
  std::unordered_map<std::string, TensorView> index_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

struct TensorSpec {
  std::string name;
  DType dtype;
  Shape shape;
  size_t nbytes() const { return size_t(numel(shape)) * dtype_size(dtype); }
};
using TensorProducer = std::function<Tensor(const TensorSpec&)>;

// Writes one safetensors file atomically (temporary name, fsync, rename). Tensors are produced
// one at a time in `specs` order, so peak memory is one tensor.
void write_safetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                       const TensorProducer& produce,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Writes `specs` into folder `dir` as model.safetensors, or, when the total exceeds
// max_shard_bytes, as model-0000i-of-0000N.safetensors plus model.safetensors.index.json.
// Returns the file names written.
std::vector<std::string> write_checkpoint_tensors(const std::string& dir, const std::vector<TensorSpec>& specs,
                                                  const TensorProducer& produce, size_t max_shard_bytes);

}  // namespace ptq
