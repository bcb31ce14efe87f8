#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/progress.h"
#include "core/safetensors.h"
#include "model/corpus.h"

namespace ptq {

void log_softmax(const float* x, int n, double* out) {
  double m = -INFINITY;
  for (int i = 0; i < n; ++i) m = std::max(m, double(x[i]));
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(double(x[i]) - m);
  const double lse = m + std::log(s);
  for (int i = 0; i < n; ++i) out[i] = double(x[i]) - lse;
}

namespace {
template <class T>
std::vector<T> raw_of(const SafetensorsFile& f, const std::string& name, DType dt, int64_t n) {
  const TensorView t = f.get(name);
  if (t.dtype != dt || int64_t(t.nbytes) != n * int64_t(sizeof(T)))
    fail(Errc::format, f.path(), name, "expected " + std::string(dtype_name(dt)) + " of " + std::to_string(n) + " elements");
  std::vector<T> v(static_cast<size_t>(n));
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}
}  // namespace

void TopLogits::save(const std::string& path) const {
  const int64_t rows = int64_t(target_logp.size());
  write_safetensors(path, {{"tokens", tensor_of_raw(DType::I32, {int64_t(tokens.size())}, tokens)}, {"top_ids", tensor_of_raw(DType::I32, {rows, k}, ids)},
                           {"top_logp", tensor_of_raw(DType::F32, {rows, k}, logp)}, {"target_logp", tensor_of_raw(DType::F32, {rows}, target_logp)}},
                    {{"format", "ptqkit-top-logits"}, {"k", std::to_string(k)}, {"seq_len", std::to_string(seq_len)},
                     {"vocab", std::to_string(vocab)}, {"protocol", protocol}});
}

TopLogits TopLogits::load(const std::string& path) {
  SafetensorsFile f(path);
  auto meta = [&](const char* key) {
    auto it = f.metadata().find(key);
    if (it == f.metadata().end()) fail(Errc::format, path, std::string("__metadata__.") + key, "missing: not a file written by eval --save-logits");
    return it->second;
  };
  if (meta("format") != "ptqkit-top-logits") fail(Errc::format, path, "__metadata__.format", "not a file written by eval --save-logits");
  TopLogits t;
  t.k = std::atoi(meta("k").c_str());
  t.seq_len = std::atoi(meta("seq_len").c_str());
  t.vocab = std::atoi(meta("vocab").c_str());
  t.protocol = meta("protocol");
  if (t.k < 1 || t.seq_len < 2 || t.vocab < t.k) fail(Errc::format, path, "__metadata__", "k, seq_len or vocab out of range");
  const int64_t n = f.get("tokens").shape.empty() ? 0 : f.get("tokens").shape[0], rows = n / t.seq_len * (t.seq_len - 1);
  t.tokens = raw_of<int32_t>(f, "tokens", DType::I32, n);
  t.ids = raw_of<int32_t>(f, "top_ids", DType::I32, rows * t.k);
  t.logp = raw_of<float>(f, "top_logp", DType::F32, rows * t.k);
  t.target_logp = raw_of<float>(f, "target_logp", DType::F32, rows);
  for (int32_t id : t.ids)
    if (id < 0 || id >= t.vocab) fail(Errc::format, path, "top_ids", "a token id outside the vocabulary");
  return t;
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
  if (W == 0)
    fail(Errc::input, "", "data", "only " + std::to_string(tokens.size()) + " tokens: shorter than one window of " + std::to_string(L) + " (a shorter --seq-len, or more text)");
  if (opt.max_windows > 0) W = std::min(W, opt.max_windows);
  const int64_t per_chunk = std::max<int64_t>(1, opt.batch_tokens / L);
  const TopLogits* base = opt.kl_base;
  if (base && reference) fail(Errc::usage, "", "--kl-base", "give a reference model or saved reference logits, not both");
  if (base && (base->seq_len != L || base->protocol != opt.protocol || int64_t(base->tokens.size()) != W * L ||
               !std::equal(base->tokens.begin(), base->tokens.end(), tokens.begin())))
    fail(Errc::input, "", "--kl-base", "the saved logits are of other windows (seq_len " + std::to_string(base->seq_len) + ", protocol " + base->protocol + ", " +
                                           std::to_string(base->tokens.size() / size_t(std::max(base->seq_len, 1))) + " windows): evaluate the same data, --seq-len, --protocol and --max-windows");
  TopLogits* save = opt.save_top;
  if (save) {
    save->seq_len = L;
    save->protocol = opt.protocol;
    save->tokens.assign(tokens.begin(), tokens.begin() + W * L);
    save->ids.assign(size_t(W * (L - 1) * save->k), 0);
    save->logp.assign(save->ids.size(), 0.0f);
    save->target_logp.assign(size_t(W * (L - 1)), 0.0f);
  }
  const bool compare = reference || base;

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
    std::vector<double> nll, ref_nll(compare ? size_t(rows) : 0), kl(compare ? size_t(rows) : 0), dp(kl.size());
    std::vector<uint8_t> agree(kl.size());
    if (nll_fn && !compare && !save) {   // the NLL computed where the logits are
      nll = (*nll_fn)(chunk, S, L);
      if (int64_t(nll.size()) != rows) fail(Errc::input, "", "nll", "the NLL function returned " + std::to_string(nll.size()) + " rows, not " + std::to_string(rows));
    } else {
      nll.resize(static_cast<size_t>(rows));
      const MatF logits = model(chunk, S, L);
      MatF ref_logits;
      if (reference) ref_logits = (*reference)(chunk, S, L);
      const int V = int(logits.cols());
      if (save) save->vocab = V;
      if (save && save->k > V) fail(Errc::usage, "", "--save-logits-k", "larger than the vocabulary (" + std::to_string(V) + ")");
      if (base && base->vocab != V) fail(Errc::input, "", "--kl-base", "saved for a vocabulary of " + std::to_string(base->vocab) + ", the model has " + std::to_string(V));
#pragma omp parallel
      {
        std::vector<double> lp(static_cast<size_t>(V)), lr(static_cast<size_t>(V));
        std::vector<int32_t> order(static_cast<size_t>(V));
#pragma omp for schedule(static)
        for (int64_t k = 0; k < rows; ++k) {
          const int64_t s = k / (L - 1), t = k % (L - 1), row = s * L + t, g = w0 * (L - 1) + k;   // g: the row in all windows
          const int32_t target = chunk[size_t(row + 1)];
          log_softmax(logits.row(row).data(), V, lp.data());
          nll[size_t(k)] = -lp[size_t(target)];
          if (save) {   // the K most likely, ties by id (deterministic)
            std::iota(order.begin(), order.end(), 0);
            std::partial_sort(order.begin(), order.begin() + save->k, order.end(),
                              [&](int32_t a, int32_t b) { return lp[size_t(a)] > lp[size_t(b)] || (lp[size_t(a)] == lp[size_t(b)] && a < b); });
            for (int j = 0; j < save->k; ++j) {
              save->ids[size_t(g * save->k + j)] = order[size_t(j)];
              save->logp[size_t(g * save->k + j)] = float(lp[size_t(order[size_t(j)])]);
            }
            save->target_logp[size_t(g)] = float(lp[size_t(target)]);
          }
          if (!compare) continue;
          // the reference's KL, its argmax and its log-probability of the target: from its logits,
          // or from the saved top K (KL over them and the rest of the mass as one bucket)
          double d = 0, ref_target;
          int am = 0, ar = 0;
          for (int v = 1; v < V; ++v)
            if (lp[size_t(v)] > lp[size_t(am)]) am = v;
          if (base) {
            const int32_t* id = &base->ids[size_t(g * base->k)];
            const float* lb = &base->logp[size_t(g * base->k)];
            double p_top = 0, q_top = 0;
            for (int j = 0; j < base->k; ++j) {
              const double p = std::exp(double(lb[j]));
              d += p * (double(lb[j]) - lp[size_t(id[j])]);
              p_top += p;
              q_top += std::exp(lp[size_t(id[j])]);
            }
            const double p_rest = 1.0 - p_top, q_rest = std::max(1.0 - q_top, 1e-300);
            if (p_rest > 1e-12) d += p_rest * (std::log(p_rest) - std::log(q_rest));
            ar = id[0];
            ref_target = double(base->target_logp[size_t(g)]);
          } else {
            log_softmax(ref_logits.row(row).data(), V, lr.data());
            for (int v = 0; v < V; ++v) {
              d += std::exp(lr[size_t(v)]) * (lr[size_t(v)] - lp[size_t(v)]);
              if (lr[size_t(v)] > lr[size_t(ar)]) ar = v;
            }
            ref_target = lr[size_t(target)];
          }
          kl[size_t(k)] = std::max(0.0, d);
          agree[size_t(k)] = am == ar;
          ref_nll[size_t(k)] = -ref_target;
          dp[size_t(k)] = std::exp(lp[size_t(target)]) - std::exp(ref_target);
        }
      }
    }
    for (int64_t k = 0; k < rows; ++k) {   // fixed order: results do not depend on the thread count
      if (k % (L - 1) < first) continue;
      nll_sum += nll[size_t(k)];
      nll_sq_sum += nll[size_t(k)] * nll[size_t(k)];
      ++r.scored_tokens;
      if (compare) { ref_nll_sum += ref_nll[size_t(k)]; dp_sum += dp[size_t(k)]; top1 += agree[size_t(k)]; kls.push_back(kl[size_t(k)]); }
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
  if (compare) {
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
