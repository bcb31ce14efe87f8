// Whole runs on the GPU against the same runs on the CPU: quantize with device: cuda against
// device: cpu, and evaluation through the packed kernels against the reference kernels.
#include <cmath>
#include <cstring>
#include <numeric>
#include <map>

#include "core/bits.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/rng.h"
#include "model/attention_cuda.h"
#include "model/forward_cuda.h"
#include "gptq/gptq_cuda.h"
#include <cuda_runtime.h>

#include "cuda/comm.h"
#include "cuda/random.h"
#include "formats/gguf.h"
#include "kernels/act_quant.h"
#include "kernels/reference.h"
#include "kernels/nf4.h"
#include "kernels/w4a16.h"
#include "kernels/w8a8.h"
#include "cuda/runtime.h"
#include "model/corpus.h"
#include "eval/perplexity.h"
#include "eval/nll_cuda.h"
#include "eval/perplexity_cuda.h"
#include "formats/open.h"
#include "model/generate.h"
#include "model/synth.h"
#include "pipeline/pipeline.h"
#include "golden.h"
#include "testing.h"
#include "testing_cuda.h"

using namespace ptq;
using nlohmann::json;

namespace {
// configs/smoothquant-w8a8-gptq.yaml's quantization (α searched, per-token int8 inputs), on the GPU.
Recipe smoothquant_recipe() {
  Recipe q = parse_recipe(YAML::Load("quantization: {method: gptq, bits: 8, group_size: -1, sym: true,\n"
                                     "  smoothquant: {alpha: auto, pairs: [input_layernorm, post_attention_layernorm]},\n"
                                     "  activations: {strategy: token, dynamic: true}}\n"
                                     "export: {format: [compressed-tensors]}\n"),
                          "sq.yaml");
  q.device = "cuda";
  return q;
}
// r stopped once layer 3 is on disk (QuantizeOptions::stop_after_layer; with resume set the
// folder stays, as a killed run leaves it), then run again with --resume: layers 0-3 replayed.
// Returns the resumed run's model.safetensors.
std::string stopped_and_resumed(const Recipe& r) {
  QuantizeOptions stop;
  stop.resume = true;
  stop.stop_after_layer = 3;
  CHECK_THROWS_WITH(run_quantize(r, stop), Catch::Contains("stopped after layer 3"));
  CHECK(std::filesystem::exists(r.output + ".partial/.layers/layer-00003.safetensors"));
  CHECK_FALSE(std::filesystem::exists(r.output));
  QuantizeOptions resume;
  resume.resume = true;
  const json rj = run_quantize(r, resume);
  int replayed = 0;
  for (const json& l : rj["layers"]) replayed += l.value("resumed", false);
  CHECK(replayed == 4);
  return read_text_file(r.output + "/model.safetensors");
}
// r run with --save-stats, once on one GPU (gpus 0) and once with `gpus` ranks: the two runs'
// models and statistics files, byte for byte, and a --load-stats run of the second's statistics
// with gpus still set (it runs on one GPU) writes the same model again.
void check_saved_statistics(Recipe r, int gpus, const ptqtest::TempDir& d) {
  QuantizeOptions save;
  r.gpus = 0;
  r.output = d / "saved-one";
  save.save_stats = d / "stats-one";
  run_quantize(r, save);
  r.gpus = gpus;
  r.output = d / "saved-ranks";
  save.save_stats = d / "stats-ranks";
  run_quantize(r, save);
  const std::string model = read_text_file(d / "saved-one/model.safetensors");
  CHECK(read_text_file(d / "saved-ranks/model.safetensors") == model);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(d / "stats-one")) {
    INFO(e.path().filename());
    CHECK(read_text_file(e.path().string()) == read_text_file(d / "stats-ranks/" + e.path().filename().string()));
    ++files;
  }
  CHECK(files >= 2);   // stats.json and a file a layer
  QuantizeOptions load;
  load.load_stats = d / "stats-ranks";
  r.output = d / "loaded";
  run_quantize(r, load);
  CHECK(read_text_file(d / "loaded/model.safetensors") == model);
}
}  // namespace

TEST_CASE("gpu: device cuda reproduces device cpu on distilled-13m (perplexity 0.2%, module loss 1%)") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string a = ptqtest::assets();
  Recipe r = parse_recipe(YAML::Load("quantization: {bits: 4, group_size: 128, act_order: true, static_groups: true}\n"), "r.yaml");
  r.model = a + "/models/distilled-13m";
  r.calibration = {a + "/text/tinystories/calib.txt", 32, 512, 0};
  r.device = "cpu";
  r.output = d / "cpu";
  json rc = run_quantize(r, {});
  r.device = "cuda";
  r.gpu_forward = GENERATE(false, true);
  r.output = d / "gpu";
  json rg = run_quantize(r, {});
  std::cout << "--- GPU forward: " << rg["forward"] << "\n";
  CHECK(rg["device"].get<std::string>().rfind("cuda", 0) == 0);
  CHECK((rg["forward"].get<std::string>().rfind("cuda", 0) == 0) == r.gpu_forward);
  // Module losses. The CPU forward (gpu_forward false) feeds the GPU the same fp32 activations,
  // but the Hessians still differ by summation order (~2.5e-7), so a few near-boundary codes of
  // layer 0 flip and every later module sees inputs moved by whole quantization steps (the
  // cascade below): which codes flip is a draw that moves with the last bits of the forward. Worst
  // module 0.78% on the H100; 1.18% on the H200 once the CPU softmax took Eigen's vectorized exp
  // (layer 1 k_proj, mean drift -0.008%: docs/lab/2026-11-28-cpu-attention.md). So each loss and
  // its GPTQ/RTN ratio within 2%, with no systematic drift (below). The GPU forward rounds GEMM
  // operands to 16 bits, so from layer 1 on every module sees slightly different inputs (and the
  // code flips they cause): there the loss is on a slightly different H, and the measure that
  // compares like with like is GPTQ's loss over RTN's on the same H, with the raw losses and that
  // ratio within 2% and no systematic drift (mean relative difference within 0.3%). Measured on the H100: worst ratio difference 0.94% with the
  // unfused attention, 1.45% with flash attention (layer 1 q/k_proj; the layer's output is as
  // accurate as before, 1.9e-4 against fp32, and the mean drift is -0.07%): which codes flip in
  // layer 0 moves the next layer's H, so the worst single module is a draw, not a bias.
  double drift = 0, worst_raw = 0, worst_ratio = 0;
  for (size_t i = 0; i < rc["modules"].size(); ++i) {
    const json &mc = rc["modules"][i], &mg = rg["modules"][i];
    const double lc = mc["loss"], lg = mg["loss"], rcr = mc["loss_ratio_vs_rtn"], rgr = mg["loss_ratio_vs_rtn"];
    INFO(mc["name"] << ": loss GPU " << lg << " CPU " << lc << "; ratio to RTN GPU " << rgr << " CPU " << rcr);
    drift += (lg - lc) / lc;
    worst_raw = std::max(worst_raw, std::abs(lg - lc) / lc);
    worst_ratio = std::max(worst_ratio, std::abs(rgr - rcr) / rcr);
    CHECK(std::abs(lg - lc) <= 0.02 * lc);
    CHECK(std::abs(rgr - rcr) <= 0.02 * rcr);
  }
  drift /= double(rc["modules"].size());
  std::cout << "module losses GPU vs CPU: worst " << 100 * worst_raw << "%, mean signed " << 100 * drift << "%; GPTQ/RTN ratio worst " << 100 * worst_ratio << "%\n";
  CHECK(std::abs(drift) <= 0.003);
  // Share of identical codes (through the dequantized weights). q/k/v of layer 0 see identical
  // inputs (their Hessians differ by summation order, ~2.5e-7), so their codes must agree. Every
  // module after them takes inputs computed with the quantized modules before it, and a single
  // flipped code moves those inputs by a quantization step: measured on the H100, q/k/v 99.9-100%,
  // o 99.3%, gate/up 87%, down 72% — GPTQ's sequential cascade, seen on the CPU alone too (a 1e-8
  // change of the damping: identical until one code flips, ~85% after). Perplexity and the
  // per-module losses are the end-to-end measures.
  std::map<int, std::pair<int64_t, int64_t>> share;
  int64_t qkv_same = 0, qkv_total = 0;
  {
    Checkpoint cc(d / "cpu"), cg(d / "gpu");
    for (auto& n : cc.names()) {
      if (n.find("_proj.weight") == std::string::npos) continue;
      auto x = tensor_to_f32(cc.get(n)), y = tensor_to_f32(cg.get(n));
      auto& e = share[std::atoi(n.c_str() + 13)];
      int64_t same_here = 0;
      for (size_t i = 0; i < x.size(); ++i) same_here += x[i] == y[i];
      e.first += same_here;
      e.second += int64_t(x.size());
      if (n.rfind("model.layers.0.", 0) == 0) std::cout << "  " << n << ": " << 100.0 * double(same_here) / double(x.size()) << "%\n";
      if (n.rfind("model.layers.0.self_attn.", 0) == 0 && n.find("o_proj") == std::string::npos) { qkv_same += same_here; qkv_total += int64_t(x.size()); }
    }
  }
  for (auto& [l, e] : share) std::cout << "identical codes GPU vs CPU, layer " << l << ": " << 100.0 * double(e.first) / double(e.second) << "%\n";
  // With the GPU forward the layer-0 inputs are rounded to 16 bits before the Hessian (as the
  // GEMMs consume them), so even q/k/v see a slightly different H: a looser bound there.
  CHECK(double(qkv_same) / double(qkv_total) >= (r.gpu_forward ? 0.95 : 0.99));
  const auto ids = ptqtest::eval_tokens(r.model);
  const EvalOptions o = ptqtest::eval_windows(512, 100);
  const double pc = evaluate(*open_model(d / "cpu"), ids, o).perplexity, pg = evaluate(*open_model(d / "gpu"), ids, o).perplexity;
  std::cout << "distilled-13m GPTQ 4-bit g128: perplexity GPU " << pg << ", CPU " << pc << "; GPU peak " << rg["peak_gpu_mb"] << " MiB\n";
  CHECK(std::abs(pg - pc) <= 0.002 * pc);
}

TEST_CASE("gpu: GGUF Q4_K_M of distilled-13m with device cuda: llama.cpp's grids solved on the GPU, near device cpu's losses and perplexity") {
  // The mix puts Q4_K and Q6_K on the 1024-wide down projections and Q5_0 / Q8_0 (integer grids) on
  // the 384-wide Linears. Before 2026-12-05 the K-quants' solve ran on the host in a GPU run; now
  // their grids are formed on the device (static_grids' to the bit) and the solve runs there, whose column
  // loop differs from the CPU's by rounding (the case above: GPTQ's cascade), so the runs are held
  // to each module's loss (2%, the CPU forward feeding both) and the perplexity (0.2%). (That these
  // specs go to the GPU solve is the spec-check case's in test_gptq_cuda: the report does not say
  // where a module was solved.) The output and embedding tables (Q8_0 and Q5_0: llama.cpp's
  // fallbacks on rows of 384) take no calibration: the GPU run forms them on a thread beside it, and
  // they must be the CPU run's bytes.
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const auto [model, ids, o] = ptqtest::distilled_eval();
  Recipe r = parse_recipe(YAML::Load("quantization: {method: gptq, act_order: true, static_groups: true}\nexport: {format: [gguf], gguf_type: Q4_K_M}\n"),
                          "r.yaml");
  r.model = model;
  r.calibration = {ptqtest::assets() + "/text/tinystories/calib.txt", 32, 512, 0};
  r.device = "cpu";
  r.output = d / "cpu";
  const json rc = run_quantize(r, {});
  r.device = "cuda";
  r.gpu_forward = false;
  r.output = d / "gpu";
  const json rg = run_quantize(r, {});
  REQUIRE(rc["modules"].size() == rg["modules"].size());
  int q4_k = 0, q6_k = 0;
  double worst = 0;
  for (size_t i = 0; i < rc["modules"].size(); ++i) {
    const json &mc = rc["modules"][i], &mg = rg["modules"][i];
    const double lc = mc["loss"], lg = mg["loss"];
    INFO(mc["name"] << ": loss GPU " << lg << " CPU " << lc);
    CHECK(mg["name"] == mc["name"]);
    CHECK(std::abs(lg - lc) <= 0.02 * lc);
    worst = std::max(worst, std::abs(lg - lc) / lc);
    if (mc["name"].get<std::string>().find("down_proj") != std::string::npos) (mc["bits"] == 6 ? q6_k : q4_k)++;
  }
  CHECK(q4_k == 4);   // the mix: Q6_K on half of the down projections, Q4_K on the rest
  CHECK(q6_k == 4);
  CHECK(rc["background_seconds"]["gguf_tables"] == 0.0);   // the CPU run forms them in its export
  CHECK(rg["background_seconds"]["gguf_tables"] > 0.0);
  const GgufFile fc(d / "cpu/model.gguf"), fg(d / "gpu/model.gguf");
  for (const char* t : {"output.weight", "token_embd.weight"}) {
    INFO(t);
    const GgufFile::TensorInfo *a = fc.find(t), *b = fg.find(t);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->type == b->type);
    CHECK(a->type != GgmlType::F16);
    REQUIRE(a->nbytes == b->nbytes);
    CHECK(std::memcmp(a->data, b->data, a->nbytes) == 0);
  }
  const double pc = evaluate(*open_model(d / "cpu"), ids, o).perplexity, pg = evaluate(*open_model(d / "gpu"), ids, o).perplexity;
  std::cout << "distilled-13m Q4_K_M: perplexity GPU " << pg << ", CPU " << pc << "; module losses within " << 100 * worst << "%\n";
  CHECK(std::abs(pg - pc) <= 0.002 * pc);
}

TEST_CASE("gpu: eval on the GPU of gptq, compressed-tensors (pack- and int-quantized) and NF4 checkpoints (W4A16, W8A16, NF4, W8A8 kernels) equals the reference-kernel evaluation within 1e-3") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string a = ptqtest::assets();
  const auto [model, ids, o] = ptqtest::distilled_eval();
  struct Case { const char* yaml; const char* format; };
  const Case cases[] = {{"quantization: {bits: 4, group_size: 128, act_order: true}\nexport: {format: [gptq]}\n", "gptq"},
                        {"quantization: {bits: 4, group_size: 128, sym: false}\nexport: {format: [gptq_v2]}\n", "gptq_v2"},
                        {"quantization: {bits: 8, group_size: -1}\nexport: {format: [gptq]}\n", "gptq"},
                        // pack-quantized (the W4A16 and W8A16 schemes' default export) through the same kernels as gptq
                        {"quantization: {bits: 4, group_size: 128, act_order: true, sym: false}\nexport: {format: [compressed-tensors]}\n", "compressed-tensors/pack-quantized"},
                        {"quantization: {bits: 8, group_size: -1}\nexport: {format: [compressed-tensors]}\n", "compressed-tensors/pack-quantized"},
                        {"quantization: {method: nf4}\nexport: {format: [nf4], nf4_blocksize: 64, nf4_double_quant: true}\n", "bitsandbytes-nf4"},
                        {"quantization: {method: rtn, bits: 8, group_size: -1, smoothquant: {alpha: 0.5}, activations: {strategy: token, dynamic: true}}\n"
                         "export: {format: [compressed-tensors]}\n", "compressed-tensors/int-quantized"},
                        {"quantization: {method: rtn, bits: 8, group_size: -1, activations: {strategy: tensor, dynamic: false}}\n"
                         "export: {format: [compressed-tensors]}\n", "compressed-tensors/int-quantized"}};
  int k = 0;
  for (const Case& cs : cases) {
    Recipe r = parse_recipe(YAML::Load(cs.yaml), "r.yaml");
    r.model = model;
    r.calibration = {a + "/text/tinystories/calib.txt", 16, 256, 0};
    r.output = d / ("q" + std::to_string(k++));
    run_quantize(r, {});
    REQUIRE(model_format(r.output) == cs.format);
    auto m = open_model(r.output);
    const EvalResult cpu = evaluate(*m, ids, o);   // the reference path: weights dequantized by the reference unpacking, fp32 GEMMs
    cuda::GpuLogits gpu(*m, r.output);
    const LogitsFn fn = [&gpu](const std::vector<int32_t>& t, int S, int T) { return gpu(t, S, T); };
    const EvalResult g = evaluate(fn, m->config().max_position_embeddings, ids, o);
    const NllFn nfn = [&gpu](const std::vector<int32_t>& t, int S, int T) { return gpu.nll(t, S, T); };
    const EvalResult gn = evaluate(fn, m->config().max_position_embeddings, ids, o, nullptr, &nfn);   // the NLL on the device (eval --device cuda)
    INFO("device NLL perplexity " << gn.perplexity << " vs host log-softmax " << g.perplexity);
    CHECK(std::abs(gn.perplexity / g.perplexity - 1) <= 1e-12);
    CHECK(gn.scored_tokens == g.scored_tokens);
    std::cout << cs.format << " " << cs.yaml << "  perplexity GPU " << g.perplexity << " CPU reference " << cpu.perplexity << " (relative "
              << g.perplexity / cpu.perplexity - 1 << "); " << gpu.describe() << "; GPU forward " << gpu.forward_seconds() << " s\n";
    CHECK(gpu.describe().find("56 of 56") != std::string::npos);   // every decoder Linear through the kernels (distilled-13m: 8 layers x 7 = 56)
    CHECK(std::abs(g.perplexity / cpu.perplexity - 1) <= 1e-3);
    CHECK(g.scored_tokens == cpu.scored_tokens);
  }
}

TEST_CASE("gpu: the NLL of each row on the device equals the host's fp64 log-softmax (1e-12)") {
  PTQ_REQUIRE_GPU();
  const int S = 3, T = 37;
  const int64_t V = 32001, N = int64_t(S) * T;   // V not a multiple of the block
  Rng r{41};
  std::vector<float> logits(size_t(N * V));
  for (auto& v : logits) v = float(r.normal() * 4.0);
  std::vector<int32_t> tokens(static_cast<size_t>(N));
  for (auto& t : tokens) t = int32_t(r.next() % uint64_t(V));
  cuda::DeviceBuffer<float> dl(logits.size(), "logits");
  cuda::copy_to_device(dl.get(), logits.data(), logits.size() * 4);
  const std::vector<double> nll = cuda::nll_rows(dl.get(), tokens, S, T, V);
  REQUIRE(nll.size() == size_t(S * (T - 1)));
  std::vector<double> lp(static_cast<size_t>(V));
  double worst = 0;
  for (int s = 0; s < S; ++s)
    for (int t = 0; t < T - 1; ++t) {
      log_softmax(logits.data() + (int64_t(s) * T + t) * V, int(V), lp.data());
      const double want = -lp[size_t(tokens[size_t(s * T + t + 1)])];
      worst = std::max(worst, std::abs(nll[size_t(s * (T - 1) + t)] - want) / want);
    }
  INFO("worst relative difference " << worst);
  CHECK(worst <= 1e-12);
  CHECK(cuda::nll_rows(dl.get(), tokens, S, T, V) == nll);   // fixed reduction order: the same bytes again
}

TEST_CASE("gpu: Qwen3, Mixtral, Qwen3-MoE and Phi-3 quantized with device cuda (every expert) match device cpu, and are evaluated on the GPU") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  for (const std::string family : {"qwen3", "mixtral", "qwen3-moe", "phi3"}) {
    ptqtest::TempDir d;
    Recipe r = parse_recipe(YAML::Load("quantization: {bits: 4, group_size: 16, act_order: true, static_groups: true}\n"), "r.yaml");
    r.formats = {"fake"};
    const auto [rc, rg] = ptqtest::tiny_runs_cpu_gpu(r, family, d);
    const bool moe = family == "mixtral" || family == "qwen3-moe";
    INFO(family << ": forward " << rg["forward"]);
    // Every family runs the GPU forward (q/k norms, fused Linears, experts).
    CHECK(rg["forward"].get<std::string>().rfind("cuda", 0) == 0);
    REQUIRE(rc["modules"].size() == rg["modules"].size());
    // 16-bit GEMM operands move every later module's input a little (see the distilled-13m case):
    // no drift on average, each loss within 5%. (Every expert's Hessians see every row, so a
    // router choice the rounding flips moves only the layer's output.)
    double worst = 0, drift = 0;
    for (size_t i = 0; i < rc["modules"].size(); ++i) {
      const json &mc = rc["modules"][i], &mg = rg["modules"][i];
      INFO(mc["name"]);
      CHECK(mc["name"] == mg["name"]);
      const double lc = mc["loss"], lg = mg["loss"];
      worst = std::max(worst, std::abs(lg - lc) / lc);
      drift += (lg - lc) / lc / double(rc["modules"].size());
      CHECK(std::abs(lg - lc) <= 0.05 * lc);
      if (moe && mg.contains("expert")) CHECK(mg["routed_tokens"].get<int64_t>() >= 0);
      CHECK(lg <= mg["rtn_loss"].get<double>() * (1 + 1e-6));
    }
    std::cout << "tiny-" << family << ": " << rc["modules"].size() << " Linears, module loss GPU vs CPU: worst " << 100 * worst << "%, mean signed "
              << 100 * drift << "%\n";
    CHECK(std::abs(drift) <= 0.01);
    if (family == "qwen3-moe") {   // routed calibration on the GPU: each expert's Hessian from the rows routed to it
      r.moe_calibrate_all_experts = false;
      r.output = d / "gpu-routed";
      const json rr = run_quantize(r, {});
      r.device = "cpu";
      r.output = d / "cpu-routed";
      const json rcr = run_quantize(r, {});
      int64_t gpu_sum = 0, cpu_sum = 0;
      for (size_t i = 0; i < rr["modules"].size(); ++i) {
        const json &mg = rr["modules"][i], &mc = rcr["modules"][i];
        if (!mg.contains("expert")) continue;
        CHECK(mg["hessian_tokens"] == mg["routed_tokens"]);
        gpu_sum += mg["routed_tokens"].get<int64_t>();
        cpu_sum += mc["routed_tokens"].get<int64_t>();
        // The 16-bit router may flip a near-tied choice, and layer 1 reads inputs computed with
        // codes that differ here and there (GPU vs CPU forward): counts per expert within 5% + 3
        // of the CPU's (measured on the H200: at most 9 of ~190).
        CHECK(std::abs(mg["routed_tokens"].get<int64_t>() - mc["routed_tokens"].get<int64_t>()) <= 3 + mc["routed_tokens"].get<int64_t>() / 20);
      }
      CHECK(gpu_sum == cpu_sum);   // 16 x 48 tokens x 2 experts x 3 Linears x 2 layers
      CHECK(gpu_sum == 16 * 48 * 2 * 3 * 2);
    }
    // The GPU evaluation (q/k norms, fused Linears and experts through the W4A16 kernel) against the CPU forward of
    // the same checkpoints: the fake export (16-bit weights through cuBLAS) and a gptq export
    const ptqtest::Golden g = ptqtest::golden("tiny-" + family);
    const std::vector<int32_t>& ids = g.ids;
    const int S = g.S, T = g.T;
    r.moe_calibrate_all_experts = true;
    r.formats = {"gptq"};
    r.output = d / "gpu-gptq";
    run_quantize(r, {});
    for (const std::string& dir : {d / "gpu", d / "gpu-gptq"}) {
      auto model = open_model(dir);
      const MatF want = model->forward(ids, S, T);
      cuda::GpuLogits gl(*model, dir);
      const MatF got = gl(ids, S, T);
      REQUIRE((got.rows() == want.rows() && got.cols() == want.cols()));
      // MoE: a router choice the 16-bit logits flip moves that token's logits wholesale: rows
      int within = 0;
      for (Eigen::Index row = 0; row < got.rows(); ++row) within += (got.row(row) - want.row(row)).norm() <= 1e-2 * want.row(row).norm();
      const double rel = (got - want).norm() / want.norm();
      std::cout << "tiny-" << family << " GPU evaluation (" << gl.describe() << ") vs CPU: relative " << rel << ", rows within 1%: " << within << " of "
                << got.rows() << "\n";
      // Measured on the H200: the gptq exports (f16 activations, every Linear, fused or expert,
      // through the W4A16 kernel) within 0.05-0.09% of the CPU; the bf16 fake exports within 0.45-0.67%,
      // except tiny-qwen3-moe at 4.7% (56 of 96 rows within 1%): bf16 inputs to its router (8-bit
      // mantissas) flip near-tied choices among its 8 random experts, and each flip moves a
      // token's logits wholesale from the layer on. The f16 path above bounds the code; this
      // bounds bf16 MoE routing.
      const bool bf16_moe = moe && model->config().dtype == DType::BF16 && dir == d / "gpu";
      if (!moe) CHECK(rel <= 1e-2);
      else if (bf16_moe) CHECK(rel <= 6e-2);
      else CHECK(within >= got.rows() * 9 / 10);
      if (dir == d / "gpu-gptq") CHECK_THAT(gl.describe(), Catch::Contains(std::to_string(rg["modules"].size()) + " of " + std::to_string(rg["modules"].size()) + " Linears"));
      // The GPU decode over the same weights (q, k, v and gate, up stacked, or Phi-3's fused ones;
      // MoE experts routed on the host):
      // a prompt, then tokens fed one at a time (the CPU's argmax each step), logits against the
      // CPU reference (model/generate.h) at every step.
      if (!model->config().fused && !moe)   // Phi-3 stores its Linears fused already; MoE layers have no dense gate, up
        CHECK_THAT(gl.describe(), Catch::Contains("stacked") || Catch::Contains("f16 weights") || Catch::Contains("bf16 weights"));
      Generator cpu(*model);
      cuda::DecodeCuda dec(gl.decode_weights(), 1, 32);
      std::vector<int32_t> feed(ids.begin(), ids.begin() + 8);
      for (int step = 0; step < 6; ++step) {
        const VecF lc = cpu.feed(feed);
        dec.feed(feed, int(feed.size()));
        const VecF lg = dec.logits().row(0).transpose();
        const double drel = (lg - lc).norm() / lc.norm();
        INFO("decode step " << step << ": relative " << drel);
        // bf16 MoE (the float tiny-qwen3-moe): as in the evaluation above, the bf16 GEMMs move the
        // residual enough to flip near-tied choices among its random experts (measured on the H200:
        // 1.3-6.4% at steps 0-5); every other case within 1%.
        CHECK(drel <= (bf16_moe ? 8e-2 : 1e-2));
        Eigen::Index arg = 0;
        lc.maxCoeff(&arg);
        feed = {int32_t(arg)};
      }
    }
  }
}

TEST_CASE("gpu: the GPU evaluation of the float tiny checkpoints matches transformers' golden logits (Qwen3, Mixtral, Qwen3-MoE, Phi-3)") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  const std::string a = ptqtest::assets();
  for (const std::string family : {"qwen3", "mixtral", "qwen3-moe", "phi3"}) {
    const std::string dir = a + "/models/tiny-" + family;
    const ptqtest::Golden g = ptqtest::golden("tiny-" + family);
    const MatF want = Eigen::Map<const MatF>(g.logits.data(), Eigen::Index(g.ids.size()), Eigen::Index(g.vocab()));
    auto model = open_model(dir);
    cuda::GpuLogits gl(*model, dir);
    const MatF got = gl(g.ids, g.S, g.T);
    REQUIRE((got.rows() == want.rows() && got.cols() == want.cols()));
    int within = 0;
    for (Eigen::Index row = 0; row < got.rows(); ++row) within += (got.row(row) - want.row(row)).norm() <= 1e-2 * want.row(row).norm();
    const double rel = (got - want).norm() / want.norm();
    std::cout << "tiny-" << family << " GPU evaluation (bf16 GEMMs) vs transformers' fp32 golden logits: relative " << rel << ", rows within 1%: " << within
              << " of " << got.rows() << "\n";
    // bf16 operands (2^-9) with fp32 accumulation. Measured on the H200: qwen3 0.65%, mixtral
    // 0.45%, qwen3-moe 0.80%, phi3 0.55% (the float models' routers flip no choice here).
    CHECK(rel <= 1e-2);
  }
}

TEST_CASE("gpu: quantize --gpus 1 (NCCL, one rank) writes the bytes of the one-GPU run, and more GPUs than visible are refused") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  Recipe r = parse_recipe(YAML::Load("quantization: {bits: 4, group_size: 32, act_order: true, static_groups: true}\nexport: {format: [gptq]}\n"), "r.yaml");
  r.model = ptqtest::assets() + "/models/distilled-13m";
  r.calibration = {"random", 8, 128, 0};
  r.device = "cuda";
  int visible = 0;
  cudaGetDeviceCount(&visible);
  r.gpus = visible + 1;
  r.output = d / "too-many";
  CHECK_THROWS_WITH(run_quantize(r, {}), Catch::Contains("gpus") && (Catch::Contains("visible") || Catch::Contains("no NCCL")));
  CHECK_FALSE(std::filesystem::exists(d / "too-many"));
  if (!cuda::nccl_built()) {
    WARN("this build has no NCCL: --gpus is refused (above); the one-rank NCCL run is skipped");
    return;
  }
  {   // the communicator itself, one rank: sums leave the values, a digest agrees with itself
    cuda::Comm c(cuda::Comm::new_id(), 0, 1);
    const std::vector<double> h = {1.5, -2.25, 1e300};
    cuda::DeviceBuffer<double> dh(h.size(), "test");
    cuda::copy_to_device(dh.get(), h.data(), h.size() * 8);
    c.sum(dh.get(), h.size());
    std::vector<double> back(h.size());
    cuda::copy_to_host(back.data(), dh.get(), back.size() * 8);
    CHECK(back == h);
    CHECK(c.same(0x0123456789abcdefull));
    CHECK_THROWS_WITH(cuda::Comm("00ff", 0, 1), Catch::Contains("hex digits"));
    c.close();   // the normal end; after it a collective is refused, a second close does nothing
    CHECK_THROWS_WITH(c.sum(dh.get(), h.size()), Catch::Contains("closed"));
    c.close();
  }
  r.gpus = 0;
  r.output = d / "one";
  run_quantize(r, {});
  r.gpus = 1;   // the same run through the data-parallel path: one rank, the Hessians through an NCCL all-reduce
  r.output = d / "nccl";
  const json rep = run_quantize(r, {});
  CHECK_THAT(rep["forward"].get<std::string>(), Catch::Contains("data-parallel over 1 GPUs"));
  // An all-reduce over one rank is a copy: the same Hessians, so the same codes, byte for byte.
  CHECK(read_text_file(d / "one/model.safetensors") == read_text_file(d / "nccl/model.safetensors"));
  // Both paths stopped once layer 3 is on disk and resumed: the GPU forward replays layers 0-3
  // from the layer store (their dequantized weights, rounded to 16 bits as the solver's were)
  // and the run writes the uninterrupted bytes.
  for (int gpus : {0, 1}) {
    r.gpus = gpus;
    r.output = d / ("resumed-" + std::to_string(gpus));
    CHECK(stopped_and_resumed(r) == read_text_file(d / "one/model.safetensors"));
  }
  // SmoothQuant W8A8 through the same path: one rank's statistics are the run's, so the same α,
  // the same folded norms and the same codes.
  Recipe q = smoothquant_recipe();
  q.model = r.model;
  q.calibration = r.calibration;
  q.output = d / "sq-one";
  const json sq1 = run_quantize(q, {});
  q.gpus = 1;
  q.output = d / "sq-nccl";
  const json sqn = run_quantize(q, {});
  CHECK(sqn["smoothquant"] == sq1["smoothquant"]);
  CHECK(read_text_file(d / "sq-one/model.safetensors") == read_text_file(d / "sq-nccl/model.safetensors"));
  // --save-stats through the same path writes a one-GPU saving run's statistics and model, and
  // --load-stats with gpus set runs on one GPU.
  check_saved_statistics(r, 1, d);
}

// NCCL is opened at --gpus' first use (cuda/libs.cpp), not linked: the dynamic loader's log
// (glibc's LD_DEBUG=files: every object a process opens, linked or dlopen'd) of a one-GPU quantize
// names cuBLAS but not libnccl, and the same run with --gpus 1 (one rank, through NCCL) names it.
TEST_CASE("gpu: quantize loads NCCL only with --gpus (the dynamic loader's log)") {
  PTQ_REQUIRE_GPU();
  if (!cuda::nccl_built()) PTQ_SKIP("this build has no NCCL");
  if (!std::filesystem::exists(ptqtest::ptqkit_bin())) PTQ_SKIP("the ptqkit CLI is not at " + ptqtest::ptqkit_bin() + " (set PTQKIT_BIN)");
  ptqtest::TempDir d;
  auto r = ptqtest::run_command(ptqtest::ptqkit_bin() + " synth --preset tiny --seed 1 --output " + d / "m");
  REQUIRE(r.code == 0);
  const std::string quantize = "LD_DEBUG=files " + ptqtest::ptqkit_bin() + " -q quantize --model " + d / "m" +
                               " --scheme W4A16 --dataset random --set device=cuda --set calibration.samples=4 --set calibration.seq_len=64";
  r = ptqtest::run_command(quantize + " -o " + d / "one");
  INFO(r.out.substr(0, 4000));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("file=libcublas.so") != std::string::npos);   // the GPU path ran
  CHECK(r.out.find("libnccl") == std::string::npos);
  r = ptqtest::run_command(quantize + " --gpus 1 -o " + d / "nccl");
  INFO(r.out.substr(0, 4000));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("file=libnccl.so.2") != std::string::npos);
  CHECK(ptq::read_text_file(d / "one/model.safetensors") == ptq::read_text_file(d / "nccl/model.safetensors"));
}

// Two ranks (worker processes running the ptqkit CLI, PTQKIT_DIST_EXE): the run ends (on
// 2026-11-28 it hung in NCCL's teardown: rank 0 waited for a worker that waited for rank 0) and
// writes the one-GPU run's bytes, twice. Exact, not approximate: with 32 windows of 512 tokens each
// rank's 8192 tokens are one of the one-GPU run's fp32 groups of 8 x 1024 rows (hessian_cuda.h),
// so the fp64 sum adds the same two terms. (With shares that split a group the fp32 sums round
// differently: 8 windows of 128 tokens moved a Linear's loss by 1.4% with act-order.)
TEST_CASE("gpu: quantize --gpus 2 (two processes, NCCL) ends and writes the one-GPU run's bytes, twice (GPTQ and W8A8 and GGUF Q4_K_M)") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  int visible = 0;
  cudaGetDeviceCount(&visible);
  if (visible < 2) PTQ_SKIP("quantize --gpus 2 needs two GPUs; " + std::to_string(visible) + " visible");
  if (!cuda::nccl_built()) PTQ_SKIP("this build has no NCCL");
  if (!std::filesystem::exists(ptqtest::ptqkit_bin())) PTQ_SKIP("the ptqkit CLI is not at " + ptqtest::ptqkit_bin() + " (set PTQKIT_BIN)");
  ::setenv("PTQKIT_DIST_EXE", ptqtest::ptqkit_bin().c_str(), 1);
  struct Unset { ~Unset() { ::unsetenv("PTQKIT_DIST_EXE"); } } unset;   // also when a run throws
  ptqtest::TempDir d;
  Recipe r = parse_recipe(YAML::Load("quantization: {bits: 4, group_size: 32, act_order: true, static_groups: true}\nexport: {format: [gptq]}\n"), "r.yaml");
  r.model = ptqtest::assets() + "/models/distilled-13m";
  r.calibration = {"random", 32, 512, 0};
  r.device = "cuda";
  r.output = d / "one";
  run_quantize(r, {});
  r.gpus = 2;
  r.output = d / "two-a";
  const json two = run_quantize(r, {});
  r.output = d / "two-b";
  run_quantize(r, {});
  CHECK_THAT(two["forward"].get<std::string>(), Catch::Contains("data-parallel over 2 GPUs"));
  const std::string one = read_text_file(d / "one/model.safetensors");
  CHECK(read_text_file(d / "two-a/model.safetensors") == one);
  CHECK(read_text_file(d / "two-b/model.safetensors") == one);
  // Interrupted once layer 3 is on disk (the workers stopped with rank 0), then --resume --gpus 2:
  // every rank replays layers 0-3 from rank 0's layer store through its own windows, and the run
  // writes the same bytes.
  r.output = d / "resumed";
  CHECK(stopped_and_resumed(r) == one);
  // GGUF Q4_K_M: llama.cpp's grids formed on the device for each rank's rows, the output and
  // embedding tables formed beside calibration on rank 0: the one-GPU run's file.
  Recipe g = parse_recipe(YAML::Load("quantization: {method: gptq, act_order: true, static_groups: true}\nexport: {format: [gguf], gguf_type: Q4_K_M}\n"),
                          "g.yaml");
  g.model = r.model;
  g.calibration = r.calibration;
  g.device = "cuda";
  g.output = d / "gguf-one";
  run_quantize(g, {});
  g.gpus = 2;
  g.output = d / "gguf-two";
  run_quantize(g, {});
  CHECK(read_text_file(d / "gguf-two/model.gguf") == read_text_file(d / "gguf-one/model.gguf"));
  // SmoothQuant W8A8 (per token), and W8A8 with static per-tensor scales alone: each rank's column
  // maxima and its share of the α search's rows combined (StageStats::across_ranks) are the
  // one-GPU run's statistics exactly, so the same α, norms, scales and codes, byte for byte.
  Recipe q = smoothquant_recipe();
  Recipe st = parse_recipe(YAML::Load("quantization: {method: gptq, bits: 8, group_size: -1, sym: true, activations: {strategy: tensor, dynamic: false}}\n"
                                      "export: {format: [compressed-tensors]}\n"),
                           "st.yaml");
  for (Recipe* x : {&q, &st}) {
    x->model = r.model;
    x->calibration = r.calibration;
    x->device = "cuda";
    x->output = d / "w8a8-one";
    std::filesystem::remove_all(x->output);
    const json a = run_quantize(*x, {});
    x->gpus = 2;
    x->output = d / "w8a8-two";
    std::filesystem::remove_all(x->output);
    const json b = run_quantize(*x, {});
    CHECK(b["smoothquant"] == a["smoothquant"]);
    CHECK(read_text_file(d / "w8a8-two/model.safetensors") == read_text_file(d / "w8a8-one/model.safetensors"));
  }
  // --save-stats over two ranks: the statistics are every rank's, each solve whole on every rank
  // from the host Hessian; the same statistics and model as one GPU's saving run.
  {
    ptqtest::TempDir ds;
    check_saved_statistics(r, 2, ds);
  }
  // The CPU forward's statistics would be each rank's own: refused, naming the field, nothing written.
  q.gpu_forward = false;
  q.output = d / "cpu-forward";
  CHECK_THROWS_WITH(run_quantize(q, {}), Catch::Contains("gpu_forward"));
  CHECK_FALSE(std::filesystem::exists(q.output));
}
