// bench_gptq.cpp — `ptqkit bench gptq`: one decoder layer's Hessians and GPTQ solves on the GPU by
// phase, or (--layers K) the whole pipeline on a synthetic checkpoint of the preset's shapes.
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "command.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/rng.h"
#include "eval/perplexity.h"
#include "model/corpus.h"
#include "model/llama.h"
#include "model/schedule.h"
#include "model/synth.h"
#include "model/tokenizer.h"
#include "pipeline/pipeline.h"
#ifdef PTQKIT_HAVE_CUDA
#include "cuda/random.h"
#include "cuda/runtime.h"
#include "gptq/gptq_cuda.h"
#include "kernels/bench_kernels.h"
#endif
#include "bench.h"

namespace ptq {

namespace {

// One decoder layer of a preset's shapes: Hessians from random 16-bit activations generated on
// the GPU (samples x seq_len tokens) and the GPTQ solve of its seven Linears, timed by phase.
// The forward pass is not part of it yet (the CUDA forward is still to come).
// The whole pipeline (ptqkit quantize, device cuda) on a synthetic checkpoint of the preset's
// shapes with K layers and random calibration tokens; phases from its report, per-layer time, the
// extrapolation to the preset's depth, peak GPU memory and the ratio to the compute floor.
int bench_pipeline(const BenchGptqArgs& a) {
#ifndef PTQKIT_HAVE_CUDA
  fail(Errc::usage, "", "bench gptq", "this build has no CUDA");
#else
  if (!cuda::available()) fail(Errc::usage, "", "bench gptq", "needs a GPU: " + cuda::describe());
  namespace fs = std::filesystem;
  const bool tmp = a.workdir.empty();
  const std::string dir = tmp ? (fs::temp_directory_path() / ("ptqkit-bench-" + std::to_string(::getpid()))).string() : a.workdir;
  struct Cleanup { std::string d; bool on; ~Cleanup() { std::error_code ec; if (on) fs::remove_all(d, ec); } } cleanup{dir, tmp};
  fs::create_directories(dir);
  using clk = std::chrono::steady_clock;
  auto t0 = clk::now();
  SynthOptions so;
  so.preset = a.preset;
  so.layers = a.layers;
  so.dtype = DType::F16;
  so.force = true;
  synth_model(so, dir + "/model");
  const double t_synth = std::chrono::duration<double>(clk::now() - t0).count();
  Recipe r = parse_recipe(YAML::Load("export: {format: [gptq]}\n"), "bench");
  r.model = dir + "/model";
  r.output = dir + "/out";
  r.device = "cuda";
  r.gpu_activations = a.gpu_activations;
  r.calibration = {"random", a.samples, a.seq_len, 0};
  r.quant.bits = a.bits;
  r.quant.group_size = a.group;
  r.quant.act_order = a.act_order;
  r.quant.static_groups = a.act_order;
  r.gpus = a.gpus;
  QuantizeOptions o;
  o.force = true;
  const nlohmann::json rep = run_quantize(r, o);
  const LlamaConfig c = load_config(r.model);
  const int full_layers = parse_config(synth_config_json(a.preset, -1, DType::F16), "x").num_hidden_layers;
  double layer_sum = 0;
  for (auto& l : rep["layers"]) layer_sum += l["seconds"].get<double>();
  const double per_layer = layer_sum / a.layers;
  // Compute floor per layer at 800 TFLOP/s (performance.md): the forward's GEMMs and attention,
  // and the Hessians as SYRK (half of a GEMM).
  const double N = double(a.samples) * a.seq_len, d = c.hidden_size, f = c.intermediate_size, qd = c.q_dim();
  const double fwd = 2 * N * double(c.params_per_layer() - 2 * c.hidden_size) + 4.0 * a.seq_len * N * qd / 2;
  const double hess = N * (2 * d * d + qd * qd + f * f);
  const double floor_layer = (fwd + hess) / 800e12;
  std::printf("bench gptq (pipeline): synthetic %s with %d of %d layers (f16), %d x %d random calibration tokens, %d-bit g%d%s, gptq export, on %s%s\n",
              a.preset.c_str(), a.layers, full_layers, a.samples, a.seq_len, a.bits, a.group, a.act_order ? " act-order" : "",
              cuda::describe().c_str(), a.gpus > 0 ? (" x " + std::to_string(a.gpus) + " GPUs").c_str() : "");
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
  std::printf("  %-24s %8.3f s  (layers 1..%d: %.3f s)\n", "per layer", per_layer, a.layers - 1,
              a.layers > 1 ? (layer_sum - rep["layers"][0]["seconds"].get<double>()) / (a.layers - 1) : per_layer);
  std::printf("  %-24s %8.1f s  (per layer x %d layers, excluding load/export of the rest)\n", "model estimate", per_layer * full_layers, full_layers);
  std::printf("  %-24s %8.3f s per layer (%.2e FLOP at 800 TFLOP/s): measured / floor = %.1fx\n", "compute floor", floor_layer, fwd + hess,
              per_layer / floor_layer);
  std::printf("  %-24s %8.2f GiB (activations %.2f GiB fp32 + %.2f GiB 16-bit)\n", "peak GPU memory", rep["peak_gpu_mb"].get<double>() / 1024,
              N * d * 4 / (1u << 30), N * std::max(qd, f) * 2 / (1u << 30));
  return 0;
#endif
}

int run_bench_gptq_layer(const BenchGptqArgs& a) {
#ifndef PTQKIT_HAVE_CUDA
  fail(Errc::usage, "", "bench gptq", "this build has no CUDA");
#else
  if (!cuda::available()) fail(Errc::usage, "", "bench gptq", "needs a GPU: " + cuda::describe());
  const LlamaConfig c = parse_config(synth_config_json(a.preset, 1, DType::F16), a.preset);
  const int64_t N = int64_t(a.samples) * a.seq_len, d = c.hidden_size, f = c.intermediate_size;
  const std::string moe = c.moe_layer(0) ? ", " + std::to_string(c.num_experts) + " experts of ffn " + std::to_string(c.moe_intermediate_size) +
                                               " (every token through every expert)" : "";
  std::printf("bench gptq: %s layer (hidden %lld, ffn %lld%s), %d x %d calibration tokens, %d-bit g%d%s, on %s\n", a.preset.c_str(),
              (long long)d, (long long)f, moe.c_str(), a.samples, a.seq_len, a.bits, a.group, a.act_order ? " act-order" : "", cuda::describe().c_str());
  using clk = std::chrono::steady_clock;
  const LayerSchedule sched = layer_schedule(c, 0);
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
  s.bits = a.bits;
  s.group_size = a.group;
  s.act_order = a.act_order;
  s.static_groups = a.act_order;
  // As the pipeline solves them: each group's Linears stacked into one solve, and (--batch) runs of
  // expert downs, each with its own Hessian, in batches of kBatchHessianBytes.
  {   // warm-up, not timed: the first call of each cuSOLVER/cuBLAS routine loads its kernels
    const int64_t n = 256;
    MatF W = MatF::Random(64, n);
    MatD Hh = MatD::Identity(n, n);
    cuda::DeviceBuffer<double> dH(size_t(n * n), "warm-up Hessian");
    cuda::copy_to_device(dH.get(), Hh.data(), size_t(n * n) * 8);
    const cuda::SolveProblem p{{cuda::WeightRows{64, &W, nullptr, DType::F32}}, HessianRef{dH.get(), 1.0}};
    cuda::gptq_solve_cuda(std::vector<cuda::SolveProblem>{p}, n, s, cuda::SolveKeep::codes);
    cuda::gptq_solve_cuda(std::vector<cuda::SolveProblem>{p, p}, n, s, cuda::SolveKeep::codes);
  }
  cuda::GptqPhaseTimes sum;
  double t_solve = 0;
  int solves = 0;
  std::deque<MatF> weights;   // the batch's, until it is solved
  std::vector<cuda::SolveProblem> batch;
  int64_t batch_bytes = 0;
  auto flush = [&] {
    if (batch.empty()) return;
    auto t = clk::now();
    cuda::gptq_solve_cuda(batch, batch[0].parts[0].host->cols(), s, cuda::SolveKeep::codes);
    t_solve += std::chrono::duration<double>(clk::now() - t).count();
    ++solves;
    auto pt = cuda::last_phase_times();
    sum.prepare += pt.prepare;
    sum.factorization += pt.factorization;
    sum.potrf += pt.potrf;
    sum.trtri += pt.trtri;
    sum.column_loop += pt.column_loop;
    sum.download += pt.pack + pt.download;   // the codes are packed on the device, then copied
    batch.clear();
    weights.clear();
    batch_bytes = 0;
  };
  for (size_t k = 0; k < sched.groups.size(); ++k) {
    const LinearGroup& g = sched.groups[k];
    const int64_t width = linear_shape(c, g.linears[0]).in, bytes = width * width * 8;
    const bool batched = a.batch && g.input == Stage::expert_act;
    if (!batched || batch_bytes + bytes > cuda::kBatchHessianBytes) flush();
    cuda::SolveProblem p{{}, H[k]->device()};
    for (LinearId id : g.linears) {
      const LinearShape sh = linear_shape(c, id);
      MatF& W = weights.emplace_back(sh.out, sh.in);
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < W.rows(); ++r) {
        Rng rng{uint64_t(id.proj) + 16 * uint64_t(id.expert + 1), uint64_t(r)};
        for (int64_t j = 0; j < W.cols(); ++j) W(r, j) = float(rng.normal() / std::sqrt(double(sh.in)));
      }
      p.parts.push_back({W.rows(), &W, nullptr, DType::F32});
    }
    batch.push_back(std::move(p));
    batch_bytes += bytes;
    if (!batched) flush();
  }
  flush();
  const double layer = t_hess + t_solve;
  const std::string hess_label = "Hessians (" + std::to_string(sched.groups.size()) + " inputs, tensor cores)";
  std::printf("  %-34s %8.3f s  (%.0f TFLOP/s as GEMM)\n", hess_label.c_str(), t_hess, hess_flop / t_hess / 1e12);
  std::printf("  %-34s %8.3f s\n", "solve: prepare (upload, permute)", sum.prepare);
  std::printf("  %-34s %8.3f s  (potrf %.3f, L^-1 in place %.3f)\n", "solve: factorization (fp64)", sum.factorization, sum.potrf, sum.trtri);
  std::printf("  %-34s %8.3f s\n", "solve: column loop + trailing GEMMs", sum.column_loop);
  std::printf("  %-34s %8.3f s\n", "solve: codes packed, to the host", sum.download);
  std::printf("  %-34s %8.3f s  (%zu Linears in %d solves%s, wall %.3f s)\n", "solve total", sum.prepare + sum.factorization + sum.column_loop + sum.download,
              sched.linears().size(), solves, a.batch ? "" : ", --batch false", t_solve);
  std::printf("  %-34s %8.3f s per layer; x %d layers = %.1f s (forward and I/O not included)\n", "Hessians + GPTQ", layer,
              parse_config(synth_config_json(a.preset, -1, DType::F16), "x").num_hidden_layers,
              layer * parse_config(synth_config_json(a.preset, -1, DType::F16), "x").num_hidden_layers);
  std::printf("  %-34s %8.1f GiB\n", "peak GPU memory (pool)", double(cuda::pool_peak_bytes()) / (1u << 30));
  return 0;
#endif
}
}  // namespace

int run_bench_gptq(const BenchGptqArgs& a) {
  if (a.gpus > 0 && a.layers <= 0) {   // several GPUs: only the pipeline spreads its work
    BenchGptqArgs b = a;
    b.layers = 2;
    return bench_pipeline(b);
  }
  return a.layers > 0 ? bench_pipeline(a) : run_bench_gptq_layer(a);
}

}  // namespace ptq
