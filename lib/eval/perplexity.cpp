#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/progress.h"
#include "eval/data.h"

namespace ptq {

void log_softmax(const float* x, int n, double* out) {
  double m = -INFINITY;
  for (int i = 0; i < n; ++i) m = std::max(m, double(x[i]));
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(double(x[i]) - m);
  const double lse = m + std::log(s);
  for (int i = 0; i < n; ++i) out[i] = double(x[i]) - lse;
}

nlohmann::json EvalResult::to_json() const {
  nlohmann::json j = {{"perplexity", perplexity}, {"mean_nll", mean_nll},   {"scored_tokens", scored_tokens},
                      {"windows", windows},       {"seq_len", seq_len},     {"total_tokens", total_tokens},
                      {"seconds", seconds},       {"tokens_per_second", tokens_per_second}};
  if (protocol != "gptq") j["protocol"] = protocol;   // (absent: the GPTQ/HF protocol)
  if (kl)
    j["kl"] = {{"mean", kl->mean},           {"median", kl->median},           {"p99", kl->p99},
               {"max", kl->max},             {"top1_agreement", kl->top1_agreement}, {"mean_delta_p", kl->mean_delta_p},
               {"reference_perplexity", kl->reference_perplexity}};
  return j;
}

EvalResult evaluate(const LogitsFn& model, int max_positions, const std::vector<int32_t>& tokens, const EvalOptions& opt,
                    const LogitsFn* reference, const NllFn* nll_fn) {
  const int L = opt.seq_len;
  if (L < 2) fail(Errc::input, "", "seq_len", "must be at least 2");
  if (L > max_positions)
    fail(Errc::input, "", "seq_len", "window of " + std::to_string(L) + " tokens exceeds the model's context (max_position_embeddings " +
                                         std::to_string(max_positions) + ")");
  int64_t W = count_windows(tokens.size(), L);
  if (W == 0) fail(Errc::input, "", "data", "only " + std::to_string(tokens.size()) + " tokens: shorter than one window of " + std::to_string(L));
  if (opt.max_windows > 0) W = std::min(W, opt.max_windows);
  const int64_t per_chunk = std::max<int64_t>(1, opt.batch_tokens / L);

  const bool llama_cpp = opt.protocol == "llama.cpp";
  if (!llama_cpp && opt.protocol != "gptq") fail(Errc::usage, "", "--protocol", "must be gptq or llama.cpp");
  if (llama_cpp && opt.bos < 0) fail(Errc::usage, "", "--protocol", "llama.cpp's protocol starts each window with BOS; the tokenizer has none");
  const int64_t first = llama_cpp ? L / 2 : 0;   // the first scored position of each window
  EvalResult r;
  r.seq_len = L;
  r.protocol = opt.protocol;
  r.windows = W;
  r.total_tokens = int64_t(tokens.size());
  double nll_sum = 0, nll_sq_sum = 0, ref_nll_sum = 0, dp_sum = 0;
  int64_t top1 = 0;
  std::vector<double> kls;
  Progress bar(opt.label, double(W * L), "tok");
  for (int64_t w0 = 0; w0 < W; w0 += per_chunk) {
    const int S = int(std::min(per_chunk, W - w0));
    std::vector<int32_t> chunk(tokens.begin() + w0 * L, tokens.begin() + (w0 + S) * L);
    if (llama_cpp)
      for (int s = 0; s < S; ++s) chunk[size_t(s) * size_t(L)] = opt.bos;
    const int64_t rows = int64_t(S) * (L - 1);
    std::vector<double> nll, ref_nll(reference ? size_t(rows) : 0), kl(reference ? size_t(rows) : 0), dp(kl.size());
    std::vector<uint8_t> agree(kl.size());
    if (nll_fn && !reference) {   // the NLL computed where the logits are
      nll = (*nll_fn)(chunk, S, L);
      if (int64_t(nll.size()) != rows) fail(Errc::input, "", "nll", "the NLL function returned " + std::to_string(nll.size()) + " rows, not " + std::to_string(rows));
    } else {
      nll.resize(static_cast<size_t>(rows));
      const MatF logits = model(chunk, S, L);
      MatF ref_logits;
      if (reference) ref_logits = (*reference)(chunk, S, L);
      const int V = int(logits.cols());
#pragma omp parallel
      {
        std::vector<double> lp(static_cast<size_t>(V)), lr(static_cast<size_t>(V));
#pragma omp for schedule(static)
        for (int64_t k = 0; k < rows; ++k) {
          const int64_t s = k / (L - 1), t = k % (L - 1), row = s * L + t;
          const int32_t target = chunk[size_t(row + 1)];
          log_softmax(logits.row(row).data(), V, lp.data());
          nll[size_t(k)] = -lp[size_t(target)];
          if (reference) {
            log_softmax(ref_logits.row(row).data(), V, lr.data());
            ref_nll[size_t(k)] = -lr[size_t(target)];
            double d = 0;
            int am = 0, ar = 0;
            for (int v = 0; v < V; ++v) {
              d += std::exp(lr[size_t(v)]) * (lr[size_t(v)] - lp[size_t(v)]);
              if (lp[size_t(v)] > lp[size_t(am)]) am = v;
              if (lr[size_t(v)] > lr[size_t(ar)]) ar = v;
            }
            kl[size_t(k)] = std::max(0.0, d);
            agree[size_t(k)] = am == ar;
            dp[size_t(k)] = std::exp(lp[size_t(target)]) - std::exp(lr[size_t(target)]);
          }
        }
      }
    }
    for (int64_t k = 0; k < rows; ++k) {   // fixed order: results do not depend on the thread count
      if (k % (L - 1) < first) continue;
      nll_sum += nll[size_t(k)];
      nll_sq_sum += nll[size_t(k)] * nll[size_t(k)];
      ++r.scored_tokens;
      if (reference) { ref_nll_sum += ref_nll[size_t(k)]; dp_sum += dp[size_t(k)]; top1 += agree[size_t(k)]; kls.push_back(kl[size_t(k)]); }
    }
    bar.update(double((w0 + S) * L));
  }
  bar.finish();
  r.seconds = bar.elapsed();
  r.mean_nll = nll_sum / double(r.scored_tokens);
  r.perplexity = std::exp(r.mean_nll);
  if (r.scored_tokens > 1) {
    const double n = double(r.scored_tokens), var = std::max(0.0, nll_sq_sum / n - r.mean_nll * r.mean_nll);
    r.perplexity_std_error = r.perplexity * std::sqrt(var / (n - 1));
  }
  r.tokens_per_second = r.seconds > 0 ? double(W * L) / r.seconds : 0;   // evaluated tokens per second (a reference model's time included)
  if (reference) {
    KlStats k;
    const double n = double(kls.size());
    for (double v : kls) k.mean += v;
    k.mean /= n;
    std::sort(kls.begin(), kls.end());
    auto pct = [&](double p) { return kls[std::min(kls.size() - 1, size_t(p * (n - 1) + 0.5))]; };
    k.median = pct(0.5);
    k.p99 = pct(0.99);
    k.max = kls.back();
    k.top1_agreement = double(top1) / n;
    k.mean_delta_p = dp_sum / n;
    k.reference_perplexity = std::exp(ref_nll_sum / n);
    r.kl = k;
  }
  return r;
}

EvalResult evaluate(const LlamaModel& model, const std::vector<int32_t>& tokens, const EvalOptions& opt, const LlamaModel* reference) {
  EvalOptions o = opt;
  if (o.seq_len == 0) o.seq_len = model.config().max_position_embeddings;
  LogitsFn f = [&](const std::vector<int32_t>& t, int S, int T) { return model.forward(t, S, T); };
  if (!reference) return evaluate(f, model.config().max_position_embeddings, tokens, o);
  if (reference->config().vocab_size != model.config().vocab_size)
    fail(Errc::input, reference->dir(), "vocab_size", "reference model's vocabulary differs from the evaluated model's");
  LogitsFn g = [&](const std::vector<int32_t>& t, int S, int T) { return reference->forward(t, S, T); };
  return evaluate(f, model.config().max_position_embeddings, tokens, o, &g);
}

}  // namespace ptq
