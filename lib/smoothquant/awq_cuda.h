// awq_cuda.h — AWQ's search on the GPU. Same math as output_sq_error and awq_delta (awq.h), their
// references.
#pragma once
#include "smoothquant/awq.h"

namespace ptq::cuda {

// ‖X dWᵀ‖²_F / rows: X and dW uploaded, X · dW_cᵀ by cuBLAS SGEMM (fp32, no TF32) over chunks of
// dW's rows, the squares summed in fp64 a row of X a block, then in a fixed order: the same value
// every run; against the host's (Eigen's fp32 GEMM) to ~1e-6 relative.
double output_sq_error(const MatF& X, const MatF& dW);

// The whole search's scoring on the GPU: X and the Linears' fp32 weights uploaded once a search;
// at each candidate s only s goes up, and dW = Q(W · diag(s)) · diag(s)⁻¹ − W is formed on the device
// (quant/grid.cuh: the host's grid and codes to the bit; the last product and difference each
// rounded as the host's are, no FMA) and scored as output_sq_error scores it. Declines (an empty
// scorer: the host's) where a Linear's grid is not GPTQ's integer one or runs its MSE search.
// AwqProduct::bf16: X · dWᵀ with both rounded to bf16 on the tensor cores (fp32 accumulation):
// the search 2x faster on a llama2-7b layer (H200, lab run 47: 1.13 -> 0.55 s), each error within
// 5e-5 of the fp32 one there and 2e-4 on outlier-laden small ones (the operands' rounding;
// awq_cuda.cu), the same ratios.
enum class AwqProduct { fp32, bf16 };
AwqScorer awq_scorer(AwqProduct product = AwqProduct::fp32);

}  // namespace ptq::cuda
