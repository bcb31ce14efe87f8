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
// Which a W8A8 Linear of M rows takes (w8a8_linear_f32): the decode product where it serves M (its
// wgmma form from kW8A8WgmmaFromM rows on sm_90, below; past 32 rows on layers of at most 128 x the
// SMs' rows), else the wgmma GEMM (sm_90).
bool w8a8_takes_gemv(int64_t M, int64_t N, int64_t K);
// wgmma: whether w8a8_gemv may dispatch to w8a8_wgmma_gemv (false: the dp4a and int8 mma.sync
// forms only, which tests and sweeps compare against).
void w8a8_gemv(const int8_t* x, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y, float beta,
               bool wgmma = true);
// The same product on Hopper's int8 wgmma with both operands streamed by the copy engine
// (w8a8_wgmma_gemv.cu): 1..kW8A8WgmmaMaxM rows, K a multiple of 16 below 2^17, sm_90; Errc::usage otherwise.
constexpr int64_t kW8A8WgmmaMaxM = 128;
// Same bytes as the other forms (and as the GEMM): float(exact int32 sum) · sx · sw (+ beta y).
bool w8a8_wgmma_gemv_serves(int64_t M, int64_t K);
void w8a8_wgmma_gemv(const int8_t* x, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y, float beta);
// Where w8a8_gemv takes the wgmma form: from kW8A8WgmmaFromM rows where it serves (PTQKIT_W8A8_WG_FROM
// moves the bound for sweeps; 0: never). Measured on the H200 (docs/lab/2026-11-24-decode-h200.md,
// runs 213-218), decode W8A8 against the forms before it: batch 32 llama2-7b 6,536 -> 8,345 tok/s
// (1.06x -> 1.35x f16), llama3-8b 6,631 -> 8,349, phi3-mini 8,712 -> 10,850; batch 16 llama2-7b
// 4,415 -> 5,105; from 5 or 1 rows batch 8 lost 7% and batch 1 19%. At 17..32 rows it also
// replaced the wgmma GEMM on the layers of 9,216 rows or more (22016x4096 at 32 rows 36.4 against
// 38.5 µs; the GEMM's 256-row tiles left the 4096-row layers a sixth of the SMs).
constexpr int64_t kW8A8WgmmaFromM = 9;
bool w8a8_wgmma_takes(int64_t M, int64_t K);

// A W8A8 Linear as the GPU forward and the decode call it: y [M, N] fp32 = (x quantized by `act`)
// · wᵀ + beta · y, x [M, K] 16-bit (dt): quantize_activations_int8, then w8a8_gemv where
// w8a8_takes_gemv, else w8a8_gemm (sm_90) and add_scaled where beta is not 0.
void w8a8_linear_f32(const void* x, DType dt, const ActQuant& act, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y,
                     float beta);
// The same on activations already quantized (xq [M, K] int8, sx [M]): the decode quantizes them in
// the kernel that produces them (eval/decode_cuda.cu).
void w8a8_linear_int8_f32(const int8_t* xq, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y, float beta);

}  // namespace ptq::cuda
