// testing_cuda.h — what the GPU tests share: skipping without a GPU, the GPU solve of one Linear
// from a host Hessian (the tests' way into gptq_solve_cuda), and their inputs: random embeddings
// for a layer, the evaluation text and windows for perplexity comparisons.
#pragma once
#include "core/rng.h"
#include "eval/perplexity.h"
#include "gptq/gptq_cuda.h"
#include "model/corpus.h"
#include "model/tokenizer.h"
#include "model/weights.h"
#include "pipeline/pipeline.h"
#include "testing.h"

#define PTQ_REQUIRE_GPU() \
  if (!ptq::cuda::available()) PTQ_SKIP("no GPU: " + ptq::cuda::describe())

namespace ptqtest {

// GPTQ on the GPU for W [rows, cols] and H (host, already scaled): codes and grids on the host.
inline ptq::QuantizedLinear gpu_gptq(const ptq::MatF& W, const ptq::MatD& H, const ptq::QuantSpec& s, ptq::SolveStats* st = nullptr,
                                     const std::vector<float>* limits = nullptr) {
  ptq::cuda::DeviceBuffer<double> dH(size_t(H.size()), "test Hessian");
  ptq::cuda::copy_to_device(dH.get(), H.data(), size_t(H.size()) * 8);
  ptq::cuda::WeightRows rows;
  rows.rows = W.rows();
  rows.host = &W;
  return std::move(ptq::cuda::gptq_solve_cuda({rows}, W.cols(), ptq::HessianRef{dH.get(), 1.0}, s, ptq::cuda::SolveKeep::codes, st, limits).parts[0]);
}

// S windows of T random tokens (from `seed`) through the model's embedding: a decoder layer's input.
inline ptq::MatF random_embeddings(const ptq::LlamaModel& m, int S, int T, uint64_t seed) {
  std::vector<int32_t> tok(size_t(S) * size_t(T));
  ptq::Rng rng(seed);
  for (auto& t : tok) t = int32_t(rng.uniform() * (m.config().vocab_size - 1));
  return m.embed(tok);
}

// The tinystories evaluation text in `model`'s tokens, and the windows a comparison scores.
inline std::vector<int32_t> eval_tokens(const std::string& model) {
  auto tok = ptq::load_tokenizer(model, 1);
  return ptq::encode_corpus(*tok, assets() + "/text/tinystories/eval.txt");
}
inline ptq::EvalOptions eval_windows(int seq_len, int64_t windows) {
  ptq::EvalOptions o;
  o.seq_len = seq_len;
  o.max_windows = windows;
  return o;
}
// distilled-13m's evaluation as the GPU evaluation tests compare it: the model, its tokens of the
// evaluation text, and 16 windows of 512.
struct DistilledEval {
  std::string model;
  std::vector<int32_t> ids;
  ptq::EvalOptions windows;
};
inline DistilledEval distilled_eval() {
  const std::string model = assets() + "/models/distilled-13m";
  return {model, eval_tokens(model), eval_windows(512, 16)};
}

// The tiny checkpoint of `family` (random calibration, 16 windows of 48 tokens) quantized by r on
// the host into DIR/cpu, then on the GPU into DIR/gpu; r is left as the GPU run's recipe. The
// two runs' reports, the host's first.
inline std::pair<nlohmann::json, nlohmann::json> tiny_runs_cpu_gpu(ptq::Recipe& r, const std::string& family, const TempDir& d) {
  r.model = assets() + "/models/tiny-" + family;
  r.calibration = {"random", 16, 48, 0};
  r.device = "cpu";
  r.output = d / "cpu";
  nlohmann::json rc = ptq::run_quantize(r, {});
  r.device = "cuda";
  r.output = d / "gpu";
  return {std::move(rc), ptq::run_quantize(r, {})};
}

}  // namespace ptqtest
