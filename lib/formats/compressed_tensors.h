// compressed_tensors.h — the compressed-tensors format (vLLM, llm-compressor), pack-quantized for
// weight-only runs and int-quantized for W8A8: pack, unpack, export, read (formats.md).
//
//   pack-quantized  P.weight_packed I32 [out, ceil(in * bits / 32)]  each row one bitstream
//                   P.weight_scale  [out, groups] (model dtype)
//                   P.weight_zero_point I32 [ceil(out * bits / 32), groups]  (asymmetric only)
//                   P.weight_shape  I32 [2] = [out, in];  P.weight_g_idx I32 [in] (act-order groups)
//   int-quantized   P.weight I8 [out, in], P.weight_scale [out, 1], P.input_scale F32 [1] (static)
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/common.h"

namespace ptq {

struct CtPacked { std::vector<int32_t> weight_packed, zero_point, g_idx; std::vector<float> scale; int64_t rows, cols, groups, packed_cols; int bits; };
CtPacked pack_ct(const QuantizedLinear& q);
QuantizedLinear unpack_ct(const CtPacked& p, bool sym);
void check_ct_module(const ModulePlan& m);
std::vector<std::string> export_compressed_tensors(const ExportJob& job);   // weight-only: pack-quantized
std::vector<std::string> export_ct_int8(const ExportJob& job);              // W8A8: int-quantized
// Module m of a pack-quantized checkpoint whose Linear is [out, in] = s; `group` from the config
// (-1: per channel) when the checkpoint stores no g_idx. Every size and group index is checked.
CtPacked read_ct_packed(const Checkpoint& ck, const std::string& m, const Shape& s, int bits, int group, bool sym);
// Module m's [out, in] from its weight_shape (checked: two positive sizes).
Shape ct_weight_shape(const Checkpoint& ck, const std::string& m);
// The first config group of a compressed-tensors quantization_config (present, with a weights
// object: else Errc::format naming config_file) and its weights' bits, symmetry and group size
// (-1: per channel). JSON of a wrong type throws nlohmann's error: callers name the file.
struct CtWeights {
  const nlohmann::json* config_group;
  int bits;
  bool sym;
  int group_size;
};
CtWeights ct_weights(const nlohmann::json& quantization_config, const std::string& config_file);

}  // namespace ptq
