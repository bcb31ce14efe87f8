// bench.cpp — `ptqkit bench eval | gptq | kernels | smoothquant`: throughput against the machine's measured
// limits (the numbers in docs/benchmarks.md come from these).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
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
#include "gptq/clip_cuda.h"
#include "gptq/gptq_cuda.h"
#include "kernels/bench_kernels.h"
#include "smoothquant/awq_cuda.h"
#include "smoothquant/smoothquant_cuda.h"
#endif
#include "gptq/clip.h"
#include "smoothquant/awq.h"
#include "smoothquant/smoothquant.h"
#include "bench.h"

namespace ptq {

namespace {

struct BenchEvalArgs {
  std::string model, data;
  int seq_len = 0;
  int64_t windows = 16;
};
struct BenchSmoothArgs {
  std::string preset = "llama2-7b";
  int64_t rows = 4096;   // the search's activation rows (the pipeline's max_rows)
  bool host = false;     // also time the host's reference search
};
struct BenchAwqArgs {
  std::string preset = "llama2-7b";
  int64_t rows = 4096;   // the search's activation rows (the pipeline's kSmoothRows)
  int grid = 20;
  bool gpu_only = false;   // skip the host's arms (minutes on 7B shapes); the GPU arms compared with each other
};
struct BenchKernelsArgs {
  int runs = 100;
  std::vector<std::string> kernels{"w4a16", "w8a16", "nf4", "w8a8"};
  std::vector<int64_t> m{1, 8, 16, 32, 64, 128, 4096};
  std::vector<std::string> shapes{"4096x4096", "11008x4096", "4096x11008", "14336x4096", "4096x14336"};
};

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

int run_bench_eval(const BenchEvalArgs& a) {
  LlamaModel m(a.model);
  const auto& c = m.config();
  const int L = a.seq_len > 0 ? a.seq_len : c.max_position_embeddings;
  auto tok = load_tokenizer(m.dir(), c.bos_token_id);
  auto ids = encode_corpus(*tok, a.data);
  const double gemm = eigen_gemm_gflops(16384, c.hidden_size, c.intermediate_size);
  EvalOptions o;
  o.seq_len = L;
  o.max_windows = a.windows;
  EvalResult r = evaluate(m, ids, o);
  // Useful FLOPs per token: 2 x linear weights (+ lm_head) + causal attention (QK^T and PV).
  const double linear = double(c.params_per_layer() - 2 * c.hidden_size) * c.num_hidden_layers + double(c.vocab_size) * c.hidden_size;
  const double attn = 2.0 * 2.0 * c.q_dim() * (L + 1) / 2.0 * c.num_hidden_layers;
  const double flop_per_token = 2.0 * linear + attn;
  const double tok_s = double(r.windows * L) / r.seconds;
  const double gflops = tok_s * flop_per_token / 1e9;
  std::printf("bench eval: %s, %lld windows x %d tokens\n", a.model.c_str(), (long long)r.windows, L);
  std::printf("  %-28s %10.0f tok/s\n", "evaluation throughput", tok_s);
  std::printf("  %-28s %10.1f GFLOP/s  (%.1f MFLOP/token)\n", "achieved", gflops, flop_per_token / 1e6);
  std::printf("  %-28s %10.1f GFLOP/s  (fp32 %d x %d x %d, same run)\n", "Eigen GEMM", gemm, 16384, c.hidden_size, c.intermediate_size);
  std::printf("  %-28s %10.1f %%\n", "ratio to the GEMM rate", 100 * gflops / gemm);
  std::printf("  perplexity %.6f over %lld tokens\n", r.perplexity, (long long)r.scored_tokens);
  return 0;
}

// r x k normal values of standard deviation sd, drawn in order from rng.
MatF random_matrix(Rng& rng, int64_t r, int64_t k, double sd) {
  MatF m(r, k);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = float(sd * rng.normal());
  return m;
}

// One decoder layer's norm-fed Linears for the search benchmarks: random weights (sd 0.02) and
// `rows` activation rows (sd 1, every 64th channel x 30: the outliers SmoothQuant and AWQ are for),
// drawn in this order from seed 7.
struct BenchLayer {
  MatF X, q, k, v, g, u;
  BenchLayer(const LlamaConfig& c, int64_t rows) {
    Rng rng(7);
    auto random = [&rng](int64_t r, int64_t k, double sd) { return random_matrix(rng, r, k, sd); };
    const int64_t d = c.hidden_size;
    X = random(rows, d, 1.0);
    for (int64_t j = 0; j < d; j += 64) X.col(j) *= 30.0f;
    q = random(c.q_dim(), d, 0.02), k = random(c.kv_dim(), d, 0.02), v = random(c.kv_dim(), d, 0.02);
    g = random(c.intermediate_size, d, 0.02), u = random(c.intermediate_size, d, 0.02);
  }
  std::vector<std::vector<const MatF*>> groups() const { return {{&q, &k, &v}, {&g, &u}}; }
};

// SmoothQuant's alpha search (alpha_grid(): no smoothing and alpha = 0, 0.05, ..., 1) for one
// decoder layer of a preset's shapes, both of its smoothed groups (input_layernorm -> q, k, v;
// post_attention_layernorm -> gate, up): random weights (sd 0.02) and activations (sd 1, every 64th
// channel x 30, the outliers SmoothQuant is for), on the GPU and (--host) on the host.
int run_bench_smoothquant(const BenchSmoothArgs& a) {
#ifndef PTQKIT_HAVE_CUDA
  fail(Errc::usage, "", "bench smoothquant", "this build has no CUDA");
#else
  if (!cuda::available()) fail(Errc::usage, "", "bench smoothquant", "needs a GPU: " + cuda::describe());
  const LlamaConfig c = parse_config(synth_config_json(a.preset, -1, DType::F16), a.preset);
  const BenchLayer L(c, a.rows);
  const MatF& X = L.X;
  const int64_t d = c.hidden_size;
  VecF am;
  update_channel_absmax(X, am);
  const std::vector<std::vector<const MatF*>> groups = L.groups();
  const ActQuant act{ActQuant::per_token, 0};
  const size_t evals = alpha_grid().size();
  std::printf("bench smoothquant: %s layer (hidden %lld, ffn %lld), %lld activation rows, %zu evaluations a group, on %s\n", a.preset.c_str(),
              (long long)d, (long long)c.intermediate_size, (long long)a.rows, evals, cuda::describe().c_str());
  double ops = 0;
  for (auto& grp : groups)
    for (const MatF* W : grp) ops += 2.0 * double(a.rows) * double(W->rows()) * double(d) * double(evals);
  auto time_search = [&](AlphaErrors errors, const char* label) {
    double best = 1e30;
    for (int it = 0; it < (errors == smoothed_errors ? 1 : 3); ++it) {   // the GPU's first call pays cuBLAS's set-up
      const auto t0 = std::chrono::steady_clock::now();
      for (auto& grp : groups) (void)search_alpha(X, am, grp, act, a.rows, errors);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("  %-22s %8.3f s a layer  %8.1f s for %d layers  (%.1f TOP/s of the W8A8 products)\n", label, best,
                best * c.num_hidden_layers, c.num_hidden_layers, ops / best / 1e12);
  };
  time_search(cuda::smoothed_errors, "GPU (int8 cuBLAS)");
  if (a.host) time_search(smoothed_errors, "host (fp32 Eigen)");
  return 0;
#endif
}

// AWQ's search (smoothquant/awq.h: the unscaled Linears and `grid` ratios, RTN 4-bit groups of 128,
// asymmetric) for one decoder layer of a preset's shapes, its four pairs (q, k, v; o, tied as the
// schedule ties it; gate, up; down): random weights (sd 0.02) and activations of each input's width
// (sd 1, every 64th channel x 30), its output errors on the host (the reference) and, where a GPU
// is present, by cuda::output_sq_error (dW from the host) and by cuda::awq_scorer (dW formed on the
// GPU), whose every error is compared with the host's; then AWQ's
// clipping search (gptq/clip.h) on the layer's v, o, gate, up and down, each with its input's Hessian.
int run_bench_awq(const BenchAwqArgs& a) {
  bool gpu = false;
#ifdef PTQKIT_HAVE_CUDA
  gpu = cuda::available();
#endif
  if (a.gpu_only && !gpu) fail(Errc::usage, "", "bench awq --gpu-only", "needs a GPU");
  const LlamaConfig c = parse_config(synth_config_json(a.preset, -1, DType::F16), a.preset);
  const BenchLayer L(c, a.rows);
  const MatF& X = L.X;
  const int64_t d = c.hidden_size;
  Rng rng(8);
  auto random = [&rng](int64_t r, int64_t k, double sd) { return random_matrix(rng, r, k, sd); };
  auto activations = [&](int64_t k) {
    MatF x = random(a.rows, k, 1.0);
    for (int64_t j = 0; j < k; j += 64) x.col(j) *= 30.0f;
    return x;
  };
  const MatF o = random(d, c.q_dim(), 0.02), down = random(d, c.intermediate_size, 0.02);
  const MatF Xo = activations(c.q_dim()), Xf = activations(c.intermediate_size);
  const LayerSchedule sched = layer_schedule(c, 0);
  struct Pair {
    const MatF* X;
    std::vector<const MatF*> ws;
    std::vector<int64_t> tie;
  };
  const std::vector<Pair> pairs = {{&X, {&L.q, &L.k, &L.v}, {}}, {&Xo, {&o}, scale_source(c, sched.groups[1]).row}, {&X, {&L.g, &L.u}, {}}, {&Xf, {&down}, {}}};
  QuantSpec spec;
  spec.method = "rtn";
  spec.sym = false;
  std::printf("bench awq: %s layer (hidden %lld, ffn %lld), %lld activation rows, %d ratios and the unscaled Linears a pair (q/k/v, o, gate/up, down), RTN 4-bit g128 asymmetric\n",
              a.preset.c_str(), (long long)d, (long long)c.intermediate_size, (long long)a.rows, a.grid);
  std::vector<std::vector<double>> errors(4);   // per scorer, every evaluation in order
  // scorer unset: the host's own choice (search_awq: the product X·dWᵀ, or the Gram form for tall X)
  auto time_search = [&](AwqScorer scorer, const char* label, std::vector<double>* seen) {
    const AwqScorer logged = scorer && seen ? AwqScorer([seen, scorer](const MatF& x, const std::vector<const MatF*>& ws, const std::vector<QuantSpec>& sp) {
      const AwqErrorAt at = scorer(x, ws, sp);
      return AwqErrorAt([seen, at](const VecF& s) { const double e = at(s); seen->push_back(e); return e; });
    })
                                            : scorer;
    const auto t0 = std::chrono::steady_clock::now();
    std::string picks;
    for (const Pair& p : pairs) {
      const AwqSearch s = search_awq(*p.X, p.ws, std::vector<QuantSpec>(p.ws.size(), spec), a.grid, true, logged, p.tie);
      picks += " " + (s.ratio < 0 ? std::string("none") : std::to_string(s.ratio).substr(0, 4));
    }
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  %-26s %8.2f s a layer  %8.1f s for %d layers  (ratios:%s)\n", label, t, t * c.num_hidden_layers, c.num_hidden_layers, picks.c_str());
  };
  if (!a.gpu_only) time_search({}, 2 * a.rows > d ? "host (Gram form where tall)" : "host (X·dWᵀ)", nullptr);
  // AWQ's clipping search (gptq/clip.h) on the Linears it covers: v, o, gate, up, down, each with its input's Hessian
  auto hessian = [](const MatF& x) {   // 2/rows · xᵀx, as the pipeline's (gptq/hessian.h)
    Hessian h(x.cols());
    h.add(x);
    return h.take_finalized();
  };
  const MatD Hd = hessian(X), Ho = hessian(Xo), Hf = hessian(Xf);
  const std::vector<std::pair<const MatF*, const MatD*>> linears = {{&L.v, &Hd}, {&o, &Ho}, {&L.g, &Hd}, {&L.u, &Hd}, {&down, &Hf}};
  QuantSpec cs = spec;
  cs.output_clip = true;
  // search(W, H) -> its limits, timed over the five Linears
  auto time_clipping = [&](const char* label, const std::function<ClipSearch(const MatF&, const MatD&)>& search) {
    int64_t searched = 0, clipped = 0;
    std::vector<float> limits;
    const auto t0 = std::chrono::steady_clock::now();
    for (auto [W, H] : linears) {
      const ClipSearch r = search(*W, *H);
      searched += r.groups;
      clipped += r.clipped;
      limits.insert(limits.end(), r.limits.begin(), r.limits.end());
    }
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  %-26s %8.2f s a layer  %8.1f s for %d layers  (v, o, gate, up, down: %.1f%% of %lld groups clipped)\n", label, t,
                t * c.num_hidden_layers, c.num_hidden_layers, 100.0 * double(clipped) / double(std::max<int64_t>(searched, 1)), (long long)searched);
    return limits;
  };
  std::vector<float> host_limits;
  if (!a.gpu_only) host_limits = time_clipping("clipping search (host)", [&](const MatF& W, const MatD& H) { return output_clip_limits(W, H, cs); });
#ifdef PTQKIT_HAVE_CUDA
  if (gpu) {
    (void)cuda::output_sq_error(X.topRows(1), L.q.topRows(1));   // cuBLAS's set-up, outside the time
    // The device's search reads H = scale · sum from device memory (the pipeline's HessianCuda); the
    // upload of each H is timed with it here.
    const std::vector<float> dev_limits = time_clipping("clipping search (GPU)", [&](const MatF& W, const MatD& H) {
      cuda::DeviceBuffer<double> dH(size_t(H.size()), "bench awq: Hessian");
      cuda::copy_to_device(dH.get(), H.data(), size_t(H.size()) * 8);
      return cuda::output_clip_limits(W, HessianRef{dH.get(), 1.0}, cs);
    });
    if (!host_limits.empty()) {
      size_t equal = 0;
      for (size_t i = 0; i < host_limits.size() && i < dev_limits.size(); ++i) equal += host_limits[i] == dev_limits[i];
      std::printf("  the GPU's clipping limits equal to the host's: %zu of %zu\n", equal, host_limits.size());
    }
    if (!a.gpu_only) time_search(product_scorer(output_sq_error), "host (X·dWᵀ, the GPU's form)", &errors[0]);
    time_search(product_scorer(cuda::output_sq_error), "GPU SGEMM, dW from the host", &errors[1]);
    time_search(cuda::awq_scorer(), "GPU (X, W and dW resident)", &errors[2]);
    time_search(cuda::awq_scorer(cuda::AwqProduct::bf16), "GPU resident, bf16 products", &errors[3]);
    // Each GPU arm against the host's product (without it, --gpu-only: against the SGEMM arm)
    const size_t ref = a.gpu_only ? 1 : 0;
    const char* names[] = {"", "the GPU SGEMM's", "the resident search's", "the bf16 resident search's"};
    for (size_t k = ref + 1; k <= 3; ++k) {
      double worst = 0;
      for (size_t i = 0; i < errors[ref].size() && i < errors[k].size(); ++i) worst = std::max(worst, std::abs(errors[k][i] / errors[ref][i] - 1));
      std::printf("  %s errors against the %s: %zu of %zu compared, at most %.2e relative\n", names[k],
                  ref == 0 ? "host's" : "GPU SGEMM arm's (dW from the host)", std::min(errors[ref].size(), errors[k].size()), errors[ref].size(), worst);
    }
    return 0;
  }
#endif
  std::printf("  (no GPU here: the host's search only)\n");
  return 0;
}

int run_bench_kernels(const BenchKernelsArgs& a) {
#ifndef PTQKIT_HAVE_CUDA
  fail(Errc::usage, "", "bench kernels", "this build has no CUDA");
#else
  if (!cuda::available()) fail(Errc::usage, "", "bench kernels", "needs a GPU: " + cuda::describe());
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (const auto& s : a.shapes) {
    long long n = 0, k = 0;
    char tail = 0;
    if (std::sscanf(s.c_str(), "%lldx%lld%c", &n, &k, &tail) != 2 || n < 1 || k < 16 || k % 16)
      fail(Errc::usage, "", "--shapes", "'" + s + "' is not NxK with N >= 1 and K a multiple of 16");
    shapes.emplace_back(n, k);
  }
  cuda::bench_kernels(shapes, a.m, a.runs, a.kernels);
  return 0;
#endif
}

}  // namespace

std::vector<Command> add_bench(CLI::App& app) {
  auto ea = std::make_shared<BenchEvalArgs>();
  auto ga = std::make_shared<BenchGptqArgs>();
  auto ka = std::make_shared<BenchKernelsArgs>();
  auto da = std::make_shared<BenchDecodeArgs>();
  auto sa = std::make_shared<BenchSmoothArgs>();
  CLI::App* bench = app.add_subcommand("bench", "benchmarks (throughput against the machine's measured limits)");
  bench->require_subcommand(1);
  CLI::App* be = bench->add_subcommand("eval", "CPU evaluation throughput beside an Eigen GEMM measured in the same run");
  be->add_option("--model", ea->model, "model folder")->required();
  be->add_option("--data", ea->data, "text file")->required();
  be->add_option("--seq-len", ea->seq_len, "window length (default: the model's context)");
  be->add_option("--windows", ea->windows, "windows to evaluate")->default_val(16);
  CLI::App* bg = bench->add_subcommand("gptq", "Hessians and the GPTQ solve of one decoder layer on the GPU, by phase");
  bg->add_option("--preset", ga->preset, "llama2-7b | llama3-8b | llama2-70b | small")->default_val("llama2-7b");
  bg->add_option("--samples", ga->samples, "calibration windows")->default_val(128);
  CLI::App* bd = bench->add_subcommand("decode", "GPU decode tok/s per weight format and batch on a synthetic checkpoint, beside each format's bytes-per-token floor");
  bd->add_option("--preset", da->preset, "llama2-7b | llama3-8b | ... (synth presets)")->capture_default_str();
  bd->add_option("--layers", da->layers, "layers (default: the preset's)");
  bd->add_option("--formats", da->formats, "f16, w8a16, w4a16, nf4, w8a8; q4_k, q6_k (GGUF's K-quants on the A16 kernels)")
      ->check(CLI::IsMember({"f16", "w8a16", "w4a16", "nf4", "w8a8", "q4_k", "q6_k"}))
      ->delimiter(',');
  bd->add_option("--batch", da->batches, "sequences decoded together (default 1,8,32)")->check(CLI::Range(1, 256))->delimiter(',');
  bd->add_option("--prompt", da->prompt, "prompt tokens (prefill)")->capture_default_str();
  bd->add_option("--decode", da->decode, "tokens decoded")->capture_default_str();
  bd->add_option("--json", da->json_out, "write the table as JSON here");
  bd->add_flag("--no-graph", da->no_graph, "launch each decode step's kernels one by one instead of replaying a CUDA graph");
  bd->add_flag("--apart", da->apart, "q, k, v and gate, up as separate Linears (default: stacked into one Linear each, as generate loads them)");
  CLI::App* bs = bench->add_subcommand("smoothquant", "SmoothQuant's alpha search for one decoder layer of a preset's shapes on the GPU (and --host)");
  bs->add_option("--preset", sa->preset, "llama2-7b | llama3-8b | ... (synth presets)")->capture_default_str();
  bs->add_option("--rows", sa->rows, "activation rows of the search")->check(CLI::Range(int64_t(1), int64_t(65536)))->capture_default_str();
  bs->add_flag("--host", sa->host, "also time the host's fp32 reference search (slow on 7B shapes)");
  auto aa = std::make_shared<BenchAwqArgs>();
  CLI::App* ba = bench->add_subcommand("awq", "AWQ's search for one decoder layer of a preset's shapes: its errors on the host and, with a GPU, on the GPU (compared)");
  ba->add_option("--preset", aa->preset, "llama2-7b | llama3-8b | ... (synth presets)")->capture_default_str();
  ba->add_option("--rows", aa->rows, "activation rows of the search")->check(CLI::Range(int64_t(1), int64_t(65536)))->capture_default_str();
  ba->add_option("--grid", aa->grid, "ratios searched")->check(CLI::Range(1, 1000))->capture_default_str();
  ba->add_flag("--gpu-only", aa->gpu_only, "the GPU's arms only (the host's take minutes on 7B shapes): the resident search compared with the SGEMM arm");
  CLI::App* bk = bench->add_subcommand("kernels", "W4A16, W8A16, NF4 (against cuBLAS f16) and W8A8 (against cuBLAS bf16 and int8) GPU kernels: llama shapes, M = 1..4096, cold L2");
  bk->add_option("--runs", ka->runs, "runs per measurement (median)")->default_val(100);
  bk->add_option("--kernels", ka->kernels, "which kernels")->check(CLI::IsMember({"w4a16", "w8a16", "nf4", "w8a8"}))->delimiter(',');
  bk->add_option("--m", ka->m, "activation rows M (default 1,8,16,32,64,128,4096)")->check(CLI::Range(int64_t(1), int64_t(65536)))->delimiter(',');
  bk->add_option("--shapes", ka->shapes, "weight shapes NxK (default the Llama-7B/8B ones)")->delimiter(',');
  bg->add_option("--layers", ga->layers, "run the whole pipeline on a synthetic checkpoint of this many layers (0: one layer's Hessians and solve only)");
  bg->add_option("--gpus", ga->gpus, "the pipeline data-parallel over N GPUs, one process each through NCCL (quantize --gpus N; implies --layers 2 where not given)")
      ->check(CLI::Range(0, 64));
  bg->add_option("--workdir", ga->workdir, "folder for the synthetic checkpoint and output (default: a temporary one, removed after)");
  bg->add_option("--seq-len", ga->seq_len, "tokens per window")->default_val(2048);
  bg->add_option("--gpu-activations", ga->gpu_activations, "where the pipeline keeps the calibration activations")
      ->check(CLI::IsMember({"auto", "device", "host"}))->default_val("auto");
  bg->add_option("--bits", ga->bits)->default_val(4);
  bg->add_option("--group-size", ga->group)->default_val(128);
  bg->add_option("--act-order", ga->act_order, "act-order with static groups")->default_val(true);
  bg->add_option("--batch", ga->batch, "one layer: solve an MoE layer's expert downs in batches, as the pipeline does (false: one by one)")->default_val(true);
  return {{be, [ea] { return run_bench_eval(*ea); }}, {bg, [ga] { return run_bench_gptq(*ga); }}, {bk, [ka] { return run_bench_kernels(*ka); }},
          {bs, [sa] { return run_bench_smoothquant(*sa); }},
          {ba, [aa] { return run_bench_awq(*aa); }},
          {bd, [da] { return run_bench_decode(*da); }}};
}

}  // namespace ptq
