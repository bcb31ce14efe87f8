#include "gptq/quantizer.h"

#include <cmath>

#include "core/bits.h"
#include "core/error.h"

namespace ptq {

namespace {
GridParams minmax(float xmin, float xmax, const QuantSpec& s) {
  const int maxq = s.maxq();
  xmin = std::min(xmin, 0.0f);
  xmax = std::max(xmax, 0.0f);
  if (s.sym) {
    xmax = std::max(-xmin, xmax);
    xmin = -xmax;
  }
  if (xmin == 0.0f && xmax == 0.0f) { xmin = -1.0f; xmax = 1.0f; }
  float scale = round_to(s.scale_dtype, (xmax - xmin) / float(maxq));
  if (!(scale > 0.0f)) scale = round_to(s.scale_dtype, std::ldexp(1.0f, -24));   // underflow of a tiny range
  const int32_t zero = s.sym ? (maxq + 1) / 2 : int32_t(std::nearbyint(-xmin / scale));
  return {scale, std::min(std::max(zero, 0), maxq)};
}
}  // namespace

GridParams find_grid(const float* x, int64_t n, int64_t stride, const QuantSpec& s) {
  float xmin = 0.0f, xmax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    xmin = std::min(xmin, x[i * stride]);
    xmax = std::max(xmax, x[i * stride]);
  }
  GridParams best = minmax(xmin, xmax, s);
  if (!s.mse) return best;
  // Clipping search of the reference quantizer: shrink the range by p = 1 - k/100, k < 80,
  // keep the grid with the least sum |q - x|^2.4.
  const int maxq = s.maxq();
  auto err = [&](GridParams g) {
    double e = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i * stride];
      e += std::pow(std::abs(double(dequantize_code(quantize_code(v, g, maxq), g)) - v), 2.4);
    }
    return e;
  };
  double best_err = err(best);
  for (int k = 1; k < 80; ++k) {
    const float p = 1.0f - float(k) / 100.0f;
    GridParams g = minmax(p * xmin, p * xmax, s);
    const double e = err(g);
    if (e < best_err) { best_err = e; best = g; }
  }
  return best;
}

uint32_t QuantizedLinear::code(int64_t r, int64_t c) const {
  return unpack_bit(packed.data() + r * packed_words(cols, spec.bits), c, spec.bits);
}

void QuantizedLinear::set_codes(const uint8_t* c) {
  packed.assign(size_t(rows * packed_words(cols, spec.bits)), 0);
  pack_rows(c, rows, cols, spec.bits, packed.data());
}

std::vector<uint8_t> QuantizedLinear::unpacked_codes() const {
  std::vector<uint8_t> c(size_t(rows * cols));
  unpack_rows(packed.data(), rows, cols, spec.bits, c.data());
  return c;
}

MatF QuantizedLinear::dequantize() const {
  MatF W(rows, cols);
#pragma omp parallel for schedule(static) if (rows * cols > (int64_t(1) << 20))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t g = g_idx[size_t(c)];
      W(r, c) = dequantize_code(int(code(r, c)), {scales[size_t(g * rows + r)], zeros[size_t(g * rows + r)]});
    }
  return W;
}

QuantizedLinear QuantizedLinear::row_slice(int64_t r0, int64_t r1) const {
  QuantizedLinear q;
  q.name = name;
  q.spec = spec;
  q.rows = r1 - r0;
  q.cols = cols;
  q.groups = groups;
  q.g_idx = g_idx;
  const int64_t nw = packed_words(cols, spec.bits);
  q.packed.assign(packed.begin() + r0 * nw, packed.begin() + r1 * nw);
  for (int64_t g = 0; g < groups; ++g) {
    q.scales.insert(q.scales.end(), scales.begin() + g * rows + r0, scales.begin() + g * rows + r1);
    q.zeros.insert(q.zeros.end(), zeros.begin() + g * rows + r0, zeros.begin() + g * rows + r1);
  }
  return q;
}

QuantizedLinear QuantizedLinear::empty(int64_t rows, int64_t cols, const QuantSpec& s) {
  QuantizedLinear q;
  q.spec = s;
  q.rows = rows;
  q.cols = cols;
  const int64_t gs = s.group_size > 0 ? s.group_size : cols;
  q.groups = (cols + gs - 1) / gs;
  q.packed.assign(size_t(rows * packed_words(cols, s.bits)), 0);
  q.scales.assign(size_t(q.groups * rows), 0.0f);
  q.zeros.assign(size_t(q.groups * rows), 0);
  q.g_idx.resize(size_t(cols));
  for (int64_t c = 0; c < cols; ++c) q.g_idx[size_t(c)] = int32_t(c / gs);
  return q;
}

QuantizedLinear rtn_quantize(const MatF& W, const QuantSpec& s) {
  QuantizedLinear q = QuantizedLinear::empty(W.rows(), W.cols(), s);
  const int64_t gs = s.group_size > 0 ? s.group_size : q.cols;
  std::vector<uint8_t> codes(size_t(q.rows * q.cols));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t g = 0; g < q.groups; ++g) {
      const int64_t c0 = g * gs, n = std::min(gs, q.cols - c0);
      const GridParams p = find_grid(&W(r, c0), n, 1, s);
      q.scales[size_t(g * q.rows + r)] = p.scale;
      q.zeros[size_t(g * q.rows + r)] = p.zero;
      for (int64_t c = c0; c < c0 + n; ++c) codes[size_t(r * q.cols + c)] = uint8_t(quantize_code(W(r, c), p, s.maxq()));
    }
  q.set_codes(codes.data());
  return q;
}

}  // namespace ptq
