// blas.h — the process's cuBLAS handle, for CUDA translation units (one handle, created on first
// use, on the default stream).
#pragma once
#include <cublas_v2.h>

namespace ptq::cuda {
cublasHandle_t blas_handle();
}
