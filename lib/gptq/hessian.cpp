#include "gptq/hessian.h"

#include <algorithm>

#include "core/error.h"
#include "gptq/tasks.h"

namespace ptq {

// Each chunk's fp32 sum, lower triangle, in tiles of kTile x kTile of H, one task a tile (the
// tiles are disjoint, so the threads never write the same element; n = 4096 is 528 tiles, enough
// for any core count): a diagonal tile by a rank update (SYRK), the others by a GEMM. Eigen runs
// neither in parallel itself here (a triangular product never, a GEMM not inside a team of
// threads), so each tile's arithmetic, and the bytes of H, are the same whatever the number of
// threads (a test). Eigen's one rank update over all of H, which this replaces, ran on one core.
void Hessian::add(const MatF& X) {
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
  if (scaled_) return H_;
  MatD H = H_.selfadjointView<Eigen::Lower>();
  if (n_ > 0) H *= scale();
  return H;
}

MatD Hessian::diag_sum_x2() const { return H_.diagonal().transpose(); }

}  // namespace ptq
