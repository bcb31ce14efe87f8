// hessian_cuda.cu — contract:
//   HessianCuda: X [n, cols] row-major fp32 (host) or 16-bit (device) -> H [cols, cols] fp64.
//     The upper triangle of C = X^T X in 2048 x 2048 blocks: per block, eight GEMMs of <= 1024
//     tokens (cublasGemmEx, fp32 accumulation) summed in an L2-resident fp32 block, then added to
//     an fp64 sum. Roofline: about n cols^2 FLOP on tensor cores (SYRK-shaped; diagonal blocks
//     computed whole), the fp64 sum moved once per 8192 tokens.
//   Reference: lib/gptq/hessian.cpp (Hessian::add: fp32 per 1024 tokens in 128 x 128 tiles, fp64 across).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "cuda/blas.h"
#include "cuda/comm.h"
#include "gptq/hessian_cuda.h"

namespace ptq::cuda {

namespace {
constexpr int64_t kChunk = 1024; // tokens per Hessian GEMM (fp32 accumulation inside)
constexpr int64_t kFlush = 8;    // GEMMs summed in fp32 before the fp64 sum
constexpr int64_t kBlock = 2048; // side of the fp32 block of H (16 MiB: L2-resident)

int blocks_for(int64_t n, int t = 256) { return int((n + t - 1) / t); }
int dtype_code(DType t) { return t == DType::F16 ? 1 : t == DType::BF16 ? 2 : 0; }
cudaDataType cuda_type(DType t) { return t == DType::F16 ? CUDA_R_16F : t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

__global__ void cast_f32_kernel(const float* x, void* y, int64_t n, int dtype) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  if (dtype == 1) static_cast<__half*>(y)[i] = __float2half_rn(x[i]);
  else if (dtype == 2) static_cast<__nv_bfloat16*>(y)[i] = __float2bfloat16_rn(x[i]);
  else static_cast<float*>(y)[i] = x[i];
}
// acc (row-major [cols, cols], lower triangle) += the column-major block c [bi, bj] (ld ldc) of
// C at (i0, j0), j0 >= i0: element (ii, jj) is acc[j0 + jj][i0 + ii], kept where i0 + ii <= j0 + jj.
// The upper triangle is filled by symmetrize_kernel when read.
__global__ void accumulate_block_kernel(const float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t bi, double* acc, int64_t cols) {
  const int64_t jj = blockIdx.y, ii = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (ii < bi && i0 + ii <= j0 + jj) acc[(j0 + jj) * cols + i0 + ii] += double(c[ii + jj * ldc]);
}
__global__ void symmetrize_kernel(double* a, int64_t cols) {
  const int64_t i = blockIdx.y, j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j < i) a[j * cols + i] = a[i * cols + j];
}
}  // namespace

struct HessianCuda::Impl {
  DeviceBuffer<double> sum;
  DeviceBuffer<float> c;
  DeviceBuffer<uint8_t> x16;
  DeviceBuffer<float> x32;
};

HessianCuda::HessianCuda(int64_t cols, DType dtype, const Comm* comm) : p_(new Impl), cols_(cols), dtype_(dtype), comm_(comm) {
  p_->sum = DeviceBuffer<double>(size_t(cols * cols), "Hessian (fp64 sum)");
  PTQ_CUDA(cudaMemset(p_->sum.get(), 0, size_t(cols * cols) * 8));
}
HessianCuda::~HessianCuda() { delete p_; }

// The upper triangle of C = X^T X (column-major; read as the row-major lower triangle of the fp64
// sum) in square blocks of kBlock x kBlock. For one block, kFlush GEMMs of kChunk tokens each
// (fp32 accumulation inside a GEMM, GEMM beta = 1 across them) sum into an fp32 block of 16 MiB,
// which stays in L2 between the GEMMs, and then into the fp64 sum. So the fp32 partial sum never
// goes to DRAM, the fp64 sum is read and written once per kFlush * kChunk tokens, and there is no
// full-size fp32 copy of H (cuBLAS has no 16-bit SYRK; diagonal blocks compute their full square).
// Numerics: kChunk products in fp32 per GEMM, kFlush GEMMs summed in fp32, then fp64 (a test
// checks the result against an fp64 accumulation).
// Every rank's lower-triangle fp64 sum and token count added (the symmetric fill comes after, as
// without ranks): fp64 addition in NCCL's order, the same bytes on every rank.
void HessianCuda::reduce() const {
  if (!comm_ || reduced_) return;
  reduced_ = true;
  comm_->sum(p_->sum.get(), size_t(cols_ * cols_));
  DeviceBuffer<int64_t> n(1, "Hessian token count");
  copy_to_device(n.get(), &n_, 8);
  comm_->sum(n.get(), 1);
  copy_to_host(&n_, n.get(), 8);
}

void HessianCuda::add_device(const void* X, int64_t rows) {
  if (reduced_) fail(Errc::usage, "", "HessianCuda", "rows added after the sum was read across ranks");
  cublasHandle_t blas = blas_handle();
  const float one = 1.0f, zero = 0.0f;
  const size_t es = dtype_size(dtype_);
  const int64_t B = std::min(kBlock, cols_);
  if (!p_->c.get()) p_->c = DeviceBuffer<float>(size_t(B * B), "Hessian block (fp32 partial sum)");
  for (int64_t g0 = 0; g0 < rows; g0 += kChunk * kFlush) {
    const int64_t n = std::min(kChunk * kFlush, rows - g0);
    // row-major X [n, cols] is column-major X^T [cols, n]: C[i0:, j0:] = X^T[i0:i0+bi] (X^T[j0:j0+bj])^T
    const uint8_t* A = static_cast<const uint8_t*>(X) + size_t(g0 * cols_) * es;
    for (int64_t i0 = 0; i0 < cols_; i0 += B)
      for (int64_t j0 = i0; j0 < cols_; j0 += B) {
        const int64_t bi = std::min(B, cols_ - i0), bj = std::min(B, cols_ - j0);
        for (int64_t t0 = 0; t0 < n; t0 += kChunk) {
          const uint8_t* At = A + size_t(t0 * cols_) * es;
          PTQ_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_T, int(bi), int(bj), int(std::min(kChunk, n - t0)), &one, At + size_t(i0) * es,
                                  cuda_type(dtype_), int(cols_), At + size_t(j0) * es, cuda_type(dtype_), int(cols_), t0 == 0 ? &zero : &one,
                                  p_->c.get(), CUDA_R_32F, int(B), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
        accumulate_block_kernel<<<dim3(unsigned(blocks_for(bi)), unsigned(bj)), 256>>>(p_->c.get(), B, i0, j0, bi, p_->sum.get(), cols_);
        PTQ_CUDA_LAUNCH("accumulate_block_kernel");
      }
  }
  n_ += rows;
}

void HessianCuda::add(const MatF& X) {
  // Rows go up kChunk at a time and are summed kChunk * kFlush at a time, as add_device does.
  const size_t es = dtype_size(dtype_);
  const int64_t group = kChunk * kFlush;
  for (int64_t g0 = 0; g0 < X.rows(); g0 += group) {
    const int64_t n = std::min(group, X.rows() - g0);
    if (p_->x16.size() < size_t(n * cols_) * es) {
      p_->x32 = DeviceBuffer<float>(size_t(kChunk * cols_), "Hessian input chunk (fp32)");
      p_->x16 = DeviceBuffer<uint8_t>(size_t(group * cols_) * es, "Hessian input rows");
    }
    for (int64_t t0 = 0; t0 < n; t0 += kChunk) {
      const int64_t k = std::min(kChunk, n - t0);
      PTQ_CUDA(cudaMemcpy(p_->x32.get(), X.row(g0 + t0).data(), size_t(k * cols_) * 4, cudaMemcpyHostToDevice));
      cast_f32_kernel<<<blocks_for(k * cols_), 256>>>(p_->x32.get(), p_->x16.get() + size_t(t0 * cols_) * es, k * cols_, dtype_code(dtype_));
      PTQ_CUDA_LAUNCH("cast_f32_kernel");
    }
    add_device(p_->x16.get(), n);
  }
}

HessianRef HessianCuda::device() {
  reduce();
  p_->c = DeviceBuffer<float>();   // accumulation is over: the fp32 block is not needed again
  p_->x16 = DeviceBuffer<uint8_t>();
  p_->x32 = DeviceBuffer<float>();
  symmetrize_kernel<<<dim3(unsigned(blocks_for(cols_)), unsigned(cols_)), 256>>>(p_->sum.get(), cols_);
  PTQ_CUDA_LAUNCH("symmetrize_kernel");
  return {p_->sum.get(), scale()};
}

MatD HessianCuda::finalize() const {
  reduce();
  symmetrize_kernel<<<dim3(unsigned(blocks_for(cols_)), unsigned(cols_)), 256>>>(p_->sum.get(), cols_);
  PTQ_CUDA_LAUNCH("symmetrize_kernel");
  MatD H(cols_, cols_);
  PTQ_CUDA(cudaMemcpy(H.data(), p_->sum.get(), size_t(cols_ * cols_) * 8, cudaMemcpyDeviceToHost));
  if (n_ > 0) H *= scale();
  return H;
}

}  // namespace ptq::cuda
