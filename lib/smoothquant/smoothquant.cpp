#include "smoothquant/smoothquant.h"

#include <algorithm>
#include <cmath>

#include "core/product.h"

namespace ptq {

namespace {
// acc[j] = max(acc[j], max_r |X[r, j]|), the rows on threads, each thread's maxima then combined.
// A maximum is exact in any order, so these are the bytes of Eigen's colwise maxCoeff, which reads
// a row-major X column by column on one thread (0.2 s for a 7B layer's gate, up weights).
void max_abs_columns(const MatF& X, VecF& acc) {
#pragma omp parallel
  {
    VecF m = VecF::Zero(X.cols());
#pragma omp for schedule(static) nowait
    for (Eigen::Index r = 0; r < X.rows(); ++r) m = m.cwiseMax(X.row(r).transpose().cwiseAbs());
#pragma omp critical
    acc = acc.cwiseMax(m);
  }
}
}  // namespace

void update_channel_absmax(const MatF& X, VecF& absmax) {
  if (absmax.size() != X.cols()) absmax = VecF::Zero(X.cols());
  max_abs_columns(X, absmax);
}

double outlier_ratio(const VecF& a) {
  std::vector<float> v(a.data(), a.data() + a.size());
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  const double med = v[v.size() / 2];
  return med > 0 ? double(a.maxCoeff()) / med : 0.0;
}

VecF weight_absmax(const std::vector<const MatF*>& weights) {
  VecF wmax = VecF::Zero(weights.empty() ? 0 : weights[0]->cols());
  for (const MatF* W : weights) max_abs_columns(*W, wmax);
  return wmax;
}

VecF smoothing_factors(const VecF& act_absmax, const std::vector<const MatF*>& weights, double alpha) {
  return smoothing_factors_from(act_absmax, weight_absmax(weights), alpha);
}

VecF smoothing_factors_from(const VecF& act_absmax, const VecF& wmax, double alpha) {
  VecF s(act_absmax.size());
  for (Eigen::Index j = 0; j < s.size(); ++j)
    s[j] = float(std::pow(std::max(double(act_absmax[j]), 1e-5), alpha) / std::pow(std::max(double(wmax[j]), 1e-5), 1.0 - alpha));
  return s;
}

void scale_columns(MatF& W, const VecF& s) {
#pragma omp parallel for schedule(static)
  for (Eigen::Index r = 0; r < W.rows(); ++r) W.row(r) = W.row(r).cwiseProduct(s.transpose());
}

void fold_smoothing(VecF& norm, const std::vector<MatF*>& weights, const VecF& s) {
  norm = norm.cwiseQuotient(s);
  for (MatF* W : weights) scale_columns(*W, s);
}

Linear w8a8_linear(const MatF& W, const ActQuant& act) {
  QuantSpec spec;
  spec.bits = 8;
  spec.group_size = -1;
  spec.sym = true;
  spec.scale_dtype = DType::F32;
  QuantizedLinear q = rtn_quantize(W, spec);
  Linear l;
  l.W = q.dequantize();
  l.act = act;
  return l;
}

namespace {
// The float outputs X·Wᵀ of the unsmoothed Linears: what each W8A8 output is measured against.
// Smoothing leaves them unchanged (Xs·Wsᵀ = X·Wᵀ in exact arithmetic), so the search forms them
// once for all 21 alphas instead of once an alpha.
std::vector<MatF> float_outputs(const MatF& X, const std::vector<const MatF*>& ws) {
  std::vector<MatF> y(ws.size());
  for (size_t i = 0; i < ws.size(); ++i) fixed_depth_product(X, ws[i]->transpose(), y[i]);
  return y;
}
// Mean over rows of ||y_w8a8(X, ws[i]) - y[i]||^2, summed over i.
double w8a8_error(const MatF& X, const std::vector<const MatF*>& ws, const std::vector<MatF>& y, const ActQuant& act0) {
  ActQuant act = act0;
  if (act.mode == ActQuant::per_tensor && act.static_scale == 0) act.static_scale = X.cwiseAbs().maxCoeff() / 127.0f;   // as calibrated
  double e = 0;
  MatF yq;
  for (size_t i = 0; i < ws.size(); ++i) {
    linear(X, w8a8_linear(*ws[i], act), yq);
    e += (yq - y[i]).squaredNorm() / double(X.rows());
  }
  return e;
}
// The W8A8 error of the Linears smoothed by s (input X / s, weights W·diag(s)) against the
// unsmoothed float outputs y.
double smoothed_error(const MatF& X, const std::vector<const MatF*>& ws, const std::vector<MatF>& y, const ActQuant& act, const VecF& s) {
  MatF Xs = X;
  scale_columns(Xs, s.cwiseInverse());
  std::vector<MatF> Wss;
  for (const MatF* W : ws) {
    Wss.push_back(*W);
    scale_columns(Wss.back(), s);
  }
  std::vector<const MatF*> p;
  for (auto& W : Wss) p.push_back(&W);
  return w8a8_error(Xs, p, y, act);
}
}  // namespace

double w8a8_output_error(const MatF& X, const std::vector<const MatF*>& ws, const ActQuant& act) {
  return w8a8_error(X, ws, float_outputs(X, ws), act);
}

MatF subsample_rows(const MatF& X0, int64_t max_rows) {
  const int64_t step = std::max<int64_t>(1, X0.rows() / max_rows);
  MatF X(X0.rows() / step, X0.cols());
  for (int64_t r = 0; r < X.rows(); ++r) X.row(r) = X0.row(r * step);
  return X;
}

std::vector<double> smoothed_errors(const MatF& X, const VecF& act_absmax, const VecF& w_absmax, const std::vector<const MatF*>& ws,
                                    const ActQuant& act, const std::vector<double>& alphas) {
  const std::vector<MatF> y = float_outputs(X, ws);
  std::vector<double> e;
  for (double a : alphas)
    e.push_back(a < 0 ? w8a8_error(X, ws, y, act) : smoothed_error(X, ws, y, act, smoothing_factors_from(act_absmax, w_absmax, a)));
  return e;
}

AlphaSearch evaluate_alpha(const MatF& X0, const VecF& act_absmax, const std::vector<const MatF*>& ws, const ActQuant& act, double alpha,
                           int64_t max_rows, AlphaErrors errors) {
  const VecF wmax = weight_absmax(ws);
  const std::vector<double> e = errors(subsample_rows(X0, max_rows), act_absmax, wmax, ws, act, {-1.0, alpha});
  return {alpha, e[1], e[0], smoothing_factors_from(act_absmax, wmax, alpha)};
}

std::vector<double> alpha_grid() {
  std::vector<double> alphas{-1.0};
  for (int k = 0; k <= 20; ++k) alphas.push_back(k / 20.0);
  return alphas;
}

AlphaSearch search_alpha(const MatF& X0, const VecF& act_absmax, const std::vector<const MatF*>& ws, const ActQuant& act, int64_t max_rows,
                         AlphaErrors errors) {
  const std::vector<double> alphas = alpha_grid();
  const VecF wmax = weight_absmax(ws);
  const std::vector<double> e = errors(subsample_rows(X0, max_rows), act_absmax, wmax, ws, act, alphas);
  AlphaSearch best{0, INFINITY, e[0], {}};
  for (size_t k = 1; k < alphas.size(); ++k)
    if (e[k] < best.error) { best.alpha = alphas[k]; best.error = e[k]; }
  best.factors = smoothing_factors_from(act_absmax, wmax, best.alpha);
  return best;
}

}  // namespace ptq
