// quantizer.h — the uniform integer grid of GPTQ ("min-max", algorithms.md) and the one
// representation of quantized weights that every export format is written from.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "model/llama.h"

namespace ptq {

// How a group's grid is represented, which decides the values its parameters can take. The
// formats that are not GPTQ's own are llama.cpp's blocks (formats/gguf.h), solved on their own grid
// so that every code is what llama.cpp decodes.
enum class GridForm : uint8_t {
  integer_zero,  // w = s (q - z), z an integer in [0, maxq], s rounded to scale_dtype (GPTQ; Q4_0, Q5_0, Q8_0)
  f16_min,       // w = s q + m, s and m f16 values (Q4_1, Q5_1)
  k_min,         // w = (d sc) q - (dmin mc): super-blocks of 8 groups of 32, f16 d and dmin, 6-bit sc and mc (Q4_K, Q5_K)
  k_sym,         // w = (d sc) (q - 32): super-blocks of 16 groups of 16, f16 d, int8 sc (Q6_K)
};
const char* grid_form_name(GridForm f);   // "integer_zero"
bool parse_grid_form(const std::string& s, GridForm* f);
inline bool has_min(GridForm f) { return f == GridForm::f16_min || f == GridForm::k_min; }
// Groups per super-block of a K form (0 for the others).
inline int groups_per_super(GridForm f) { return f == GridForm::k_min ? 8 : f == GridForm::k_sym ? 16 : 0; }

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
  // AWQ's clipping search (gptq/clip.h): each group's range clamped where that lowers its output
  // error under the Hessian. A flag for the solvers, which run the search and pass its limits to
  // static_grids; static grids only (RTN, or GPTQ with static_groups), groups only, not with mse.
  bool output_clip = false;
  DType scale_dtype = DType::F16;  // scales are rounded to this before use, so GPTQ compensates their rounding
  GridForm form = GridForm::integer_zero;   // the others need static grids (group parameters known before the solve)
  int maxq() const { return (1 << bits) - 1; }
  bool operator==(const QuantSpec& o) const {
    return method == o.method && bits == o.bits && group_size == o.group_size && sym == o.sym && act_order == o.act_order &&
           static_groups == o.static_groups && damp_percent == o.damp_percent && block_size == o.block_size && mse == o.mse &&
           output_clip == o.output_clip && scale_dtype == o.scale_dtype && form == o.form;
  }
};

// Why spec s cannot take AWQ's clipping search ("" where it can): it needs groups, grids fixed
// before the solve (RTN, or GPTQ with static_groups) and no MSE search of its own.
const char* output_clip_refusal(const QuantSpec& s);
// AWQ leaves the Linears whose outputs hold attention's queries or keys unclipped, as AutoAWQ does
// (their errors meet in q·kᵀ, which the group's output error does not see): q_proj, k_proj and a
// fused qkv_proj.
bool reads_into_scores(const std::string& module);

// Grid parameters of one row of one group: w ~ scale * (q - zero), or scale * q + min where the
// form has a min; q in [0, maxq]. A K form's scale may be 0 (a sub-block scale rounded to 0: every
// code decodes to the min, or to 0) and Q6_K's negative (its sc is signed).
struct GridParams {
  float scale;
  int32_t zero;
  float min = 0.0f;
  bool with_min = false;
};

// The group's grid for n values x: min-max (with the optional MSE clipping search), its scale (and
// min) rounded as the form stores them. K forms: the float grid of one sub-block, before
// round_super_block. `limit`: the grid of the values clamped to [-limit, limit] (AWQ's clipping;
// infinity: none); codes of values past it saturate at the grid's ends.
GridParams find_grid(const float* x, int64_t n, int64_t stride, const QuantSpec& s, float limit = std::numeric_limits<float>::infinity());
// K forms: rounds the grids of one row's super-block (groups_per_super of them) to the block's
// representation; returns the super-block's d and dmin (0 for k_sym), f16 values.
std::pair<float, float> round_super_block(GridParams* g, const QuantSpec& s);
inline int32_t quantize_code(float x, GridParams g, int maxq) {
  if (g.scale == 0.0f) return g.with_min ? 0 : g.zero;
  const float q = g.with_min ? std::nearbyint((x - g.min) / g.scale) : std::nearbyint(x / g.scale) + float(g.zero);
  return int32_t(std::min(std::max(q, 0.0f), float(maxq)));
}
// As llama.cpp decodes: d * (q - z) for integer zeros, d * q - m for mins (here min = -m).
inline float dequantize_code(int32_t q, GridParams g) { return g.with_min ? g.scale * float(q) + g.min : g.scale * float(q - g.zero); }

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
  void row_codes(int64_t r, uint8_t* out) const;   // row r's codes, one byte each, into out[cols]
  void set_codes(const uint8_t* codes);        // from one byte per code [rows, cols] (rows, cols, spec.bits set)
  std::vector<uint8_t> unpacked_codes() const; // one byte per code [rows, cols]
  std::vector<float> scales;     // [groups, rows], already rounded to spec.scale_dtype
  std::vector<int32_t> zeros;    // [groups, rows]
  std::vector<float> mins;       // [groups, rows], forms with a min only: w = scale * q + min
  // K forms: each super-block's d and dmin [groups / groups_per_super, rows] (f16 values); a group's
  // scale is d * sc and its min -(dmin * mc), sc and mc the integers the block stores.
  std::vector<float> super_d, super_dmin;
  std::vector<int32_t> g_idx;    // [cols]
  GridParams grid(int64_t g, int64_t r) const;   // group g's of row r
  MatF dequantize() const;
  QuantizedLinear row_slice(int64_t r0, int64_t r1) const;   // rows [r0, r1): same spec, columns and g_idx
  // Shape, spec and zeroed storage for W [rows, cols]; g_idx in natural order (c / group).
  static QuantizedLinear empty(int64_t rows, int64_t cols, const QuantSpec& s);
};

// Linears over one input stacked along their outputs (q, k, v -> one Linear): the parts' rows in
// order, every grid parameter with its row. False (and *out untouched) where the parts differ in
// bits, grid form, inputs, groups or g_idx (act-order with different permutations).
bool concat_rows(const std::vector<QuantizedLinear>& parts, QuantizedLinear* out);

// The grids of W's groups in natural column order [groups, rows] (one group per row without
// group_size; super-blocks rounded), also written into q's scales, zeros, mins and super-block
// parameters (q: QuantizedLinear::empty). `limits` [groups, rows]: each group's clamp (find_grid's
// limit; gptq/clip.h), null: none.
std::vector<GridParams> static_grids(const MatF& W, QuantizedLinear& q, const std::vector<float>* limits = nullptr);

// Round-to-nearest with the same grids (the baseline), groups in natural column order.
QuantizedLinear rtn_quantize(const MatF& W, const QuantSpec& s, const std::vector<float>* limits = nullptr);
// rtn_quantize(W, s).dequantize() without forming the codes: the same floats (a test), for the
// searches that only score the rounded weights (AWQ's ratios).
MatF rtn_fake_quantize(const MatF& W, const QuantSpec& s);

}  // namespace ptq
