// more_commands.cpp — subcommands beyond eval/synth/inspect: bench.
#include <chrono>
#include <memory>
#include <cstdio>

#include "commands.h"
#include "core/error.h"
#include "core/json_field.h"
#include "core/fsutil.h"
#include "report/report_html.h"
#include <filesystem>
#include <nlohmann/json.hpp>
#include "eval/data.h"
#include "eval/perplexity.h"
#include "model/llama.h"
#include "model/schedule.h"
#include "model/synth.h"
#include "pipeline/pipeline.h"
#include <unistd.h>
#include "core/rng.h"
#ifdef PTQKIT_HAVE_CUDA
#include "gptq/gptq_cuda.h"
#include "cuda/random.h"
#include "cuda/runtime.h"
#include "kernels/bench_kernels.h"
#endif

namespace ptq {

namespace {
struct BenchEvalArgs {
  std::string model, data;
  int seq_len = 0;
  int64_t windows = 16;
} g_be;
CLI::App* g_bench = nullptr;
CLI::App* g_report = nullptr;
std::string g_report_in, g_report_out;
CLI::App* g_bench_eval = nullptr;
CLI::App* g_bench_gptq = nullptr;
CLI::App* g_bench_kernels = nullptr;
int g_bk_runs = 100;
std::vector<std::string> g_bk_kernels{"w4a16", "w8a16", "nf4", "w8a8"};
std::vector<int64_t> g_bk_m{1, 8, 16, 32, 64, 128, 4096};
std::vector<std::string> g_bk_shapes{"4096x4096", "11008x4096", "4096x11008", "14336x4096", "4096x14336"};
struct BenchGptqArgs {
  std::string preset = "llama2-7b";
  int samples = 128, seq_len = 2048, bits = 4, group = 128;
  bool act_order = true;
  int layers = 0;            // > 0: the whole pipeline on a synthetic checkpoint of this many layers
  std::string workdir;       // where it is written (default: a temporary folder, removed after)
  std::string gpu_activations = "auto";
} g_bg;

// Eigen's fp32 GEMM rate at a shape like the model's MLP, measured now: the CPU's practical roof.
double eigen_gemm_gflops(int64_t m, int64_t k, int64_t n) {
  MatF x = MatF::Random(m, k), w = MatF::Random(n, k), y;
  double best = 0;
  for (int it = 0; it < 4; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    y.noalias() = x * w.transpose();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (it > 0) best = std::max(best, 2.0 * double(m * k * n) / s / 1e9);
  }
  return best;
}

int bench_eval() {
  LlamaModel m(g_be.model);
  const auto& c = m.config();
  const int L = g_be.seq_len > 0 ? g_be.seq_len : c.max_position_embeddings;
  auto tok = load_tokenizer(m.dir(), c.bos_token_id);
  auto ids = encode_corpus(*tok, g_be.data);
  const double gemm = eigen_gemm_gflops(16384, c.hidden_size, c.intermediate_size);
  EvalOptions o;
  o.seq_len = L;
  o.max_windows = g_be.windows;
  EvalResult r = evaluate(m, ids, o);
  // Useful FLOPs per token: 2 x linear weights (+ lm_head) + causal attention (QK^T and PV).
  const double linear = double(c.params_per_layer() - 2 * c.hidden_size) * c.num_hidden_layers + double(c.vocab_size) * c.hidden_size;
  const double attn = 2.0 * 2.0 * c.q_dim() * (L + 1) / 2.0 * c.num_hidden_layers;
  const double flop_per_token = 2.0 * linear + attn;
  const double tok_s = double(r.windows * L) / r.seconds;
  const double gflops = tok_s * flop_per_token / 1e9;
  std::printf("bench eval: %s, %lld windows x %d tokens\n", g_be.model.c_str(), (long long)r.windows, L);
  std::printf("  %-28s %10.0f tok/s\n", "evaluation throughput", tok_s);
  std::printf("  %-28s %10.1f GFLOP/s  (%.1f MFLOP/token)\n", "achieved", gflops, flop_per_token / 1e6);
  std::printf("  %-28s %10.1f GFLOP/s  (fp32 %d x %d x %d, same run)\n", "Eigen GEMM", gemm, 16384, c.hidden_size, c.intermediate_size);
  std::printf("  %-28s %10.1f %%\n", "ratio to the GEMM rate", 100 * gflops / gemm);
  std::printf("  perplexity %.6f over %lld tokens\n", r.perplexity, (long long)r.scored_tokens);
  return 0;
}
// One decoder layer of a preset's shapes: Hessians from random 16-bit activations generated on
// the GPU (samples x seq_len tokens) and the GPTQ solve of its seven Linears, timed by phase.
// The forward pass is not part of it yet (the CUDA forward is still to come).
// The whole pipeline (ptqkit quantize, device cuda) on a synthetic checkpoint of the preset's
// shapes with K layers and random calibration tokens; phases from its report, per-layer time, the
// extrapolation to the preset's depth, peak GPU memory and the ratio to the compute floor.
int bench_pipeline() {
#ifndef PTQKIT_HAVE_CUDA
  fail(Errc::usage, "", "bench gptq", "this build has no CUDA");
#else
  if (!cuda::available()) fail(Errc::usage, "", "bench gptq", "needs a GPU: " + cuda::describe());
  namespace fs = std::filesystem;
  const bool tmp = g_bg.workdir.empty();
  const std::string dir = tmp ? (fs::temp_directory_path() / ("ptqkit-bench-" + std::to_string(::getpid()))).string() : g_bg.workdir;
  struct Cleanup { std::string d; bool on; ~Cleanup() { std::error_code ec; if (on) fs::remove_all(d, ec); } } cleanup{dir, tmp};
  fs::create_directories(dir);
  using clk = std::chrono::steady_clock;
  auto t0 = clk::now();
  SynthOptions so;
  so.preset = g_bg.preset;
  so.layers = g_bg.layers;
  so.dtype = DType::F16;
  so.force = true;
  synth_model(so, dir + "/model");
  const double t_synth = std::chrono::duration<double>(clk::now() - t0).count();
  Recipe r = parse_recipe(YAML::Load("export: {format: [gptq]}\n"), "bench");
  r.model = dir + "/model";
  r.output = dir + "/out";
  r.device = "cuda";
  r.gpu_activations = g_bg.gpu_activations;
  r.calibration = {"random", g_bg.samples, g_bg.seq_len, 0};
  r.quant.bits = g_bg.bits;
  r.quant.group_size = g_bg.group;
  r.quant.act_order = g_bg.act_order;
  r.quant.static_groups = g_bg.act_order;
  QuantizeOptions o;
  o.force = true;
  const nlohmann::json rep = run_quantize(r, o);
  const LlamaConfig c = load_config(r.model);
  const int full_layers = parse_config(synth_config_json(g_bg.preset, -1, DType::F16), "x").num_hidden_layers;
  double layer_sum = 0;
  for (auto& l : rep["layers"]) layer_sum += l["seconds"].get<double>();
  const double per_layer = layer_sum / g_bg.layers;
  // Compute floor per layer at 800 TFLOP/s (performance.md): the forward's GEMMs and attention,
  // and the Hessians as SYRK (half of a GEMM).
  const double N = double(g_bg.samples) * g_bg.seq_len, d = c.hidden_size, f = c.intermediate_size, qd = c.q_dim();
  const double fwd = 2 * N * double(c.params_per_layer() - 2 * c.hidden_size) + 4.0 * g_bg.seq_len * N * qd / 2;
  const double hess = N * (2 * d * d + qd * qd + f * f);
  const double floor_layer = (fwd + hess) / 800e12;
  std::printf("bench gptq (pipeline): synthetic %s with %d of %d layers (f16), %d x %d random calibration tokens, %d-bit g%d%s, gptq export, on %s\n",
              g_bg.preset.c_str(), g_bg.layers, full_layers, g_bg.samples, g_bg.seq_len, g_bg.bits, g_bg.group, g_bg.act_order ? " act-order" : "",
              cuda::describe().c_str());
  std::printf("  forward: %s\n", rep["forward"].get<std::string>().c_str());
  std::printf("  (synthetic checkpoint written in %.1f s, not counted)\n", t_synth);
  for (auto& [k, v] : rep["phases_seconds"].items()) std::printf("  %-24s %8.3f s\n", k.c_str(), v.get<double>());
  if (rep.contains("solve_phases_seconds"))
    for (auto& [k, v] : rep["solve_phases_seconds"].items()) std::printf("    solve: %-15s %8.3f s\n", k.c_str(), v.get<double>());
  if (rep.contains("upload_phases_seconds"))
    for (auto& [k, v] : rep["upload_phases_seconds"].items()) std::printf("    upload: %-14s %8.3f s\n", k.c_str(), v.get<double>());
  double in_phases = 0;
  for (auto& [k, v] : rep["phases_seconds"].items()) in_phases += v.get<double>();
  std::printf("  %-24s %8.3f s\n", "(not in a phase)", rep["total_seconds"].get<double>() - in_phases);
  std::printf("  %-24s %8.3f s\n", "total", rep["total_seconds"].get<double>());
  std::printf("  %-24s %8.3f s  (in a background thread)\n", "layer files written", rep["background_seconds"]["save_layer"].get<double>());
  std::printf("  %-24s %8.3f s  (in a background thread, overlapping the above)\n", "next-layer reads", rep["background_seconds"]["load_next_layer"].get<double>());
  std::printf("  %-24s %8.3f s  (layers 1..%d: %.3f s)\n", "per layer", per_layer, g_bg.layers - 1,
              g_bg.layers > 1 ? (layer_sum - rep["layers"][0]["seconds"].get<double>()) / (g_bg.layers - 1) : per_layer);
  std::printf("  %-24s %8.1f s  (per layer x %d layers, excluding load/export of the rest)\n", "model estimate", per_layer * full_layers, full_layers);
  std::printf("  %-24s %8.3f s per layer (%.2e FLOP at 800 TFLOP/s): measured / floor = %.1fx\n", "compute floor", floor_layer, fwd + hess,
              per_layer / floor_layer);
  std::printf("  %-24s %8.2f GiB (activations %.2f GiB fp32 + %.2f GiB 16-bit)\n", "peak GPU memory", rep["peak_gpu_mb"].get<double>() / 1024,
              N * d * 4 / (1u << 30), N * std::max(qd, f) * 2 / (1u << 30));
  return 0;
#endif
}

int bench_gptq() {
  if (g_bg.layers > 0) return bench_pipeline();
#ifndef PTQKIT_HAVE_CUDA
  fail(Errc::usage, "", "bench gptq", "this build has no CUDA");
#else
  if (!cuda::available()) fail(Errc::usage, "", "bench gptq", "needs a GPU: " + cuda::describe());
  const LlamaConfig c = parse_config(synth_config_json(g_bg.preset, 1, DType::F16), g_bg.preset);
  const int64_t N = int64_t(g_bg.samples) * g_bg.seq_len, d = c.hidden_size, f = c.intermediate_size;
  std::printf("bench gptq: %s layer (hidden %lld, ffn %lld), %d x %d calibration tokens, %d-bit g%d%s, on %s\n", g_bg.preset.c_str(),
              (long long)d, (long long)f, g_bg.samples, g_bg.seq_len, g_bg.bits, g_bg.group, g_bg.act_order ? " act-order" : "", cuda::describe().c_str());
  using clk = std::chrono::steady_clock;
  const LayerSchedule& sched = layer_schedule(c);
  std::vector<std::unique_ptr<cuda::HessianCuda>> H;
  double t_hess = 0, hess_flop = 0;
  {
    const int64_t chunk = 16384;
    cuda::DeviceBuffer<uint16_t> x(size_t(chunk * f), "bench activations");
    for (int k = 0; k < int(sched.groups.size()); ++k) {
      const int64_t width = linear_shape(c, sched.groups[size_t(k)].linears[0]).in;
      H.push_back(std::make_unique<cuda::HessianCuda>(width, DType::F16));
      for (int64_t t0 = 0; t0 < N; t0 += chunk) {
        const int64_t n = std::min(chunk, N - t0);
        cuda::fill_random_normal(x.get(), DType::F16, n * width, uint64_t(k * 1000 + t0), 1.0f);
        cuda::synchronize();
        auto t = clk::now();
        H.back()->add_device(x.get(), n);
        cuda::synchronize();
        t_hess += std::chrono::duration<double>(clk::now() - t).count();
      }
      hess_flop += 2.0 * double(N) * double(width) * double(width);
    }
  }
  QuantSpec s;
  s.bits = g_bg.bits;
  s.group_size = g_bg.group;
  s.act_order = g_bg.act_order;
  s.static_groups = g_bg.act_order;
  cuda::GptqPhaseTimes sum;
  double t_solve = 0;
  for (size_t k = 0; k < sched.groups.size(); ++k)
    for (Proj p : sched.groups[k].linears) {
    const int m = int(p);
    const LinearShape sh = linear_shape(c, p);
    MatF W(sh.out, sh.in);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < W.rows(); ++r) {
      Rng rng{uint64_t(m), uint64_t(r)};
      for (int64_t j = 0; j < W.cols(); ++j) W(r, j) = float(rng.normal() / std::sqrt(double(sh.in)));
    }
    auto t = clk::now();
    cuda::WeightRows rows;
    rows.rows = W.rows();
    rows.host = &W;
    cuda::gptq_solve_cuda({rows}, W.cols(), H[k]->device(), s, cuda::SolveKeep::codes);
    t_solve += std::chrono::duration<double>(clk::now() - t).count();
    auto pt = cuda::last_phase_times();
    sum.prepare += pt.prepare;
    sum.factorization += pt.factorization;
    sum.potrf += pt.potrf;
    sum.trtri += pt.trtri;
    sum.column_loop += pt.column_loop;
    sum.download += pt.download;
  }
  const double layer = t_hess + t_solve;
  std::printf("  %-34s %8.3f s  (%.0f TFLOP/s as GEMM)\n", "Hessians (4 inputs, tensor cores)", t_hess, hess_flop / t_hess / 1e12);
  std::printf("  %-34s %8.3f s\n", "solve: prepare (upload, permute)", sum.prepare);
  std::printf("  %-34s %8.3f s  (potrf %.3f, L^-1 in place %.3f)\n", "solve: factorization (fp64)", sum.factorization, sum.potrf, sum.trtri);
  std::printf("  %-34s %8.3f s\n", "solve: column loop + trailing GEMMs", sum.column_loop);
  std::printf("  %-34s %8.3f s\n", "solve: codes back to the host", sum.download);
  std::printf("  %-34s %8.3f s  (7 Linears, wall %.3f s)\n", "solve total", sum.prepare + sum.factorization + sum.column_loop + sum.download, t_solve);
  std::printf("  %-34s %8.3f s per layer; x %d layers = %.1f s (forward and I/O not included)\n", "Hessians + GPTQ", layer,
              parse_config(synth_config_json(g_bg.preset, -1, DType::F16), "x").num_hidden_layers,
              layer * parse_config(synth_config_json(g_bg.preset, -1, DType::F16), "x").num_hidden_layers);
  std::printf("  %-34s %8.1f GiB\n", "peak GPU memory (pool)", double(cuda::pool_peak_bytes()) / (1u << 30));
  return 0;
#endif
}
}  // namespace

void register_more_commands(CLI::App& app) {
  register_quantize(app);
  g_report = app.add_subcommand("report", "render a report.json (from quantize) as a self-contained report.html");
  g_report->add_option("report_json", g_report_in, "report.json")->required();
  g_report->add_option("-o,--output", g_report_out, "HTML file (default: beside the JSON, .html)");
  g_bench = app.add_subcommand("bench", "benchmarks (throughput against the machine's measured limits)");
  g_bench->require_subcommand(1);
  g_bench_eval = g_bench->add_subcommand("eval", "CPU evaluation throughput beside an Eigen GEMM measured in the same run");
  g_bench_eval->add_option("--model", g_be.model, "model folder")->required();
  g_bench_eval->add_option("--data", g_be.data, "text file")->required();
  g_bench_eval->add_option("--seq-len", g_be.seq_len, "window length (default: the model's context)");
  g_bench_eval->add_option("--windows", g_be.windows, "windows to evaluate")->default_val(16);
  g_bench_gptq = g_bench->add_subcommand("gptq", "Hessians and the GPTQ solve of one decoder layer on the GPU, by phase");
  g_bench_gptq->add_option("--preset", g_bg.preset, "llama2-7b | llama3-8b | llama2-70b | small")->default_val("llama2-7b");
  g_bench_gptq->add_option("--samples", g_bg.samples, "calibration windows")->default_val(128);
  g_bench_kernels = g_bench->add_subcommand("kernels", "W4A16, W8A16, NF4 (against cuBLAS f16) and W8A8 (against cuBLAS bf16 and int8) GPU kernels: llama shapes, M = 1..4096, cold L2");
  g_bench_kernels->add_option("--runs", g_bk_runs, "runs per measurement (median)")->default_val(100);
  g_bench_kernels->add_option("--kernels", g_bk_kernels, "which kernels")->check(CLI::IsMember({"w4a16", "w8a16", "nf4", "w8a8"}))->delimiter(',');
  g_bench_kernels->add_option("--m", g_bk_m, "activation rows M (default 1,8,16,32,64,128,4096)")->check(CLI::Range(int64_t(1), int64_t(65536)))->delimiter(',');
  g_bench_kernels->add_option("--shapes", g_bk_shapes, "weight shapes NxK (default the Llama-7B/8B ones)")->delimiter(',');
  g_bench_gptq->add_option("--layers", g_bg.layers, "run the whole pipeline on a synthetic checkpoint of this many layers (0: one layer's Hessians and solve only)");
  g_bench_gptq->add_option("--workdir", g_bg.workdir, "folder for the synthetic checkpoint and output (default: a temporary one, removed after)");
  g_bench_gptq->add_option("--seq-len", g_bg.seq_len, "tokens per window")->default_val(2048);
  g_bench_gptq->add_option("--gpu-activations", g_bg.gpu_activations, "where the pipeline keeps the calibration activations")
      ->check(CLI::IsMember({"auto", "device", "host"}))->default_val("auto");
  g_bench_gptq->add_option("--bits", g_bg.bits)->default_val(4);
  g_bench_gptq->add_option("--group-size", g_bg.group)->default_val(128);
  g_bench_gptq->add_option("--act-order", g_bg.act_order, "act-order with static groups")->default_val(true);
}

int run_more_commands(CLI::App& app) {
  if (quantize_parsed()) return run_quantize_command();
  if (g_report && g_report->parsed()) {
    nlohmann::json rep;
    try { rep = nlohmann::json::parse(read_text_file(g_report_in)); } catch (const nlohmann::json::exception& e) {
      fail(Errc::format, g_report_in, "", std::string("malformed JSON: ") + e.what());
    }
    if (!rep.is_object() || !rep.contains("modules")) fail(Errc::format, g_report_in, "modules", "missing: not a ptqkit report.json");
    const std::string out = g_report_out.empty() ? std::filesystem::path(g_report_in).replace_extension(".html").string() : g_report_out;
    write_file_atomic(out, json_errors_named(Errc::format, g_report_in, "", [&] { return report_html(rep); }));
    std::printf("wrote %s\n", out.c_str());
    return 0;
  }
  if (g_bench_eval && g_bench_eval->parsed()) return bench_eval();
  if (g_bench_gptq && g_bench_gptq->parsed()) return bench_gptq();
  if (g_bench_kernels && g_bench_kernels->parsed()) {
#ifndef PTQKIT_HAVE_CUDA
    fail(Errc::usage, "", "bench kernels", "this build has no CUDA");
#else
    if (!cuda::available()) fail(Errc::usage, "", "bench kernels", "needs a GPU: " + cuda::describe());
    std::vector<std::pair<int64_t, int64_t>> shapes;
    for (const auto& s : g_bk_shapes) {
      long long n = 0, k = 0;
      char tail = 0;
      if (std::sscanf(s.c_str(), "%lldx%lld%c", &n, &k, &tail) != 2 || n < 1 || k < 16 || k % 16)
        fail(Errc::usage, "", "--shapes", "'" + s + "' is not NxK with N >= 1 and K a multiple of 16");
      shapes.emplace_back(n, k);
    }
    cuda::bench_kernels(shapes, g_bk_m, g_bk_runs, g_bk_kernels);
    return 0;
#endif
  }
  fail(Errc::usage, "", "", "no command given; see --help");
}

}  // namespace ptq
