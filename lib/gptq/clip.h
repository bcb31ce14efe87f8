// clip.h — AWQ's clipping search (Lin et al., 2023; AutoAWQ's auto_clip), scored by the Hessian.
//
// For row r and group g of a Linear W (the group's columns c), the candidate limits are
//
//     m_k = (1 − k/20) · max_c |W_rc|,   k = 0 … 9          (AutoAWQ's grid of 20, max shrink 0.5)
//
// Each gives the grid of the clamped values (find_grid's limit) and the rounding error of the
// unclamped weights on it, e = Q_m(w) − w (codes past the range saturate at its ends, which is what
// clamping first gives, save where the clamped end itself would round one code short). Its cost is
// the group's share of the Linear's output error,
//
//     e_gᵀ H_gg e_g  ∝  Σ_t (Σ_{c∈g} x_tc e_c)²,
//
// H_gg the group's diagonal block of the Hessian (H = 2/n XᵀX, gptq/hessian.h). AutoAWQ measures
// the same sum on 512 strided calibration tokens; H holds every token. The least cost wins, ties
// keep the wider range, and k = 0 is no clamp at all (limit +infinity), so an unclipped group's grid
// is bit for bit the one without the search. K forms (llama.cpp's super-blocks) are searched on
// the group's float grid, before round_super_block.
//
// Precision: the errors and the products e·H_gg in fp32 (RTN's errors do not cancel), H_gg rounded
// to fp32, each cost summed in fp64. Rows in fixed chunks of 32, a thread a chunk: the same bytes
// on any thread count.
#pragma once
#include <cstdint>
#include <vector>

#include "gptq/hessian.h"
#include "quant/quantizer.h"

namespace ptq {

constexpr int kClipGrid = 20, kClipSteps = 10;
// The limit of step k for a group whose max |w| is amax (+infinity for k = 0).
float clip_limit(int k, float amax);

struct ClipSearch {
  std::vector<float> limits;   // [groups, rows]: static_grids' limits
  int64_t groups = 0;          // (row, group) pairs searched
  int64_t clipped = 0;         // of them, those given a limit
};
// The search for W [rows, cols] with the Hessian of its input H [cols, cols], groups of
// s.group_size (> 0) on s's grid.
ClipSearch output_clip_limits(const MatF& W, const MatD& H, const QuantSpec& s);

}  // namespace ptq
