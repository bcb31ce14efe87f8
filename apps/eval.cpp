// eval.cpp — `ptqkit eval`: perplexity (and KL divergence against a reference) of a checkpoint on
// a text, on the CPU (the reference path) or the GPU; the regression gate of CI jobs.
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <vector>

#include "command.h"
#include "core/build_info.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/progress.h"
#include "eval/perplexity.h"
#include "model/corpus.h"
#ifdef PTQKIT_HAVE_CUDA
#include "cuda/runtime.h"
#include "eval/perplexity_cuda.h"
#endif
#include "formats/open.h"
#include "model/tokenizer.h"

namespace ptq {

using nlohmann::json;

namespace {

struct EvalArgs {
  std::vector<std::string> data;   // one text, or several evaluated with one load of the models
  std::string model, json_out, reference, tokenizer, w8a8_path = "int", device = "cpu", protocol = "gptq", save_logits, kl_base;
  bool device_given = false;   // --device on the command line (else the CPU, said where a GPU is present)
  int save_logits_k = 32;
  int seq_len = 0;
  int64_t max_windows = -1, batch_tokens = 16384;
  // regression gate
  std::string baseline, write_baseline;
  double max_ppl_delta = -1, max_kl = -1, min_top1 = -1;
  bool relative = false;
};

void print_eval(const EvalResult& r) {
  // ± the standard error of the perplexity from that of the mean NLL (as llama-perplexity prints it)
  std::printf("perplexity %.6f +/- %.6f  (mean NLL %.6f over %lld scored tokens; %lld windows of %d%s; %.1f s, %.0f tok/s)\n", r.perplexity,
              r.perplexity_std_error, r.mean_nll, (long long)r.scored_tokens, (long long)r.windows, r.seq_len,
              r.protocol == "gptq" ? "" : ", llama.cpp's protocol: second halves scored", r.seconds, r.tokens_per_second);
  if (r.kl)
    std::printf("vs reference: perplexity %.6f; KL mean %.6f, median %.6f, p99 %.6f, max %.6f; top-1 agreement %.4f%%; mean dp %+.6f\n",
                r.kl->reference_perplexity, r.kl->mean, r.kl->median, r.kl->p99, r.kl->max, 100 * r.kl->top1_agreement, r.kl->mean_delta_p);
}


// "; the baseline was written by ptqkit 0.1.0 (git …, isa), this run by … (git …, isa)" where the
// baseline records a build (--write-baseline since the build was recorded) other than this one: a
// regression's first question is whether the code or its compilation changed.
std::string builds_differ(const json& base) {
  if (!base.contains("build") || !base["build"].is_object()) return "";
  const json& b = base["build"];
  const json mine = build_json();
  if (build_label(b) == build_label(mine)) return "";
  auto describe = [](const json& x) { return x.value("version", std::string("?")) + " (" + build_label(x) + ")"; };
  return "; the baseline was written by ptqkit " + describe(b) + ", this run by ptqkit " + describe(mine);
}

// The regression gate: the run's numbers against a baseline written by --write-baseline.
// Returns the reason a threshold was crossed, or "" when none was.
std::string gate_reason(const EvalArgs& a, const json& run) {
  if (a.max_kl >= 0 || a.min_top1 >= 0) {
    if (!run.contains("kl")) fail(Errc::usage, "", "--max-kl/--min-top1", "need --reference MODEL_DIR or --kl-base FILE");
    const double kl = run["kl"]["mean"], top1 = run["kl"]["top1_agreement"];
    char b[256];
    if (a.max_kl >= 0 && kl > a.max_kl) { std::snprintf(b, sizeof b, "mean KL divergence %.6g exceeds --max-kl %.6g", kl, a.max_kl); return b; }
    if (a.min_top1 >= 0 && top1 < a.min_top1) { std::snprintf(b, sizeof b, "top-1 agreement %.6g is below --min-top1 %.6g", top1, a.min_top1); return b; }
  }
  if (a.max_ppl_delta >= 0) {
    if (a.baseline.empty()) fail(Errc::usage, "", "--max-ppl-delta", "needs --baseline FILE");
    json base;
    try { base = json::parse(read_text_file(a.baseline)); } catch (const json::exception& e) {
      fail(Errc::format, a.baseline, "", std::string("malformed JSON: ") + e.what());
    }
    for (const char* k : {"perplexity", "data_sha256", "seq_len", "windows"})
      if (!base.is_object() || !base.contains(k)) fail(Errc::format, a.baseline, k, "missing (write baselines with --write-baseline)");
    if (!base["perplexity"].is_number()) fail(Errc::format, a.baseline, "perplexity", "must be a number");
    if (base.value("protocol", std::string("gptq")) != run.value("protocol", std::string("gptq")))
      fail(Errc::input, a.baseline, "protocol", "differs from this run: the baseline measured something else");
    for (const char* k : {"data_sha256", "seq_len", "windows"})
      if (base[k] != run[k])
        fail(Errc::input, a.baseline, k, "differs from this run (" + base[k].dump() + " vs " + run[k].dump() + "): the baseline measured something else");
    const double b = base["perplexity"], p = run["perplexity"];
    const double delta = a.relative ? p / b - 1 : p - b;
    char m[256];
    if (delta > a.max_ppl_delta) {
      std::snprintf(m, sizeof m, "perplexity %.6f exceeds baseline %.6f by %.6g%s > --max-ppl-delta %.6g%s", p, b, a.relative ? 100 * delta : delta,
                    a.relative ? "%" : "", a.relative ? 100 * a.max_ppl_delta : a.max_ppl_delta, a.relative ? "%" : "");
      return m + builds_differ(base);
    }
  }
  return "";
}


int run_eval(const EvalArgs& a) {
  if (a.data.empty()) fail(Errc::usage, "", "--data", "give the text to evaluate");
  const bool several = a.data.size() > 1;
  if (several)   // each of these is one text's: a baseline, a gate, a logits file
    for (const auto& [given, flag] : std::vector<std::pair<bool, const char*>>{{!a.baseline.empty(), "--baseline"},
                                                                              {!a.write_baseline.empty(), "--write-baseline"},
                                                                              {a.max_ppl_delta >= 0, "--max-ppl-delta"},
                                                                              {a.max_kl >= 0, "--max-kl"},
                                                                              {a.min_top1 >= 0, "--min-top1"},
                                                                              {!a.save_logits.empty(), "--save-logits"},
                                                                              {!a.kl_base.empty(), "--kl-base"}})
      if (given) fail(Errc::usage, "", flag, "takes one --data text (the gate, baselines and saved logits are one text's): run one eval for each");
  std::unique_ptr<LlamaModel> mp = open_model(a.model);
  if (a.w8a8_path != "int" && a.w8a8_path != "fake") fail(Errc::usage, "", "--w8a8-path", "must be int or fake");
  mp->set_integer_path(a.w8a8_path == "int");
  const LlamaModel& model = *mp;
  std::unique_ptr<LlamaModel> ref;
  if (!a.reference.empty()) ref = open_model(a.reference);
  auto tok = cli_tokenizer(a.tokenizer, model.dir(), model.config().bos_token_id, "give one with --tokenizer FILE");
  EvalOptions o;
  o.seq_len = a.seq_len > 0 ? a.seq_len : model.config().max_position_embeddings;
  o.max_windows = a.max_windows;
  o.batch_tokens = a.batch_tokens;
  o.protocol = a.protocol;
  o.bos = model.config().bos_token_id;
  TopLogits top, base;
  if (!a.save_logits.empty()) {
    if (a.save_logits_k < 1) fail(Errc::usage, "", "--save-logits-k", "must be positive");
    if (std::filesystem::exists(a.save_logits)) fail(Errc::exists, a.save_logits, "--save-logits", "exists: remove it or name another file");
    top.k = a.save_logits_k;
    o.save_top = &top;
  }
  if (!a.kl_base.empty()) {
    base = TopLogits::load(a.kl_base);
    o.kl_base = &base;
  }
  // The models on their device once; then each text through them.
  if (a.device != "cpu" && a.device != "cuda") fail(Errc::usage, "", "--device", "must be cpu or cuda");
  std::string device = "cpu";
  std::function<EvalResult(const std::vector<int32_t>&)> evaluate_ids = [&](const std::vector<int32_t>& ids) { return evaluate(model, ids, o, ref.get()); };
  std::function<double()> prefill_seconds = [] { return 0.0; };
#ifdef PTQKIT_HAVE_CUDA
  std::unique_ptr<cuda::GpuLogits> gpu, gref;
  if (a.device == "cuda") {
    gpu = std::make_unique<cuda::GpuLogits>(model, a.model);
    if (ref) gref = std::make_unique<cuda::GpuLogits>(*ref, a.reference);
    evaluate_ids = [&](const std::vector<int32_t>& ids) {
      const LogitsFn fn = [&](const std::vector<int32_t>& t, int S, int T) { return (*gpu)(t, S, T); };
      const LogitsFn rfn = [&](const std::vector<int32_t>& t, int S, int T) { return (*gref)(t, S, T); };
      const NllFn nfn = [&](const std::vector<int32_t>& t, int S, int T) { return gpu->nll(t, S, T); };   // no reference: the NLL on the GPU
      return evaluate(fn, model.config().max_position_embeddings, ids, o, ref ? &rfn : nullptr, &nfn);
    };
    device = gpu->describe();
    prefill_seconds = [&] { return gpu->forward_seconds(); };
  }
  if (a.device == "cpu" && !a.device_given && cuda::available())   // a 7B model's text takes hours on the CPU, seconds there
    std::fprintf(stderr, "ptqkit: note: evaluating on the CPU (the reference path); this machine has a GPU (%s): --device cuda evaluates there\n",
                 cuda::describe().c_str());
#else
  if (a.device == "cuda") fail(Errc::usage, "", "--device", "this build has no CUDA (nvcc was not found when it was built)");
#endif
  json all = json::array();
  for (const std::string& data : a.data) {
    if (several) std::printf("%s:\n", data.c_str());
    const std::vector<int32_t> ids = encode_corpus(*tok, data);
    const double prefill_before = prefill_seconds();
    const EvalResult r = evaluate_ids(ids);
    const double prefill = prefill_seconds() - prefill_before;
    if (o.save_top) {
      top.save(a.save_logits);
      std::printf("saved the top %d logits of %lld positions to %s (--kl-base reads them)\n", top.k, (long long)top.target_logp.size(), a.save_logits.c_str());
    }
    print_eval(r);
    json j = r.to_json();
    if (o.kl_base) j["kl_base"] = {{"file", a.kl_base}, {"k", base.k}, {"note", "KL over the reference's top k tokens and the rest as one bucket: a lower bound of the full KL"}};
    j["device"] = device;
    j["perplexity_std_error"] = r.perplexity_std_error;
    if (prefill > 0) {
      const double t = double(r.windows) * r.seq_len;
      std::printf("GPU forward (prefill with logits): %.3f s, %.0f tok/s; %s\n", prefill, t / prefill, device.c_str());
      j["prefill_seconds"] = prefill;
      j["prefill_tokens_per_second"] = t / prefill;
    }
    j["model"] = a.model;
    j["model_format"] = model_format(a.model);
    j["data"] = data;
    j["data_sha256"] = sha256_file(data);
    if (ref) j["reference"] = a.reference;
    j["build"] = build_json();
    all.push_back(j);
  }
  // One text: its result as it always was; several: {"evals": [one per text, in order]} (compare reads both).
  const json out = several ? json{{"evals", all}} : all[0];
  if (!a.json_out.empty()) write_file_atomic(a.json_out, out.dump(2) + "\n");
  log_event("result", {{"command", "eval"}, {"result", out}});
  if (several) return 0;
  const json& j = all[0];
  if (!a.write_baseline.empty()) {
    json b = {{"perplexity", j["perplexity"]}, {"mean_nll", j["mean_nll"]}, {"scored_tokens", j["scored_tokens"]}, {"windows", j["windows"]},
              {"seq_len", j["seq_len"]}, {"data", j["data"]}, {"data_sha256", j["data_sha256"]}, {"model", a.model},
              {"build", j["build"]}};
    if (j.value("protocol", std::string("gptq")) != "gptq") b["protocol"] = j["protocol"];
    if (j.contains("kl")) b["kl"] = j["kl"];
    write_file_atomic(a.write_baseline, b.dump(2) + "\n");
  }
  const std::string why = gate_reason(a, j);
  if (!why.empty()) {
    std::fprintf(stderr, "ptqkit: gate failed: %s\n", why.c_str());
    log_event("gate", {{"passed", false}, {"reason", why}, {"exit_code", int(Errc::gate)}});
    return int(Errc::gate);
  }
  if (!a.baseline.empty() || a.max_kl >= 0 || a.min_top1 >= 0) {
    std::printf("gate passed\n");
    log_event("gate", {{"passed", true}});
  }
  return 0;
}

}  // namespace

Command add_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* ev = app.add_subcommand("eval", "perplexity (and KL divergence against a reference) on a text or .jsonl file");
  ev->add_option("--model", a->model, "model folder (HF layout)")->required();
  ev->add_option("--data", a->data, "text file, or .jsonl with a \"text\" field; several (--data A --data B, or --data A B) are evaluated with one load of the models, a result each")->required();
  ev->add_option("--seq-len", a->seq_len, "window length L (default: max_position_embeddings)");
  ev->add_option("--max-windows", a->max_windows, "evaluate at most K windows");
  ev->add_option("--protocol", a->protocol,
                 "gptq: every token but each window's first scored (GPTQ's and transformers' convention); llama.cpp: each window "
                 "starts with BOS and only its second half is scored, as llama-perplexity does")
      ->check(CLI::IsMember({"gptq", "llama.cpp"}))
      ->default_val("gptq");
  ev->add_option("--json", a->json_out, "write the result as JSON here");
  ev->add_option("--reference", a->reference, "reference model folder: adds KL divergence and top-1 agreement");
  ev->add_option("--save-logits", a->save_logits, "keep this model's top logits of every position in FILE (the float model's, for --kl-base later)");
  ev->add_option("--save-logits-k", a->save_logits_k, "how many of each position's most likely tokens --save-logits keeps")->default_val(32);
  ev->add_option("--kl-base", a->kl_base, "KL divergence and top-1 agreement against logits saved with --save-logits (same data and windows)");
  ev->add_option("--tokenizer", a->tokenizer, "tokenizer file or folder (default: the model folder)");
  ev->add_option("--batch-tokens", a->batch_tokens, "tokens per forward chunk (memory bound)")->default_val(16384);
  ev->add_option("--baseline", a->baseline, "regression gate: a baseline written by --write-baseline");
  ev->add_option("--max-ppl-delta", a->max_ppl_delta, "fail (exit 10) when perplexity exceeds the baseline's by more than this");
  ev->add_flag("--relative", a->relative, "--max-ppl-delta is a fraction of the baseline (0.005 = 0.5%)");
  ev->add_option("--max-kl", a->max_kl, "fail when the mean KL divergence against --reference exceeds this");
  ev->add_option("--min-top1", a->min_top1, "fail when the top-1 agreement with --reference is below this (0..1)");
  ev->add_option("--write-baseline", a->write_baseline, "record this run as a baseline");
  CLI::Option* device = ev->add_option("--device", a->device, "cpu (the reference path) or cuda (float, gptq (2..8 bits), compressed-tensors and bitsandbytes-nf4 checkpoints through the W4A16/W8A16/NF4/W8A8 kernels; GGUF's blocks, Q4_0 to Q6_K, on the W4A16/W8A16 kernels)")->default_val("cpu");
  ev->add_option("--w8a8-path", a->w8a8_path, "W8A8 models: int (int8 GEMM, int32 accumulation) or fake (float)")->default_val("int");

  return {ev, [a, device] {
            a->device_given = device->count() > 0;
            return run_eval(*a);
          }};
}

}  // namespace ptq
