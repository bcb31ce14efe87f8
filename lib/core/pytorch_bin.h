// pytorch_bin.h — PyTorch `torch.save` checkpoints (pytorch_model.bin) read without executing
// anything: a zip reader and a restricted unpickler.
//
// Two serializations exist:
//  - zip (torch >= 1.6): an uncompressed ("stored") zip archive holding <archive>/data.pkl (the
//    pickled state dict), <archive>/data/<key> (one raw little-endian storage per key) and
//    optionally <archive>/byteorder ("little").
//  - legacy (before 1.6): five pickles in a row (the magic number 0x1950a86a20f9469cfc6c, the
//    protocol version 1001, system info, the state dict, the list of storage keys), then for each
//    key in that list a u64 element count and the storage's raw bytes.
//
// The unpickler is a stack machine over the opcodes torch.save emits (protocols 2-4). It builds
// only plain values (None, bools, ints, floats, strings, bytes, tuples, lists, dicts) and exactly
// these globals:
//   torch._utils._rebuild_tensor_v2   (storage, offset, size, stride, requires_grad, hooks[, meta])
//   torch._utils._rebuild_parameter   (tensor, requires_grad, hooks): the tensor itself
//   collections.OrderedDict           a dict (its attribute state, BUILD, is dropped)
//   torch.{Float,Half,BFloat16,Double,Long,Int,Short,Char,Byte,Bool}Storage, as the storage type
//     of a persistent id ('storage', type, key, location, numel[, view])
// Any other global is refused when its GLOBAL opcode is read, with Errc::format naming it: nothing
// is ever called. The top object must be a dict of name -> tensor.
//
// Tensors are views into the mapped file when their strides are row-major (every checkpoint
// transformers writes); other strides are gathered into owned memory once, at open.
#pragma once
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/checkpoint.h"
#include "core/fsutil.h"

namespace ptq {

class PytorchBinFile final : public TensorFile {
 public:
  // Maps and validates: the zip's directories (or the legacy layout), the pickle, every storage's
  // byte count against its element count, every tensor's extent inside its storage.
  explicit PytorchBinFile(const std::string& path);
  const std::string& path() const override { return map_.path(); }
  bool has(const std::string& name) const override { return index_.count(name) != 0; }
  TensorView get(const std::string& name) const override;
  const std::vector<std::string>& names() const override { return names_; }   // in pickle order
  void release(const TensorView& t) const override;
  bool legacy() const { return legacy_; }
 private:
  MappedFile map_;
  bool legacy_{false};
  std::unordered_map<std::string, TensorView> index_;
  std::vector<std::string> names_;
  std::deque<std::vector<uint8_t>> gathered_;   // copies of the tensors whose strides are not row-major
};

// True when the file starts like a torch.save checkpoint (a zip, or a protocol-2 pickle).
bool looks_like_pytorch_bin(const std::string& path);

}  // namespace ptq
