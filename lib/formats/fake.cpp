#include "formats/fake.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/fsutil.h"

namespace fs = std::filesystem;

namespace ptq {

std::vector<std::string> ordered_tensor_names(const Checkpoint& ck) {
  std::vector<std::string> names = ck.names();
  auto key = [](const std::string& n) {
    const int l = layer_of(n);
    const int top = n.rfind("model.embed", 0) == 0 ? 0 : l >= 0 ? 1 : n.rfind("model.", 0) == 0 ? 2 : 3;
    return std::make_tuple(top, l, n);
  };
  std::stable_sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) { return key(a) < key(b); });
  return names;
}

DequantizedLookup dequantized_from(const QuantStore& store) {
  return [&store](const std::string& tensor, MatF* W) {
    VecF v;
    if (store.float_override(tensor, &v)) {   // a smoothed norm, a float Linear it feeds, a bias (factors folded in)
      *W = Eigen::Map<MatF>(v.data(), v.size(), 1);
      return true;
    }
    if (!tensor.ends_with(".weight")) return false;
    const QuantizedLinear* q = store.get(tensor.substr(0, tensor.size() - 7));
    if (q) *W = q->dequantize();
    return q != nullptr;
  };
}

std::vector<std::string> export_fake(const Checkpoint& src, const DequantizedLookup& lookup, const std::string& out_dir, size_t max_shard_bytes) {
  std::vector<TensorSpec> specs;
  for (auto& n : ordered_tensor_names(src)) {
    TensorView t = src.get(n);
    specs.push_back({n, t.dtype, t.shape});
  }
  auto produce = [&](const TensorSpec& s) {
    MatF W;
    if (!lookup(s.name, &W)) {   // left in float: copied as it is
      TensorView t = src.get(s.name);
      Tensor out(t.dtype, t.shape);
      std::memcpy(out.bytes.data(), t.data, t.nbytes);
      src.release(s.name);
      return out;
    }
    return tensor_from_f32(W.data(), s.shape, s.dtype);
  };
  return write_checkpoint_tensors(out_dir, specs, produce, max_shard_bytes);
}

std::vector<std::string> copy_side_files(const std::string& src_dir, const std::string& out_dir) {
  std::vector<std::string> copied;
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                        "special_tokens_map.json", "vocab.json", "merges.txt"}) {
    const std::string s = src_dir + "/" + f;
    if (!fs::exists(s)) continue;
    write_file_atomic(out_dir + "/" + f, read_text_file(s));
    copied.push_back(f);
  }
  return copied;
}

}  // namespace ptq
