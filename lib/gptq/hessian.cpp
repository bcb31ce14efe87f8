#include "gptq/hessian.h"

#include <omp.h>

#include <algorithm>

#include "core/error.h"

namespace ptq {

// Each chunk's fp32 sum, lower triangle, in row panels of kPanel rows of H, one task a panel
// (the panels are disjoint, so the threads never write the same element): the panel's diagonal
// block by a rank update (SYRK), the rest of its rows by a GEMM. Eigen runs neither in parallel
// itself here (a triangular product never, a GEMM not inside a team of threads), so each panel's
// arithmetic, and the bytes of H, are the same whatever the number of threads (a test). Eigen's
// one rank update over all of H, which this replaces, ran on one core.
void Hessian::add(const MatF& X) {
  if (scaled_) fail(Errc::usage, "", "Hessian::add", "this Hessian was given whole (from_matrix); nothing can be added to it");
  constexpr int64_t kChunk = 1024;   // the same chunking as the GPU (hessian_cuda.cu): fp32 within, fp64 across
  constexpr Eigen::Index kPanel = 128;
  const Eigen::Index n = X.cols(), panels = (n + kPanel - 1) / kPanel;
  for (int64_t t0 = 0; t0 < X.rows(); t0 += kChunk) {
    const auto Xc = X.middleRows(t0, std::min(kChunk, X.rows() - t0));
    auto panel = [&](Eigen::Index p) {
      const Eigen::Index i0 = p * kPanel, w = std::min(kPanel, n - i0);
      Eigen::MatrixXf d = Eigen::MatrixXf::Zero(w, w);   // column-major: selfadjointView rank updates want it
      d.selfadjointView<Eigen::Lower>().rankUpdate(Xc.middleCols(i0, w).transpose());   // SYRK in fp32
      H_.block(i0, i0, w, w).triangularView<Eigen::Lower>() += d.cast<double>();
      if (i0 > 0) {
        MatF o(w, i0);
        o.noalias() = Xc.middleCols(i0, w).transpose() * Xc.leftCols(i0);   // rows i0.., columns before them
        H_.block(i0, 0, w, i0) += o.cast<double>();
      }
    };
    if (omp_in_parallel()) {   // already inside a team: the panels in turn (Eigen's GEMM stays serial there too)
      for (Eigen::Index p = panels - 1; p >= 0; --p) panel(p);
    } else {
#pragma omp parallel for schedule(dynamic, 1)
      for (Eigen::Index p = panels - 1; p >= 0; --p) panel(p);   // the longest rows first
    }
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
