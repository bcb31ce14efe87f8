// The GPU decode (eval/decode_cuda.h) against the CPU reference (model/generate.h, itself checked
// against transformers' logits in test_generate.cpp): the same greedy tokens for the first steps
// on the shared models, logits within the 16-bit operands' error; and a synthetic W4A16 model's
// decode runs through the packed kernels.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <utility>

#include "core/safetensors.h"
#include "eval/decode_cuda.h"
#include "eval/perplexity.h"
#include "model/corpus.h"
#include "eval/perplexity_cuda.h"
#include "formats/open.h"
#include "kernels/a16_path.h"
#include "kernels/w8a8.h"
#include "pipeline/pipeline.h"
#include "golden.h"
#include "testing.h"
#include "model/generate.h"
#include "model/synth.h"
#include "testing_cuda.h"

using namespace ptq;

namespace {
// The checkpoint at path (default: the shared model) against the CPU; the prompt: the first
// `prefix` tokens of the model's golden input, fed to each of `batch` sequences. The cache: up to
// 512 positions, or `cache` where given (the model's context raised to it where shorter: the steps
// stay well inside the trained one).
void check_gpu_greedy(const std::string& model, int prefix, int steps, std::string path = "", int cache = 0, int batch = 1) {
  if (path.empty()) path = ptqtest::assets() + "/models/" + model;
  auto m = open_model(path);
  const std::vector<int32_t> ids = ptqtest::golden(model).ids;
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + prefix);
  // CPU reference: greedy from the prefix.
  Generator cpu(*m);
  VecF l = cpu.feed(prompt);
  Rng rng(0);
  std::vector<int32_t> want;
  std::vector<VecF> cpu_logits{l};
  for (int i = 0; i < steps; ++i) {
    want.push_back(sample_token(l, {}, rng));
    l = cpu.feed({want.back()});
    cpu_logits.push_back(l);
  }
  cuda::GpuLogits gl(*m, path);
  // At batch 1 and 2 the attention splits each head's positions over several CTAs (max_len / 64,
  // at most 16) and combines them: up to 8 in a cluster (sm_90), more through global memory.
  cuda::DecodeWeights w = gl.decode_weights();
  if (cache) w.c.max_position_embeddings = std::max(w.c.max_position_embeddings, cache);
  const int max_len = cache ? cache : std::min(w.c.max_position_embeddings, 512);
  cuda::DecodeCuda dec(std::move(w), batch, max_len);
  std::vector<int32_t> prompts;
  for (int b = 0; b < batch; ++b) prompts.insert(prompts.end(), prompt.begin(), prompt.end());
  dec.feed(prompts, prefix);
  const MatF first = dec.logits();
  double maxd = 0, scale = 0;
  for (Eigen::Index j = 0; j < first.cols(); ++j) {
    for (int b = 0; b < batch; ++b) maxd = std::max(maxd, double(std::abs(first(b, j) - cpu_logits[0][j])));   // every sequence's
    scale = std::max(scale, double(std::abs(cpu_logits[0][j])));
  }
  const std::vector<int32_t> got = dec.decode_greedy(steps);   // [step, sequence]
  INFO(model << ", cache " << max_len << ", batch " << batch << ": prefill logits max |GPU - CPU| " << maxd << " (largest |logit| " << scale << ")");
  CHECK(maxd < 0.02 * scale);
  for (int b = 0; b < batch; ++b) {
    std::vector<int32_t> seq;
    for (int i = 0; i < steps; ++i) seq.push_back(got[size_t(i * batch + b)]);
    CHECK(seq == want);
  }
}

// The shared model `model` quantized by the recipe text `yaml` (calibration: 16 x 256 tokens of
// the tinystories text) into `out`; returns out.
std::string quantize_shared(const std::string& model, const std::string& yaml, const std::string& out) {
  Recipe r = parse_recipe(YAML::Load(yaml), "r.yaml");
  r.model = ptqtest::assets() + "/models/" + model;
  r.calibration = {ptqtest::assets() + "/text/tinystories/calib.txt", 16, 256, 0};
  r.output = out;
  run_quantize(r, {});
  return out;
}

// The checkpoint at `path` evaluated on the GPU (GpuLogits) against the CPU reference over the
// tokens `ids` in the windows `o`: perplexity within 1e-3, the same tokens scored. Prints both
// beside `label`; returns the GPU path's describe() (which Linears run on which kernels).
std::string check_gpu_eval(const std::string& label, const std::string& path, const std::vector<int32_t>& ids, const EvalOptions& o) {
  auto m = open_model(path);
  const EvalResult cpu = evaluate(*m, ids, o);
  cuda::GpuLogits gpu(*m, path);
  const std::string how = gpu.describe();
  INFO(label << ": " << how);
  const LogitsFn fn = [&gpu](const std::vector<int32_t>& t, int S, int T) { return gpu(t, S, T); };
  const EvalResult g = evaluate(fn, m->config().max_position_embeddings, ids, o);
  std::cout << label << "  perplexity GPU " << g.perplexity << " CPU reference " << cpu.perplexity << " (relative " << g.perplexity / cpu.perplexity - 1
            << "); " << how << "\n";
  CHECK(std::abs(g.perplexity / cpu.perplexity - 1) <= 1e-3);
  CHECK(g.scored_tokens == cpu.scored_tokens);
  return how;
}
}  // namespace

TEST_CASE("decode cuda: greedy tokens equal the CPU reference's (stories260k, llama2xs, distilled-13m, qwen3, phi3, mixtral, qwen3-moe)") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  check_gpu_greedy("stories260k", 32, 16);
  check_gpu_greedy("llama2xs", 32, 16);
  check_gpu_greedy("distilled-13m", 32, 16);
  check_gpu_greedy("tiny-qwen3", 16, 8);
  check_gpu_greedy("tiny-phi3", 16, 8);   // its fused qkv and gate_up Linears as stored
  check_gpu_greedy("tiny-mixtral", 16, 8);   // MoE: routed on the host, experts on the device
  check_gpu_greedy("tiny-qwen3-moe", 16, 8);
}

// ptqkit's W4A16 and W8A16 schemes export compressed-tensors pack-quantized by default; the GPU
// reads it as codes and grids (formats/gptq.h, GptqReader), as it reads gptq_v2. One run exported in both formats: the
// pack-quantized copy decodes as the CPU reference does, and gives the gptq_v2 copy's logits and
// tokens to the bit (the same codes in the same kernels).
TEST_CASE("decode cuda: a compressed-tensors pack-quantized checkpoint decodes as the CPU reference, and as its gptq_v2 twin to the bit") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  int k = 0;
  for (const char* q : {"{bits: 4, group_size: 128, act_order: true, sym: false}", "{bits: 8, group_size: -1}"}) {
    INFO(q);
    const std::string out = quantize_shared("distilled-13m", std::string("quantization: ") + q + "\nexport: {format: [gptq_v2, compressed-tensors]}\n",
                                            d / ("twins-" + std::to_string(k++)));
    const std::string ct = out + "/compressed-tensors", v2 = out + "/gptq_v2";
    REQUIRE(model_format(ct) == "compressed-tensors/pack-quantized");
    check_gpu_greedy("distilled-13m", 32, 16, ct);
    const std::vector<int32_t> ids = ptqtest::golden("distilled-13m").ids;
    const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 32);
    auto run = [&](const std::string& path, MatF* first) {
      auto m = open_model(path);
      cuda::GpuLogits gl(*m, path);
      CHECK(gl.describe().find("56 of 56") != std::string::npos);   // every decoder Linear through the packed kernels
      cuda::DecodeCuda dec(gl.decode_weights(), 1, 128);
      dec.feed(prompt, 32);
      *first = dec.logits();
      return dec.decode_greedy(16);
    };
    MatF lc, lv;
    const std::vector<int32_t> tc = run(ct, &lc), tv = run(v2, &lv);
    CHECK(tc == tv);
    REQUIRE(lc.size() == lv.size());
    CHECK(std::memcmp(lc.data(), lv.data(), size_t(lc.size()) * sizeof(float)) == 0);
  }
  // stories260k's W4A16 export (the README's main job): its gate and up of 172 rows (pack-quantized
  // pads each row to a word, GPTQ's files could not hold them) run on the kernels too, stacked; its
  // 172-wide down stays float in compressed-tensors.
  const std::string st = quantize_shared("stories260k", "quantization: {bits: 4, group_size: 128, act_order: true}\nexport: {format: [compressed-tensors]}\n",
                                         d / "stories260k");
  REQUIRE(model_format(st) == "compressed-tensors/pack-quantized");
  check_gpu_greedy("stories260k", 32, 16, st);
  auto m = open_model(st);
  cuda::GpuLogits gl(*m, st);
  INFO(gl.describe());
  CHECK(gl.describe().find("30 of 35 Linears through the W4A16/W8A16 kernels") != std::string::npos);
}

// GGUF on the GPU: every quantized block type through the W4A16 / W8A16 kernels as codes and grids
// (formats/gguf.h, gguf_quantized: llama's q/k rows un-permuted): integer zero points (Q4_0, Q5_0,
// Q8_0, Q6_K's groups of 16) and mins (Q4_1, Q5_1, Q4_K, Q5_K), 5- and 6-bit codes in the 8-bit
// layout. Each decodes and evaluates as the CPU reference does: Q4_0, Q8_0, Q4_1, and llama.cpp's
// Q4_K_M and Q5_K_M mixes (on distilled-13m the K-quants take the 1024-wide down projections; the
// 384-wide inputs fall back to Q5_0 / Q5_1 and, for Q6_K, Q8_0): all eight types.
TEST_CASE("decode cuda: GGUF checkpoints decode and evaluate on the GPU as the CPU reference (every block type on the A16 kernels)") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const auto [model, ids, o] = ptqtest::distilled_eval();
  int k = 0;
  for (const char* type : {"Q4_0", "Q8_0", "Q4_1", "Q4_K_M", "Q5_K_M"}) {
    INFO(type);
    const std::string out = quantize_shared("distilled-13m", std::string("quantization: {act_order: true}\nexport: {format: [gguf], gguf_type: ") + type + "}\n",
                                            d / ("gguf-" + std::to_string(k++)));
    REQUIRE(model_format(out) == "gguf");
    check_gpu_greedy("distilled-13m", 32, 16, out);
    const std::string how = check_gpu_eval(std::string("GGUF ") + type, out, ids, o);
    INFO(how);
    CHECK(how.find("GGUF") != std::string::npos);
    CHECK(how.find("56 of 56 Linears through the W4A16/W8A16 kernels") != std::string::npos);
    CHECK(how.find("), the lm_head dequantized to f16") != std::string::npos);   // every Linear packed: only the lm_head is 16-bit
    if (std::string(type) != "Q4_0" && std::string(type) != "Q8_0") CHECK(how.find("Linears with mins") != std::string::npos);
  }
}

// The W3A16 scheme exports GPTQ 3-bit (act-order, groups of 128), which the GPU runs in the W4A16
// kernel's layout, codes and zero points as stored; GPTQ v2 at 2 bits (asymmetric, groups of 64)
// alike. Each evaluates as the CPU reference does, through the kernels on every Linear, and the
// 3-bit model gives the CPU's greedy tokens (a 2-bit model of 13M parameters is too near a tie
// between its top logits for 16-bit products to be held to the fp32 path's choice).
TEST_CASE("decode cuda: GPTQ 3-bit (the W3A16 scheme) and 2-bit checkpoints decode and evaluate on the W4A16 kernel as the CPU reference") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const auto [model, ids, o] = ptqtest::distilled_eval();
  struct Case { const char* yaml; int bits; bool greedy; };
  const Case cases[] = {{"quantization: {bits: 3, group_size: 128, act_order: true}\nexport: {format: [gptq]}\n", 3, true},
                        {"quantization: {bits: 2, group_size: 64, sym: false}\nexport: {format: [gptq_v2]}\n", 2, false}};
  int k = 0;
  for (const Case& cs : cases) {
    INFO(cs.yaml);
    const std::string out = quantize_shared("distilled-13m", cs.yaml, d / ("low-" + std::to_string(k++)));
    if (cs.greedy) check_gpu_greedy("distilled-13m", 32, 16, out);
    const std::string how = check_gpu_eval(std::to_string(cs.bits) + "-bit GPTQ", out, ids, o);
    INFO(how);
    CHECK(how.find("56 of 56 Linears through the W4A16/W8A16 kernels (lib/kernels/w4a16.cu) (" + std::to_string(cs.bits) + "-bit codes held in the 4-bit layout)") !=
          std::string::npos);
  }
}

// Grids the checkpoint's writer allows and the kernels do not hold as stored. distilled-13m at
// group_size 256 stores its 384-wide inputs (q, k, v, o, gate, up) in groups of 256 and 128 columns:
// the kernels run them as runs of 128 columns, each with its group's grid (a16_group_columns), so
// every Linear is on the kernels. stories260k at 8 bits per channel has 172-wide down projections,
// which the kernels do not take (in_features a multiple of 16): those are dequantized at load, the
// rest stay on the kernels. Both decode and evaluate as the CPU reference. (Before a16_takes the
// loader passed the first to W4A16Linear::from_quantized, which refused it, and with it the model.)
TEST_CASE("decode cuda: GPTQ checkpoints with groups of unequal sizes, or Linears the kernels do not take, decode and evaluate as the CPU reference") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  struct Case { const char* model; const char* yaml; const char* linears; const char* refused; };
  const Case cases[] = {
      {"distilled-13m", "quantization: {bits: 4, group_size: 256, act_order: true}\nexport: {format: [gptq]}\n", "56 of 56 Linears through the W4A16/W8A16 kernels (lib/kernels/w4a16.cu), the lm_head f16", ""},
      {"stories260k", "quantization: {bits: 8, group_size: -1}\nexport: {format: [gptq]}\n", "30 of 35 Linears through the W4A16/W8A16 kernels (lib/kernels/w4a16.cu), the rest f16",
       "dequantized at load, 5 (in_features: must be a multiple of 16, got 172)"}};
  int k = 0;
  for (const Case& cs : cases) {
    INFO(cs.model << ": " << cs.yaml);
    const std::string out = quantize_shared(cs.model, cs.yaml, d / ("grids-" + std::to_string(k++)));
    check_gpu_greedy(cs.model, 32, 16, out);
    const std::string how = check_gpu_eval(cs.model, out, ptqtest::eval_tokens(ptqtest::assets() + "/models/" + cs.model), ptqtest::eval_windows(512, 16));
    INFO(how);
    CHECK(how.find(cs.linears) != std::string::npos);
    CHECK((how.find("dequantized at load") == std::string::npos) == (*cs.refused == 0));
    CHECK(how.find(cs.refused) != std::string::npos);
  }
}

// generate's loop: one token at a time through feed(), the host choosing each next token. From the
// second one-token feed the step replays a captured CUDA graph; its tokens and logits are the CPU
// reference's, as plain launches' are, also after a reset and a longer prompt (which replaces the
// per-row buffers, so the graph is captured again), and device memory handed out between feeds
// is not written by a replay (the graph's workspaces stay held: cuda::PoolHold). Two checkpoints:
// distilled-13m as stored, and its act-order GPTQ W4A16 export, whose kernels gather x into a
// workspace from the pool at every Linear (768 B and 2 KB a row): the blocks a replay writes.
TEST_CASE("decode cuda: one-token feeds replay a captured graph and follow the CPU reference's greedy tokens (float, and act-order GPTQ with pool workspaces)") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string act_order = quantize_shared("distilled-13m", "quantization: {bits: 4, group_size: 128, act_order: true}\nexport: {format: [gptq]}\n", d / "act-order");
  const std::vector<int32_t> ids = ptqtest::golden("distilled-13m").ids;
  for (const std::string& path : {ptqtest::assets() + "/models/distilled-13m", act_order}) {
    INFO(path);
    auto m = open_model(path);
    cuda::GpuLogits gl(*m, path);
    cuda::DecodeCuda dec(gl.decode_weights(), 1, 256);
    for (int prefix : {16, 48}) {   // the second prompt is longer: grow() replaces the buffers
      INFO("prompt of " << prefix << " tokens");
      Generator cpu(*m);
      const std::vector<int32_t> prompt(ids.begin(), ids.begin() + prefix);
      VecF want = cpu.feed(prompt);
      dec.reset();
      dec.feed(prompt, prefix);
      Rng rng(0);
      for (int i = 0; i < 24; ++i) {
        const VecF got = dec.logits().row(0).transpose();
        const double scale = want.cwiseAbs().maxCoeff();
        CHECK((got - want).cwiseAbs().maxCoeff() < 0.02 * scale);
        const int32_t t = sample_token(want, {}, rng);
        REQUIRE(sample_token(got, {}, rng) == t);
        // Buffers handed out between feeds (512 B to 8 MB: any cached block up to 16 MB can be one
        // of them), filled with a pattern a replay would overwrite were its workspaces among them.
        std::vector<cuda::DeviceBuffer<float>> others;
        for (size_t n = 128; n <= (size_t(1) << 21); n *= 2) {
          others.emplace_back(n, "test buffer");
          const std::vector<float> pattern(n, 7.0f);
          cuda::copy_to_device(others.back().get(), pattern.data(), n * 4);
        }
        dec.feed({t}, 1);
        CHECK(dec.graph_used() == (i > 0 || prefix > 16));   // only the very first one-token feed runs plainly
        if (dec.graph_used() && path == act_order) CHECK(dec.graph_held_bytes() > 0);   // the gathered x's blocks
        for (const auto& o : others) {
          std::vector<float> back(o.size());
          cuda::copy_to_host(back.data(), o.get(), back.size() * 4);
          CHECK(std::all_of(back.begin(), back.end(), [](float v) { return v == 7.0f; }));
        }
        want = cpu.feed({t});
      }
    }
  }
}

// generate's greedy loop on the GPU: next_greedy picks each token on the device (only the token
// crosses to the host) and feeds it at once, the step launched before the call returns. The tokens
// are the CPU reference's greedy tokens, the step replays feed's graph from the second token on,
// and at the end next_greedy(false) picks the last token without a step (the position stays).
TEST_CASE("decode cuda: greedy tokens chosen and fed on the device, one at a time, are the CPU reference's") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  for (const char* model : {"distilled-13m", "tiny-qwen3", "tiny-mixtral"}) {   // mixtral: routed on the host, plain launches
    INFO(model);
    const std::string path = ptqtest::assets() + "/models/" + model;
    auto m = open_model(path);
    const std::vector<int32_t> ids = ptqtest::golden(model).ids;
    const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 16);
    Generator cpu(*m);
    VecF l = cpu.feed(prompt);
    Rng rng(0);
    cuda::GpuLogits gl(*m, path);
    cuda::DecodeCuda dec(gl.decode_weights(), 1, 64);
    dec.feed(prompt, 16);
    const int n = 8;
    for (int i = 0; i < n; ++i) {
      const int32_t want = sample_token(l, {}, rng);
      const bool more = i + 1 < n;
      const std::vector<int32_t> got = dec.next_greedy(more);
      REQUIRE(got.size() == 1);
      REQUIRE(got[0] == want);
      CHECK(dec.position() == 16 + i + (more ? 1 : 0));
      if (more && std::string(model) != "tiny-mixtral") CHECK(dec.graph_used() == (i > 0));
      if (more) l = cpu.feed({want});
    }
    // The last logits are the CPU reference's after the 7 tokens fed.
    const VecF got = dec.logits().row(0).transpose();
    CHECK((got - l).cwiseAbs().maxCoeff() < 0.02 * l.cwiseAbs().maxCoeff());
  }
}

// A hold keeps the blocks freed while it is open from the pool's other users, and gives them back
// when it ends.
TEST_CASE("gpu: blocks freed while a pool hold is open are handed out again only after it ends") {
  PTQ_REQUIRE_GPU();
  cuda::pool_release_cached();   // no cached block of this size from earlier cases
  void* held = nullptr;
  {
    cuda::PoolHold hold;
    hold.open();
    held = cuda::device_alloc(size_t(3) << 20, "test block");
    cuda::device_free(held);
    hold.close();
    void* other = cuda::device_alloc(size_t(3) << 20, "test block");
    CHECK(other != held);
    cuda::device_free(other);
  }
  void* again = cuda::device_alloc(size_t(3) << 20, "test block");
  void* again2 = cuda::device_alloc(size_t(3) << 20, "test block");
  CHECK((again == held || again2 == held));   // the cache's two blocks of that size now: the held one and `other`
  cuda::device_free(again);
  cuda::device_free(again2);
}

TEST_CASE("decode cuda: a synthetic model decodes through every format's kernels, batched sequences independent") {
  PTQ_REQUIRE_GPU();
  const LlamaConfig c = parse_config(synth_config_json("small", 2, DType::F16), "small");
  for (const char* f : {"f16", "w4a16", "w8a16", "nf4", "q4_k", "q6_k"}) {   // q4_k, q6_k: GGUF's K-quants (mins; 6-bit codes in groups of 16)
    for (bool stacked : {true, false}) {
      INFO(f << (stacked ? " stacked" : " apart"));
      cuda::DecodeWeights w = cuda::synthetic_decode_weights(c, f, stacked);
      // Two sequences prefilled together: each one's logits as when it is alone.
      std::vector<int32_t> p2 = {5, 9, 17, 3, 40, 2, 8, 11};   // [2, 4]
      cuda::DecodeCuda both(w, 2, 16);
      both.feed(p2, 4);
      const MatF l2 = both.logits();
      for (int b = 0; b < 2; ++b) {
        cuda::DecodeCuda one(w, 1, 16);
        one.feed(std::vector<int32_t>(p2.begin() + 4 * b, p2.begin() + 4 * b + 4), 4);
        const MatF l1 = one.logits();
        const double scale = l1.cwiseAbs().maxCoeff();
        CHECK((l1.row(0) - l2.row(b)).cwiseAbs().maxCoeff() <= 0.01 * scale + 1e-3);
      }
      const std::vector<int32_t> t = both.decode_greedy(6);
      REQUIRE(t.size() == 12);
      CHECK(both.graph_used());
      // The graph replays exactly the plain launches.
      cuda::DecodeCuda plain(w, 2, 16);
      plain.set_graphs(false);
      plain.feed(p2, 4);
      CHECK(plain.decode_greedy(6) == t);
      CHECK_FALSE(plain.graph_used());
      for (int32_t x : t) CHECK((x >= 0 && x < c.vocab_size));
      CHECK(both.position() == 10);
    }
  }
}

// From 17 rows the norm, silu·mul and attention (attend) kernels write x in the wgmma A16 kernel's
// k-step order too, and the Linears that run that kernel read it instead of permuting x themselves:
// one llama2-7b layer (its q, k, v, gate, up and down take the wgmma kernel at 24 and 48 rows, and
// with 4-bit codes its o projection too, after attend) and one llama3-8b layer (whose attention,
// decode_attention, writes ctx plainly: its o projection permutes x itself) give the same logits
// and tokens, to the bit, as with the Linears' own permute pass.
TEST_CASE("decode cuda: x written in the wgmma kernel's order by the norm, silu·mul and attention gives the bytes of the Linears' own permute pass") {
  PTQ_REQUIRE_GPU();
  if (!cuda::a16_wgmma_supported()) PTQ_SKIP("the wgmma A16 kernel needs sm_90: " + cuda::describe());
  for (auto [preset, f] : {std::pair{"llama2-7b", "w4a16"}, std::pair{"llama2-7b", "w8a16"}, std::pair{"llama3-8b", "w4a16"}}) {
    INFO(preset << " " << f);
    const LlamaConfig c = parse_config(synth_config_json(preset, 1, DType::F16), preset);
    cuda::DecodeWeights w = cuda::synthetic_decode_weights(c, f, true);
    const int B = 24;
    std::vector<int32_t> p(size_t(B * 2));
    for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t((i * 7919 + 13) % size_t(c.vocab_size));
    cuda::DecodeCuda a(w, B, 8), b(w, B, 8);
    b.set_permuted_x(false);
    a.feed(p, 2);   // 48 rows
    b.feed(p, 2);
    CHECK(a.permuted_x_used());
    CHECK_FALSE(b.permuted_x_used());
    const MatF la = a.logits(), lb = b.logits();
    CHECK(lb.allFinite());
    CHECK(la.allFinite());
    CHECK((la - lb).cwiseAbs().maxCoeff() == 0.0f);
    CHECK(a.decode_greedy(3) == b.decode_greedy(3));   // 24 rows a step
    CHECK((a.logits() - b.logits()).cwiseAbs().maxCoeff() == 0.0f);
  }
}

// At 17..32 rows the stacked q, k, v Linear of a GPTQ or NF4 model writes q and the cache rows rotated
// itself (a16_fold_rope) and rope_append does not run: one llama2-7b layer (heads of 128, its q, k,
// v on the wgmma kernel's streamed form there; W4A16, W8A16, NF4) and one llama3-8b layer (8
// key/value heads for 32 query heads; W4A16 at 4 K slices, W8A16, NF4) give the same logits and tokens, to the bit, as with rope_append
// after the Linear (the same fp32 sums, the same rotation: kernels/rotary.cuh).
// 24 sequences prefilled a token each, then decoded (24 rows a step); 12 prefilled two tokens
// each (24 rows, positions 0 and 1 of each sequence).
TEST_CASE("decode cuda: the rotary and KV append folded into the q, k, v Linear at 17 to 32 rows give the bytes of the rotary kernel") {
  PTQ_REQUIRE_GPU();
  if (!cuda::a16_wgmma_supported()) PTQ_SKIP("the wgmma A16 kernel needs sm_90: " + cuda::describe());
  for (auto [preset, f] : {std::pair{"llama2-7b", "w4a16"}, std::pair{"llama2-7b", "w8a16"}, std::pair{"llama2-7b", "nf4"}, std::pair{"llama3-8b", "w4a16"}, std::pair{"llama3-8b", "w8a16"},
                               std::pair{"llama3-8b", "nf4"}})
    for (auto [B, T] : {std::pair{24, 1}, std::pair{12, 2}}) {
      INFO(preset << " " << f << " batch " << B << " prompt " << T);
      const LlamaConfig c = parse_config(synth_config_json(preset, 1, DType::F16), preset);
      cuda::DecodeWeights w = cuda::synthetic_decode_weights(c, f, true);
      std::vector<int32_t> p(size_t(B * T));
      for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t((i * 7919 + 13) % size_t(c.vocab_size));
      cuda::DecodeCuda a(w, B, 8), b(w, B, 8);
      b.set_rope_in_linear(false);
      a.feed(p, T);
      b.feed(p, T);
      CHECK(a.rope_in_linear_used());
      CHECK_FALSE(b.rope_in_linear_used());
      const MatF la = a.logits(), lb = b.logits();
      CHECK(la.allFinite());
      CHECK((la - lb).cwiseAbs().maxCoeff() == 0.0f);
      if (T == 1) {
        CHECK(a.decode_greedy(3) == b.decode_greedy(3));
        CHECK((a.logits() - b.logits()).cwiseAbs().maxCoeff() == 0.0f);
      }
    }
}

// At 17..32 rows the norms of an NF4 or W4A16 model are split between the Linears around them (the o
// and down Linears write each token's sums of squares and f16(X w / 16); the q, k, v and gate, up
// Linears on the wgmma kernel's streamed form scale their sums by 16 / rms(X_n)): two llama2-7b
// (and llama3-8b) layers at batch 24, where each sequence's logits after its prompt token and after
// two greedy steps must equal that sequence decoded alone (batch 1: the norm folded whole into
// NF4's one-row kernel; other kernels, other sums: 1% of the logits' range).
TEST_CASE("decode cuda: the norms split between the Linears at 17 to 32 rows give each sequence's logits at batch 1") {
  PTQ_REQUIRE_GPU();
  if (!cuda::a16_wgmma_supported()) PTQ_SKIP("the wgmma A16 kernel needs sm_90: " + cuda::describe());
  // NF4: the L2-fed kernel writes; W4A16: the wgmma kernel's streamed form (llama3-8b: its down
  // 4096 x 14336 writes and its readers run 3-stage rings, lab run 406).
  const std::pair<const char*, const char*> cases[] = {{"llama2-7b", "nf4"}, {"llama2-7b", "w4a16"}, {"llama3-8b", "w4a16"}};
  for (const auto& [preset, f] : cases) {
    INFO(preset << " " << f);
    const LlamaConfig c = parse_config(synth_config_json(preset, 2, DType::F16), preset);
    cuda::DecodeWeights w = cuda::synthetic_decode_weights(c, f, true);
    const int B = 24;
    std::vector<int32_t> p(static_cast<size_t>(B));
    for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t((i * 7919 + 13) % size_t(c.vocab_size));
    cuda::DecodeCuda all(w, B, 8);
    all.feed(p, 1);
    const MatF first = all.logits();
    const std::vector<int32_t> tokens = all.decode_greedy(2);   // [2, B]
    const MatF last = all.logits();
    CHECK(all.norm_split_rows_used());
    for (int b : {0, 7, 23}) {
      INFO("sequence " << b);
      cuda::DecodeCuda one(w, 1, 8);
      one.feed({p[size_t(b)]}, 1);
      const MatF l1 = one.logits();
      CHECK((l1.row(0) - first.row(b)).cwiseAbs().maxCoeff() <= 0.01 * l1.cwiseAbs().maxCoeff() + 1e-3);
      one.feed({tokens[size_t(b)]}, 1);   // the batch's own tokens, so that a near tie cannot fork the two
      one.feed({tokens[size_t(B + b)]}, 1);
      const MatF l3 = one.logits();
      CHECK((l3.row(0) - last.row(b)).cwiseAbs().maxCoeff() <= 0.01 * l3.cwiseAbs().maxCoeff() + 1e-3);
    }
  }
}

// The attention's other forms against the CPU: 16 splits a head at batch 1 (a 1,024-position
// cache), combined through global memory rather than in a cluster; two sequences, whose decode
// steps run the rotary kernel rather than the attention's own rotary, and at head_dim 64 the
// tensor-core decode attention (model/attention_cuda.h).
TEST_CASE("decode cuda: the attention's global split combine and the batched rotary kernel give the CPU reference's greedy tokens") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  check_gpu_greedy("stories260k", 32, 16, "", 1024, 1);
  check_gpu_greedy("stories260k", 32, 16, "", 512, 2);
  check_gpu_greedy("tiny-qwen3", 16, 8, "", 512, 2);   // head norms and GQA in the rotary kernel
  check_gpu_greedy("stories260k", 32, 16, "", 512, 64);   // 64 rows x 8 heads: the rows with many (row, head) pairs
  check_gpu_greedy("distilled-13m", 32, 8, "", 512, 2);    // head_dim 64: the prompt by flash attention, a sequence at a time;
                                                            // the decode steps by decode_attention (3 query heads a KV head)
}

// W8A8 checkpoints (SmoothQuant with per-token activations; static per-tensor ones): the GPU decode
// against the CPU reference, whose W8A8 Linears quantize fp32 activations (the GPU's are rounded to
// 16 bits first, as every GPU Linear takes them: greedy tokens equal, logits within 2%). The decode
// quantizes these Linears' inputs in the RMSNorm and silu·mul kernels (DecodeLayer::lin8): the
// logits must be bit for bit those of the same weights with the int8 forms removed, where the
// separate quantizer (tests/test_kernels_cuda.cpp: against quantize_activations) does it.
TEST_CASE("decode cuda: W8A8 checkpoints decode as the CPU reference, int8 inputs quantized by the norm and silu kernels exactly as by the quantizer") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  if (!cuda::w8a8_supported()) PTQ_SKIP("W8A8 checkpoints run on the GPU's W8A8 GEMM, which needs sm_90: " + cuda::describe());
  ptqtest::TempDir d;
  const char* yamls[] = {"quantization: {method: rtn, bits: 8, group_size: -1, smoothquant: {alpha: 0.5}, activations: {strategy: token, dynamic: true}}\n"
                         "export: {format: [compressed-tensors]}\n",
                         "quantization: {method: rtn, bits: 8, group_size: -1, activations: {strategy: tensor, dynamic: false}}\n"
                         "export: {format: [compressed-tensors]}\n"};
  int k = 0;
  for (const char* yaml : yamls) {
    INFO(yaml);
    const std::string out = quantize_shared("distilled-13m", yaml, d / ("w8a8-" + std::to_string(k++)));
    check_gpu_greedy("distilled-13m", 32, 16, out);

    auto m = open_model(out);
    cuda::GpuLogits gl(*m, out);
    cuda::DecodeWeights fused = gl.decode_weights(), plain = fused;
    int int8_forms = 0, linears = 0;
    for (cuda::DecodeLayer& L : plain.layers) {
      for (size_t j = 0; j < 7; ++j) linears += bool(L.lin[j]), int8_forms += bool(L.lin8[j]), L.lin8[j] = {};
      linears += bool(L.qkv) + bool(L.gate_up);
      int8_forms += bool(L.qkv8) + bool(L.gate_up8);
      L.qkv8 = L.gate_up8 = {};
    }
    CHECK(linears >= 8 * 4);   // distilled-13m: 8 layers (q, k, v and gate, up stacked where stored alike)
    CHECK(int8_forms == linears);   // every Linear W8A8
    const std::vector<int32_t> ids = ptqtest::golden("distilled-13m").ids;
    const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 32);
    cuda::DecodeCuda df(fused, 1, 64), dp(plain, 1, 64);
    df.feed(prompt, 32);
    dp.feed(prompt, 32);
    CHECK((df.logits().array() == dp.logits().array()).all());
    CHECK(df.decode_greedy(16) == dp.decode_greedy(16));
    CHECK((df.logits().array() == dp.logits().array()).all());
  }
}
