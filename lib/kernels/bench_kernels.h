// bench_kernels.h — `ptqkit bench kernels` (bench_kernels.cu).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "kernels/nf4.h"
#include "kernels/w4a16.h"

namespace ptq::cuda {
// Linears of random codes for benchmarks (`bench kernels`, `bench decode`): GPTQ symmetric `bits`
// (4: groups of 128, 8: per channel) with every scale `scale`; NF4 in blocks of 64 with every
// absmax `absmax`. Codes drawn from r.
std::unique_ptr<W4A16Linear> random_gptq_linear(int64_t N, int64_t K, int bits, float scale, Rng& r);
std::unique_ptr<Nf4Linear> random_nf4_linear(int64_t N, int64_t K, float absmax, Rng& r);
// GGUF's K-quants as the GPU holds them (W4A16Linear::from_quantized): "q4_k" 4-bit codes with a
// scale and a min a group of 32 (Q4_K, and Q4_1's layout), "q6_k" 6-bit codes in the 8-bit layout
// on zero point 32 with a scale a group of 16 (Q6_K). Every scale `scale`, mins centring the codes.
std::unique_ptr<W4A16Linear> random_gguf_linear(int64_t N, int64_t K, const std::string& type, float scale, Rng& r);

// shapes: (N = out, K = in); prints one line per (kernel, shape, M). kernels: any of w4a16, w8a16,
// nf4, w8a8.
void bench_kernels(const std::vector<std::pair<int64_t, int64_t>>& shapes, const std::vector<int64_t>& Ms, int runs, const std::vector<std::string>& kernels);

// A chain of dependent launches with ideal bodies (`bench decode`'s chain floor): one CUDA graph
// of bytes.size() kernels, kernel i reading bytes[i] bytes once (16-byte streaming loads from a
// region of its own in a pool of at most 2 GiB, so no byte comes from L2) and doing nothing else.
// Each is launched as the decode step's kernels are (programmatic dependent launch): it lets the
// next one launch at once, issues its first loads (16 a thread, 2,048 threads an SM) before it
// waits for the one before, and after the wait reads that one's output word and writes its own.
// What a step of that many kernels with those bytes costs when every kernel streams at the rate
// the hardware gives a lone read; the step's own kernels also multiply, dequantize and reduce.
// Returns ms per replay, the mean of `reps` replays after one untimed.
double stream_chain_ms(const std::vector<double>& bytes, int reps);
}
