#include "gptq/hessian.h"

#include <algorithm>

#include "core/error.h"
#include "core/fsutil.h"
#include "gptq/tasks.h"

namespace ptq {

Hessian::Hessian(int64_t cols) {
  H_.resize(cols, cols);
  advise_huge_pages(H_.data(), sizeof(double) * size_t(H_.size()));
  H_.setZero();
}

// Each chunk's fp32 sum, lower triangle, in tiles of kTile x kTile of H, one task a tile (the
// tiles are disjoint, so the threads never write the same element; n = 4096 is 528 tiles, enough
// for any core count): a diagonal tile by a rank update (SYRK), the others by a GEMM. Eigen runs
// neither in parallel itself here (a triangular product never, a GEMM not inside a team of
// threads), so each tile's arithmetic, and the bytes of H, are the same whatever the number of
// threads (a test). Eigen's one rank update over all of H, which this replaces, ran on one core.
void Hessian::add(const MatF& X) {
  if (taken_) fail(Errc::usage, "", "Hessian::add", "this Hessian was taken (take_finalized); nothing can be added to it");
  if (scaled_) fail(Errc::usage, "", "Hessian::add", "this Hessian was given whole (from_matrix); nothing can be added to it");
  constexpr int64_t kChunk = 1024;   // the same chunking as the GPU (hessian_cuda.cu): fp32 within, fp64 across
  constexpr Eigen::Index kTile = 128;
  const Eigen::Index n = X.cols(), T = (n + kTile - 1) / kTile;
  for (int64_t t0 = 0; t0 < X.rows(); t0 += kChunk) {
    const auto Xc = X.middleRows(t0, std::min(kChunk, X.rows() - t0));
    over_threads(lower_tiles(T), [&](int64_t t) {
      const auto [I, J] = lower_tile(t);
      const Eigen::Index i0 = I * kTile, j0 = J * kTile, h = std::min(kTile, n - i0), w = std::min(kTile, n - j0);
      if (I == J) {
        Eigen::MatrixXf d = Eigen::MatrixXf::Zero(h, h);   // column-major: selfadjointView rank updates want it
        d.selfadjointView<Eigen::Lower>().rankUpdate(Xc.middleCols(i0, h).transpose());   // SYRK in fp32
        H_.block(i0, i0, h, h).triangularView<Eigen::Lower>() += d.cast<double>();
      } else {
        MatF o(h, w);
        o.noalias() = Xc.middleCols(i0, h).transpose() * Xc.middleCols(j0, w);
        H_.block(i0, j0, h, w) += o.cast<double>();
      }
    });
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
  if (taken_) fail(Errc::usage, "", "Hessian::finalize", "this Hessian was taken (take_finalized)");
  if (scaled_) return H_;
  MatD H = H_.selfadjointView<Eigen::Lower>();
  if (n_ > 0) H *= scale();
  return H;
}

// finalize's values (each lower element times the scale, mirrored), in place, by tiles of 256 x 256
// of the lower triangle, a thread a tile: a tile below the diagonal writes its mirror above it, a
// diagonal tile its own upper half. finalize's copy of an 11008-column H read the lower triangle
// column-wise into a new 1 GB matrix: 4.3 s on two cores, where this takes 0.1 s.
MatD Hessian::take_finalized() {
  if (taken_) fail(Errc::usage, "", "Hessian::take_finalized", "this Hessian was taken already");
  taken_ = true;
  if (scaled_) return std::move(H_);
  constexpr Eigen::Index kTile = 256;
  const double s = scale();
  const Eigen::Index n = H_.rows(), T = (n + kTile - 1) / kTile;
  over_threads(lower_tiles(T), [&](int64_t t) {
    const auto [I, J] = lower_tile(t);
    const Eigen::Index i0 = I * kTile, j0 = J * kTile, h = std::min(kTile, n - i0), w = std::min(kTile, n - j0);
    if (I != J) {
      H_.block(i0, j0, h, w) *= s;
      H_.block(j0, i0, w, h) = H_.block(i0, j0, h, w).transpose();
      return;
    }
    for (Eigen::Index i = i0; i < i0 + h; ++i)
      for (Eigen::Index j = i0; j <= i; ++j) H_(j, i) = H_(i, j) *= s;
  });
  return std::move(H_);
}

MatD Hessian::diag_sum_x2() const { return H_.diagonal().transpose(); }

}  // namespace ptq
