// act8.cuh — the device arithmetic of int8 activation quantization (W8A8 inputs), shared by the
// deployed quantizer's kernels (kernels/act_quant.cu), the decode's kernels that quantize what
// they produce (eval/decode_cuda.cu: RMSNorm and silu·mul fused with the quantization of a W8A8
// Linear's input) and the calibration forward's W8A8 Linears (model/forward_cuda.cu). In the
// platform layer because all three folders use it and the model's is below the kernels'.
// Reference: quantize_activations (lib/model/llama.cpp): per token s = max |x| / 127 (per tensor the
// static scale), 1 where that is not positive; q = x / s rounded half to even, clamped.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace ptq::cuda::act8 {

// The row's scale from this thread's max |x| (m): per token the CTA's max / 127 (blockDim a
// multiple of 32; every thread reaches it), else the static scale; 1 where not positive. Thread 0
// writes it to s[blockIdx.x] (one CTA per row).
__device__ __forceinline__ float row_scale(float m, bool per_token, float static_scale, float* s) {
  __shared__ float sh[32];
  float scale = static_scale;
  if (per_token) {
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = m;
    __syncthreads();
    m = 0;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) m = fmaxf(m, sh[w]);
    scale = m / 127.0f;
  }
  if (!(scale > 0)) scale = 1.0f;
  if (threadIdx.x == 0) s[blockIdx.x] = scale;
  return scale;
}

// q = x / s rounded half to even, clamped: IEEE division, as quantize_activations on the host.
__device__ __forceinline__ int8_t code_of(float x, float scale) { return int8_t(fminf(127.0f, fmaxf(-128.0f, rintf(__fdiv_rn(x, scale))))); }

// Four codes in one 4-byte word (p 4-byte aligned).
__device__ __forceinline__ void store_codes4(int8_t* p, float a, float b, float c, float d, float scale) {
  *reinterpret_cast<char4*>(p) = make_char4(code_of(a, scale), code_of(b, scale), code_of(c, scale), code_of(d, scale));
}

}  // namespace ptq::cuda::act8
