// attention_cuda.h — causal (and sliding-window) GQA attention of whole windows in one kernel
// (flash attention: scores and probabilities never leave the chip).
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

// The same in fp64 on the host from fp32 inputs (the test reference).
void attention_reference(const float* q, const float* k, const float* v, double* ctx, int windows, int T, int heads, int kv_heads,
                         int head_dim, double scale, int window);

}  // namespace ptq::cuda
