// packed.h — the packed checkpoint formats, written from QuantStore (or, for NF4, from the float
// weights) and read back by dequantizing behind a WeightSource (formats.md has each layout).
//   gptq / gptq_v2        P.qweight, P.qzeros, P.scales, P.g_idx (+ quantize_config.json)
//   compressed-tensors    P.weight_packed, P.weight_scale, [P.weight_zero_point], P.weight_shape, [P.weight_g_idx]
//   nf4 (bitsandbytes)    P.weight (u8), P.weight.absmax, P.weight.quant_map, [nested], P.weight.quant_state.bitsandbytes__nf4
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "formats/pack.h"
#include "gptq/qstore.h"
#include "model/llama.h"

namespace ptq {

struct ExportJob {
  const LlamaModel* model = nullptr;     // the float source
  const QuantStore* store = nullptr;     // quantized modules (not needed for nf4)
  std::string out_dir;
  size_t max_shard_bytes = size_t(2) << 30;
  bool true_sequential = true;
  int nf4_blocksize = 64;
  bool nf4_double_quant = false;
  DType nf4_compute_dtype = DType::F16;
  std::vector<std::string> nf4_modules;  // the Linears to store as NF4
};

// What will be written for each Linear of the decoder layers.
struct ModulePlan {
  std::string name;
  int64_t rows = 0, cols = 0;
  QuantSpec spec;
  bool quantized = true;   // false: left in float
};
// Refuses (Errc::usage naming the module and the reason) a plan that `format` cannot hold:
// called by the pipeline before calibration, and by each exporter on what it is given.
void check_format(const std::string& format, const LlamaConfig& c, const std::vector<ModulePlan>& plan, int nf4_blocksize = 64);

// Each checks up front that every module fits the format (Errc::usage naming the module and
// why, before anything is written), then writes the model files and config.json.
std::vector<std::string> export_gptq(const ExportJob& job, bool v2);
std::vector<std::string> export_compressed_tensors(const ExportJob& job);   // weight-only: pack-quantized
std::vector<std::string> export_ct_int8(const ExportJob& job);              // W8A8: int-quantized
std::vector<std::string> export_nf4(const ExportJob& job);
// NF4-dequantized weights of job.nf4_modules, for the fake export of an NF4 run.
std::function<bool(const std::string&, MatF*)> nf4_dequantized(const ExportJob& job);

// A WeightSource over a packed safetensors checkpoint: Linears are dequantized to fp32 as they
// are read (the reference path: s * (q - z), NF4 code * absmax), everything else is passed through.
std::unique_ptr<WeightSource> packed_source(const std::string& dir, const nlohmann::json& quantization_config);

// Packed tensors of one module, in the format's layout (exposed for tests and kernels).
struct GptqPacked { std::vector<int32_t> qweight, qzeros, g_idx; std::vector<float> scales; int64_t rows, cols, groups; int bits; };
GptqPacked pack_gptq(const QuantizedLinear& q, bool v2);
QuantizedLinear unpack_gptq(const GptqPacked& p, bool v2, bool sym);
struct CtPacked { std::vector<int32_t> weight_packed, zero_point, g_idx; std::vector<float> scale; int64_t rows, cols, groups, packed_cols; int bits; };
CtPacked pack_ct(const QuantizedLinear& q);
QuantizedLinear unpack_ct(const CtPacked& p, bool sym);

// The NF4 tensors of weight `name` of a bitsandbytes checkpoint as stored (its quant_state JSON
// parsed; a malformed one is Errc::format naming it); *shape, if given, gets W's [out, in].
Nf4Tensor read_nf4(const Checkpoint& ck, const std::string& name, Shape* shape);

// The packed tensors of a gptq / gptq_v2 checkpoint, module by module as stored (what the GPU
// kernels convert at load time; the reference path dequantizes through packed_source instead).
class GptqReader {
 public:
  explicit GptqReader(const std::string& dir);   // Errc::format naming config.json if not gptq
  bool v2() const { return v2_; }
  bool has(const std::string& module) const;     // false: the module is stored in float
  GptqPacked read(const std::string& module) const;
 private:
  std::unique_ptr<Checkpoint> ck_;
  bool v2_ = false;
  int bits_ = 4;
};

}  // namespace ptq
