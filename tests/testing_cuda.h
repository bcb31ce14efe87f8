// testing_cuda.h — what the GPU tests share: skipping without a GPU, and the GPU solve of one
// Linear from a host Hessian (the tests' way into gptq_solve_cuda).
#pragma once
#include "gptq/gptq_cuda.h"
#include "testing.h"

#define PTQ_REQUIRE_GPU() \
  if (!ptq::cuda::available()) PTQ_SKIP("no GPU: " + ptq::cuda::describe())

namespace ptqtest {

// GPTQ on the GPU for W [rows, cols] and H (host, already scaled): codes and grids on the host.
inline ptq::QuantizedLinear gpu_gptq(const ptq::MatF& W, const ptq::MatD& H, const ptq::QuantSpec& s, ptq::SolveStats* st = nullptr) {
  ptq::cuda::DeviceBuffer<double> dH(size_t(H.size()), "test Hessian");
  ptq::cuda::copy_to_device(dH.get(), H.data(), size_t(H.size()) * 8);
  ptq::cuda::WeightRows rows;
  rows.rows = W.rows();
  rows.host = &W;
  return std::move(ptq::cuda::gptq_solve_cuda({rows}, W.cols(), ptq::HessianRef{dH.get(), 1.0}, s, ptq::cuda::SolveKeep::codes, st).parts[0]);
}

}  // namespace ptqtest
