#include "smoothquant/smoothquant.h"

#include <algorithm>
#include <cmath>

namespace ptq {

void update_channel_absmax(const MatF& X, VecF& absmax) {
  if (absmax.size() != X.cols()) absmax = VecF::Zero(X.cols());
  absmax = absmax.cwiseMax(X.cwiseAbs().colwise().maxCoeff().transpose());
}

double outlier_ratio(const VecF& a) {
  std::vector<float> v(a.data(), a.data() + a.size());
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  const double med = v[v.size() / 2];
  return med > 0 ? double(a.maxCoeff()) / med : 0.0;
}

VecF smoothing_factors(const VecF& act_absmax, const std::vector<const MatF*>& weights, double alpha) {
  VecF wmax = VecF::Zero(act_absmax.size());
  for (const MatF* W : weights) wmax = wmax.cwiseMax(W->cwiseAbs().colwise().maxCoeff().transpose());
  VecF s(act_absmax.size());
  for (Eigen::Index j = 0; j < s.size(); ++j)
    s[j] = float(std::pow(std::max(double(act_absmax[j]), 1e-5), alpha) / std::pow(std::max(double(wmax[j]), 1e-5), 1.0 - alpha));
  return s;
}

void fold_smoothing(VecF& norm, const std::vector<MatF*>& weights, const VecF& s) {
  norm = norm.cwiseQuotient(s);
  for (MatF* W : weights) *W = (*W) * s.asDiagonal();
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
  for (size_t i = 0; i < ws.size(); ++i) y[i].noalias() = X * ws[i]->transpose();
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
MatF subsample(const MatF& X0, int64_t max_rows) {   // an evenly strided subset of the calibration rows
  const int64_t step = std::max<int64_t>(1, X0.rows() / max_rows);
  MatF X(X0.rows() / step, X0.cols());
  for (int64_t r = 0; r < X.rows(); ++r) X.row(r) = X0.row(r * step);
  return X;
}
// The W8A8 error of the Linears smoothed at alpha (input X / s, weights W·diag(s)) against the
// unsmoothed float outputs y.
double smoothed_error(const MatF& X, const VecF& act_absmax, const std::vector<const MatF*>& ws, const std::vector<MatF>& y, const ActQuant& act,
                      double alpha) {
  const VecF s = smoothing_factors(act_absmax, ws, alpha);
  const MatF Xs = X * s.cwiseInverse().asDiagonal();
  std::vector<MatF> Wss;
  for (const MatF* W : ws) Wss.push_back((*W) * s.asDiagonal());
  std::vector<const MatF*> p;
  for (auto& W : Wss) p.push_back(&W);
  return w8a8_error(Xs, p, y, act);
}
}  // namespace

double w8a8_output_error(const MatF& X, const std::vector<const MatF*>& ws, const ActQuant& act) {
  return w8a8_error(X, ws, float_outputs(X, ws), act);
}

AlphaSearch evaluate_alpha(const MatF& X0, const VecF& act_absmax, const std::vector<const MatF*>& ws, const ActQuant& act, double alpha,
                           int64_t max_rows) {
  const MatF X = subsample(X0, max_rows);
  const std::vector<MatF> y = float_outputs(X, ws);
  return {alpha, smoothed_error(X, act_absmax, ws, y, act, alpha), w8a8_error(X, ws, y, act)};
}

AlphaSearch search_alpha(const MatF& X0, const VecF& act_absmax, const std::vector<const MatF*>& ws, const ActQuant& act, int64_t max_rows) {
  const MatF X = subsample(X0, max_rows);
  const std::vector<MatF> y = float_outputs(X, ws);
  AlphaSearch best{0, INFINITY, w8a8_error(X, ws, y, act)};
  for (int k = 0; k <= 20; ++k) {
    const double e = smoothed_error(X, act_absmax, ws, y, act, k / 20.0);
    if (e < best.error) { best.alpha = k / 20.0; best.error = e; }
  }
  return best;
}

}  // namespace ptq
