// pack.h — the bit layouts of the packed formats (formats.md), with their inverses.
//
// Every integer packing here is one little-endian bitstream (core/bits.h: pack_bits).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "core/bits.h"

namespace ptq {

// ---- bitsandbytes NF4 ----
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
std::vector<float> bnb_dynamic_map();           // bitsandbytes' signed 8-bit dynamic map (256 values, sorted)

// ---- llama.cpp blocks ----
constexpr int kQK = 32;                         // elements per Q4_0 / Q8_0 block
struct BlockQ4_0 { uint16_t d; uint8_t qs[kQK / 2]; };   // 4.5 bits per weight
struct BlockQ8_0 { uint16_t d; int8_t qs[kQK]; };       // 8.5 bits per weight
static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block is 18 bytes");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block is 34 bytes");
// llama.cpp's reference quantizers (quantize_row_q4_0_ref, quantize_row_q8_0_ref) of one block.
BlockQ4_0 quantize_block_q4_0(const float* x);
BlockQ8_0 quantize_block_q8_0(const float* x);
void dequantize_block_q4_0(const BlockQ4_0& b, float* y);
void dequantize_block_q8_0(const BlockQ8_0& b, float* y);

}  // namespace ptq
