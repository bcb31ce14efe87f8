// more_commands.cpp — subcommands beyond eval/synth/inspect: bench.
#include <chrono>
#include <cstdio>

#include "commands.h"
#include "core/error.h"
#include "eval/data.h"
#include "eval/perplexity.h"
#include "model/llama.h"

namespace ptq {

namespace {
struct BenchEvalArgs {
  std::string model, data;
  int seq_len = 0;
  int64_t windows = 16;
} g_be;
CLI::App* g_bench = nullptr;
CLI::App* g_bench_eval = nullptr;

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
}  // namespace

void register_more_commands(CLI::App& app) {
  register_quantize(app);
  g_bench = app.add_subcommand("bench", "benchmarks (throughput against the machine's measured limits)");
  g_bench->require_subcommand(1);
  g_bench_eval = g_bench->add_subcommand("eval", "CPU evaluation throughput beside an Eigen GEMM measured in the same run");
  g_bench_eval->add_option("--model", g_be.model, "model folder")->required();
  g_bench_eval->add_option("--data", g_be.data, "text file")->required();
  g_bench_eval->add_option("--seq-len", g_be.seq_len, "window length (default: the model's context)");
  g_bench_eval->add_option("--windows", g_be.windows, "windows to evaluate")->default_val(16);
}

int run_more_commands(CLI::App& app) {
  if (quantize_parsed()) return run_quantize_command();
  if (g_bench_eval && g_bench_eval->parsed()) return bench_eval();
  fail(Errc::usage, "", "", "no command given; see --help");
}

}  // namespace ptq
