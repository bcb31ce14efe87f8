// ggml_blocks.h — llama.cpp's quantized blocks (ggml-common.h), each with the decoder llama.cpp
// applies (its dequantize_row_*, element for element, in the same float operations) and the encoder
// the GGUF writer uses: codes and grid parameters chosen by the solve in, the block's bytes out.
// Sizes are static_assert'ed; tests/test_client.cpp decodes random blocks with llama.cpp's own
// libggml-base and compares every float.
//
// Values per block and their decoding (q: the code, 0..2^bits-1 as lib/gptq stores it):
//   Q4_0  32  d (q - 8)                 Q4_1  32  d q + m
//   Q5_0  32  d (q - 16)                Q5_1  32  d q + m
//   Q8_0  32  d (q - 128)   (stored as the signed byte q - 128)
//   Q4_K 256  (d sc_j) q - (dmin m_j), 8 sub-blocks j of 32, sc_j and m_j 6 bits
//   Q5_K 256  the same with 5-bit q
//   Q6_K 256  (d sc_j) (q - 32), 16 sub-blocks of 16, sc_j a signed byte
// d, dmin and m are f16.
#pragma once
#include <cstdint>

namespace ptq {

enum class GgmlType : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30 };
const char* ggml_type_name(GgmlType t);    // "Q4_0"
bool parse_ggml_type(const char* name, GgmlType* t);   // a quantized type's name (Q4_0 .. Q6_K)
int ggml_block_elems(GgmlType t);          // 1 for the float types
int ggml_block_bytes(GgmlType t);

constexpr int kQK = 32;    // elements of a Q4_0 .. Q8_0 block
constexpr int kQKK = 256;  // elements of a K-quant super-block
struct BlockQ4_0 { uint16_t d; uint8_t qs[kQK / 2]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[kQK / 2]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[kQK]; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[kQKK / 2]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[kQKK / 8]; uint8_t qs[kQKK / 2]; };
struct BlockQ6_K { uint8_t ql[kQKK / 2]; uint8_t qh[kQKK / 4]; int8_t scales[kQKK / 16]; uint16_t d; };
static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block is 18 bytes");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block is 20 bytes");
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block is 22 bytes");
static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block is 24 bytes");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block is 34 bytes");
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block is 144 bytes");
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block is 176 bytes");
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block is 210 bytes");

// One block's parameters and codes, as the writer has them. Unused fields are ignored: d for every
// type; m for Q4_1 / Q5_1; dmin, sc[8], mc[8] for Q4_K / Q5_K; sc[16] for Q6_K (signed).
struct BlockParams {
  uint16_t d = 0, m = 0, dmin = 0;   // f16 bits
  int sc[16] = {}, mc[8] = {};
};
// Writes one block of type t (ggml_block_bytes(t) bytes at out) holding codes q[ggml_block_elems(t)].
void encode_block(GgmlType t, const BlockParams& p, const uint8_t* q, void* out);
// Decodes n elements (a multiple of the block) of type t, as llama.cpp's dequantize_row_*.
void dequantize_row(GgmlType t, const void* blocks, float* y, int64_t n);

// One block as codes and grids: q[ggml_block_elems(t)] the codes (0..2^bits - 1, element order),
// and each group of ggml_block_group(t) elements' grid, the numbers dequantize_row multiplies:
// w = scale (q - zero) (Q4_0, Q5_0, Q8_0; Q6_K with scale d sc), or w = scale q + min (Q4_1,
// Q5_1; Q4_K, Q5_K with scale d sc and min -(dmin m)). Scales and mins are exact products of the
// block's f16 and 6- or 8-bit integers.
struct BlockGrid {
  float scale = 0.0f, min = 0.0f;
  int zero = 0;
};
int ggml_block_group(GgmlType t);   // 32; 16 for Q6_K
void decode_block(GgmlType t, const void* block, uint8_t* q, BlockGrid* groups);

// llama.cpp's reference quantizers (quantize_row_*_ref, what llama_model_quantize writes without an
// importance matrix; ggml_quantize.cpp): n values (whole blocks) of type t into out. The GGUF
// writer's rounding of the tensors that have no Hessian (output.weight, token_embd.weight).
void quantize_row_ggml(GgmlType t, const float* x, int64_t n, void* out);
// Q4_K / Q5_K: the 12 bytes of eight 6-bit scales sc and mins mc, and sub-block j's back
// (llama.cpp's get_scale_min_k4).
void pack_scales_k4(const int* sc, const int* mc, uint8_t* s);
void scale_min_k4(int j, const uint8_t* s, int* sc, int* m);
// One Q4_0 / Q8_0 block of them (also the baselines of tests/test_gguf.cpp).
BlockQ4_0 quantize_block_q4_0(const float* x);
BlockQ8_0 quantize_block_q8_0(const float* x);
inline void dequantize_block_q4_0(const BlockQ4_0& b, float* y) { dequantize_row(GgmlType::Q4_0, &b, y, kQK); }
inline void dequantize_block_q8_0(const BlockQ8_0& b, float* y) { dequantize_row(GgmlType::Q8_0, &b, y, kQK); }

}  // namespace ptq
