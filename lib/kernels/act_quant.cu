// act_quant.cu — contract: x [rows, cols] 16-bit row-major (device) -> q int8 [rows, cols], s fp32
// [rows]; one CTA of 256 threads per row: a max-|x| reduction (per token) or the static scale,
// then q = rint(x / s) clamped, IEEE fp32 division as on the host. Roofline: reads 2 bytes and
// writes 1 per element (memory-bound; quantize_rows_vec_kernel holds the row in registers, the
// general one re-reads it from L1/L2 for the codes).
// Reference: quantize_activations (lib/model/llama.cpp); tests/test_kernels_cuda.cpp compares them.
#include "kernels/act_quant.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdlib>

#include "core/error.h"
#include "cuda/pdl.cuh"
#include "cuda/runtime.h"
#include "cuda/act8.cuh"
#include "kernels/w8a8.h"

namespace ptq::cuda {

namespace {
template <class T> __device__ float to_f(T v);
template <> __device__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

using act8::code_of;
using act8::row_scale;

template <class T>
__global__ void quantize_rows_kernel(const T* x, int64_t cols, bool per_token, float static_scale, int8_t* q, float* s) {
  const T* xr = x + int64_t(blockIdx.x) * cols;
  float m = 0;
  if (per_token)
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, fabsf(to_f(xr[c])));
  const float scale = row_scale(m, per_token, static_scale, s);
  int8_t* qr = q + int64_t(blockIdx.x) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) qr[c] = code_of(to_f(xr[c]), scale);
}

// The same with the row in registers (cols % 8 == 0, cols <= 8 x 256 x kRowVecMax): 16-byte loads,
// one pass over x, 8 codes per 8-byte store. The latency of the two passes and 2-byte accesses
// above is on the critical path of every decode-step W8A8 Linear (one CTA per row).
constexpr int kRowVecThreads = 256, kRowVecMax = 8;
template <class T>
__global__ void __launch_bounds__(kRowVecThreads) quantize_rows_vec_kernel(const T* x, int cols, bool per_token, float static_scale, int8_t* q, float* s) {
  pdl::wait_prior_grid();   // launched with PDL: x comes from the kernel before
  pdl::allow_dependents();  // the product after it loads its first weights meanwhile (it reads q and s after its own wait)
  const uint4* xr = reinterpret_cast<const uint4*>(x + int64_t(blockIdx.x) * cols);
  const int n8 = cols / 8;
  uint4 v[kRowVecMax];
  float m = 0;
#pragma unroll
  for (int k = 0; k < kRowVecMax; ++k) {
    const int i = int(threadIdx.x) + k * kRowVecThreads;
    v[k] = i < n8 ? xr[i] : make_uint4(0, 0, 0, 0);
    const T* e = reinterpret_cast<const T*>(&v[k]);
#pragma unroll
    for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(to_f(e[j])));
  }
  const float scale = row_scale(m, per_token, static_scale, s);
  uint2* qr = reinterpret_cast<uint2*>(q + int64_t(blockIdx.x) * cols);
#pragma unroll
  for (int k = 0; k < kRowVecMax; ++k) {
    const int i = int(threadIdx.x) + k * kRowVecThreads;
    if (i >= n8) break;
    const T* e = reinterpret_cast<const T*>(&v[k]);
    union {
      int8_t c[8];
      uint2 u;
    } o;
#pragma unroll
    for (int j = 0; j < 8; ++j) o.c[j] = code_of(to_f(e[j]), scale);
    qr[i] = o.u;
  }
}

__global__ void add_scaled_kernel(float* y, const float* t, int64_t n, float beta) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = beta == 0.0f ? t[i] : t[i] + beta * y[i];
}
}  // namespace

void quantize_activations_int8(const void* x, DType dt, int64_t rows, int64_t cols, const ActQuant& a, int8_t* q, float* s) {
  if (a.mode == ActQuant::none) fail(Errc::usage, "", "quantize_activations_int8", "no int8 activation spec");
  if (rows == 0) return;
  const bool per_token = a.mode == ActQuant::per_token;
  const bool vec = cols % 8 == 0 && cols <= int64_t(8) * kRowVecThreads * kRowVecMax;
  if (vec && dt == DType::F16)
    launch_pdl("quantize_rows_vec_kernel", true, -1, quantize_rows_vec_kernel<__half>, dim3(unsigned(rows)), dim3(kRowVecThreads), 0,
               static_cast<const __half*>(x), int(cols), per_token, a.static_scale, q, s);
  else if (vec && dt == DType::BF16)
    launch_pdl("quantize_rows_vec_kernel", true, -1, quantize_rows_vec_kernel<__nv_bfloat16>, dim3(unsigned(rows)), dim3(kRowVecThreads), 0,
               static_cast<const __nv_bfloat16*>(x), int(cols), per_token, a.static_scale, q, s);
  else if (dt == DType::F16) quantize_rows_kernel<__half><<<unsigned(rows), 256, 0, static_cast<cudaStream_t>(current_stream())>>>(static_cast<const __half*>(x), cols, per_token, a.static_scale, q, s);
  else if (dt == DType::BF16)
    quantize_rows_kernel<__nv_bfloat16><<<unsigned(rows), 256, 0, static_cast<cudaStream_t>(current_stream())>>>(static_cast<const __nv_bfloat16*>(x), cols, per_token, a.static_scale, q, s);
  else fail(Errc::usage, "", "quantize_activations_int8", "activations must be F16 or BF16");
  PTQ_CUDA_LAUNCH("quantize_rows_kernel");
}

void add_scaled(float* y, const float* t, int64_t n, float beta) {
  if (n == 0) return;
  add_scaled_kernel<<<unsigned((n + 255) / 256), 256, 0, static_cast<cudaStream_t>(current_stream())>>>(y, t, n, beta);
  PTQ_CUDA_LAUNCH("add_scaled_kernel");
}

void w8a8_linear_f32(const void* x, DType dt, const ActQuant& act, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y,
                     float beta) {
  DeviceBuffer<int8_t> xq(size_t(M * K), "W8A8 activations (int8)");
  DeviceBuffer<float> sx(size_t(M), "W8A8 activation scales");
  quantize_activations_int8(x, dt, M, K, act, xq.get(), sx.get());
  w8a8_linear_int8_f32(xq.get(), sx.get(), w, sw, M, N, K, y, beta);
}

void w8a8_linear_int8_f32(const int8_t* xq, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y, float beta) {
  if (w8a8_takes_gemv(M, N, K)) return w8a8_gemv(xq, sx, w, sw, M, N, K, y, beta);   // decode
  if (beta == 0.0f) return w8a8_gemm(xq, sx, w, sw, M, N, K, y, true);
  DeviceBuffer<float> t(size_t(M * N), "W8A8 output (fp32)");
  w8a8_gemm(xq, sx, w, sw, M, N, K, t.get(), true);
  add_scaled(y, t.get(), M * N, beta);
}

}  // namespace ptq::cuda
