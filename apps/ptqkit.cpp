// ptqkit — command-line entry point. Each subcommand is a thin layer over lib/: parse options,
// call the library, print a summary to stdout and write JSON where asked.
// Errors: "ptqkit: error: FILE: FIELD: message" on stderr, exit code by kind (core/error.h).
#include <omp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>

#include "commands.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/json_field.h"
#include "core/progress.h"
#include "core/safetensors.h"
#include "eval/data.h"
#include "eval/perplexity.h"
#ifdef PTQKIT_HAVE_CUDA
#include "eval/perplexity_cuda.h"
#endif
#include "formats/gguf.h"
#include "formats/open.h"
#include "model/llama.h"
#include "model/synth.h"
#include "model/tokenizer.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace ptq {

namespace {

DType parse_float_dtype(const std::string& s) {
  if (s == "f16" || s == "float16") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "f32" || s == "float32") return DType::F32;
  fail(Errc::usage, "", "--dtype", "must be f16, bf16 or f32, got '" + s + "'");
}

std::string human_bytes(double b) {
  char s[32];
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) { b /= 1024; ++i; }
  std::snprintf(s, sizeof s, i ? "%.2f %s" : "%.0f %s", b, u[i]);
  return s;
}

void print_eval(const EvalResult& r) {
  std::printf("perplexity %.6f  (mean NLL %.6f over %lld scored tokens; %lld windows of %d; %.1f s, %.0f tok/s)\n", r.perplexity,
              r.mean_nll, (long long)r.scored_tokens, (long long)r.windows, r.seq_len, r.seconds, r.tokens_per_second);
  if (r.kl)
    std::printf("vs reference: perplexity %.6f; KL mean %.6f, median %.6f, p99 %.6f, max %.6f; top-1 agreement %.4f%%; mean dp %+.6f\n",
                r.kl->reference_perplexity, r.kl->mean, r.kl->median, r.kl->p99, r.kl->max, 100 * r.kl->top1_agreement, r.kl->mean_delta_p);
}

}  // namespace

// The regression gate: the run's numbers against a baseline written by --write-baseline.
// Returns the reason a threshold was crossed, or "" when none was.
std::string gate_reason(const EvalArgs& a, const json& run) {
  if (a.max_kl >= 0 || a.min_top1 >= 0) {
    if (!run.contains("kl")) fail(Errc::usage, "", "--max-kl/--min-top1", "need --reference MODEL_DIR");
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
    for (const char* k : {"data_sha256", "seq_len", "windows"})
      if (base[k] != run[k])
        fail(Errc::input, a.baseline, k, "differs from this run (" + base[k].dump() + " vs " + run[k].dump() + "): the baseline measured something else");
    const double b = base["perplexity"], p = run["perplexity"];
    const double delta = a.relative ? p / b - 1 : p - b;
    char m[256];
    if (delta > a.max_ppl_delta) {
      std::snprintf(m, sizeof m, "perplexity %.6f exceeds baseline %.6f by %.6g%s > --max-ppl-delta %.6g%s", p, b, a.relative ? 100 * delta : delta,
                    a.relative ? "%" : "", a.relative ? 100 * a.max_ppl_delta : a.max_ppl_delta, a.relative ? "%" : "");
      return m;
    }
  }
  return "";
}

int cmd_eval(const EvalArgs& a) {
  std::unique_ptr<LlamaModel> mp = open_model(a.model);
  if (a.w8a8_path != "int" && a.w8a8_path != "fake") fail(Errc::usage, "", "--w8a8-path", "must be int or fake");
  mp->set_integer_path(a.w8a8_path == "int");
  const LlamaModel& model = *mp;
  std::unique_ptr<LlamaModel> ref;
  if (!a.reference.empty()) ref = open_model(a.reference);
  auto tok = load_tokenizer(a.tokenizer.empty() ? model.dir() : a.tokenizer, model.config().bos_token_id);
  const std::vector<int32_t> ids = encode_corpus(*tok, a.data);
  EvalOptions o;
  o.seq_len = a.seq_len > 0 ? a.seq_len : model.config().max_position_embeddings;
  o.max_windows = a.max_windows;
  o.batch_tokens = a.batch_tokens;
  EvalResult r;
  std::string device = "cpu";
  double prefill_seconds = 0;
  if (a.device != "cpu" && a.device != "cuda") fail(Errc::usage, "", "--device", "must be cpu or cuda");
  if (a.device == "cuda") {
#ifdef PTQKIT_HAVE_CUDA
    cuda::GpuLogits gpu(model, a.model);
    std::unique_ptr<cuda::GpuLogits> gref;
    if (ref) gref = std::make_unique<cuda::GpuLogits>(*ref, a.reference);
    const LogitsFn fn = [&gpu](const std::vector<int32_t>& t, int S, int T) { return gpu(t, S, T); };
    const LogitsFn rfn = [&gref](const std::vector<int32_t>& t, int S, int T) { return (*gref)(t, S, T); };
    const NllFn nfn = [&gpu](const std::vector<int32_t>& t, int S, int T) { return gpu.nll(t, S, T); };   // no reference: the NLL on the GPU
    r = evaluate(fn, model.config().max_position_embeddings, ids, o, ref ? &rfn : nullptr, &nfn);
    device = gpu.describe();
    prefill_seconds = gpu.forward_seconds();
#else
    fail(Errc::usage, "", "--device", "this build has no CUDA (nvcc was not found when it was built)");
#endif
  } else {
    r = evaluate(model, ids, o, ref.get());
  }
  print_eval(r);
  json j = r.to_json();
  j["device"] = device;
  if (prefill_seconds > 0) {
    const double tok = double(r.windows) * r.seq_len;
    std::printf("GPU forward (prefill with logits): %.3f s, %.0f tok/s; %s\n", prefill_seconds, tok / prefill_seconds, device.c_str());
    j["prefill_seconds"] = prefill_seconds;
    j["prefill_tokens_per_second"] = tok / prefill_seconds;
  }
  j["model"] = a.model;
  j["model_format"] = model_format(a.model);
  j["data"] = a.data;
  j["data_sha256"] = sha256_file(a.data);
  if (ref) j["reference"] = a.reference;
  if (!a.json_out.empty()) write_file_atomic(a.json_out, j.dump(2) + "\n");
  if (!a.write_baseline.empty()) {
    json b = {{"perplexity", r.perplexity}, {"mean_nll", r.mean_nll}, {"scored_tokens", r.scored_tokens}, {"windows", r.windows},
              {"seq_len", r.seq_len}, {"data", a.data}, {"data_sha256", j["data_sha256"]}, {"model", a.model}};
    if (r.kl) b["kl"] = j["kl"];
    write_file_atomic(a.write_baseline, b.dump(2) + "\n");
  }
  log_event("result", {{"command", "eval"}, {"result", j}});
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

int cmd_synth(const SynthArgs& a) {
  SynthOptions o;
  o.preset = a.preset;
  o.layers = a.layers;
  o.seed = a.seed;
  o.dtype = parse_float_dtype(a.dtype);
  o.force = a.force;
  if (a.max_shard_mb > 0) o.max_shard_bytes = size_t(a.max_shard_mb) << 20;
  synth_model(o, a.output);
  LlamaConfig c = load_config(a.output);
  std::printf("wrote %s: synthetic %s, %d layers, hidden %d, ffn %d, %d/%d heads, vocab %d, %s\n", a.output.c_str(), a.preset.c_str(),
              c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.vocab_size,
              std::string(dtype_name(o.dtype)).c_str());
  return 0;
}

int inspect_gguf(const InspectArgs& a, const std::string& path) {
  GgufFile f(path);
  std::map<std::string, std::pair<int64_t, size_t>> by_type;
  const char* names[] = {"F32", "F16", "Q4_0", "", "", "", "", "", "Q8_0"};
  json tensors = json::array();
  size_t total = 0;
  for (auto& t : f.tensors()) {
    auto& e = by_type[names[int(t.type)]];
    e.first++;
    e.second += t.nbytes;
    total += t.nbytes;
    tensors.push_back({{"name", t.name}, {"type", names[int(t.type)]}, {"ne", t.ne}, {"bytes", t.nbytes}});
  }
  if (a.json) {
    std::cout << json({{"path", path}, {"format", "gguf"}, {"metadata", f.metadata()}, {"tensors", tensors}}).dump(2) << "\n";
    return 0;
  }
  const json& m = f.metadata();
  auto n = [&](const char* k) { return (long long)json_field<int64_t>(m, k, 0, Errc::format, path); };
  std::printf("%s\n  format        GGUF v3, %s\n", path.c_str(), json_field<std::string>(m, "general.architecture", "?", Errc::format, path).c_str());
  std::printf("  architecture  %lld layers, hidden %lld, ffn %lld, heads %lld/%lld, context %lld\n", n("llama.block_count"),
              n("llama.embedding_length"), n("llama.feed_forward_length"), n("llama.attention.head_count"),
              n("llama.attention.head_count_kv"), n("llama.context_length"));
  std::printf("  tokenizer     %s\n", json_field<std::string>(m, "tokenizer.ggml.model", "none", Errc::format, path).c_str());
  std::printf("  tensors       %zu, %s\n", f.tensors().size(), human_bytes(double(total)).c_str());
  for (auto& [d, e] : by_type) std::printf("    %-8s %6lld tensors  %s\n", d.c_str(), (long long)e.first, human_bytes(double(e.second)).c_str());
  if (a.tensors)
    for (auto& t : tensors) std::printf("    %-32s %-5s %s\n", t["name"].get<std::string>().c_str(), t["type"].get<std::string>().c_str(), t["ne"].dump().c_str());
  return 0;
}

int cmd_inspect(const InspectArgs& a) {
  if (model_format(a.path) == "gguf") return inspect_gguf(a, fs::is_directory(a.path) ? a.path + "/model.gguf" : a.path);
  json out;
  const bool dir = fs::is_directory(a.path);
  Checkpoint ck(a.path);
  std::map<std::string, std::pair<int64_t, size_t>> by_dtype;   // dtype -> (tensors, bytes)
  json tensors = json::array();
  for (auto& n : ck.names()) {
    TensorView t = ck.get(n);
    auto& e = by_dtype[std::string(dtype_name(t.dtype))];
    e.first++;
    e.second += t.nbytes;
    tensors.push_back({{"name", n}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"bytes", t.nbytes},
                       {"file", fs::path(ck.file_of(n)).filename().string()}});
  }
  out["path"] = a.path;
  out["tensor_count"] = tensors.size();
  out["total_bytes"] = ck.total_bytes();
  for (auto& [d, e] : by_dtype) out["dtypes"][d] = {{"tensors", e.first}, {"bytes", e.second}};
  if (dir && fs::exists(a.path + "/config.json")) {
    LlamaConfig c = load_config(a.path);
    int64_t params = 0;
    for (auto& t : tensors) params += numel(t["shape"].get<Shape>());
    out["architecture"] = {{"model_type", c.model_type},       {"layers", c.num_hidden_layers}, {"hidden_size", c.hidden_size},
                           {"intermediate_size", c.intermediate_size}, {"heads", c.num_attention_heads},
                           {"kv_heads", c.num_key_value_heads}, {"head_dim", c.head_dim}, {"vocab_size", c.vocab_size},
                           {"max_position_embeddings", c.max_position_embeddings}, {"rope_theta", c.rope_theta},
                           {"rope_scaling", c.rope_scaling ? "llama3" : "none"}, {"tie_word_embeddings", c.tie_word_embeddings},
                           {"torch_dtype", dtype_name(c.dtype)}, {"parameters", params}};
    if (c.raw.contains("quantization_config")) out["quantization_config"] = c.raw["quantization_config"];
    out["format"] = model_format(a.path);
    try {
      out["tokenizer"] = load_tokenizer(a.path, c.bos_token_id)->kind();
    } catch (const Error&) {
      out["tokenizer"] = "none";
    }
  }
  if (a.json) {
    out["tensors"] = tensors;
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf("%s\n", a.path.c_str());
  if (out.contains("architecture")) {
    auto& ar = out["architecture"];
    std::printf("  architecture  %s, %d layers, hidden %d, ffn %d, heads %d/%d (head_dim %d), vocab %d, context %d\n",
                ar["model_type"].get<std::string>().c_str(), ar["layers"].get<int>(), ar["hidden_size"].get<int>(),
                ar["intermediate_size"].get<int>(), ar["heads"].get<int>(), ar["kv_heads"].get<int>(), ar["head_dim"].get<int>(),
                ar["vocab_size"].get<int>(), ar["max_position_embeddings"].get<int>());
    std::printf("  rope          theta %g, scaling %s; tied embeddings %s; dtype %s\n", ar["rope_theta"].get<double>(),
                ar["rope_scaling"].get<std::string>().c_str(), ar["tie_word_embeddings"].get<bool>() ? "yes" : "no",
                ar["torch_dtype"].get<std::string>().c_str());
    std::printf("  format        %s\n", out["format"].get<std::string>().c_str());
    std::printf("  stored values %.3f M\n", double(ar["parameters"].get<int64_t>()) / 1e6);
    std::printf("  tokenizer     %s\n", out["tokenizer"].get<std::string>().c_str());
  }
  std::printf("  tensors       %zu, %s\n", tensors.size(), human_bytes(double(ck.total_bytes())).c_str());
  for (auto& [d, e] : by_dtype) std::printf("    %-8s %6lld tensors  %s\n", d.c_str(), (long long)e.first, human_bytes(double(e.second)).c_str());
  if (out.contains("quantization_config")) std::printf("  quantization  %s\n", out["quantization_config"].dump().c_str());
  else std::printf("  quantization  none\n");
  if (a.tensors)
    for (auto& t : tensors)
      std::printf("    %-56s %-5s %-16s %s\n", t["name"].get<std::string>().c_str(), t["dtype"].get<std::string>().c_str(),
                  shape_str(t["shape"].get<Shape>()).c_str(), t["file"].get<std::string>().c_str());
  return 0;
}

}  // namespace ptq

namespace {
// SIGINT / SIGTERM: say what happened and what is left, then exit non-zero at once. Output folders
// are only ever complete under their final name; an interrupted quantization leaves OUT.partial,
// which `ptqkit quantize ... --resume` continues.
extern "C" void on_signal(int sig) {
  const char msg[] = "\nptqkit: interrupted; nothing was committed (an unfinished quantization stays in OUTPUT.partial: rerun with --resume)\n";
  ssize_t ignored = ::write(2, msg, sizeof msg - 1);
  (void)ignored;
  ::_exit(128 + sig);
}
}  // namespace

int main(int argc, char** argv) {
  using namespace ptq;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  tune_allocator();
  CLI::App app{"ptqkit: post-training quantization of Llama-family models (GPTQ, RTN, SmoothQuant) on CPU and CUDA"};
  app.require_subcommand(1);
  bool quiet = false;
  int threads = 0;
  std::string log_json;
  app.add_flag("-q,--quiet", quiet, "no progress output");
  app.add_option("--log-json", log_json, "write progress, results and errors as JSON lines to this file (batch jobs)");
  app.add_option("--threads", threads, "OpenMP threads (default: all cores)");

  EvalArgs ea;
  auto* ev = app.add_subcommand("eval", "perplexity (and KL divergence against a reference) on a text or .jsonl file");
  ev->add_option("--model", ea.model, "model folder (HF layout)")->required();
  ev->add_option("--data", ea.data, "text file, or .jsonl with a \"text\" field")->required();
  ev->add_option("--seq-len", ea.seq_len, "window length L (default: max_position_embeddings)");
  ev->add_option("--max-windows", ea.max_windows, "evaluate at most K windows");
  ev->add_option("--json", ea.json_out, "write the result as JSON here");
  ev->add_option("--reference", ea.reference, "reference model folder: adds KL divergence and top-1 agreement");
  ev->add_option("--tokenizer", ea.tokenizer, "tokenizer file or folder (default: the model folder)");
  ev->add_option("--batch-tokens", ea.batch_tokens, "tokens per forward chunk (memory bound)")->default_val(16384);
  ev->add_option("--baseline", ea.baseline, "regression gate: a baseline written by --write-baseline");
  ev->add_option("--max-ppl-delta", ea.max_ppl_delta, "fail (exit 10) when perplexity exceeds the baseline's by more than this");
  ev->add_flag("--relative", ea.relative, "--max-ppl-delta is a fraction of the baseline (0.005 = 0.5%)");
  ev->add_option("--max-kl", ea.max_kl, "fail when the mean KL divergence against --reference exceeds this");
  ev->add_option("--min-top1", ea.min_top1, "fail when the top-1 agreement with --reference is below this (0..1)");
  ev->add_option("--write-baseline", ea.write_baseline, "record this run as a baseline");
  ev->add_option("--device", ea.device, "cpu (the reference path) or cuda (float, gptq and bitsandbytes-nf4 checkpoints; the W4A16/W8A16/NF4 kernels)")->default_val("cpu");
  ev->add_option("--w8a8-path", ea.w8a8_path, "W8A8 models: int (int8 GEMM, int32 accumulation) or fake (float)")->default_val("int");

  SynthArgs sa;
  auto* sy = app.add_subcommand("synth", "write a synthetic HF-layout Llama checkpoint with a real model's shapes");
  sy->add_option("--preset", sa.preset, "micro | tiny | small | llama2-7b | llama3-8b | llama2-70b")->default_val("tiny");
  sy->add_option("--output", sa.output, "output folder")->required();
  sy->add_option("--layers", sa.layers, "number of decoder layers (default: the preset's)");
  sy->add_option("--seed", sa.seed, "random seed")->default_val(0);
  sy->add_option("--dtype", sa.dtype, "f16 | bf16 | f32")->default_val("f16");
  sy->add_option("--max-shard-mb", sa.max_shard_mb, "shard size limit in MiB (default 2048)");
  sy->add_flag("--force", sa.force, "replace an existing output folder");

  InspectArgs ia;
  auto* in = app.add_subcommand("inspect", "describe a checkpoint: architecture, tensors, dtypes, sizes, quantization");
  in->add_option("path", ia.path, "model folder or .safetensors file")->required();
  in->add_flag("--json", ia.json, "machine-readable output");
  in->add_flag("--tensors", ia.tensors, "list every tensor");

  register_more_commands(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  Progress::set_quiet(quiet);
  if (threads > 0) omp_set_num_threads(threads);
  try {
    if (!log_json.empty()) {
      open_json_log(log_json);
      log_event("command", {{"argv", std::vector<std::string>(argv, argv + argc)}, {"version", "0.1.0"}});
    }
    if (ev->parsed()) return cmd_eval(ea);
    if (sy->parsed()) return cmd_synth(sa);
    if (in->parsed()) return cmd_inspect(ia);
    return run_more_commands(app);
  } catch (const Error& e) {
    std::fprintf(stderr, "ptqkit: error: %s\n", e.what());
    log_event("error", {{"exit_code", int(e.code)}, {"file", e.file}, {"field", e.field}, {"message", e.what()}});
    return int(e.code);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ptqkit: error: %s\n", e.what());
    log_event("error", {{"exit_code", 1}, {"message", e.what()}});
    return 1;
  }
}
