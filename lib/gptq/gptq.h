// gptq.h — the GPTQ solve for one Linear (algorithms.md), and the Hessian it needs.
//
// Precision: H is accumulated as fp32 GEMMs over chunks of at most 1024 tokens, summed in fp64
// (16-bit inputs times 16-bit inputs are exact in fp32; the chunked fp64 sum keeps the error of
// 10^5-10^6 terms out). Damping and the factorization are fp64. The column loop and the trailing
// GEMM are fp32, as in the reference and the GPU path, so the two paths round alike.
#pragma once
#include <Eigen/Core>
#include <string>
#include <vector>

#include "gptq/quantizer.h"

namespace ptq {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// H = (2/n) sum_t x_t x_t^T over the rows x_t of the Linear's inputs.
class Hessian {
 public:
  explicit Hessian(int64_t cols) : H_(MatD::Zero(cols, cols)) {}
  void add(const MatF& X);                // X [tokens, cols]
  MatD finalize() const;                  // symmetric, scaled by 2/n
  int64_t tokens() const { return n_; }
  MatD diag_sum_x2() const;               // sum_t x_t^2 per column: llama.cpp's importance matrix
 private:
  MatD H_;                                // lower triangle of sum x x^T
  int64_t n_ = 0;
};

struct SolveStats {
  double damp_percent = 0;   // the damping finally used (fraction of mean diag H)
  int retries = 0;           // Cholesky failures that raised the damping
  int dead_columns = 0;      // columns whose input was always zero
  double seconds = 0;
  std::vector<std::string> log;   // one line per retry
};

QuantizedLinear gptq_quantize(const MatF& W, const MatD& H, const QuantSpec& s, SolveStats* stats = nullptr);

// The steps around the factorization and the column loop, shared by the CPU and CUDA solvers:
// dead columns, static-group parameters, the act-order permutation (steps 1-3), and the
// per-channel grids; then, after the loop, codes and g_idx back in the natural column order.
struct GptqProblem {
  MatF W;                               // dead columns zeroed, columns permuted
  MatD H;                               // the same permutation, not yet damped
  std::vector<int64_t> perm;            // permuted position -> natural column
  int64_t gs = 0;                       // group size in columns (cols for per channel)
  std::vector<GridParams> static_params;  // [groups, rows], static groups only
  std::vector<GridParams> row_params;     // [rows], per channel only
  QuantizedLinear q;                    // shape, spec and storage, filled by the loop
};
GptqProblem gptq_prepare(const MatF& W, const MatD& H, const QuantSpec& s, SolveStats& stats);

// The layer's output error ||(W - Wq) X||^2 / n_tokens = tr((W - Wq) H (W - Wq)^T) / 2, in fp64.
double output_error(const MatF& W, const MatF& Wq, const MatD& H);

}  // namespace ptq
