#include "gptq/hessian.h"

#include <algorithm>

#include "core/error.h"

namespace ptq {

void Hessian::add(const MatF& X) {
  if (scaled_) fail(Errc::usage, "", "Hessian::add", "this Hessian was given whole (from_matrix); nothing can be added to it");
  constexpr int64_t kChunk = 1024;   // the same chunking as the GPU (hessian_cuda.cu): fp32 within, fp64 across
  Eigen::MatrixXf part;   // column-major: selfadjointView rank updates want it
  for (int64_t t0 = 0; t0 < X.rows(); t0 += kChunk) {
    const int64_t n = std::min(kChunk, X.rows() - t0);
    part.setZero(X.cols(), X.cols());
    part.selfadjointView<Eigen::Lower>().rankUpdate(X.middleRows(t0, n).transpose());   // SYRK in fp32
    H_.triangularView<Eigen::Lower>() += part.cast<double>();
  }
  n_ += X.rows();
}

Hessian Hessian::from_matrix(MatD H) {
  Hessian h(0);
  h.H_ = std::move(H);
  h.scaled_ = true;
  return h;
}

MatD Hessian::finalize() const {
  if (scaled_) return H_;
  MatD H = H_.selfadjointView<Eigen::Lower>();
  if (n_ > 0) H *= scale();
  return H;
}

MatD Hessian::diag_sum_x2() const { return H_.diagonal().transpose(); }

}  // namespace ptq
