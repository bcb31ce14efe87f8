// perplexity.h — perplexity under the GPTQ/HF protocol (non-overlapping windows of L tokens,
// every token but each window's first scored) or llama.cpp's (llama-perplexity: the same windows,
// each window's first token replaced by BOS, only the second half of each window scored: the
// predictions of tokens L/2 + 1 .. L - 1) and, against a reference model on the same windows,
// llama.cpp's KL-divergence statistics. Log-probabilities and sums are taken in fp64.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "model/llama.h"

namespace ptq {

// A reference model's top logits kept on disk (`eval --save-logits`), so that evaluations of its
// quantized variants get the KL statistics without running it again (`--kl-base`). Per row of
// every window (position t predicting t + 1): the K most likely tokens' ids and log-probabilities,
// and the target's log-probability, fp32. KL(P || Q) is taken over those K tokens and the rest of
// the mass as one bucket, sum_i p_i log(p_i / q_i) + p_rest log(p_rest / q_rest): a lower bound of
// the full KL (the log-sum inequality), exact when K is the vocabulary.
struct TopLogits {
  int k = 0, seq_len = 0, vocab = 0;
  std::string protocol;
  std::vector<int32_t> tokens;      // the evaluated windows [W * L], as fed (checked on reuse)
  std::vector<int32_t> ids;         // [rows, k], rows = W * (L - 1), most likely first
  std::vector<float> logp;          // [rows, k]
  std::vector<float> target_logp;   // [rows]
  void save(const std::string& path) const;   // safetensors
  static TopLogits load(const std::string& path);
};

struct EvalOptions {
  int seq_len = 0;                 // 0: the model's max_position_embeddings
  int64_t max_windows = -1;        // -1: all
  int64_t batch_tokens = 16384;    // tokens per forward chunk (bounds activation memory)
  std::string label = "eval";
  std::string protocol = "gptq";   // or "llama.cpp"
  int bos = -1;                    // llama.cpp protocol: the BOS id each window starts with
  TopLogits* save_top = nullptr;   // filled with this model's top logits (save_top->k set by the caller)
  const TopLogits* kl_base = nullptr;   // the reference's saved top logits: KL statistics without a reference model
};

struct KlStats {
  double mean = 0, median = 0, p99 = 0, max = 0;
  double top1_agreement = 0;       // fraction of scored positions whose argmax agrees
  double mean_delta_p = 0;         // mean of p(correct) - p_ref(correct)
  double reference_perplexity = 0;
};

struct EvalResult {
  double perplexity = 0, mean_nll = 0;
  int64_t scored_tokens = 0, windows = 0, total_tokens = 0;
  int seq_len = 0;
  std::string protocol = "gptq";
  double perplexity_std_error = 0;   // ppl x the standard error of the mean NLL (llama-perplexity's "+/-")
  double seconds = 0, tokens_per_second = 0;
  std::optional<KlStats> kl;
  nlohmann::json to_json() const;
};

// Something that turns S windows of T tokens into logits [S*T, vocab]: a float model, later a
// quantized one. Evaluation does not care which.
using LogitsFn = std::function<MatF(const std::vector<int32_t>& tokens, int S, int T)>;

// Or, where the logits need not reach the host (no reference model): the NLL of each scored row
// (window s, position t < T - 1, target tokens[s*T + t + 1]) in that order, fp64.
using NllFn = std::function<std::vector<double>(const std::vector<int32_t>& tokens, int S, int T)>;

// nll, when given, serves the runs without a reference (the logits function then serves none).
EvalResult evaluate(const LogitsFn& model, int max_positions, const std::vector<int32_t>& tokens, const EvalOptions& opt,
                    const LogitsFn* reference = nullptr, const NllFn* nll = nullptr);
EvalResult evaluate(const LlamaModel& model, const std::vector<int32_t>& tokens, const EvalOptions& opt,
                    const LlamaModel* reference = nullptr);

// log-softmax of one row, in fp64.
void log_softmax(const float* logits, int n, double* out);

}  // namespace ptq
