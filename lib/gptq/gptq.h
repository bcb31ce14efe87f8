// gptq.h — the GPTQ solve for one Linear (algorithms.md); its Hessian is gptq/hessian.h.
//
// Precision: H arrives in fp64 (hessian.h). Damping and the factorization are fp64. The column loop and the trailing
// GEMM are fp32, as in the reference and the GPU path, so the two paths round alike.
#pragma once
#include <Eigen/Core>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gptq/hessian.h"
#include "quant/quantizer.h"

namespace ptq {

struct SolveStats {
  double damp_percent = 0;   // the damping finally used (fraction of mean diag H)
  int retries = 0;           // Cholesky failures that raised the damping
  int dead_columns = 0;      // columns whose input was always zero
  double seconds = 0;
  std::vector<std::string> log;   // one line per retry
  // The CPU column loop's sum of err^2 over the live columns, fp64 (NaN where no CPU loop ran),
  // and the damping it added to H's diagonal: with them GPTQ's output error costs no product
  // (damped_output_error).
  double err2 = std::numeric_limits<double>::quiet_NaN();
  double lambda = 0;
  // AWQ's clipping search (gptq/clip.h) where the spec asks for it: (row, group)s searched, clamped.
  int64_t clip_groups = 0, clipped_groups = 0;
};

// `limits`: static_grids' clamps of the groups (AWQ's clipping, gptq/clip.h), static groups only.
QuantizedLinear gptq_quantize(const MatF& W, const MatD& H, const QuantSpec& s, SolveStats* stats = nullptr,
                              const std::vector<float>* limits = nullptr);

// The steps around the factorization and the column loop, shared by the CPU and CUDA solvers:
// dead columns, static-group parameters, the act-order permutation (steps 1-3), and the
// per-channel grids; then, after the loop, codes and g_idx back in the natural column order.
struct GptqProblem {
  MatF W;                               // dead columns zeroed, columns permuted
  std::vector<int64_t> perm;            // permuted position -> natural column
  std::vector<char> dead;               // per natural column: H_jj == 0 (its H_jj is taken as 1)
  int64_t gs = 0;                       // group size in columns (cols for per channel)
  std::vector<GridParams> static_params;  // [groups, rows], static groups only
  std::vector<GridParams> row_params;     // [rows], per channel only
  QuantizedLinear q;                    // shape, spec and storage, filled by the loop
};
GptqProblem gptq_prepare(const MatF& W, const MatD& H, const QuantSpec& s, SolveStats& stats, const std::vector<float>* limits = nullptr);
// mean(diag) of H in the problem's order (dead columns as 1), summed in that order; and
// Hd = P H P^T + lambda I with the dead diagonals 1 + lambda, gathered straight from the caller's H
// (no permuted copy of a cols^2 matrix is kept: the 7B down projection's is 1 GB).
double permuted_mean_diag(const MatD& H, const GptqProblem& P);
void damped_permuted_hessian(const MatD& H, const GptqProblem& P, double lambda, MatD& Hd);

// U, upper triangular with H^-1 = U^T U (GPTQ's factor), from a blocked Cholesky of the reversed
// H and L^-1 by column blocks, on the CPU's threads (the same bytes on any thread count); H is read
// by its lower triangle. False if H is not positive definite. (gptq_quantize runs the same steps
// in the damped H's own storage and writes U in fp32 directly.)
bool inverse_cholesky_upper(const MatD& H, MatD& U);

// The layer's output error ||(W - Wq) X||^2 / n_tokens = tr((W - Wq) H (W - Wq)^T) / 2, in fp64:
// the definition, by one product (W - Wq) H (the reference of the forms below).
double output_error(const MatF& W, const MatF& Wq, const MatD& H);

// The same as sum_ij G_ij H_ij / 2 with G = (W - Wq)^T (W - Wq), the Gram matrix of the error
// rows: G is symmetric, so only its lower tiles are formed (256 x 256, a thread a tile), half the
// products of output_error's; the tiles' sums are added in a fixed order, so the bytes are the same
// on any thread count. Scalar: the precision of G's products and in-chunk sums. double: fp64
// throughout (GPTQ's errors are fitted to H and cancel: they need it). float: chunks of 1,024
// rows summed in fp32 and added in fp64 (RTN's errors do not cancel: ~1e-6 relative, twice the
// speed again).
template <class Scalar>
double output_error_gram(const MatF& W, const MatF& Wq, const MatD& H);
// The float form for a difference already formed: tr(dW H dWᵀ) / 2 (AWQ's search, whose ratios
// share one H: smoothquant/awq.h).
double delta_error_gram(const MatF& dW, const MatD& H);

// GPTQ's output error from its column loop. With H_d = H + lambda I the damped Hessian it factors
// (H_d^-1 = U^T U) and err_j = (w_j - q_j) / U_jj the errors it propagates, W - Q = err U, so
// (W - Q) H_d (W - Q)^T = err err^T and the error is (sum err^2 - lambda sum (W - Q)^2) / 2, both
// sums over the live columns (the dead ones, H_jj = 0, are decoupled in H_d). NaN where the
// damping term is over 90% of sum err^2: the fp32 rounding of err would be amplified past 1e-4
// there, and the exact form is needed.
double damped_output_error(double err2, double live_dw2, double lambda);

// The report's two losses of a Linear solved on the host (GPTQ's or RTN's weights Wq, and RTN's
// Wr in a GPTQ run, else null): GPTQ's by damped_output_error where stats has the loop's sums,
// else by the fp64 Gram form; RTN's by the fp32 Gram form.
std::pair<double, double> host_output_errors(const MatF& W, const MatF& Wq, const MatF* Wr, const MatD& H, bool gptq, const SolveStats& stats);

}  // namespace ptq
