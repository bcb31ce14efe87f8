#include "smoothquant/awq.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "gptq/gptq.h"
#include "smoothquant/smoothquant.h"

namespace ptq {

VecF mean_abs_columns(const MatF& X) {
  // Blocks of columns on threads, each column's rows summed in row order: the same bytes on any
  // number of threads.
  constexpr Eigen::Index kBlock = 64;
  const Eigen::Index n = X.cols();
  VecF out(n);
#pragma omp parallel for schedule(static)
  for (Eigen::Index c0 = 0; c0 < n; c0 += kBlock) {
    const Eigen::Index len = std::min(kBlock, n - c0);
    Eigen::VectorXd sum = Eigen::VectorXd::Zero(len);
    for (Eigen::Index r = 0; r < X.rows(); ++r)
      for (Eigen::Index j = 0; j < len; ++j) sum[j] += std::abs(double(X(r, c0 + j)));
    for (Eigen::Index j = 0; j < len; ++j) out[c0 + j] = float(sum[j] / double(std::max<Eigen::Index>(X.rows(), 1)));
  }
  return out;
}

VecF awq_weight_mean(const std::vector<const MatF*>& ws, const std::vector<int>& group_sizes) {
  const Eigen::Index n = ws.empty() ? 0 : ws[0]->cols();
  Eigen::VectorXd sum = Eigen::VectorXd::Zero(n);
  int64_t rows = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    const MatF& W = *ws[i];
    const Eigen::Index g = group_sizes[i] > 0 ? group_sizes[i] : n;
    for (Eigen::Index r = 0; r < W.rows(); ++r)
      for (Eigen::Index c0 = 0; c0 < n; c0 += g) {
        const Eigen::Index len = std::min(g, n - c0);
        const double m = double(W.row(r).segment(c0, len).cwiseAbs().maxCoeff()) + 1e-6;
        for (Eigen::Index j = c0; j < c0 + len; ++j) sum[j] += std::abs(double(W(r, j))) / m;
      }
    rows += W.rows();
  }
  return (sum / double(std::max<int64_t>(rows, 1))).cast<float>();
}

VecF awq_scales(const VecF& x_mean, const VecF& w_mean, double ratio) {
  std::vector<double> s(size_t(x_mean.size()));
  for (Eigen::Index j = 0; j < x_mean.size(); ++j) {
    double v = std::pow(double(x_mean[j]), ratio);
    if (w_mean.size()) v /= std::pow(double(w_mean[j]), 1.0 - ratio) + 1e-4;
    s[size_t(j)] = std::max(v, 1e-4);
  }
  const auto [lo, hi] = std::minmax_element(s.begin(), s.end());
  const double norm = std::sqrt(*lo * *hi);
  VecF out(x_mean.size());
  for (Eigen::Index j = 0; j < out.size(); ++j) {
    const double v = s[size_t(j)] / norm;
    out[j] = std::isfinite(v) ? float(v) : 1.0f;
  }
  return out;
}

double output_sq_error(const MatF& X, const MatF& dW) {
  constexpr Eigen::Index kChunk = 512;   // rows of dW a GEMM: X · dW_cᵀ stays [rows, 512]
  double sum = 0;
  for (Eigen::Index r0 = 0; r0 < dW.rows(); r0 += kChunk) {
    const Eigen::Index n = std::min(kChunk, dW.rows() - r0);
    const MatF Y = X * dW.middleRows(r0, n).transpose();
    sum += Y.cast<double>().squaredNorm();
  }
  return sum / double(std::max<Eigen::Index>(X.rows(), 1));
}

MatF awq_delta(const MatF& W, const QuantSpec& spec, const VecF& s) {
  if (s.size() == 0) return rtn_fake_quantize(W, spec) - W;
  MatF Ws = W;
  scale_columns(Ws, s);
  MatF D = rtn_fake_quantize(Ws, spec);
  const VecF inv = s.cwiseInverse();
#pragma omp parallel for schedule(static)
  for (Eigen::Index r = 0; r < D.rows(); ++r) D.row(r) = D.row(r).cwiseProduct(inv.transpose()) - W.row(r);
  return D;
}

VecF tied_mean(const VecF& v, const std::vector<int64_t>& tie) {
  std::map<int64_t, std::pair<double, int64_t>> sum;   // class -> (sum, count)
  for (Eigen::Index j = 0; j < v.size(); ++j) {
    auto& [s, n] = sum[tie[size_t(j)]];
    s += double(v[j]);
    ++n;
  }
  VecF out(v.size());
  for (Eigen::Index j = 0; j < v.size(); ++j) {
    const auto& [s, n] = sum[tie[size_t(j)]];
    out[j] = float(s / double(n));
  }
  return out;
}

void fold_source(const std::vector<MatF*>& consumers, Linear& source, const std::vector<int64_t>& rows, const VecF& s) {
  for (MatF* W : consumers) scale_columns(*W, s);
  VecF inv = VecF::Ones(source.W.rows());
  for (size_t j = 0; j < rows.size(); ++j) inv[rows[j]] = 1.0f / s[Eigen::Index(j)];
  source.W = inv.asDiagonal() * source.W;
  if (source.b.size()) source.b = source.b.cwiseProduct(inv);
}

AwqScorer product_scorer(OutputSqError err) {
  return [err](const MatF& X, const std::vector<const MatF*>& ws, const std::vector<QuantSpec>& specs) -> AwqErrorAt {
    int64_t rows = 0;
    for (const MatF* W : ws) rows += W->rows();
    return [&X, &ws, &specs, err, rows](const VecF& s) {
      MatF dW(rows, X.cols());
      int64_t r0 = 0;
      for (size_t i = 0; i < ws.size(); ++i) {
        dW.middleRows(r0, ws[i]->rows()) = awq_delta(*ws[i], specs[i], s);
        r0 += ws[i]->rows();
      }
      return err(X, dW);
    };
  };
}

AwqSearch search_awq(const MatF& X, const std::vector<const MatF*>& ws, const std::vector<QuantSpec>& specs, int grid, bool duo,
                     const AwqScorer& scorer, const std::vector<int64_t>& tie) {
  AwqErrorAt error_at = scorer ? scorer(X, ws, specs) : AwqErrorAt();
  MatD H;   // the Gram form's, where the host scores and X is tall
  if (!error_at && 2 * X.rows() > X.cols()) {
    Hessian h(X.cols());
    h.add(X);
    H = h.take_finalized();
    error_at = product_scorer([&H](const MatF&, const MatF& dW) { return delta_error_gram(dW, H); })(X, ws, specs);
  } else if (!error_at) {
    error_at = product_scorer(output_sq_error)(X, ws, specs);
  }
  AwqSearch best;
  best.error = best.error_unscaled = error_at(VecF());
  best.scales = VecF::Ones(X.cols());
  VecF x_mean = mean_abs_columns(X);
  std::vector<int> gs;
  for (const QuantSpec& s : specs) gs.push_back(s.group_size);
  VecF w_mean = duo ? awq_weight_mean(ws, gs) : VecF();
  if (!tie.empty()) {
    if (tie.size() != size_t(X.cols())) fail(Errc::usage, "", "search_awq", "tie classes for " + std::to_string(tie.size()) + " of " + std::to_string(X.cols()) + " columns");
    x_mean = tied_mean(x_mean, tie);
    if (duo) w_mean = tied_mean(w_mean, tie);
  }
  for (int k = 0; k < grid; ++k) {
    const double ratio = double(k) / grid;
    VecF s = awq_scales(x_mean, w_mean, ratio);
    const double e = error_at(s);
    if (e < best.error) best = {ratio, e, best.error_unscaled, std::move(s)};
  }
  return best;
}

}  // namespace ptq
