#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace ptq {

Generator::Generator(const LlamaModel& m) : m_(m) {
  const int L = m.config().num_hidden_layers;
  layers_.reserve(size_t(L));
  for (int i = 0; i < L; ++i) layers_.push_back(m.load_layer(i));
  reset();
}

void Generator::reset() {
  const int L = m_.config().num_hidden_layers;
  K_.assign(size_t(L), MatF());
  V_.assign(size_t(L), MatF());
  pos_ = 0;
}

VecF Generator::feed(const std::vector<int32_t>& tokens) {
  const LlamaConfig& c = m_.config();
  if (tokens.empty()) fail(Errc::input, m_.dir(), "tokens", "nothing to feed");
  const int T = int(tokens.size());
  if (pos_ + T > c.max_position_embeddings)
    fail(Errc::input, m_.dir(), "max_position_embeddings",
         "position " + std::to_string(pos_ + T) + " is past the model's context of " + std::to_string(c.max_position_embeddings) + " tokens");
  MatF x = m_.embed(tokens);
  const Rope& rope = m_.rope(pos_ + T);
  for (size_t i = 0; i < layers_.size(); ++i) decoder_layer_cached(layers_[i], c, rope, K_[i], V_[i], x);
  pos_ += T;
  MatF out;
  const MatF last = x.bottomRows(1);
  m_.logits(last, out);
  return out.row(0).transpose();
}

int32_t sample_token(const VecF& logits, const Sampling& s, Rng& rng) {
  const Eigen::Index n = logits.size();
  if (s.temperature <= 0) {
    Eigen::Index best = 0;
    for (Eigen::Index i = 1; i < n; ++i)
      if (logits[i] > logits[best]) best = i;
    return int32_t(best);
  }
  // Probabilities in fp64, most likely first (ties by id), cut at top_p, renormalized.
  const double mx = double(logits.maxCoeff());
  std::vector<double> p(static_cast<size_t>(n));
  for (Eigen::Index i = 0; i < n; ++i) p[size_t(i)] = std::exp((double(logits[i]) - mx) / s.temperature);
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  double kept = 0;
  size_t k = 0;
  while (k < order.size() && (k == 0 || kept < s.top_p * total)) kept += p[size_t(order[k++])];
  double u = rng.uniform() * kept;
  for (size_t i = 0; i < k; ++i) {
    u -= p[size_t(order[i])];
    if (u < 0) return order[i];
  }
  return order[k - 1];
}

std::vector<int32_t> eos_ids(const LlamaConfig& c) {
  std::vector<int32_t> r;
  if (!c.raw.contains("eos_token_id")) return r;
  const auto& e = c.raw["eos_token_id"];
  if (e.is_number_integer()) r.push_back(e.get<int32_t>());
  else if (e.is_array())
    for (auto& x : e)
      if (x.is_number_integer()) r.push_back(x.get<int32_t>());
  return r;
}

}  // namespace ptq
