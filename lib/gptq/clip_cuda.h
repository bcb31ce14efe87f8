// clip_cuda.h — AWQ's clipping search (gptq/clip.h, its reference) with the Hessian on the GPU.
#pragma once
#include "gptq/clip.h"
#include "gptq/hessian.h"

namespace ptq::cuda {

// Whether s's groups can be searched here: GPTQ's integer grid (quant/grid.cuh), no MSE search,
// groups of 1..128 columns (a group's block of H in shared memory).
bool clip_supported(const QuantSpec& s);
// output_clip_limits (clip.h) for W [rows, cols] (host, uploaded) and H = H.scale · H.sum on the
// device: the same candidates, grids and costs, each cost's products e·H_gg in fp32 and its sum in
// fp64 in another order than the host's, so a choice can differ from the host's only where two
// candidates' costs tie to that rounding.
ClipSearch output_clip_limits(const MatF& W, HessianRef H, const QuantSpec& s);
// The same for W [rows, cols] fp32 already on the device.
ClipSearch output_clip_limits(const float* W, int64_t rows, int64_t cols, HessianRef H, const QuantSpec& s);

}  // namespace ptq::cuda
