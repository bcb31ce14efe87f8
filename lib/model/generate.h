// generate.h — text generation on the CPU: the reference decode path (fp32, like the forward).
//
// A Generator holds every layer's fp32 weights and one sequence's KV cache (per layer, keys and
// values after rotary, fp32 [positions, kv_dim]). feed() runs new tokens through every layer at
// their positions, appending to the cache, and returns the logits of the last one: the prompt in
// one call (prefill), then one token per call (decode). The logits of a token fed this way equal
// the full forward's at its position (tests/test_generate.cpp checks them against transformers').
#pragma once
#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "model/llama.h"

namespace ptq {

class Generator {
 public:
  explicit Generator(const LlamaModel& m);   // loads every layer (fp32, resident)
  VecF feed(const std::vector<int32_t>& tokens);
  int position() const { return pos_; }       // tokens in the cache
  void reset();                               // empty the cache
 private:
  const LlamaModel& m_;
  std::vector<LayerWeights> layers_;
  std::vector<MatF> K_, V_;
  int pos_{0};
};

// Temperature 0: argmax (the lowest id on ties). Otherwise softmax(logits / temperature), cut to
// the smallest set of most likely tokens whose probability reaches top_p, sampled with rng.
struct Sampling {
  double temperature = 0;
  double top_p = 1;
};
int32_t sample_token(const VecF& logits, const Sampling& s, Rng& rng);

// The end-of-sequence ids of config.json's eos_token_id (a number or a list; none if absent).
std::vector<int32_t> eos_ids(const LlamaConfig& c);

}  // namespace ptq
