// smoothquant_cuda.h — SmoothQuant's alpha search on the GPU. Same math as smoothed_errors
// (smoothquant.h), its reference.
#pragma once
#include <vector>

#include "smoothquant/smoothquant.h"

namespace ptq::cuda {

// smoothed_errors on the GPU: for each alpha the same int8 codes as the host's (activations per
// token or per tensor, weights per output channel, formed with the host's float operations), their
// products by cuBLAS's int8 GEMM with exact int32 sums, rescaled as (Σ · s_x) · s_w, against X·Wᵀ
// from an fp32 GEMM; squared differences summed in fp64 in a fixed order (the same errors every
// run). The host rounds each product in fp32 and forms X·Wᵀ with its own GEMM, so the errors
// agree with it to about 1e-4 relative, not to the bit.
std::vector<double> smoothed_errors(const MatF& X, const VecF& act_absmax, const VecF& w_absmax, const std::vector<const MatF*>& ws,
                                    const ActQuant& act, const std::vector<double>& alphas);

}  // namespace ptq::cuda
