// hessian_cuda.h — Hessians on the GPU (cuBLAS on tensor cores, fp64 sums). Same math as
// lib/gptq/hessian.h (HessianSum), its reference.
#pragma once
#include "core/dtype.h"
#include "cuda/runtime.h"
#include "gptq/hessian.h"

namespace ptq::cuda {

class Comm;

// H = (2/n) sum x x^T on tensor cores: each chunk of <= 1024 tokens is cast to `dtype` (F16 or
// BF16: 16-bit x 16-bit products are exact in fp32; F32: SGEMM on CUDA cores) and multiplied with
// fp32 accumulation (upper triangle only, in 2048 x 2048 blocks); eight chunks are summed in fp32,
// then added to an fp64 sum on the device. Each add_device / add call is summed in groups of
// 8 x 1024 rows from its first row (the forward passes whole 8192-token chunks).
// With `comm` (quantize --gpus N: each process saw its share of the windows), the first read of
// the sum (tokens, device, finalize) adds every rank's fp64 sum and token count into each (one
// NCCL all-reduce); adds after that are refused.
class HessianCuda final : public HessianSum, public DeviceRowSink {
 public:
  HessianCuda(int64_t cols, DType dtype, const Comm* comm = nullptr);
  ~HessianCuda() override;
  void add(const MatF& X) override;                              // host rows [n, cols]
  void add_device(const void* X, int64_t rows) override;         // device rows [rows, cols] in `dtype`
  MatD finalize() const override;                                // to the host, symmetric, scaled
  int64_t tokens() const override { reduce(); return n_; }
  double scale() const override { reduce(); return n_ > 0 ? 2.0 / double(n_) : 1.0; }
  // The sum on the device, symmetric (accumulation ends: its scratch buffers are released).
  HessianRef device() override;
 private:
  struct Impl;
  Impl* p_;
  int64_t cols_;
  mutable int64_t n_ = 0;
  DType dtype_;
  const Comm* comm_ = nullptr;
  mutable bool reduced_ = false;
  void reduce() const;   // the all-reduce across ranks, once (nothing without comm_)
};

}  // namespace ptq::cuda
