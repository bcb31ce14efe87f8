// quantize.cpp — `ptqkit quantize RECIPE.yaml`: run a recipe, print a summary.
#include <cstdio>

#include "commands.h"
#include "core/progress.h"
#include "pipeline/pipeline.h"

namespace ptq {

namespace {
struct QuantizeArgs {
  std::string recipe, model, output, save_stats, load_stats;
  std::vector<std::string> sets;
  bool force = false, resume = false;
} g_qa;
CLI::App* g_quantize = nullptr;
}  // namespace

void register_quantize(CLI::App& app) {
  g_quantize = app.add_subcommand("quantize", "calibrate and quantize a model with a YAML recipe (GPTQ or RTN)");
  g_quantize->add_option("recipe", g_qa.recipe, "recipe file (configs/*.yaml)")->required();
  g_quantize->add_option("--model", g_qa.model, "model folder (overrides the recipe's model)");
  g_quantize->add_option("--output", g_qa.output, "output folder (overrides the recipe's output)");
  g_quantize->add_option("--set", g_qa.sets, "override a recipe field: key.path=value (repeatable)");
  g_quantize->add_flag("--force", g_qa.force, "replace an existing output folder");
  g_quantize->add_option("--save-stats", g_qa.save_stats, "keep the Hessians and activation statistics in this folder");
  g_quantize->add_option("--load-stats", g_qa.load_stats,
                         "quantize from statistics saved with --save-stats (same model and calibration) without running the model");
  g_quantize->add_flag("--resume", g_qa.resume, "continue an interrupted run of the same recipe from its last finished layer");
}

bool quantize_parsed() { return g_quantize && g_quantize->parsed(); }

int run_quantize_command() {
  std::vector<std::string> sets = g_qa.sets;
  if (!g_qa.model.empty()) sets.push_back("model=" + g_qa.model);
  if (!g_qa.output.empty()) sets.push_back("output=" + g_qa.output);
  Recipe r = load_recipe(g_qa.recipe, sets);
  QuantizeOptions o;
  o.force = g_qa.force;
  o.resume = g_qa.resume;
  o.save_stats = g_qa.save_stats;
  o.load_stats = g_qa.load_stats;
  nlohmann::json rep = run_quantize(r, o);
  log_event("result", {{"command", "quantize"}, {"output", r.output}, {"total_seconds", rep["total_seconds"]},
                       {"phases_seconds", rep["phases_seconds"]}, {"modules", rep["modules"].size()}, {"outputs", rep["outputs"]},
                       {"report", r.output + "/report.json"}});
  double ratio = 0, worst = 0;
  std::string worst_name;
  for (auto& m : rep["modules"]) {
    if (!m.contains("loss_ratio_vs_rtn")) continue;   // NF4: data-free, no error measured
    const double x = m["loss_ratio_vs_rtn"];
    ratio += x;
    if (x > worst) { worst = x; worst_name = m["name"]; }
  }
  const size_t n = rep["modules"].size();
  std::printf("quantized %zu modules of %s into %s\n", n, r.model.c_str(), r.output.c_str());
  for (auto& o : rep["outputs"]) std::printf("  wrote %s in %s\n", o["format"].get<std::string>().c_str(), o["dir"].get<std::string>().c_str());
  if (n && ratio > 0) std::printf("  output error vs RTN: mean ratio %.3f, worst %.3f (%s)\n", ratio / double(n), worst, worst_name.c_str());
  if (rep["calibration"].contains("samples"))
    std::printf("  calibration: %d x %d tokens from %s (seed %llu)\n", rep["calibration"]["samples"].get<int>(),
                rep["calibration"]["seq_len"].get<int>(), r.calibration.dataset.c_str(), (unsigned long long)r.calibration.seed);
  else
    std::printf("  calibration: none (data-free)\n");
  std::printf("  time %s total:", format_seconds(rep["total_seconds"]).c_str());
  for (auto& [k, v] : rep["phases_seconds"].items()) std::printf(" %s %.1fs", k.c_str(), v.get<double>());
  std::printf("; peak memory %.0f MiB\n", rep["peak_rss_mb"].get<double>());
  std::printf("  report: %s/report.json, %s/report.html\n", r.output.c_str(), r.output.c_str());
  return 0;
}

}  // namespace ptq
