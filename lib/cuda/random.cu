// random.cu — random.h: one thread per element, no state (the value is a hash of seed and index).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/random.h"
#include "cuda/runtime.h"

namespace ptq::cuda {

namespace {
int blocks_for(int64_t n, int t = 256) { return int((n + t - 1) / t); }
int dtype_code(DType t) { return t == DType::F16 ? 1 : t == DType::BF16 ? 2 : 0; }
__device__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__global__ void random_normal_kernel(void* y, int dtype, int64_t n, uint64_t seed, float sd) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const uint64_t a = mix64(seed * 0x9E3779B97F4A7C15ull + uint64_t(i) * 2 + 1), b = mix64(a + 0x632BE59BD9B4E019ull);
  const float u1 = (float(a >> 40) + 1.0f) / 16777217.0f, u2 = float(b >> 40) / 16777216.0f;
  const float v = sd * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
  if (dtype == 1) static_cast<__half*>(y)[i] = __float2half_rn(v);
  else if (dtype == 2) static_cast<__nv_bfloat16*>(y)[i] = __float2bfloat16_rn(v);
  else static_cast<float*>(y)[i] = v;
}
}  // namespace

void fill_random_normal(void* dst, DType dtype, int64_t n, uint64_t seed, float sd) {
  random_normal_kernel<<<blocks_for(n), 256>>>(dst, dtype_code(dtype), n, seed, sd);
  PTQ_CUDA_LAUNCH("random_normal_kernel");
}


}  // namespace ptq::cuda
