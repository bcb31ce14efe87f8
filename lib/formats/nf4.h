// nf4.h — bitsandbytes NF4 (transformers' load_in_4bit checkpoints): the code table, blockwise
// quantization with optional nested (double) quantization of the absmax values, export, read.
//
//   P.weight U8 [n / 2, 1]  two codes per byte, first element in the high nibble
//   P.weight.absmax F32 [blocks] (or U8 when nested, + nested_absmax F32, nested_quant_map F32 [256])
//   P.weight.quant_map F32 [16];  P.weight.quant_state.bitsandbytes__nf4 U8: JSON (blocksize, shape, ...)
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "formats/common.h"

namespace ptq {

extern const std::array<float, 16> kNf4Code;   // index -> value, formats.md §3
uint8_t nf4_index(float x);                     // nearest code of x in [-1, 1] (ties by the table's midpoints, to the lower)

struct Nf4Tensor {
  std::vector<uint8_t> packed;          // two codes per byte, first element in the high nibble
  std::vector<float> absmax;            // per block (not nested)
  int blocksize = 64;
  bool nested = false;
  std::vector<uint8_t> absmax_q;        // nested: absmax - offset, 8-bit blockwise with the dynamic map
  std::vector<float> nested_absmax;     // per nested block of 256
  std::vector<float> nested_map;        // 256 values
  float offset = 0;                     // nested: mean of the absmax values
  int nested_blocksize = 256;
};
Nf4Tensor nf4_quantize(const float* x, int64_t n, int blocksize, bool double_quant);
void nf4_dequantize(const Nf4Tensor& t, int64_t n, float* out);
float nf4_block_absmax(const Nf4Tensor& t, int64_t block);   // fp32, double quantization resolved
// Tensors of whole rows stacked in order (q, k, v -> one Linear): codes concatenated, absmax
// resolved to fp32 (not nested). Every part needs the same block size and an even count of
// codes in whole blocks (n_i: part i's elements); Errc::usage otherwise. Parts whose codes are
// all held apart (packed empty: read_nf4's `codes`) give the absmax alone.
Nf4Tensor concat_nf4_rows(const std::vector<Nf4Tensor>& parts, const std::vector<int64_t>& n);
std::vector<float> bnb_dynamic_map();           // bitsandbytes' signed 8-bit dynamic map (256 values, sorted)

void check_nf4(const std::vector<ModulePlan>& plan, int nf4_blocksize);
std::vector<std::string> export_nf4(const ExportJob& job);
// NF4-dequantized weights of job.nf4_modules, for the fake export of an NF4 run.
std::function<bool(const std::string&, MatF*)> nf4_dequantized(const ExportJob& job);
// The NF4 tensors of weight `name` of a bitsandbytes checkpoint as stored (its quant_state JSON
// parsed; a malformed one is Errc::format naming it); *shape, if given, gets W's [out, in].
// codes: the codes are not copied into packed (left empty) but *codes points where the checkpoint
// maps them, their size checked against the shape (valid while ck lives).
Nf4Tensor read_nf4(const Checkpoint& ck, const std::string& name, Shape* shape, const uint8_t** codes = nullptr);
// Its quant_state JSON (blocksize, shape, nested_*).
nlohmann::json nf4_quant_state(const Checkpoint& ck, const std::string& name);

}  // namespace ptq
