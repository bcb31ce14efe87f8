// open.h — open any model ptqkit reads: float safetensors; packed safetensors (gptq, gptq_v2,
// compressed-tensors pack-quantized, bitsandbytes nf4), recognized by config.json's
// quantization_config; GGUF (a .gguf file, or a folder holding model.gguf).
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "model/llama.h"

namespace ptq {

std::unique_ptr<LlamaModel> open_model(const std::string& path);
// "float", "gptq", "gptq_v2", "compressed-tensors", "bitsandbytes-nf4" or "gguf".
std::string model_format(const std::string& path);
// The GGUF file a model path names: a .gguf file, or a folder's model.gguf (beside no safetensors);
// "" if none.
std::string gguf_path(const std::string& path);

// What a model's Linears cost on disk. Safetensors: every tensor under a Linear's name in the layer
// schedule (P.qweight, P.scales, P.qzeros, P.g_idx, P.weight_packed, P.weight.absmax, ...; not
// P.bias) is its storage, against out x in weights. GGUF: the matrices of blk.N (attention, MLP and
// stacked experts; not the router), against their values. The rest (embeddings, norms, biases,
// lm_head, routers) is counted as stored. `path`: a model folder of any format, or a .gguf file.
struct WeightBits {
  int64_t linear_weights = 0, other_params = 0;
  int64_t linear_bytes = 0, other_bytes = 0;
  double linear_bits() const { return linear_weights ? 8.0 * double(linear_bytes) / double(linear_weights) : 0.0; }
  nlohmann::json to_json() const;
};
WeightBits weight_bits(const std::string& path);
// The same of what a caller has open already (inspect: one parse of the file's header).
class GgufFile;
class Checkpoint;
WeightBits weight_bits(const GgufFile& f);
WeightBits weight_bits(const LlamaConfig& c, const Checkpoint& ck);

}  // namespace ptq
