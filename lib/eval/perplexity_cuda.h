// perplexity_cuda.h — the evaluation forward on the GPU, as a LogitsFn for evaluate() (the
// protocol and the KL statistics stay in perplexity.cpp, shared with the CPU) and, without a
// reference model, as an NllFn: the fp64 log-softmax of each scored row on the device
// (eval/nll_cuda.h), so only one double per token comes back to the host.
//
// Float checkpoints run through their weights in 16 bits; gptq / gptq_v2 checkpoints (4 or 8
// bits) through the W4A16 / W8A16 kernels of lib/kernels/w4a16.cu, bitsandbytes NF4 checkpoints
// through lib/kernels/nf4.cu, converted once at load time and resident; Linears a checkpoint
// keeps in float run as 16-bit GEMMs. Activations: the fp32 residual stream and 16-bit GEMM
// operands of lib/model/forward_cuda (docs/numerics.md). A layer's q, k, v (and gate, up) stored
// alike are stacked into one Linear at load time: the same rows, one launch (the decode's and
// Phi-3's fused layout).
#pragma once
#include <memory>
#include <string>

#include "cuda/runtime.h"
#include "eval/decode_cuda.h"
#include "eval/perplexity.h"

namespace ptq::cuda {

// Whether the GPU evaluation serves this checkpoint format (model_format's names).
bool eval_supported(const std::string& format, std::string* why);

class GpuLogits {
 public:
  GpuLogits(const LlamaModel& model, const std::string& path);
  ~GpuLogits();
  MatF operator()(const std::vector<int32_t>& tokens, int S, int T) const;   // logits [S*T, vocab] on the host
  std::vector<double> nll(const std::vector<int32_t>& tokens, int S, int T) const;   // per scored row, evaluate()'s NllFn
  double forward_seconds() const;   // GPU time of the forward passes and the logits GEMMs (the prefill)
  std::string describe() const;     // what runs the Linears
  // The same resident weights for the decode engine (eval/decode_cuda.h), which keeps them alive.
  DecodeWeights decode_weights() const;
  struct Impl;   // the resident weights (perplexity_cuda.cu)
 private:
  DeviceBuffer<float> forward(const std::vector<int32_t>& tokens, int S, int T) const;   // logits [S*T, vocab] on the device
  std::shared_ptr<Impl> p_;
};

}  // namespace ptq::cuda
