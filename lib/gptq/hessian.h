// hessian.h — the Hessian of a Linear's layer-wise loss, H = (2/n) sum_t x_t x_t^T over the
// rows x_t of its inputs (algorithms.md), and the one interface every accumulator of it offers.
//
// Precision: each chunk of at most 1024 tokens is an fp32 product (on the CPU in tiles of 128 x 128
// on its threads: SYRK on the diagonal tiles, GEMM below them), the chunks are summed in fp64
// (16-bit inputs times 16-bit inputs are exact in fp32; the chunked fp64 sum keeps the error of
// 10^5-10^6 terms out). The scale 2/n is applied once, where H leaves the accumulator
// (finalize, or the scale a GPU solve multiplies by as it reads the sum).
#pragma once
#include <Eigen/Core>
#include <cstdint>

#include "model/linear_types.h"

namespace ptq {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A Hessian held on the GPU: H = scale * sum, sum fp64 [cols, cols] symmetric (device memory).
struct HessianRef {
  const double* sum = nullptr;
  double scale = 1;
};

// H = scale() * sum, accumulated from a Linear's inputs. The CPU Hessian below and the GPU's
// (lib/gptq/hessian_cuda.h) implement it; the pipeline holds either through this interface.
class HessianSum {
 public:
  virtual ~HessianSum() = default;
  virtual void add(const MatF& X) = 0;        // X [tokens, cols] (host)
  virtual MatD finalize() const = 0;          // scale() * sum, symmetric, on the host
  // The same H where the caller is the last to need it: an accumulator may give its own storage
  // (the CPU's does, symmetrized and scaled in place: no second cols^2 fp64 matrix, no copy), after
  // which only tokens() and scale() still answer.
  virtual MatD take_finalized() { return finalize(); }
  virtual int64_t tokens() const = 0;
  virtual double scale() const = 0;           // 2 / tokens (1 for a matrix that is H already)
  // The sum on the GPU, for the GPU solve to read in place; {nullptr, 1} for a host Hessian.
  virtual HessianRef device() { return {}; }
};

// The CPU accumulator (and the reference of the GPU's).
class Hessian final : public HessianSum {
 public:
  explicit Hessian(int64_t cols);   // zero, in huge pages where the kernel gives them
  // A finished H (saved statistics): finalize() returns it unchanged (scale 1).
  static Hessian from_matrix(MatD H);
  void add(const MatF& X) override;
  MatD finalize() const override;
  MatD take_finalized() override;
  int64_t tokens() const override { return n_; }
  double scale() const override { return scaled_ ? 1.0 : n_ > 0 ? 2.0 / double(n_) : 1.0; }
  MatD diag_sum_x2() const;               // sum_t x_t^2 per column: llama.cpp's importance matrix
 private:
  MatD H_;                                // lower triangle of sum x x^T (or all of H, from_matrix)
  int64_t n_ = 0;
  bool scaled_ = false;
  bool taken_ = false;                    // H_ given away by take_finalized
};

}  // namespace ptq
