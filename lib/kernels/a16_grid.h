// a16_grid.h — which quantized Linears the W4A16 / W8A16 GPU kernels take as they are
// (W4A16Linear::from_quantized, lib/kernels/w4a16.cu), in one place: the loaders ask it before they
// load a Linear, and dequantize to f16 what it refuses; from_quantized refuses by it (naming the
// field). Host code only, so the CPU build and its tests hold the same rule as the GPU's.
#pragma once
#include <cstdint>
#include <string>

#include "quant/quantizer.h"

namespace ptq {

// Why a grid is not taken: the field (as Errc messages name it) and the reason.
struct A16Refusal {
  std::string field, reason;
};

// The kernels' groups: equal runs of d columns (columns sorted by group, as act-order's g_idx is at
// load), each with one (scale, zero point) or (scale, min) a row. A checkpoint's groups of unequal
// sizes (GPTQ's group_size 256 over 384 columns: 256 and 128) are cut into runs of the largest d that
// divides every group's size, each run carrying its group's grid: the same weights. A grid with mins
// in one group is cut into the widest runs that make two or more (the kernels apply a single
// group's scale per k-step, which s q + m does not allow). d is a multiple of 16, or K for one
// group without mins. 0 where none exists.
int64_t a16_group_columns(const QuantizedLinear& q);

// True where the kernels take q: codes of 1..8 bits (1..4 held in the 4-bit layout, 5..8 in the
// 8-bit one); in_features a multiple of 16; a16_group_columns > 0; every scale and min an f16
// number and every zero point within 1024 of 0 (the kernels hold {1024 + z, s} or {m, s} as f16:
// both exact there). Else false, with *why (when given) set.
bool a16_takes(const QuantizedLinear& q, A16Refusal* why = nullptr);

}  // namespace ptq
