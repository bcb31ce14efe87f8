// stats.h — calibration statistics saved by one run and reused by another (--save-stats DIR,
// --load-stats DIR): re-quantize with other bits, groups, damping, act-order or clipping without
// running the model again.
//
// DIR/stats.json           {"ptqkit_stats": 1, "key": {...}, "layers": N}, written last (a folder
//                          without it is unfinished and refused)
// DIR/layer-00012.safetensors
//   hessian.qkv, hessian.o, hessian.mlp, hessian.down   F64 [n, n]  the Hessians 2/N sum x x^T the
//                                                        saving run used, exactly (fp64, so that a
//                                                        reload reproduces its codes bit for bit)
//   smooth.<norm>                                        F32 [n]     SmoothQuant factors folded in
//   metadata "layer": {"smoothquant": [...], "act_scales": {"qkv": s, ...}}
//
// The key: SHA-256 of the model's config.json and weight files, the calibration windows (dataset
// digest, seed, offsets, lengths), and what shapes the statistics: true_sequential, smoothquant,
// activations. A run whose key differs is refused, naming the first field that differs.
// With true_sequential, layer l's Hessians were collected on inputs computed with the saving
// run's quantized layers 0..l-1; a reload with other bits uses those (docs/numerics.md).
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/fsutil.h"
#include "core/safetensors.h"
#include "gptq/gptq.h"
#include "pipeline/recipe.h"

namespace ptq {

// SHA-256 over config.json and each weight file the loader reads (core/checkpoint.h: the
// safetensors shards, or failing them the PyTorch .bin shards), in name order; a progress bar.
std::string model_digest(const std::string& model_dir);
// The weight files again, cheaply, for --resume's fingerprint: each one's name, size and the
// SHA-256 of its first and last MiB (2 MiB a file read, whatever the model's size). Another
// checkpoint of the same config (a fine-tune) differs there; a byte changed in between does not.
nlohmann::json model_sample(const std::string& model_dir);
nlohmann::json stats_key(const std::string& model_digest, const nlohmann::json& calibration, const Recipe& r);

struct LayerStats {
  std::map<std::string, MatD> hessians;     // "qkv", "o", "mlp", "down"
  std::map<std::string, VecF> smoothing;    // norm name -> factors
  nlohmann::json meta = nlohmann::json::object();
};

class StatsWriter {
 public:
  StatsWriter(const std::string& dir, bool force, bool resume, nlohmann::json key);
  void save_layer(int layer, const LayerStats& s);
  void commit(int layers);
  const std::string& path() const { return out_.path(); }
 private:
  OutputDir out_;
  nlohmann::json key_;
};

class StatsReader {
 public:
  // Refuses a missing or unfinished folder, and a key that differs from `expected`.
  StatsReader(const std::string& dir, const nlohmann::json& expected);
  LayerStats load_layer(int layer) const;
 private:
  std::string dir_;
  int layers_ = 0;
};

}  // namespace ptq
