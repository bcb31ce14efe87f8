// common.h — what every packed format's exporter and reader shares: the export job, the plan of
// what is written for each Linear, the checks that refuse a plan before calibration, and the
// writer that copies a checkpoint while replacing its Linears' weights by packed tensors.
#pragma once
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/safetensors.h"
#include "formats/ggml_blocks.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "quant/qstore.h"

namespace ptq {

// A tensor's GGUF blocks, formed ahead of the writer.
struct GgufTable {
  GgmlType type;
  std::string bytes;
};

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
  const VocabInfo* vocab = nullptr;      // the model's vocabulary where the caller has it (GGUF); else read from the model folder
  // GGUF: the block types of output.weight and token_embd.weight, quantized as llama.cpp's quantizer
  // does (ggml_blocks.h's quantize_row_ggml), or where gguf_mse rounded to nearest on ptqkit's grid
  // with its clipping search; none: the model's float type
  std::optional<GgmlType> gguf_output, gguf_embedding;
  bool gguf_mse = false;
  std::string gguf_type;   // export.gguf_type ("" where not set): the file type general.file_type names
  // GGUF: output.weight's and token_embd.weight's blocks already formed (formats/gguf.h's
  // gguf_table_bytes, by a run beside its calibration), by Hugging Face name; the writer forms the
  // others, and any whose type differs.
  const std::map<std::string, GgufTable>* gguf_tables = nullptr;
};

// What will be written for each Linear of the decoder layers.
struct ModulePlan {
  std::string name;
  int64_t rows = 0, cols = 0;
  QuantSpec spec;
  bool quantized = true;   // false: left in float
};
// Refuses (Errc::usage naming the module and the reason) a plan that `format` cannot hold:
// called by the pipeline before calibration, and by each exporter on what it is given. The
// per-format rules live in each format's file (check_gptq_module, check_ct_module, check_nf4,
// check_gguf_module / check_gguf_model).
void check_format(const std::string& format, const LlamaConfig& c, const std::vector<ModulePlan>& plan, int nf4_blocksize = 64);

// ---- shared by the formats' files
namespace formats {
bool ends_with(const std::string& s, const std::string& e);
std::string module_of(const std::string& weight);   // strip ".weight"
template <class T>
Tensor raw(DType t, Shape s, const std::vector<T>& v) { return tensor_of_raw(t, std::move(s), v); }
template <class T>
std::vector<T> read_raw(const Checkpoint& ck, const std::string& name, DType want) {
  TensorView t = ck.get(name);
  if (t.dtype != want) fail(Errc::format, ck.file_of(name), name, "dtype " + std::string(dtype_name(t.dtype)) + ", expected " + std::string(dtype_name(want)));
  std::vector<T> v(t.nbytes / sizeof(T));
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}
std::vector<float> read_floats(const Checkpoint& ck, const std::string& name);
// What an unpacker fills: a QuantizedLinear of this shape and grid, its codes and grids still empty.
QuantizedLinear unpacked_shape(int bits, bool sym, int64_t rows, int64_t cols, int64_t groups);
// The Linears of the decoder layers with what the store holds for them.
std::vector<ModulePlan> plan(const ExportJob& job);
// Linears that are never quantized and that a format's list of unquantized modules must name
// (lm_head, and each MoE layer's router), by full module name.
std::vector<std::string> float_modules(const LlamaConfig& c);
int64_t groups_of(const ModulePlan& m);
// Writes every tensor of the source, replacing the ".weight" of each module in `packed` by the
// tensors listed there, produced by `produce_packed`; config.json gets quantization_config.
std::vector<std::string> write_model(const ExportJob& job, const std::map<std::string, std::vector<TensorSpec>>& packed,
                                     const TensorProducer& produce_packed, const nlohmann::json& qconfig);
}  // namespace formats

}  // namespace ptq
