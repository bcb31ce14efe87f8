// nll_cuda.h — the negative log-likelihood of each scored row, from logits on the device, in fp64:
// the GPU twin of evaluate()'s host loop (eval/perplexity.cpp), so that a perplexity run without a
// reference model copies one double per token back instead of a row of vocab_size floats.
#pragma once
#include <cstdint>
#include <vector>

namespace ptq::cuda {

// logits: device, [S*T, V] fp32. Rows in evaluate()'s order: window s, positions t < T - 1, target
// tokens[s*T + t + 1]; nll = log Σ_v exp(x_v) − x_target with the max taken out first and the sum
// in fp64, as log_softmax (eval/perplexity.h) computes it (the sum's order differs: ~1e-15 relative).
std::vector<double> nll_rows(const float* logits, const std::vector<int32_t>& tokens, int S, int T, int64_t V);

}  // namespace ptq::cuda
