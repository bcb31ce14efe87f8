// gguf.h — llama.cpp's GGUF v3: a writer (Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE, Phi-3;
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K quantized tensors (formats/ggml_blocks.h), F32 /
// F16 / BF16 float ones), and a reader (llama).
//
// File: "GGUF", u32 version 3, u64 tensor count, u64 metadata count; metadata (key string, u32
// type, value); tensor infos (name, u32 n_dims, u64 ne[n_dims] with ne[0] the contiguous
// dimension, u32 ggml type, u64 offset); padding to general.alignment (32); tensor data, each
// aligned to 32. All little-endian; strings are u64 length + bytes.
//
// GPTQ's symmetric 4-bit (8-bit) grid with groups of 32 along the input is Q4_0's (Q8_0's):
// x = d * (q - 8) (x = d * q8). The other types have grids of their own (quant/quantizer.h's
// GridForm: f16 mins, K-quant super-blocks), which the solve uses as the block stores them.
// Either way the file is written code for code, scale for scale: a GGUF with GPTQ-optimized
// weights, which llama.cpp's own tools cannot make.
// llama.cpp stores llama's q_proj/k_proj rows permuted (rotary halves interleaved per head); the
// writer applies its permutation and the reader undoes it. The other families rotate halves
// (NEOX) and are written as stored. Names, shapes and metadata keys follow llama.cpp's converter
// (convert_hf_to_gguf.py) and loader (src/llama-arch.cpp, src/llama-model.cpp); the client test
// (tests/test_client.cpp) loads each family in llama.cpp itself.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/fsutil.h"
#include "formats/common.h"
#include "formats/ggml_blocks.h"
#include "formats/gptq.h"
#include "model/tokenizer.h"

namespace ptq {

// llama.cpp's mixes of K types ptqkit writes: Q4_K_M, Q5_K_M, Q4_K_S, Q5_K_S (their base type is the
// name's first four characters).
inline bool is_gguf_mix(const std::string& name) { return name == "Q4_K_M" || name == "Q5_K_M" || name == "Q4_K_S" || name == "Q5_K_S"; }
// llama.cpp's general.file_type (llama_ftype) for a type or mix it has one for (Q4_0 .. Q8_0, Q6_K,
// the four mixes); -1 for the others (the plain Q4_K / Q5_K, which are no llama_ftype).
int llama_ftype_of(const std::string& name);
// The block type a module's spec is written as: the spec is that type's grid exactly (false, with
// the reason in *why, when no type holds it).
bool gguf_type_of(const QuantSpec& s, GgmlType* t, std::string* why = nullptr);
// The spec of a GGUF type: bits, group size, symmetry and grid form set from it (act-order keeps
// its static groups; the K types always have them). "" if name is a type; else why not.
std::string apply_gguf_type(const std::string& name, QuantSpec& s);

// llama.cpp's fallback for a K type on rows its 256 elements do not divide (its quantizer's
// tensor_type_fallback): Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; the type itself for the others.
GgmlType gguf_fallback_type(GgmlType t);
// The types llama.cpp's quantizer (src/llama-quant.cpp) gives the two tensors beside the Linears
// in a file of type `base` (the type of its mix: Q4_K for Q4_K_M), rows of `cols` elements:
// - output.weight, and token_embd.weight where the embeddings are tied (it is the output then):
//   Q6_K; Q8_0 where base is Q8_0 or base's blocks do not divide the row;
// - token_embd.weight: base.
// Either then falls back as gguf_fallback_type where its blocks do not divide the row; false where
// no block does (the tensor stays in the model's float type, as llama.cpp's F16 fallback).
bool gguf_output_type(GgmlType base, int64_t cols, GgmlType* t);
bool gguf_embedding_type(GgmlType base, int64_t cols, GgmlType* t);

// The plan checks (common.h's check_format): a module's spec must be a block type's grid, the
// model one the writer covers.
void check_gguf_module(const ModulePlan& m);
void check_gguf_model(const LlamaConfig& c);
// The vocabulary the file embeds, from the model folder's tokenizer: the writer's (where the
// ExportJob brings none), and the pipeline's check before calibration (a folder without tokenizer
// files is refused there, naming the folder, not after the solve). gguf_tokenizer is that load,
// which the pipeline keeps for its calibration text.
std::unique_ptr<Tokenizer> gguf_tokenizer(const std::string& model_dir, const LlamaConfig& c);
VocabInfo gguf_vocab(const std::string& model_dir, const LlamaConfig& c);
std::vector<std::string> export_gguf(const ExportJob& job);
// The blocks of a tensor with no Hessian (output.weight, token_embd.weight: Hugging Face name hf)
// in `type`, as llama.cpp's own quantizer writes them (quantize_row_ggml), rows on the OpenMP
// threads: what export_gguf writes for them without quantization.mse. They depend on the float
// model alone, so a run forms them beside its calibration (ExportJob::gguf_tables).
std::string gguf_table_bytes(const LlamaModel& model, const std::string& hf, GgmlType type);
// The Hugging Face names of the tensors GGUF stores as output.weight and token_embd.weight ("" where
// the checkpoint has none: tied embeddings have no lm_head).
std::pair<std::string, std::string> gguf_table_names(const Checkpoint& ck);

class GgufFile {
 public:
  explicit GgufFile(const std::string& path);   // Errc::format naming the file and field on malformed input
  struct TensorInfo {
    std::string name;
    std::vector<int64_t> ne;                      // ne[0] contiguous
    GgmlType type;
    uint64_t offset;                              // from the data section's start
    const uint8_t* data;
    size_t nbytes;
  };
  const std::string& path() const { return map_.path(); }
  const nlohmann::json& metadata() const { return meta_; }   // arrays longer than 64 are summarized
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  void read_f32(const TensorInfo& t, float* out) const;      // dequantized, row-major [ne1, ne0]
  // Rows `rows` of a 2-D tensor, dequantized (the embedding gather: no decode of the whole table).
  void read_rows_f32(const TensorInfo& t, const std::vector<int32_t>& rows, float* out) const;
 private:
  MappedFile map_;
  nlohmann::json meta_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
};

// A WeightSource with Hugging Face names over a GGUF file (q/k rows un-permuted).
std::unique_ptr<WeightSource> gguf_source(const std::string& path, const LlamaConfig& cfg);
// config.json equivalent built from a GGUF file's llama.* metadata.
nlohmann::json gguf_config_json(const GgufFile& f);
// llama.cpp's tensor name for a Hugging Face one ("" where it has none); every expert's Linear of
// one role maps to the same stacked tensor (blk.N.ffn_gate_exps.weight, ne = {cols, rows, experts}).
std::string hf_to_gguf_name(const std::string& hf);
// llama.cpp's architecture for a config: llama (llama, mistral, mixtral: experts), qwen2, qwen3,
// qwen3moe, phi3.
std::string gguf_arch(const LlamaConfig& c);
// llama.cpp's name of a general.file_type (llama.h's llama_ftype: "Q4_K_M" for 15; 4-6 were
// removed), "unknown" for a number it does not give; the writer sets the number (gguf.cpp: file_type).
std::string llama_ftype_name(int64_t t);

// llama.cpp's row permutation of q/k: HF row h*hd + j*(hd/2) + i -> GGUF row h*hd + 2*i + j.
int64_t gguf_permuted_row(int64_t hf_row, int head_dim);

// A Linear stored in one of llama.cpp's quantized blocks (Q4_0 ... Q6_K) as the quantizer's
// representation, code for code and grid for grid (ggml_blocks.h, decode_block): groups of 32
// along the input (16 for Q6_K); integer zero points 8, 16, 128 and 32 (Q4_0, Q5_0, Q8_0, Q6_K),
// or mins (Q4_1, Q5_1, Q4_K, Q5_K: spec.form f16_min / k_min); rows in Hugging Face order (llama's
// q/k un-permuted, as gguf_source reads them). What the GPU's W4A16 / W8A16 kernels load. False,
// and *out untouched, for float tensors and an expert's stacked tensor (the caller dequantizes
// those); with out null, only whether it would be true.
bool gguf_quantized(const GgufFile& f, const std::string& hf_name, int head_dim, QuantizedLinear* out);

}  // namespace ptq
