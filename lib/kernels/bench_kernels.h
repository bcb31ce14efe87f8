// bench_kernels.h — `ptqkit bench kernels` (bench_kernels.cu).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ptq::cuda {
// shapes: (N = out, K = in); prints one line per (kernel, shape, M). kernels: any of w4a16, w8a16,
// nf4, w8a8.
void bench_kernels(const std::vector<std::pair<int64_t, int64_t>>& shapes, const std::vector<int64_t>& Ms, int runs, const std::vector<std::string>& kernels);
}
