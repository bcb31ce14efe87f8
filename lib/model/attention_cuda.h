// attention_cuda.h — causal (and sliding-window) GQA attention on tensor cores: of whole windows
// in one kernel (flash attention: scores and probabilities never leave the chip), and of one new
// row per sequence against its KV cache (decode_attention).
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace ptq::cuda {

// Whether flash_attention serves this head size (64, 96 or 128; the forward falls back to cuBLAS
// GEMMs and a softmax kernel otherwise).
bool flash_attention_supported(int head_dim);

// For `windows` windows of T tokens (token (s, i) at row s * T + i), query head h and its KV head
// h / (heads / kv_heads):
//   ctx[row, h*hd : (h+1)*hd] = sum_j softmax_j(scale * q_i . k_j) v_j over keys j <= i of the
//   same window (and i - j < window when window > 0).
// q, ctx: [windows * T, heads * hd]; k, v: [windows * T, kv_heads * hd]; all `dt` (F16 or BF16),
// row-major, on the device. Scores and softmax in fp32, P rounded to dt for the P·V product,
// fp32 accumulation (docs/numerics.md).
void flash_attention(DType dt, const void* q, const void* k, const void* v, void* ctx, int windows, int T, int heads, int kv_heads,
                     int head_dim, float scale, int window);

// One new query row per sequence (a decode step) against its KV cache, on tensor cores:
//   ctx[b, h*hd : (h+1)*hd] = sum_j softmax_j(scale * q_b,h . k_b,j) v_b,j over keys
//   j = first .. *pos, first = max(0, *pos - window + 1) when window > 0, else 0,
// with k, v the cache rows of KV head h / (heads / kv_heads). q, ctx: [batch, heads * hd];
// k_cache, v_cache: [batch, max_len, kv_heads * hd]; pos: one int on the device (the position of
// every sequence's new row, whose key and value the cache already holds). All `dt` (F16 or BF16).
// Scores, softmax and sums fp32; P rounded to dt for the P·V product. `splits` CTAs a KV head share
// its keys (a cluster, sm_90; decode_attention_splits picks them); `pdl`: launched under
// programmatic dependent launch (cuda/pdl.cuh), reading q and rows at *pos after its wait.
bool decode_attention_supported(int head_dim, int heads, int kv_heads);   // hd 64/96/128, heads / kv_heads <= 8, sm_80+
int decode_attention_splits(int batch, int heads, int kv_heads, int max_len);
void decode_attention(DType dt, const void* q, const void* k_cache, const void* v_cache, const int* pos, void* ctx, int batch, int heads,
                      int kv_heads, int head_dim, int max_len, int window, float scale, int splits, bool pdl);

// The same in fp64 on the host from fp32 inputs (the test reference).
void attention_reference(const float* q, const float* k, const float* v, double* ctx, int windows, int T, int heads, int kv_heads,
                         int head_dim, double scale, int window);

}  // namespace ptq::cuda
