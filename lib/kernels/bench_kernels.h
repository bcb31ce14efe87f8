// bench_kernels.h — `ptqkit bench kernels` (bench_kernels.cu).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace ptq::cuda {
// shapes: (N = out, K = in); prints one line per (shape, M).
void bench_kernels(const std::vector<std::pair<int64_t, int64_t>>& shapes, const std::vector<int64_t>& Ms, int runs);
}
