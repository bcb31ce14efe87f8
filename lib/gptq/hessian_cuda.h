// hessian_cuda.h — Hessians on the GPU (cuBLAS on tensor cores, fp64 sums). Same math as
// lib/gptq/hessian.h (HessianSum), its reference.
#pragma once
#include "core/dtype.h"
#include "cuda/runtime.h"
#include "gptq/hessian.h"

namespace ptq::cuda {

// H = (2/n) sum x x^T on tensor cores: each chunk of <= 1024 tokens is cast to `dtype` (F16 or
// BF16: 16-bit x 16-bit products are exact in fp32; F32: SGEMM on CUDA cores) and multiplied with
// fp32 accumulation (upper triangle only, in 2048 x 2048 blocks); eight chunks are summed in fp32,
// then added to an fp64 sum on the device. Each add_device / add call is summed in groups of
// 8 x 1024 rows from its first row (the forward passes whole 8192-token chunks).
class HessianCuda final : public HessianSum, public DeviceRowSink {
 public:
  HessianCuda(int64_t cols, DType dtype);
  ~HessianCuda() override;
  void add(const MatF& X) override;                              // host rows [n, cols]
  void add_device(const void* X, int64_t rows) override;         // device rows [rows, cols] in `dtype`
  MatD finalize() const override;                                // to the host, symmetric, scaled
  int64_t tokens() const override { return n_; }
  double scale() const override { return n_ > 0 ? 2.0 / double(n_) : 1.0; }
  // The sum on the device, symmetric (accumulation ends: its scratch buffers are released).
  HessianRef device() override;
 private:
  struct Impl;
  Impl* p_;
  int64_t cols_, n_ = 0;
  DType dtype_;
};

}  // namespace ptq::cuda
