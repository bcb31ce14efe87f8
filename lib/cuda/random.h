// random.h — deterministic pseudo-random device data for benchmarks and tests.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace ptq::cuda {

// Fills dst [n] (device, `dtype`: F16, BF16 or F32) with normal values of standard deviation
// `stddev`: Box-Muller over a SplitMix64 hash of (seed, index), so any n and seed give the same
// values on every GPU.
void fill_random_normal(void* dst, DType dtype, int64_t n, uint64_t seed, float stddev);

}  // namespace ptq::cuda
