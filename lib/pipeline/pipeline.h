// pipeline.h — `ptqkit quantize`: calibrate and quantize a model layer by layer (algorithms.md).
//
// For each decoder layer, one forward pass over all calibration windows, stage by stage:
//   xn = norm1(x)     -> H_qkv  -> quantize q, k, v   (one Hessian for the three)
//   ctx = attn(xn)    -> H_o    -> quantize o          (attention uses the quantized q, k, v)
//   x += o(ctx); xn2 = norm2(x) -> H_mlp -> quantize gate, up
//   act = mlp(xn2)    -> H_down -> quantize down
//   x += down(act)    -> the next layer's input, computed with the quantized layer.
// Without true_sequential, the four Hessians come from one float pass, then a second pass with
// the quantized layer produces the next input. Resident memory: one layer's fp32 weights, the
// calibration activations, and the Hessians of the current group.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>

#include "pipeline/recipe.h"

namespace ptq {

namespace cuda { class Comm; }

// One process of a `--gpus N` run (pipeline/distributed.h): rank 0 writes everything; the others
// run the same layers on their share of the calibration windows and write nothing.
struct DistRank {
  int rank = 0, size = 1;
  const cuda::Comm* comm = nullptr;
  std::function<void()> layers_done;   // every rank, after its last layer's collectives: closes the communicator
  // Every rank, before its first layer: rank 0's first layer to quantize (--resume: the layers
  // before it are replayed from rank 0's layer store), whatever the others pass.
  std::function<int(int)> first_layer;
  // Rank 0 saves statistics (--save-stats): every rank's solves read the finalized host H, as
  // rank 0's must (a saved H is what a --load-stats run solves with), so that no rank splits a
  // solve across the ranks that another solves whole.
  bool host_hessians = false;
};

struct QuantizeOptions {
  bool force = false;
  bool resume = false;   // continue from the layers an interrupted run of the same recipe finished
  std::string save_stats;   // keep the Hessians and activation statistics here (pipeline/stats.h)
  std::string load_stats;   // quantize from statistics saved by an earlier run instead of running the model
  const DistRank* dist = nullptr;   // set for each rank by run_quantize_gpus and the workers
  // Tests: fail (Errc::usage, naming stop_after_layer) once layer k is saved, leaving the output folder as an
  // interrupted run leaves it for --resume (with resume set: a fresh run keeps nothing on failure).
  int stop_after_layer = -1;
  // Check and plan only (`quantize --dry-run`): every check a run makes before it calibrates, then
  // the plan as JSON ({"dry_run": true, ...}) instead of the report; nothing is written.
  bool dry_run = false;
};

// Runs the recipe and writes its output folder (model files, recipe.yaml, report.json)
// atomically. Returns the report. A recipe with gpus >= 1 runs through run_quantize_gpus
// (pipeline/distributed.h); a rank other than 0 returns an empty report.
nlohmann::json run_quantize(const Recipe& recipe, const QuantizeOptions& opt);

double peak_rss_mb();

// Refuses (Errc::io, naming `dir`) a run that must write at least `need` bytes (`what`: which
// outputs) where the file system holding `dir` has `free` left; warns where it fits with less than
// half of `need` again to spare (the bound leaves out scales, metadata and headers). run_quantize
// calls it before calibrating, with a lower bound of the layer store, the exports and --save-stats.
void check_room(const std::string& dir, const std::string& what, int64_t need, int64_t free);

}  // namespace ptq
