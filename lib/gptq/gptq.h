// gptq.h — the GPTQ solve for one Linear (algorithms.md); its Hessian is gptq/hessian.h.
//
// Precision: H arrives in fp64 (hessian.h). Damping and the factorization are fp64. The column loop and the trailing
// GEMM are fp32, as in the reference and the GPU path, so the two paths round alike.
#pragma once
#include <Eigen/Core>
#include <string>
#include <vector>

#include "gptq/hessian.h"
#include "gptq/quantizer.h"

namespace ptq {

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

// U, upper triangular with H^-1 = U^T U (GPTQ's factor), from a blocked Cholesky of the reversed
// H and L^-1 by column blocks, on the CPU's threads (the same bytes on any thread count). False if
// H is not positive definite.
bool inverse_cholesky_upper(const MatD& H, MatD& U);

// The layer's output error ||(W - Wq) X||^2 / n_tokens = tr((W - Wq) H (W - Wq)^T) / 2, in fp64.
double output_error(const MatF& W, const MatF& Wq, const MatD& H);

}  // namespace ptq
