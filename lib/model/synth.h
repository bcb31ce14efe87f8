// synth.h — synthetic Llama checkpoints with real models' shapes, for tests and benchmarks.
//
// Weights: projections N(0, 1/in) (o/down scaled by 1/sqrt(2 * layers)) with a heavy tail (0.1% of
// entries x4); norm weights near 1, except a few fixed "outlier" channels (x24 in every
// layer's input and post-attention norms), which make those channels' activations large, as in
// real LLMs, so that quantization error and SmoothQuant are not trivial. Deterministic by seed:
// each tensor's values depend only on (seed, tensor name), never on thread count.
#pragma once
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace ptq {

struct SynthOptions {
  std::string preset = "tiny";
  int layers = -1;                      // -1: the preset's
  uint64_t seed = 0;
  DType dtype = DType::F16;
  size_t max_shard_bytes = size_t(2) << 30;
  bool force = false;
};

std::vector<std::string> synth_presets();
nlohmann::json synth_config_json(const std::string& preset, int layers, DType dtype);   // Errc::usage for unknown presets
std::vector<int> outlier_channels(int hidden, uint64_t seed);
void synth_model(const SynthOptions& opt, const std::string& out_dir);

}  // namespace ptq
