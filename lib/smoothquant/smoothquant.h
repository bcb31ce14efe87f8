// smoothquant.h — SmoothQuant (algorithms.md): move activation outliers into the weights,
// s_j = max|X_j|^a / max_i |W_ij|^(1-a), norm /= s, W[:, j] *= s, so that int8 activations
// (W8A8) lose less. The float model is unchanged by the fold.
#pragma once
#include <vector>

#include "model/llama.h"
#include "quant/quantizer.h"

namespace ptq {

// Running per-input-channel max |x| over the rows of X.
void update_channel_absmax(const MatF& X, VecF& absmax);
double outlier_ratio(const VecF& absmax);   // max channel absmax / median channel absmax

// max_i |W_ij| over the rows of every W: the weight side of the factors of the Linears fed by one norm.
VecF weight_absmax(const std::vector<const MatF*>& weights);
// Factors for the Linears fed by one norm (max over all of them); both maxima clamped at 1e-5.
VecF smoothing_factors(const VecF& act_absmax, const std::vector<const MatF*>& weights, double alpha);
VecF smoothing_factors_from(const VecF& act_absmax, const VecF& w_absmax, double alpha);   // w_absmax: weight_absmax
// W[:, j] *= s_j, in place, rows on threads: each element one fp32 product, so the bytes of Eigen's
// W * s.asDiagonal() (which runs on one thread: 0.2 s for a 7B layer's gate, up) on any number.
void scale_columns(MatF& W, const VecF& s);
// norm /= s, W[:, j] *= s_j for each W.
void fold_smoothing(VecF& norm, const std::vector<MatF*>& weights, const VecF& s);

// The W8A8 Linear that the pipeline produces from float W: int8 symmetric per-channel weights
// (RTN, scale absmax/127.5: ptqkit's 8-bit grid = compressed-tensors') and int8 activations.
Linear w8a8_linear(const MatF& W, const ActQuant& act);
// Mean over rows of ||y_w8a8 - y_float||^2 for inputs X, for the Linears `ws` (summed).
double w8a8_output_error(const MatF& X, const std::vector<const MatF*>& ws, const ActQuant& act);

// The W8A8 output errors of `ws` on the input rows X (unsmoothed) for each entry of `alphas`: the
// Linears smoothed at that alpha (input X / s, weights W·diag(s), s = smoothing_factors_from(
// act_absmax, w_absmax, alpha) with w_absmax = weight_absmax(ws)), their W8A8 outputs against the
// unsmoothed float outputs X·Wᵀ, which smoothing leaves unchanged (formed once); a negative alpha:
// no smoothing. smoothed_errors is the reference (fp32 on the host); cuda::smoothed_errors
// (smoothquant_cuda.h) computes the same on the GPU.
using AlphaErrors = std::vector<double> (*)(const MatF& X, const VecF& act_absmax, const VecF& w_absmax, const std::vector<const MatF*>& ws,
                                           const ActQuant& act, const std::vector<double>& alphas);
std::vector<double> smoothed_errors(const MatF& X, const VecF& act_absmax, const VecF& w_absmax, const std::vector<const MatF*>& ws,
                                    const ActQuant& act, const std::vector<double>& alphas);
// The alphas search_alpha evaluates: -1 (no smoothing, the reported error_unsmoothed), then the
// grid 0, 0.05, ..., 1.
std::vector<double> alpha_grid();
// An evenly strided subset of at most max_rows of X's rows (the search's input).
MatF subsample_rows(const MatF& X, int64_t max_rows);

struct AlphaSearch {
  double alpha;             // the chosen one
  double error;             // its W8A8 output error
  double error_unsmoothed;  // the error with no smoothing at all
  VecF factors;             // its smoothing factors (weights' maxima taken once, for the search and these)
};
// alpha on the grid 0, 0.05, ..., 1 minimizing the W8A8 output error of `ws` on X (X: the
// unsmoothed input; at most `max_rows` rows of it are used; the first of equal errors wins), its
// errors computed by `errors`; evaluate_alpha: the given alpha's.
AlphaSearch evaluate_alpha(const MatF& X, const VecF& act_absmax, const std::vector<const MatF*>& ws, const ActQuant& act, double alpha,
                           int64_t max_rows = 4096, AlphaErrors errors = smoothed_errors);
AlphaSearch search_alpha(const MatF& X, const VecF& act_absmax, const std::vector<const MatF*>& ws, const ActQuant& act, int64_t max_rows = 4096,
                         AlphaErrors errors = smoothed_errors);

}  // namespace ptq
