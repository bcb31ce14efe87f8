// reference.h — reference kernels: y = x · Wᵀ computed straight from each packed layout, one
// weight at a time, with fp32 accumulation. Slow and simple on purpose: they are the oracles the
// fast (CUDA) kernels are checked against, and they define what each layout means.
//
// Shapes: x [M, in] row-major, y [M, out] row-major, W logically [out, in].
#pragma once
#include <cstdint>

#include "core/bits.h"
#include "formats/gguf.h"
#include "formats/nf4.h"
#include "formats/packed.h"

namespace ptq {

// GPTQ: w[o, i] = scales[g, o] * (q[i, o] - z[g, o]), g = g_idx[i]; v1 zeros stored as z - 1.
void ref_gemm_gptq(const float* x, int64_t M, const GptqPacked& w, bool v2, float* y);
// compressed-tensors pack-quantized: w[o, i] = scale[o, g] * (q[o, i] - z[o, g]) (unsigned codes).
void ref_gemm_ct(const float* x, int64_t M, const CtPacked& w, bool sym, float* y);
// bitsandbytes NF4 over the row-major flattening of W [out, in].
void ref_gemm_nf4(const float* x, int64_t M, const Nf4Tensor& w, int64_t out, int64_t in, float* y);
// llama.cpp Q4_0 / Q8_0: rows of in/32 blocks.
void ref_gemm_q4_0(const float* x, int64_t M, const BlockQ4_0* w, int64_t out, int64_t in, float* y);
void ref_gemm_q8_0(const float* x, int64_t M, const BlockQ8_0* w, int64_t out, int64_t in, float* y);
// int8 x int8 -> int32: c[m, n] = sum_k a[m, k] * b[n, k] (exact).
void ref_gemm_i8(const int8_t* a, const int8_t* b, int64_t M, int64_t N, int64_t K, int32_t* c);
// W8A8: y[m, n] = sx[m] · sw[n] · Σ_k x[m, k] · w[n, k], the int32 sum exact, the product in fp64
// rounded once to fp32 (per-token activation scales × per-channel weight scales).
void ref_gemm_w8a8(const int8_t* x, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y);

}  // namespace ptq
