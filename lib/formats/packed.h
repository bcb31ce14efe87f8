// packed.h — every packed checkpoint format ptqkit writes and reads, one file each (their layouts
// are at the top of each header), and the WeightSource that reads any of them back:
//   gptq.h                 gptq / gptq_v2 (AutoGPTQ, GPTQModel)
//   compressed_tensors.h   pack-quantized and int-quantized (vLLM, llm-compressor)
//   nf4.h                  bitsandbytes NF4 (transformers)
//   gguf.h                 llama.cpp's GGUF (Q4_0 ... Q6_K and the _M mixes)
//   fake.h                 dequantized weights in the source dtype
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "formats/common.h"
#include "formats/compressed_tensors.h"
#include "formats/gptq.h"
#include "formats/nf4.h"

namespace ptq {

// A WeightSource over a packed safetensors checkpoint: Linears are dequantized to fp32 as they
// are read (the reference path: s * (q - z), NF4 code * absmax), everything else is passed through.
std::unique_ptr<WeightSource> packed_source(const std::string& dir, const nlohmann::json& quantization_config);

}  // namespace ptq
