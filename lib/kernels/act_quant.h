// act_quant.h — int8 activations for the W8A8 GEMM on the GPU (w8a8.h): the device form of
// quantize_activations (lib/model/llama.cpp, the reference).
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "model/linear_types.h"

namespace ptq::cuda {

// q [rows, cols] int8 and s [rows] fp32 from x [rows, cols] (F16 or BF16), all on the device:
// per token s = max_c |x[r, c]| / 127 (per tensor: a.static_scale), 1 where that is not positive;
// q = x / s rounded half to even and clamped to [-128, 127] — quantize_activations' fp32
// arithmetic on the same values. Asynchronous (the thread's current stream).
void quantize_activations_int8(const void* x, DType dt, int64_t rows, int64_t cols, const ActQuant& a, int8_t* q, float* s);

// y = t + beta * y over n floats (device; beta = 0 overwrites y).
void add_scaled(float* y, const float* t, int64_t n, float beta);

}  // namespace ptq::cuda
