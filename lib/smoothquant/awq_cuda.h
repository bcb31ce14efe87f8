// awq_cuda.h — AWQ's search error on the GPU. Same math as output_sq_error (awq.h), its reference.
#pragma once
#include "smoothquant/awq.h"

namespace ptq::cuda {

// ‖X dWᵀ‖²_F / rows: X and dW uploaded, X · dW_cᵀ by cuBLAS SGEMM (fp32, no TF32) over chunks of
// dW's rows, the squares summed in fp64 a row of X a block, then in a fixed order: the same value
// every run; against the host's (Eigen's fp32 GEMM) to ~1e-6 relative.
double output_sq_error(const MatF& X, const MatF& dW);

}  // namespace ptq::cuda
