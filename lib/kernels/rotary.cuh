// rotary.cuh — the rotary embedding of one pair of a head's dims, (lo, hi) = (x_j, x_{j + half}),
// by the angle of its position and frequency j (cs, sn = cos, sin of it):
//   lo' = lo cs - hi sn,   hi' = hi cs + lo sn   (fp32)
// Each product rounded, then the difference or sum (explicit _rn intrinsics: no FMA contraction,
// which the compiler would otherwise choose per kernel), so that every kernel that rotates rounds
// alike: the decode's rope_append and attention (eval/decode_cuda.cu), the A16 wgmma kernel's
// q, k, v epilogue (a16_fold_rope, kernels/a16_wgmma.cu) and the GPU forward's rope_cast_kernel
// (model/forward_cuda.cu) write the same bytes. Reference: the CPU forward's apply_rope
// (model/llama.cpp).
#pragma once

namespace ptq::cuda {

__device__ __forceinline__ float rotary_lo(float lo, float hi, float cs, float sn) { return __fsub_rn(__fmul_rn(lo, cs), __fmul_rn(hi, sn)); }
__device__ __forceinline__ float rotary_hi(float lo, float hi, float cs, float sn) { return __fadd_rn(__fmul_rn(hi, cs), __fmul_rn(lo, sn)); }

}  // namespace ptq::cuda
