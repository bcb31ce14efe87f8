// quantize.cpp — `ptqkit quantize RECIPE.yaml`: run a recipe, print a summary.
#include <cstdio>
#include <memory>

#include "command.h"
#include "core/progress.h"
#include "pipeline/pipeline.h"

namespace ptq {

namespace {
struct QuantizeArgs {
  std::string recipe, model, output, save_stats, load_stats;
  std::vector<std::string> sets;
  bool force = false, resume = false;
};

int run(const QuantizeArgs& a) {
  std::vector<std::string> sets = a.sets;
  if (!a.model.empty()) sets.push_back("model=" + a.model);
  if (!a.output.empty()) sets.push_back("output=" + a.output);
  Recipe r = load_recipe(a.recipe, sets);
  QuantizeOptions o;
  o.force = a.force;
  o.resume = a.resume;
  o.save_stats = a.save_stats;
  o.load_stats = a.load_stats;
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
  for (auto& o : rep["outputs"]) {   // dir: relative to the output folder ("." for a single format)
    const std::string dir = o["dir"].get<std::string>() == "." ? r.output : r.output + "/" + o["dir"].get<std::string>();
    std::printf("  wrote %s in %s\n", o["format"].get<std::string>().c_str(), dir.c_str());
  }
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

}  // namespace

Command add_quantize(CLI::App& app) {
  auto a = std::make_shared<QuantizeArgs>();
  CLI::App* sub = app.add_subcommand("quantize", "calibrate and quantize a model with a YAML recipe (GPTQ or RTN)");
  sub->add_option("recipe", a->recipe, "recipe file (configs/*.yaml)")->required();
  sub->add_option("--model", a->model, "model folder (overrides the recipe's model)");
  sub->add_option("--output", a->output, "output folder (overrides the recipe's output)");
  sub->add_option("--set", a->sets, "override a recipe field: key.path=value (repeatable)");
  sub->add_flag("--force", a->force, "replace an existing output folder");
  sub->add_option("--save-stats", a->save_stats, "keep the Hessians and activation statistics in this folder");
  sub->add_option("--load-stats", a->load_stats,
                  "quantize from statistics saved with --save-stats (same model and calibration) without running the model");
  sub->add_flag("--resume", a->resume, "continue an interrupted run of the same recipe from its last finished layer");
  return {sub, [a] { return run(*a); }};
}

}  // namespace ptq
