#include "quant/quantizer.h"

#include <cmath>

#include "core/bits.h"
#include "core/error.h"

namespace ptq {

const char* grid_form_name(GridForm f) {
  switch (f) {
    case GridForm::integer_zero: return "integer_zero";
    case GridForm::f16_min: return "f16_min";
    case GridForm::k_min: return "k_min";
    case GridForm::k_sym: return "k_sym";
  }
  return "?";
}

bool parse_grid_form(const std::string& s, GridForm* f) {
  for (GridForm g : {GridForm::integer_zero, GridForm::f16_min, GridForm::k_min, GridForm::k_sym})
    if (s == grid_form_name(g)) { *f = g; return true; }
  return false;
}

const char* output_clip_refusal(const QuantSpec& s) {
  if (s.method != "gptq" && s.method != "rtn") return "the clipping search is for rtn or gptq";
  if (s.group_size <= 0) return "the clipping search takes groups (group_size > 0), not per-channel grids";
  if (s.method == "gptq" && !s.static_groups)
    return "clipped grids are fixed before the solve, and GPTQ's move with it unless static_groups: true";
  if (s.mse) return "quantization.mse runs its own clipping search: choose one";
  return "";
}

bool reads_into_scores(const std::string& m) { return m.ends_with(".q_proj") || m.ends_with(".k_proj") || m.ends_with(".qkv_proj"); }

namespace {
GridParams minmax(float xmin, float xmax, const QuantSpec& s) {
  const int maxq = s.maxq();
  switch (s.form) {
    case GridForm::integer_zero: break;
    case GridForm::f16_min: {   // Q4_1's quantizer: m = min, d = (max - min) / maxq, both as f16
      const float m = round_to(DType::F16, xmin);
      return {round_to(DType::F16, std::max(xmax - m, 0.0f) / float(maxq)), 0, m, true};
    }
    case GridForm::k_min:   // a sub-block: llama.cpp keeps min <= 0 (its mc is unsigned); rounded per super-block
      xmin = std::min(xmin, 0.0f);
      return {std::max(xmax - xmin, 0.0f) / float(maxq), 0, xmin, true};
    case GridForm::k_sym: {   // the value of largest magnitude on code 0 (-32 d sc), as llama.cpp's make_qx_quants
      const float m = -xmin >= xmax ? xmin : xmax;
      return {-m / 32.0f, 32, 0.0f, false};
    }
  }
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

GridParams find_grid(const float* x, int64_t n, int64_t stride, const QuantSpec& s, float limit) {
  float xmin = n > 0 ? x[0] : 0.0f, xmax = xmin;   // (GPTQ's grids then take in 0; Q4_1's need not)
  for (int64_t i = 0; i < n; ++i) {
    xmin = std::min(xmin, x[i * stride]);
    xmax = std::max(xmax, x[i * stride]);
  }
  if (limit < std::numeric_limits<float>::infinity()) {   // the min and max of the clamped values
    xmin = std::min(std::max(xmin, -limit), limit);
    xmax = std::min(std::max(xmax, -limit), limit);
  }
  GridParams best = minmax(xmin, xmax, s);
  if (!s.mse || best.scale == 0.0f) return best;
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

std::pair<float, float> round_super_block(GridParams* g, const QuantSpec& s) {
  const int n = groups_per_super(s.form);
  if (n == 0) fail(Errc::usage, "", "quantization", std::string("round_super_block: ") + grid_form_name(s.form) + " has no super-blocks");
  // d = the largest |scale| over the levels sc takes (63 unsigned, 127 signed), as f16; each group
  // takes the nearest multiple (d, sc as llama.cpp's quantize_row_q*_K_ref)
  const float levels = s.form == GridForm::k_min ? 63.0f : 127.0f;
  float max_scale = 0.0f, max_m = 0.0f;
  for (int j = 0; j < n; ++j) {
    max_scale = std::max(max_scale, std::abs(g[j].scale));
    max_m = std::max(max_m, -g[j].min);
  }
  const float d = round_to(DType::F16, max_scale / levels), dmin = s.form == GridForm::k_min ? round_to(DType::F16, max_m / levels) : 0.0f;
  for (int j = 0; j < n; ++j) {
    const float sc = d > 0.0f ? std::min(std::max(std::nearbyint(g[j].scale / d), -levels - 1), levels) : 0.0f;
    g[j].scale = d * sc;
    if (s.form == GridForm::k_min) {
      const float mc = dmin > 0.0f ? std::min(std::max(std::nearbyint(-g[j].min / dmin), 0.0f), levels) : 0.0f;
      g[j].min = -(dmin * mc);
    }
  }
  return {d, dmin};
}

GridParams QuantizedLinear::grid(int64_t g, int64_t r) const {
  const size_t k = size_t(g * rows + r);
  return mins.empty() ? GridParams{scales[k], zeros[k]} : GridParams{scales[k], 0, mins[k], true};
}

uint32_t QuantizedLinear::code(int64_t r, int64_t c) const {
  return unpack_bit(packed.data() + r * packed_words(cols, spec.bits), c, spec.bits);
}

void QuantizedLinear::row_codes(int64_t r, uint8_t* out) const {
  unpack_stream(packed.data() + r * packed_words(cols, spec.bits), cols, spec.bits, out);
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
#pragma omp parallel if (rows * cols > (int64_t(1) << 20))
  {
    std::vector<uint8_t> c8(static_cast<size_t>(cols));   // a row's codes
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      row_codes(r, c8.data());
      for (int64_t c = 0; c < cols; ++c) W(r, c) = dequantize_code(int(c8[size_t(c)]), grid(g_idx[size_t(c)], r));
    }
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
  auto slice = [&](const auto& v, auto& out, int64_t n) {   // [n, rows] -> [n, r1 - r0]
    out.clear();
    for (int64_t g = 0; g < n && !v.empty(); ++g) out.insert(out.end(), v.begin() + g * rows + r0, v.begin() + g * rows + r1);
  };
  slice(scales, q.scales, groups);
  slice(zeros, q.zeros, groups);
  slice(mins, q.mins, groups);
  const int64_t supers = groups_per_super(spec.form) ? groups / groups_per_super(spec.form) : 0;
  slice(super_d, q.super_d, supers);
  slice(super_dmin, q.super_dmin, supers);
  return q;
}

bool concat_rows(const std::vector<QuantizedLinear>& parts, QuantizedLinear* out) {
  if (parts.empty()) return false;
  const QuantizedLinear& a = parts[0];
  for (const QuantizedLinear& q : parts)
    if (q.spec.bits != a.spec.bits || q.spec.form != a.spec.form || q.cols != a.cols || q.groups != a.groups || q.g_idx != a.g_idx ||
        q.mins.empty() != a.mins.empty())
      return false;
  QuantizedLinear c;
  c.name = a.name;
  c.spec = a.spec;
  c.cols = a.cols;
  c.groups = a.groups;
  c.g_idx = a.g_idx;
  size_t words = 0;
  for (const QuantizedLinear& q : parts) c.rows += q.rows, words += q.packed.size();
  c.packed.reserve(words);   // one allocation: a stacked gate, up of a 7B layer is 45 MB
  for (const QuantizedLinear& q : parts) c.packed.insert(c.packed.end(), q.packed.begin(), q.packed.end());   // whole rows of words
  auto stack = [&](auto member, int64_t n) {   // [n, rows_i] each -> [n, rows]
    auto& dst = c.*member;
    if (!(a.*member).empty()) dst.reserve(size_t(n * c.rows));
    for (int64_t g = 0; g < n; ++g)
      for (const QuantizedLinear& q : parts)
        if (!(q.*member).empty()) dst.insert(dst.end(), (q.*member).begin() + g * q.rows, (q.*member).begin() + (g + 1) * q.rows);
  };
  stack(&QuantizedLinear::scales, a.groups);
  stack(&QuantizedLinear::zeros, a.groups);
  stack(&QuantizedLinear::mins, a.groups);
  const int64_t supers = groups_per_super(a.spec.form) ? a.groups / groups_per_super(a.spec.form) : 0;
  stack(&QuantizedLinear::super_d, supers);
  stack(&QuantizedLinear::super_dmin, supers);
  *out = std::move(c);
  return true;
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
  if (has_min(s.form)) q.mins.assign(size_t(q.groups * rows), 0.0f);
  if (const int n = groups_per_super(s.form)) {
    if (s.group_size <= 0 || q.groups % n)
      fail(Errc::usage, "", "quantization", std::string(grid_form_name(s.form)) + " grids need whole super-blocks: " + std::to_string(n) + " groups of " +
                                                std::to_string(s.group_size) + " columns, got " + std::to_string(cols) + " columns");
    q.super_d.assign(size_t(q.groups / n * rows), 0.0f);
    if (s.form == GridForm::k_min) q.super_dmin.assign(size_t(q.groups / n * rows), 0.0f);
  }
  q.g_idx.resize(size_t(cols));
  for (int64_t c = 0; c < cols; ++c) q.g_idx[size_t(c)] = int32_t(c / gs);
  return q;
}

std::vector<GridParams> static_grids(const MatF& W, QuantizedLinear& q, const std::vector<float>* limits) {
  const QuantSpec& s = q.spec;
  const int64_t rows = q.rows, cols = q.cols, gs = s.group_size > 0 ? s.group_size : cols;
  std::vector<GridParams> p(size_t(q.groups * rows));
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<GridParams> row(static_cast<size_t>(q.groups));
    for (int64_t g = 0; g < q.groups; ++g)
      row[size_t(g)] = find_grid(&W(r, g * gs), std::min(gs, cols - g * gs), 1, s,
                                 limits ? (*limits)[size_t(g * rows + r)] : std::numeric_limits<float>::infinity());
    if (const int n = groups_per_super(s.form))
      for (int64_t b = 0; b < q.groups / n; ++b) {
        const auto [d, dmin] = round_super_block(&row[size_t(b * n)], s);
        q.super_d[size_t(b * rows + r)] = d;
        if (!q.super_dmin.empty()) q.super_dmin[size_t(b * rows + r)] = dmin;
      }
    for (int64_t g = 0; g < q.groups; ++g) {
      const GridParams& x = row[size_t(g)];
      const size_t k = size_t(g * rows + r);
      p[k] = x;
      q.scales[k] = x.scale;
      q.zeros[k] = x.zero;
      if (!q.mins.empty()) q.mins[k] = x.min;
    }
  }
  return p;
}

QuantizedLinear rtn_quantize(const MatF& W, const QuantSpec& s, const std::vector<float>* limits) {
  QuantizedLinear q = QuantizedLinear::empty(W.rows(), W.cols(), s);
  const int64_t gs = s.group_size > 0 ? s.group_size : q.cols;
  std::vector<uint8_t> codes(size_t(q.rows * q.cols));
  const std::vector<GridParams> p = static_grids(W, q, limits);   // the grids as the solve takes them (super-blocks rounded)
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c) codes[size_t(r * q.cols + c)] = uint8_t(quantize_code(W(r, c), p[size_t(c / gs * q.rows + r)], s.maxq()));
  q.set_codes(codes.data());
  return q;
}

MatF rtn_fake_quantize(const MatF& W, const QuantSpec& s) {
  QuantizedLinear q = QuantizedLinear::empty(W.rows(), W.cols(), s);
  const int64_t gs = s.group_size > 0 ? s.group_size : q.cols;
  const std::vector<GridParams> p = static_grids(W, q);
  MatF D(q.rows, q.cols);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c) {
      const GridParams& g = p[size_t(c / gs * q.rows + r)];
      D(r, c) = dequantize_code(quantize_code(W(r, c), g, s.maxq()), g);
    }
  return D;
}

}  // namespace ptq
