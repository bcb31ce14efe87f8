// a16_wgmma.h — the Hopper (sm_90a, wgmma) kernel of the 16-bit-activation formats for up to 256
// activation rows (kernels/a16_wgmma.cu has its contract). Built in the sm_90a library; callable
// from the portable sm_90 code through these declarations.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/a16_formats.cuh"

namespace ptq::cuda::a16 {

// y [M, N] = x [M, K] · Wᵀ (f16 y, or fp32 y + beta y when yf is given), M <= kA16WgmmaMaxM, W in the
// fragment order of kernels/a16_mma.cuh.
void run_wgmma(const GptqFormat<4>& fmt, const uint4* W, const __half* x, __half* yh, float* yf, float beta, int64_t M, int64_t N, int64_t K);
void run_wgmma(const GptqFormat<8>& fmt, const uint4* W, const __half* x, __half* yh, float* yf, float beta, int64_t M, int64_t N, int64_t K);
void run_wgmma(const Nf4Format& fmt, const uint4* W, const __half* x, __half* yh, float* yf, float beta, int64_t M, int64_t N, int64_t K);
// Grids with mins (w = s q + m: GGUF's Q4_1, Q5_1, Q4_K, Q5_K) in the 4- and 8-bit layouts.
void run_wgmma(const GptqFormat<4, true>& fmt, const uint4* W, const __half* x, __half* yh, float* yf, float beta, int64_t M, int64_t N, int64_t K);
void run_wgmma(const GptqFormat<8, true>& fmt, const uint4* W, const __half* x, __half* yh, float* yf, float beta, int64_t M, int64_t N, int64_t K);

}  // namespace ptq::cuda::a16
