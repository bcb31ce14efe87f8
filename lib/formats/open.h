// open.h — open any model ptqkit reads: float safetensors; packed safetensors (gptq, gptq_v2,
// compressed-tensors pack-quantized, bitsandbytes nf4), recognized by config.json's
// quantization_config; GGUF (a .gguf file, or a folder holding model.gguf).
#pragma once
#include <memory>
#include <string>

#include "model/llama.h"

namespace ptq {

std::unique_ptr<LlamaModel> open_model(const std::string& path);
// "float", "gptq", "gptq_v2", "compressed-tensors", "bitsandbytes-nf4" or "gguf".
std::string model_format(const std::string& path);
// The GGUF file a model path names: a .gguf file, or a folder's model.gguf (beside no safetensors);
// "" if none.
std::string gguf_path(const std::string& path);

}  // namespace ptq
