#include "gptq/clip.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace ptq {

float clip_limit(int k, float amax) {
  return k == 0 ? std::numeric_limits<float>::infinity() : float(1.0 - double(k) / kClipGrid) * amax;
}

ClipSearch output_clip_limits(const MatF& W, const MatD& H, const QuantSpec& s) {
  const int64_t rows = W.rows(), cols = W.cols();
  if (s.group_size <= 0) fail(Errc::usage, "", "quantization.awq.clip", "the clipping search takes groups (group_size > 0), not per-channel grids");
  if (H.rows() != cols || H.cols() != cols) fail(Errc::numeric, "", "H", "Hessian size does not match the weight's columns");
  const int64_t gs = s.group_size, groups = (cols + gs - 1) / gs;
  ClipSearch out;
  out.limits.assign(size_t(groups * rows), std::numeric_limits<float>::infinity());
  out.groups = groups * rows;
  std::vector<MatF> Hg(static_cast<size_t>(groups));   // H's diagonal blocks, fp32
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t n = std::min(gs, cols - g * gs);
    Hg[size_t(g)] = H.block(g * gs, g * gs, n, n).cast<float>();
  }
  constexpr int64_t kChunk = 32;
  const int64_t chunks = (rows + kChunk - 1) / kChunk;
  std::vector<int64_t> clipped(static_cast<size_t>(chunks), 0);
  const int maxq = s.maxq();
#pragma omp parallel for schedule(dynamic)
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int64_t r0 = ch * kChunk, m = std::min(kChunk, rows - r0);
    MatF E, EH;
    std::vector<double> best(static_cast<size_t>(m));
    std::vector<float> amax(static_cast<size_t>(m));
    std::vector<int> best_k(static_cast<size_t>(m));
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * gs, n = std::min(gs, cols - c0);
      E.resize(m, n);
      for (int64_t i = 0; i < m; ++i) {
        float a = 0.0f;
        for (int64_t c = 0; c < n; ++c) a = std::max(a, std::abs(W(r0 + i, c0 + c)));
        amax[size_t(i)] = a;
      }
      for (int k = 0; k < kClipSteps; ++k) {
        for (int64_t i = 0; i < m; ++i) {
          const float* w = &W(r0 + i, c0);
          const GridParams p = find_grid(w, n, 1, s, clip_limit(k, amax[size_t(i)]));
          for (int64_t c = 0; c < n; ++c) E(i, c) = dequantize_code(quantize_code(w[c], p, maxq), p) - w[c];
        }
        EH.noalias() = E * Hg[size_t(g)];
        for (int64_t i = 0; i < m; ++i) {
          double cost = 0;
          for (int64_t c = 0; c < n; ++c) cost += double(EH(i, c)) * double(E(i, c));
          if (k == 0 || cost < best[size_t(i)]) { best[size_t(i)] = cost; best_k[size_t(i)] = k; }
        }
      }
      for (int64_t i = 0; i < m; ++i)
        if (best_k[size_t(i)] > 0) {
          out.limits[size_t(g * rows + r0 + i)] = clip_limit(best_k[size_t(i)], amax[size_t(i)]);
          ++clipped[size_t(ch)];
        }
    }
  }
  for (int64_t c : clipped) out.clipped += c;
  return out;
}

}  // namespace ptq
