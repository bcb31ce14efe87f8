// bench_decode.cpp — `ptqkit bench decode`: batch decode throughput per weight format on a
// synthetic checkpoint of a preset's shapes (random weights on the GPU), beside each format's
// floor: the bytes one step reads (weights, plus the KV cache at the mean position) at the
// device-to-device copy bandwidth measured in the same run. Prompt P tokens (prefill, timed),
// then D tokens decoded greedily on the device (timed). Beside it the chain floor: the step's
// launch structure (argmax, embed; per layer norm, the q, k, v Linear(s), attention, o, norm, the
// gate, up Linear(s), down; norm, lm_head, advance) as a graph of kernels that only read each
// stage's bytes (kernels/bench_kernels.h: stream_chain_ms), so what the step's kernel count and
// dependencies cost with ideal bodies, measured in the same run.
#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/rng.h"
#include "model/config.h"
#include "model/synth.h"
#ifdef PTQKIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/runtime.h"
#include "eval/decode_cuda.h"
#include "kernels/bench_kernels.h"
#endif

namespace ptq {

#ifdef PTQKIT_HAVE_CUDA
namespace {
// The decode step's launches as the chain floor's links (kernels/bench_kernels.h: stream_chain_ms),
// each the bytes its stage reads: argmax (the fp32 logits), embed (a 16-bit row a sequence); per
// layer the norm (the fp32 residual and its weights), the q, k, v Linear(s), attention (the layer's
// K and V of kv, the step's), o, the norm, the gate, up Linear(s), down; the final norm, lm_head,
// advance. lb: one layer's Linears' bytes by stage (DecodeWeights::layer_linear_bytes).
std::vector<double> step_chain(const LlamaConfig& c, int B, double kv, const std::array<std::vector<double>, 4>& lb) {
  const double d = double(c.hidden_size), act = double(B) * d, norm = act * 4 + d * 4;
  std::vector<double> chain = {double(B) * c.vocab_size * 4, act * 2};
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    chain.push_back(norm);
    chain.insert(chain.end(), lb[0].begin(), lb[0].end());
    chain.push_back(kv / c.num_hidden_layers);
    chain.insert(chain.end(), lb[1].begin(), lb[1].end());
    chain.push_back(norm);
    chain.insert(chain.end(), lb[2].begin(), lb[2].end());
    chain.insert(chain.end(), lb[3].begin(), lb[3].end());
  }
  chain.insert(chain.end(), {norm, double(c.vocab_size) * d * 2, 4.0});
  return chain;
}
}  // namespace
#endif

int run_bench_decode(const BenchDecodeArgs& a) {
#ifndef PTQKIT_HAVE_CUDA
  (void)a;
  fail(Errc::usage, "", "bench decode", "this build has no CUDA");
#else
  if (!cuda::available()) fail(Errc::usage, "", "bench decode", "needs a GPU: " + cuda::describe());
  const LlamaConfig c = parse_config(synth_config_json(a.preset, a.layers, DType::F16), a.preset);
  const int P = a.prompt, D = a.decode, max_len = P + D + 1;
  // Copy bandwidth: 1 GiB device to device, bytes read + written, best of 10.
  double copy_gbs = 0;
  {
    const size_t n = size_t(1) << 30;
    cuda::DeviceBuffer<uint8_t> x(n, "copy src"), y(n, "copy dst");
    for (int i = 0; i < 10; ++i) {
      cuda::synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      cuda::copy_device(y.get(), x.get(), n);
      cuda::synchronize();   // a device-to-device cudaMemcpy returns before it completes
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      copy_gbs = std::max(copy_gbs, 2.0 * double(n) / s / 1e9);
    }
  }
  std::printf("bench decode on %s: %s (%d layers), prompt %d then %d tokens greedy; q, k, v and gate, up %s; copy %.0f GB/s (read + write)\n",
              cuda::describe().c_str(), a.preset.c_str(), c.num_hidden_layers, P, D, a.apart ? "apart" : "stacked", copy_gbs);
  double empty_chain_ms = -1;   // the step's launches alone, each link reading 16 bytes: printed with the first format's weights
  nlohmann::json rows = nlohmann::json::array();
  std::map<int, double> f16_tps;
  // f16 first where it is asked for: the other formats' "vs f16" is against it (a format without
  // f16 in the run prints "-" there, and null in the JSON).
  std::vector<std::string> formats = a.formats;
  std::stable_partition(formats.begin(), formats.end(), [](const std::string& f) { return f == "f16"; });
  for (const std::string& fmt : formats) {
    cuda::DecodeWeights w = cuda::synthetic_decode_weights(c, fmt, !a.apart);
    const double wbytes = w.step_weight_bytes;
    auto shared = std::make_shared<cuda::DecodeWeights>(std::move(w));
    if (empty_chain_ms < 0) {   // the same links in every format (stacked or apart)
      std::vector<double> links = step_chain(c, 1, 0, shared->layer_linear_bytes);
      std::fill(links.begin(), links.end(), 16.0);
      empty_chain_ms = cuda::stream_chain_ms(links, 20);
      std::printf("chain of %zu empty links (the step's launches alone): %.3f ms\n", links.size(), empty_chain_ms);
      std::printf("%-7s %5s | %9s %8s | %9s %6s | %9s %6s | %8s | %11s\n", "format", "batch", "tok/s", "ms/step", "floor", "%floor", "chain", "%chain",
                  "vs f16", "prefill t/s");
    }
    for (int B : a.batches) {
      cuda::DecodeWeights wb = *shared;   // the same device weights (owners shared)
      cuda::DecodeCuda dec(std::move(wb), B, max_len);
      dec.set_graphs(!a.no_graph);
      Rng r(11);
      std::vector<int32_t> prompt(size_t(B) * size_t(P));
      for (auto& t : prompt) t = int32_t(r.below(uint64_t(c.vocab_size)));
      // Warm-up (cuBLAS heuristics, the buffer pool), then the timed run.
      dec.feed(prompt, P);
      dec.decode_greedy(std::min(D, 8));
      dec.reset();
      cuda::synchronize();
      auto t0 = std::chrono::steady_clock::now();
      dec.feed(prompt, P);
      cuda::synchronize();
      const double prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      t0 = std::chrono::steady_clock::now();
      dec.decode_greedy(D);   // ends with a copy of the tokens to the host
      const double decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double tps = double(B) * D / decode_s, step_ms = 1e3 * decode_s / D;
      // The last step's logits, after the timing: a synthetic model whose activations overflow
      // (its W8A16 Linears did before their zero point was set, lab run 151) times GEMMs on NaN.
      const bool finite = dec.logits().allFinite();
      if (!finite)
        std::fprintf(stderr, "bench decode: %s at batch %d ended with non-finite logits: these timings ran on NaN or infinities "
                     "(PTQKIT_DECODE_CHECK=1 with --no-graph names the stage)\n", fmt.c_str(), B);
      // Per step: the weights once, and each sequence's K and V up to the mean position.
      const double kv = 2.0 * 2.0 * double(c.kv_dim()) * c.num_hidden_layers * double(B) * (P + D / 2.0);
      const double floor_tps = double(B) / ((wbytes + kv) / (copy_gbs * 1e9));
      const std::vector<double> chain = step_chain(c, B, kv, shared->layer_linear_bytes);
      const double chain_tps = double(B) / (cuda::stream_chain_ms(chain, 20) * 1e-3);
      if (fmt == "f16") f16_tps[B] = tps;
      const bool have_f16 = f16_tps.count(B) > 0;
      const double vs = have_f16 ? tps / f16_tps[B] : 0;
      char vs_text[16];
      if (have_f16) std::snprintf(vs_text, sizeof vs_text, "%7.2fx", vs);
      else std::snprintf(vs_text, sizeof vs_text, "%8s", "-");
      std::printf("%-7s %5d | %9.1f %8.3f | %9.1f %5.1f%% | %9.1f %5.1f%% | %s | %11.0f%s\n", fmt.c_str(), B, tps, step_ms, floor_tps, 100 * tps / floor_tps,
                  chain_tps, 100 * tps / chain_tps, vs_text, double(B) * P / prefill_s, dec.graph_used() ? "  graph" : "");
      if (!finite) std::printf("  (non-finite logits)\n");
      std::fflush(stdout);
      rows.push_back({{"format", fmt}, {"batch", B}, {"tok_s", tps}, {"ms_per_step", step_ms}, {"floor_tok_s", floor_tps},
                      {"chain_floor_tok_s", chain_tps}, {"chain_kernels", chain.size()},
                      {"weight_bytes_per_step", wbytes}, {"kv_bytes_per_step", kv}, {"prefill_tok_s", double(B) * P / prefill_s},
                      {"vs_f16", have_f16 ? nlohmann::json(vs) : nlohmann::json(nullptr)}, {"graph", dec.graph_used()}, {"logits_finite", finite}});
    }
  }
  if (!a.json_out.empty())
    write_file_atomic(a.json_out, nlohmann::json({{"device", cuda::describe()}, {"preset", a.preset}, {"stacked", !a.apart}, {"copy_gbs", copy_gbs},
                                                  {"empty_chain_ms", empty_chain_ms}, {"prompt", P},
                                                  {"decode", D}, {"rows", rows}}).dump(2) + "\n");
  return 0;
#endif
}

}  // namespace ptq
