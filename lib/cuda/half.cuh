// half.cuh — the fp32 <-> 16-bit (f16, bf16) conversions the kernels share: to_f widens exactly,
// from_f rounds to nearest even (the rounding of the CPU reference's round_to, core/dtype.h).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace ptq::cuda {

__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

}  // namespace ptq::cuda
