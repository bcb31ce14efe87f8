// quantize.cpp — `ptqkit quantize RECIPE.yaml` or `ptqkit quantize --model DIR --scheme W4A16
// --dataset FILE -o OUT`: run a recipe (or a named scheme's), print a summary; `ptqkit schemes`
// and `ptqkit formats` list what --scheme and --format take.
#include <algorithm>
#include <cstdio>
#include <memory>

#include "command.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/progress.h"
#include "pipeline/distributed.h"
#include "pipeline/pipeline.h"
#include "pipeline/schemes.h"

namespace ptq {

namespace {
struct QuantizeArgs {
  std::string recipe, scheme, dataset, format, model, output, save_stats, load_stats;
  std::vector<std::string> sets;
  bool force = false, resume = false, dry_run = false;
  int gpus = -1;   // -1: the recipe's
};
struct WorkerArgs {
  std::string recipe, id;
  int rank = 0, size = 0;
  bool host_hessians = false;
};

// `--dry-run`: the plan run_quantize checked, for a person (the JSON goes to --log-json).
int print_plan(const nlohmann::json& p) {
  const nlohmann::json& m = p["model"];
  std::printf("plan: quantize %s (%s, %d layers, hidden %d, %s) into %s\n", m["path"].get<std::string>().c_str(), m["model_type"].get<std::string>().c_str(),
              m["layers"].get<int>(), m["hidden_size"].get<int>(), m["dtype"].get<std::string>().c_str(), p["output"].get<std::string>().c_str());
  std::printf("  device: %s%s\n", p["device"].get<std::string>().c_str(),
              p["gpus"].get<int>() > 1 ? (", data-parallel over " + std::to_string(p["gpus"].get<int>()) + " GPUs (NCCL)").c_str() : "");
  const nlohmann::json& cal = p["calibration"];
  if (!cal.contains("samples")) std::printf("  calibration: none (data-free)\n");
  else if (cal["dataset"] == "random")
    std::printf("  calibration: %d x %d RANDOM tokens (seed %llu), not text: give --dataset FILE to tune the quantization to real input\n",
                cal["samples"].get<int>(), cal["seq_len"].get<int>(), (unsigned long long)cal["seed"].get<uint64_t>());
  else
    std::printf("  calibration: %d x %d tokens from %s (seed %llu)\n", cal["samples"].get<int>(), cal["seq_len"].get<int>(), cal["dataset"].get<std::string>().c_str(),
                (unsigned long long)cal["seed"].get<uint64_t>());
  if (const nlohmann::json& q = p["recipe"]["quantization"]; q.contains("activations") && q["activations"].is_object()) {
    const nlohmann::json& act = q["activations"];
    std::printf("  activations: int%d, %s per %s\n", act.value("bits", 8), act.value("dynamic", true) ? "dynamic" : "static",
                act.value("strategy", std::string("token")).c_str());
  }
  if (p.contains("awq")) {
    const char* clip = p["awq"]["clip"].get<bool>() ? "each group's range clipped where that lowers its output error (all but q/k)" : "no clipping";
    if (p["awq"]["pairs"].empty())
      std::printf("  AWQ: no scales (pairs: []); %s\n", clip);
    else
      std::printf("  AWQ: scales searched per layer over %d ratios (%s) on %s; %s\n", p["awq"]["grid"].get<int>(),
                  p["awq"]["duo_scaling"].get<bool>() ? "activations and weights" : "activations", p["awq"]["pairs"].dump().c_str(), clip);
  }
  if (p.contains("smoothquant"))
    std::printf("  SmoothQuant: alpha %s\n", p["smoothquant"]["alpha"].is_string() ? "auto (searched per layer)" : p["smoothquant"]["alpha"].dump().c_str());
  std::printf("  %lld Linears:\n", (long long)p["linears"].get<int64_t>());
  for (const auto& g : p["quantized"])
    std::printf("    %5lld  %s (e.g. %s)\n", (long long)g["modules"].get<int64_t>(), g["quantization"].get<std::string>().c_str(), g["example"].get<std::string>().c_str());
  if (!p["kept_in_float"].empty())
    std::printf("    %5zu  kept in %s (e.g. %s)\n", p["kept_in_float"].size(), m["dtype"].get<std::string>().c_str(), p["kept_in_float"][0].get<std::string>().c_str());
  std::string formats;
  for (const auto& f : p["formats"]) formats += (formats.empty() ? "" : ", ") + f.get<std::string>();
  std::printf("  formats: %s\n", formats.c_str());
  if (const nlohmann::json& e = p["recipe"]["export"]; e.contains("gguf_output_type")) {
    auto type = [&](const char* k) { return e[k] == "float" ? m["dtype"].get<std::string>() : e[k].get<std::string>(); };
    if (m.value("tie_word_embeddings", false))
      std::printf("  gguf: token_embd.weight %s, the output too (tied embeddings; export.gguf_embedding_type)\n", type("gguf_embedding_type").c_str());
    else
      std::printf("  gguf: output.weight %s, token_embd.weight %s (export.gguf_output_type, gguf_embedding_type)\n", type("gguf_output_type").c_str(),
                  type("gguf_embedding_type").c_str());
  }
  const nlohmann::json& d = p["disk_min_bytes"];
  std::printf("  disk: at least %s (layer store %s, exports %s", human_bytes(d["store"].get<double>() + d["exports"].get<double>() + d["stats"].get<double>()).c_str(),
              human_bytes(d["store"].get<double>()).c_str(), human_bytes(d["exports"].get<double>()).c_str());
  if (d["stats"].get<int64_t>() > 0) std::printf(", --save-stats %s", human_bytes(d["stats"].get<double>()).c_str());
  std::printf("); %s free where the output goes\n", human_bytes(p["free_bytes"].get<double>()).c_str());
  std::printf("  every check before calibration passed; nothing was written (--dry-run)\n");
  return 0;
}

int run(const QuantizeArgs& a) {
  std::vector<std::string> sets = a.sets;
  if (!a.model.empty()) sets.push_back("model=" + a.model);
  if (!a.output.empty()) sets.push_back("output=" + a.output);
  if (a.gpus >= 0) sets.push_back("gpus=" + std::to_string(a.gpus));
  Recipe r;
  if (!a.scheme.empty()) {
    if (!a.recipe.empty()) fail(Errc::usage, "--scheme", a.recipe, "give a recipe or a scheme, not both (--set edits either)");
    if (a.model.empty()) fail(Errc::usage, "--scheme", "--model", "the model folder is needed");
    if (a.output.empty()) fail(Errc::usage, "--scheme", "--output", "the output folder is needed (-o OUT)");
    const Scheme& s = find_scheme(a.scheme);
    YAML::Node root = scheme_recipe(s, a.model, a.output, a.dataset, a.format);
    for (auto& x : a.sets) apply_set(root, x);
    if (a.gpus >= 0) apply_set(root, "gpus=" + std::to_string(a.gpus));   // (the scheme has --model and --output already)
    r = parse_recipe(root, "--scheme " + s.name);
  } else {
    if (a.recipe.empty()) fail(Errc::usage, "quantize", "", "give a recipe (configs/*.yaml) or --model DIR --scheme NAME (`ptqkit schemes`)");
    if (!a.dataset.empty()) sets.push_back("calibration.dataset=" + a.dataset);
    if (!a.format.empty()) sets.push_back("export.format=" + a.format);
    r = load_recipe(a.recipe, sets);
  }
  // Random calibration tokens only when asked for: a recipe that names no dataset is refused
  // (NF4 is data-free and needs none).
  if (!r.dataset_given && r.quant.method != "nf4")
    fail(Errc::usage, r.source, "calibration.dataset",
         "missing: name the calibration text (a .txt or .jsonl file), or write `dataset: random` to calibrate on random tokens "
         "(the report then says so); --dataset FILE sets it from the command line");
  QuantizeOptions o;
  o.force = a.force;
  o.resume = a.resume;
  o.save_stats = a.save_stats;
  o.load_stats = a.load_stats;
  o.dry_run = a.dry_run;
  nlohmann::json rep = run_quantize(r, o);
  if (a.dry_run) {
    log_event("result", {{"command", "quantize"}, {"plan", rep}});
    return print_plan(rep);
  }
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
    std::printf("  wrote %s in %s: %s, the Linears at %.2f bits a weight\n", o["format"].get<std::string>().c_str(), dir.c_str(),
                human_bytes(o["tensor_bytes"].get<double>()).c_str(), o["linear_bits_per_weight"].get<double>());
  }
  if (n && ratio > 0) std::printf("  output error vs RTN: mean ratio %.3f, worst %.3f (%s)\n", ratio / double(n), worst, worst_name.c_str());
  if (rep["calibration"].contains("samples") && r.calibration.dataset == "random")
    std::printf("  calibration: %d x %d RANDOM tokens (seed %llu), not text: the quantization is not tuned to any real input; give --dataset FILE\n",
                rep["calibration"]["samples"].get<int>(), rep["calibration"]["seq_len"].get<int>(), (unsigned long long)r.calibration.seed);
  else if (rep["calibration"].contains("samples"))
    std::printf("  calibration: %d x %d tokens from %s (seed %llu)\n", rep["calibration"]["samples"].get<int>(),
                rep["calibration"]["seq_len"].get<int>(), r.calibration.dataset.c_str(), (unsigned long long)r.calibration.seed);
  else
    std::printf("  calibration: none (data-free)\n");
  std::printf("  time %s total:", format_seconds(rep["total_seconds"]).c_str());
  {   // the phases in the pipeline's order (report.json keeps them by name), any others after
    const nlohmann::json& ph = rep["phases_seconds"];
    const std::vector<std::string> order = {"load", "calibration", "forward", "smoothquant", "awq", "hessian", "upload", "solve", "loss", "save", "export"};
    for (const std::string& k : order)
      if (ph.contains(k)) std::printf(" %s %.1fs", k.c_str(), ph[k].get<double>());
    for (auto& [k, v] : ph.items())
      if (std::find(order.begin(), order.end(), k) == order.end()) std::printf(" %s %.1fs", k.c_str(), v.get<double>());
  }
  std::printf("; peak memory %.0f MiB\n", rep["peak_rss_mb"].get<double>());
  std::printf("  report: %s/report.json, %s/report.html\n", r.output.c_str(), r.output.c_str());
  return 0;
}

}  // namespace

Command add_quantize(CLI::App& app) {
  auto a = std::make_shared<QuantizeArgs>();
  CLI::App* sub = app.add_subcommand("quantize", "calibrate and quantize a model with a YAML recipe (GPTQ or RTN)");
  sub->add_option("recipe", a->recipe, "recipe file (configs/*.yaml); or --scheme");
  sub->add_option("--scheme", a->scheme, "a named scheme instead of a recipe: W4A16, W8A8, NF4, Q4_K_M, ... (`ptqkit schemes`)");
  sub->add_option("--dataset", a->dataset, "calibration text (.txt, .jsonl), or `random` for random tokens (said in the report)");
  sub->add_option("--format", a->format, "export format (default: the scheme's deployable one; `ptqkit formats`)");
  sub->add_option("--model", a->model, "model folder (overrides the recipe's model)");
  sub->add_option("-o,--output", a->output, "output folder (overrides the recipe's output)");
  sub->add_option("--set", a->sets, "override a recipe field: key.path=value (repeatable)");
  sub->add_flag("--force", a->force, "replace an existing output folder");
  sub->add_option("--save-stats", a->save_stats, "keep the Hessians and activation statistics in this folder");
  sub->add_option("--load-stats", a->load_stats,
                  "quantize from statistics saved with --save-stats (same model and calibration) without running the model");
  sub->add_flag("--resume", a->resume, "continue an interrupted run of the same recipe from its last finished layer");
  sub->add_flag("--dry-run", a->dry_run,
                "check everything a run checks before it calibrates (recipe, model, formats, output folder, --gpus, disk, calibration text, --load-stats' key) and print the plan; "
                "writes nothing");
  sub->add_option("--gpus", a->gpus,
                  "calibrate data-parallel over N GPUs of this machine, one process each, through NCCL (recipe `gpus`; 0: one GPU without NCCL)")
      ->check(CLI::Range(0, 64));
  return {sub, [a] { return run(*a); }};
}

Command add_dist_worker(CLI::App& app) {
  auto a = std::make_shared<WorkerArgs>();
  CLI::App* sub = app.add_subcommand("dist-worker", "one rank of `quantize --gpus N` (started by rank 0, not by hand)");
  sub->group("");   // hidden from --help
  sub->add_option("--recipe", a->recipe)->required();
  sub->add_option("--rank", a->rank)->required();
  sub->add_option("--size", a->size)->required();
  sub->add_option("--id", a->id)->required();
  sub->add_flag("--host-hessians", a->host_hessians);
  return {sub, [a] {
            run_quantize_worker(a->recipe, a->rank, a->size, a->id, a->host_hessians);
            return 0;
          }};
}

Command add_schemes(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("schemes", "list the named schemes `quantize --scheme` takes");
  return {sub, [] {
            for (const Scheme& s : schemes()) std::printf("%-12s %-19s %s\n", s.name.c_str(), s.format.c_str(), s.description.c_str());
            return 0;
          }};
}

Command add_formats(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("formats", "list the export formats and what reads each");
  return {sub, [] {
            for (const FormatInfo& f : export_formats()) std::printf("%-19s %s\n", f.name.c_str(), f.description.c_str());
            return 0;
          }};
}

}  // namespace ptq
