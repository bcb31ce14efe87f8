// quantizer.h — the uniform integer grid of GPTQ ("min-max", algorithms.md) and the one
// representation of quantized weights that every export format is written from.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/llama.h"

namespace ptq {

// How one Linear is quantized.
struct QuantSpec {
  std::string method = "gptq";   // gptq | rtn
  int bits = 4;                  // 2, 3, 4, 8
  int group_size = 128;          // -1: one group per output channel (the whole row)
  bool sym = true;
  bool act_order = false;        // columns in order of decreasing diag(H)
  bool static_groups = false;    // group parameters from the unpermuted weights, before GPTQ
  double damp_percent = 0.01;    // of mean(diag(H))
  int block_size = 128;
  bool mse = false;              // search a clipping factor per row/group (norm 2.4, grid 100, max shrink 0.8)
  DType scale_dtype = DType::F16;  // scales are rounded to this before use, so GPTQ compensates their rounding
  int maxq() const { return (1 << bits) - 1; }
  bool operator==(const QuantSpec& o) const {
    return method == o.method && bits == o.bits && group_size == o.group_size && sym == o.sym && act_order == o.act_order &&
           static_groups == o.static_groups && damp_percent == o.damp_percent && block_size == o.block_size && mse == o.mse &&
           scale_dtype == o.scale_dtype;
  }
};

// Grid parameters of one row of one group: w ~ scale * (q - zero), q in [0, maxq].
struct GridParams {
  float scale;
  int32_t zero;
};

// Min-max grid (with the optional MSE clipping search) for n values x.
GridParams find_grid(const float* x, int64_t n, int64_t stride, const QuantSpec& s);
inline int32_t quantize_code(float x, GridParams g, int maxq) {
  const float q = std::nearbyint(x / g.scale) + float(g.zero);
  return int32_t(std::min(std::max(q, 0.0f), float(maxq)));
}
inline float dequantize_code(int32_t q, GridParams g) { return g.scale * float(q - g.zero); }

// A quantized Linear W [rows, cols] (rows = out_features, cols = in_features), codes in the
// natural column order. Column c belongs to group g_idx[c]; its row r dequantizes as
// scales[g * rows + r] * (codes[r * cols + c] - zeros[g * rows + r]).
struct QuantizedLinear {
  std::string name;              // "model.layers.0.self_attn.q_proj"
  QuantSpec spec;
  int64_t rows = 0, cols = 0, groups = 0;
  // The codes: row r as one core/bits.h stream of packed_words(cols, spec.bits) words [rows, words].
  // The one representation from the solve to the exporters: the layer store keeps these words as
  // they are, gptq's qweight is their transpose, compressed-tensors' weight_packed the words
  // themselves (the kernels' fragment order is kernels/relayout.h).
  std::vector<uint32_t> packed;
  uint32_t code(int64_t r, int64_t c) const;
  void set_codes(const uint8_t* codes);        // from one byte per code [rows, cols] (rows, cols, spec.bits set)
  std::vector<uint8_t> unpacked_codes() const; // one byte per code [rows, cols]
  std::vector<float> scales;     // [groups, rows], already rounded to spec.scale_dtype
  std::vector<int32_t> zeros;    // [groups, rows]
  std::vector<int32_t> g_idx;    // [cols]
  MatF dequantize() const;
  QuantizedLinear row_slice(int64_t r0, int64_t r1) const;   // rows [r0, r1): same spec, columns and g_idx
  // Shape, spec and zeroed storage for W [rows, cols]; g_idx in natural order (c / group).
  static QuantizedLinear empty(int64_t rows, int64_t cols, const QuantSpec& s);
};

// Round-to-nearest with the same grids (the baseline), groups in natural column order.
QuantizedLinear rtn_quantize(const MatF& W, const QuantSpec& s);

}  // namespace ptq
