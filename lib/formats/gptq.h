// gptq.h — the GPTQ checkpoint format (AutoGPTQ / GPTQModel; gptq and gptq_v2), every part of its
// layout in one place: pack, unpack, export, read (formats.md has the layout).
//
//   P.qweight  I32 [in * bits / 32, out]   column k of row r at bit (k * bits) of qweight[:, r]'s
//                                          stream: exactly the layer store's row words, transposed
//   P.qzeros   I32 [groups, out * bits / 32]  zero - 1 (v1) or zero (v2), packed along out
//   P.scales   F16/BF16 [groups, out]
//   P.g_idx    I32 [in]                    the group of each input column
//   + quantize_config.json, config.json's quantization_config
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "formats/common.h"

namespace ptq {

struct GptqPacked {
  std::vector<int32_t> qweight, qzeros, g_idx;
  std::vector<float> scales;
  int64_t rows, cols, groups;
  int bits;
  const uint8_t* qweight_mapped = nullptr;   // read_gptq_packed: qweight's words where the checkpoint maps them (any alignment); qweight empty
};
// From the store's packed rows (QuantizedLinear::packed) by transposing words; from one-byte codes
// by packing each row first.
GptqPacked pack_gptq(const QuantizedLinear& q, bool v2);
QuantizedLinear unpack_gptq(const GptqPacked& p, bool v2, bool sym, bool codes = true);   // codes false: packed left empty
void check_gptq_module(const ModulePlan& m, bool v2);
std::vector<std::string> export_gptq(const ExportJob& job, bool v2);
// Module m of a checkpoint, every size checked against scales [groups, out] and g_idx [in]
// before anything is unpacked. qweight is not copied but read where the checkpoint maps it
// (qweight_mapped, valid while ck lives), so unpack_gptq reads the file's words once.
GptqPacked read_gptq_packed(const Checkpoint& ck, const std::string& m, int bits);
struct GptqDims {
  int64_t groups, rows, cols;
};
GptqDims gptq_dims(const Checkpoint& ck, const std::string& m);   // from scales [groups, out] and g_idx [in]

// The quantized Linears of a gptq / gptq_v2 checkpoint, or of a compressed-tensors pack-quantized
// one, as the quantizer's representation (codes, scales, zero points as stored, g_idx): what the GPU
// kernels load (W4A16Linear::from_quantized); the reference path dequantizes through packed_source.
class GptqReader {
 public:
  explicit GptqReader(const std::string& dir);   // Errc::format naming config.json if neither
  bool v2() const { return v2_; }
  bool has(const std::string& module) const;     // false where the module is stored in float
  QuantizedLinear read(const std::string& module) const;   // every size checked before anything is unpacked
  // gptq and gptq_v2 (not compressed-tensors, whose codes read() gives): the module with its grids
  // but not its codes (packed empty), and *qweight where the checkpoint maps GPTQ's qweight
  // [cols * bits / 32, rows] (row r's stream down column r; any alignment; valid while this reader
  // lives). The GPU loaders' path: the codes go to the device as stored and are laid out there.
  bool maps_qweight() const { return !ct_; }
  QuantizedLinear read_grids(const std::string& module, const uint8_t** qweight) const;
 private:
  std::unique_ptr<Checkpoint> ck_;
  bool v2_ = false, ct_ = false, sym_ = true;
  int bits_ = 4, group_ = -1;
};

}  // namespace ptq
