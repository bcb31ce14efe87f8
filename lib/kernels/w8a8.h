// w8a8.h — the W8A8 GPU GEMM: int8 activations (per-token scales) times int8 weights (per-channel
// scales), int32 accumulation, the rescale fused into the epilogue (contract in w8a8.cu). The
// reference is ref_gemm_w8a8 (lib/kernels/reference.h).
#pragma once
#include <cstdint>

#include "kernels/act_quant.h"

namespace ptq::cuda {

// True when the device runs the kernel (compute capability 9.0: it is built for sm_90a, wgmma).
bool w8a8_supported();

// y [M, N] = sx[m] · sw[n] · Σ_k x[m, k] · w[n, k], all on the device: x [M, K] int8 row-major,
// w [N, K] int8 row-major (a Linear's weight as stored), sx [M] and sw [N] fp32. y is bf16
// (out_f32 false) or fp32. Refuses (Errc::usage) K not a multiple of 16 or not below 2^17, N odd, or a device that
// is not sm_90. Runs on the thread's current stream (cuda/runtime.h).
void w8a8_gemm(const int8_t* x, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, void* y, bool out_f32);

// Decode-sized M (contract in w8a8_gemv.cu): y [M, N] fp32 = sx[m] · sw[n] · Σ_k x[m, k] · w[n, k] + beta · y
// for 1 <= M <= 16 with K a multiple of 16 (any GPU), and up to kW8A8GemvMaxM rows where K % 64 == 0
// on sm_80 and up (int8 tensor cores); Errc::usage otherwise. The thread's current stream.
constexpr int64_t kW8A8GemvMaxM = 32;
bool w8a8_gemv_serves(int64_t M, int64_t K);
// Which a W8A8 Linear of M rows takes (w8a8_linear_f32): the decode product where it serves M,
// except at 17..32 rows on layers of kW8A8GemmFromN rows or more on sm_90, where the wgmma GEMM's
// 128-row tiles fill most SMs without a split and beat the int8 mma.sync form (H200, lab run 92,
// single-launch µs at 32 rows: 22016x4096 38.0 against 63.6, 11008x4096 30.6 against 38.7, 28672x4096
// 45.5 against 77.2; on 6144x4096 the GEMM took 28.0 against 26.8 and on the 4096-row layers
// 0.64-0.66x the product's speed, so they stay on the product). From 9216 rows, not 10240: Phi-3-mini's
// q, k, v (9216x3072) on the GEMM decodes 1.5% faster at batch 32 (lab run 209: 8,773 / 8,750
// against 8,638 / 8,619 tok/s; every phi3-mini layer on the GEMM 6,535). Both
// form float(acc) · sx[m] · sw[n] from the exact int32 sum: the same bytes either way.
constexpr int64_t kW8A8GemmFromN = 9216;
bool w8a8_takes_gemv(int64_t M, int64_t N, int64_t K);
void w8a8_gemv(const int8_t* x, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y, float beta);

// A W8A8 Linear as the GPU forward and the decode call it: y [M, N] fp32 = (x quantized by `act`)
// · wᵀ + beta · y, x [M, K] 16-bit (dt): quantize_activations_int8, then w8a8_gemv where
// w8a8_takes_gemv, else w8a8_gemm (sm_90) and add_scaled where beta is not 0.
void w8a8_linear_f32(const void* x, DType dt, const ActQuant& act, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y,
                     float beta);
// The same on activations already quantized (xq [M, K] int8, sx [M]): the decode quantizes them in
// the kernel that produces them (eval/decode_cuda.cu).
void w8a8_linear_int8_f32(const int8_t* xq, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y, float beta);

}  // namespace ptq::cuda
