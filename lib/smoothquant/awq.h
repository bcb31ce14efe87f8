// awq.h — activation-aware weight scaling (AWQ: Lin et al., 2023, as AutoAWQ and llm-compressor
// search it) for weight-only quantization. For the Linears fed by one norm, per input channel j:
//
//   s_j(r) = x̄_j^r / (w̄_j^(1-r) + 1e-4)      (duo scaling; x̄_j^r alone without it), clamped at 1e-4,
//   s      = s / sqrt(max(s) · min(s))
//
// x̄_j = mean |x_j| over the calibration rows, w̄_j = mean over the rows of |W_ij| / max |W| of its
// group (the Linears stacked). The ratio r runs over 0, 1/n, ..., (n-1)/n; each is scored by the
// quantized Linears' output error on the calibration rows,
//
//   e(s) = Σ_i ‖X (Q(W_i · diag(s)) · diag(s)⁻¹ − W_i)ᵀ‖² / rows      (Q: each Linear's own grid, RTN),
//
// and the best (or none: s = 1, where no ratio beats the unscaled error) is folded into the norm
// (norm /= s) and the weights (W *= s), which leaves the float model's output unchanged; the
// quantizer (RTN or GPTQ) then quantizes W · diag(s), with the Hessian of the scaled input.
// AutoAWQ scores a ratio by the whole attention block's or MLP's output; ptqkit scores the
// Linears' outputs (the quantity GPTQ minimizes too) and keeps s = 1 where it is better.
#pragma once
#include <functional>
#include <vector>

#include "model/llama.h"
#include "quant/quantizer.h"

namespace ptq {

// x̄: mean |x_j| over the rows of X, in fp64 sums.
VecF mean_abs_columns(const MatF& X);
// w̄: each Linear's |W_ij| over its group's max |W| (groups of group_size along a row, the whole
// row for -1; a zero group reads 0), averaged over the rows of every Linear (fp64 sums).
VecF awq_weight_mean(const std::vector<const MatF*>& ws, const std::vector<int>& group_sizes);
// The scales of ratio r (w_mean empty: x̄^r alone), normalized by sqrt(max · min).
VecF awq_scales(const VecF& x_mean, const VecF& w_mean, double ratio);

// ‖X dWᵀ‖²_F / rows: fp32 products (Eigen's GEMM, rows of dW in chunks), squares summed in fp64.
// The reference of cuda::output_sq_error (awq_cuda.h).
double output_sq_error(const MatF& X, const MatF& dW);
using OutputSqError = std::function<double(const MatF& X, const MatF& dW)>;

// dW for one Linear at scales s (empty: unscaled): Q(W · diag(s)) · diag(s)⁻¹ − W, Q the spec's
// round-to-nearest grid.
MatF awq_delta(const MatF& W, const QuantSpec& spec, const VecF& s);

// One search's scorer: e(s) of its Linears on its rows (s empty: unscaled, Q(W) − W).
using AwqErrorAt = std::function<double(const VecF& s)>;
// Makes the scorer of one search (X, the Linears, their specs), or an empty one where it cannot
// (search_awq then scores on the host): cuda::awq_scorer keeps X and W on the GPU.
using AwqScorer = std::function<AwqErrorAt(const MatF& X, const std::vector<const MatF*>& ws, const std::vector<QuantSpec>& specs)>;
// The host's dW (awq_delta, the Linears stacked) at each candidate, scored by err(X, dW). The
// AwqErrorAt it makes refers to X, ws and specs (no copies): they must outlive it, as search_awq's
// arguments outlive its search.
AwqScorer product_scorer(OutputSqError err);

struct AwqSearch {
  double ratio = -1;        // the chosen ratio; -1: none beat the unscaled Linears (s = 1)
  double error = 0;         // its output error
  double error_unscaled = 0;
  VecF scales;              // the chosen scales (all 1 when ratio is -1)
};
// The search over `grid` ratios on X (the unscaled input rows), the Linears `ws` with their specs.
// `scorer` scores the ratios (product_scorer: a given error of the host's stacked dW); unset or
// declining, the host does: by output_sq_error where X has at most half as many rows as columns,
// else by the Gram form tr(dW H dWᵀ)/2 with H = 2/rows · XᵀX formed once (gptq.h's
// delta_error_gram: the symmetric product of dW, half of X·dWᵀ's multiplies when rows = cols; fp32
// in chunks of 1,024 rows, fp64 sums; the same value to ~1e-6).
// `tie` (empty: none): columns with equal values share one scale — x̄ and w̄ are averaged over
// them first (fp64) — as the columns of o_proj that read one v row under grouped-query attention
// must (model/schedule.h's ScaleSource).
AwqSearch search_awq(const MatF& X, const std::vector<const MatF*>& ws, const std::vector<QuantSpec>& specs, int grid, bool duo,
                     const AwqScorer& scorer = {}, const std::vector<int64_t>& tie = {});
// AWQ's Linear-to-Linear fold (v_proj -> o_proj, up_proj -> down_proj; model/schedule.h's
// ScaleSource): each consumer W · diag(s), and the source's row r and bias entry r times 1 / s_j for
// the columns j with rows[j] = r (tied columns share s_j) — the float model's output unchanged.
void fold_source(const std::vector<MatF*>& consumers, Linear& source, const std::vector<int64_t>& rows, const VecF& s);
// v averaged over the columns of each tie class, in place of each (fp64 sums).
VecF tied_mean(const VecF& v, const std::vector<int64_t>& tie);

}  // namespace ptq
