// The GPU calibration forward and flash attention (lib/model/*_cuda.cu) against the fp32 CPU
// forward and an fp64 attention.
#include <filesystem>
#include <cmath>
#include <cstring>
#include <numeric>
#include <map>
#include <memory>
#include <vector>

#include "core/bits.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/attention_cuda.h"
#include "model/forward_cuda.h"
#include "gptq/gptq_cuda.h"
#include "cuda/random.h"
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
#include "model/synth.h"
#include "pipeline/pipeline.h"
#include "testing.h"
#include "model/schedule.h"
#include "testing_cuda.h"

using namespace ptq;
using nlohmann::json;

TEST_CASE("gpu: the GPU forward of a decoder layer matches the fp32 CPU reference, and so do its Hessians") {
  PTQ_REQUIRE_GPU();
  ptqtest::TempDir d;
  std::vector<std::string> models;
  SynthOptions o;
  o.preset = "tiny";   // 4 heads over 2 KV heads: GQA
  o.seed = 11;
  synth_model(o, d / "tiny");
  models.push_back(d / "tiny");
  if (ptqtest::have_assets()) {
    models.push_back(ptqtest::assets() + "/models/distilled-13m");
    models.push_back(ptqtest::assets() + "/models/tiny-qwen3");   // per-head q/k norms, head_dim 32 (the unfused attention)
    models.push_back(ptqtest::assets() + "/models/tiny-phi3");    // fused qkv_proj and gate_up_proj
    // Phi-3 with partial rotary (a quarter of each head's 16 dims rotated: the rest pass through)
    std::filesystem::create_directories(d / "phi3-partial");
    std::filesystem::copy_file(ptqtest::assets() + "/models/tiny-phi3/model.safetensors", d / "phi3-partial/model.safetensors");
    json cfg = json::parse(read_text_file(ptqtest::assets() + "/models/tiny-phi3/config.json"));
    cfg["rope_parameters"]["partial_rotary_factor"] = 0.5;
    write_file_atomic(d / "phi3-partial/config.json", cfg.dump());
    models.push_back(d / "phi3-partial");
  }
  for (auto& dir : models) {
    LlamaModel m(dir);
    const LlamaConfig& c = m.config();
    const int S = 65, T = 128;   // two chunks of the GPU forward (8192 tokens, then one window)
    MatF X = ptqtest::random_embeddings(m, S, T, 5);
    const Rope& rope = m.rope(T);
    LayerWeights w = m.load_layer(0);
    // CPU reference: the stage inputs (fp32) and their Hessians, accumulated in fp64
    MatF xn, ctx, y, act, Xc = X;
    const float eps = float(c.rms_norm_eps);
    Hessian hq(c.hidden_size), ho(c.q_dim()), hm(c.hidden_size), hd(c.intermediate_size);
    rmsnorm(Xc, w.input_layernorm, eps, xn);
    hq.add(xn);
    attention_core(w, c, rope, xn, S, T, ctx);
    ho.add(ctx);
    linear(ctx, w[Proj::o], y);
    Xc += y;
    rmsnorm(Xc, w.post_attention_layernorm, eps, xn);
    hm.add(xn);
    mlp_act(w, xn, act);
    hd.add(act);
    linear(act, w[Proj::down], y);
    Xc += y;
    // GPU, with the activations on the device and (spill) in page-locked host memory: the same
    // kernels on the same chunks, so the same bytes
    MatF X_resident;
    for (bool spill : {false, true}) {
    cuda::LayerForwardCuda fw(c, rope, S, T, c.dtype, spill);
    REQUIRE(fw.spilled() == spill);
    fw.set_input(X);
    fw.load_layer(w);
    // the stages as the pipeline runs them: the layer schedule's groups in order, then down_proj
    std::vector<std::unique_ptr<cuda::HessianCuda>> gh;
    for (const LinearGroup& g : layer_schedule(c, 0).groups) {
      gh.push_back(std::make_unique<cuda::HessianCuda>(linear_shape(c, g.linears[0]).in, fw.dtype()));
      fw.stage(g.input, gh.back().get());
    }
    REQUIRE(gh.size() == 4);
    cuda::HessianCuda &gq = *gh[0], &go = *gh[1], &gm = *gh[2], &gd = *gh[3];
    fw.down_proj();
    const MatF Xg = fw.input();
    const double ex = (Xg - Xc).norm() / (Xc - X).norm();   // relative to what the layer added
    auto rel = [](const MatD& a, const MatD& b) { return (a - b).norm() / b.norm(); };
    const double eq = rel(gq.finalize(), hq.finalize()), eo = rel(go.finalize(), ho.finalize()), em = rel(gm.finalize(), hm.finalize()),
                 ed = rel(gd.finalize(), hd.finalize());
    std::cout << dir << (spill ? " (spilled)" : "") << ": layer output rel. error " << ex << "; Hessians qkv " << eq << ", o " << eo << ", mlp " << em
              << ", down " << ed << "\n";
    // 16-bit operands (~2^-9 relative rounding for f16, 2^-8 for bf16) with fp32 accumulation
    const double tol = fw.dtype() == DType::F16 ? 5e-3 : 1e-2;
    CHECK(ex <= tol);
    CHECK(eq <= tol);
    CHECK(eo <= tol);
    CHECK(em <= tol);
    CHECK(ed <= tol);
    if (!spill) X_resident = Xg;
    else CHECK(std::memcmp(Xg.data(), X_resident.data(), size_t(Xg.size()) * 4) == 0);
    }
  }
}

namespace {
// dst (16-bit dt on the device) = src rounded to dt.
void upload_16(DType dt, const std::vector<float>& src, cuda::DeviceBuffer<uint16_t>& dst) {
  std::vector<uint16_t> b(src.size());
  convert_from_f32(dt, src.data(), b.data(), b.size());
  cuda::copy_to_device(dst.get(), b.data(), b.size() * 2);
}
// The relative (L2) and the largest absolute error of 16-bit values h against an fp64 reference.
std::pair<double, double> error_16(DType dt, const std::vector<uint16_t>& h, const std::vector<double>& ref) {
  std::vector<float> got(h.size());
  convert_to_f32(dt, h.data(), got.data(), got.size());
  double num = 0, den = 0, worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
    worst = std::max(worst, std::abs(got[i] - ref[i]));
  }
  return {std::sqrt(num / den), worst};
}
}  // namespace

TEST_CASE("gpu: flash attention equals an fp64 reference (f16 and bf16, head_dim 64, 96 and 128, GQA, ragged T, sliding window)") {
  PTQ_REQUIRE_GPU();
  struct Case { DType dt; int windows, T, heads, kv, hd, window; };
  const Case cases[] = {{DType::F16, 2, 100, 4, 2, 64, 0},  {DType::F16, 1, 300, 2, 1, 128, 0}, {DType::BF16, 2, 130, 4, 4, 128, 0},
                        {DType::F16, 1, 257, 4, 2, 64, 50}, {DType::BF16, 1, 200, 2, 2, 64, 64}, {DType::F16, 3, 64, 2, 2, 128, 0},
                        {DType::F16, 2, 150, 4, 2, 96, 0},  {DType::BF16, 1, 200, 4, 1, 96, 64}};   // 96: Phi-3-mini's head size
  Rng r(17);
  for (const Case& k : cases) {
    const int64_t rows = int64_t(k.windows) * k.T, nq = rows * k.heads * k.hd, nk = rows * k.kv * k.hd;
    // q . k / sqrt(hd) ~ N(0, 2.25): peaked and flat rows alike; inputs exactly 16-bit
    std::vector<float> q(static_cast<size_t>(nq)), kk(static_cast<size_t>(nk)), v(static_cast<size_t>(nk));
    for (auto* a : {&q, &kk, &v})
      for (auto& x : *a) x = round_to(k.dt, float(r.normal() * (a == &v ? 1.0 : 1.22)));
    std::vector<double> ref(q.size());
    const double scale = 1.0 / std::sqrt(double(k.hd));
    cuda::attention_reference(q.data(), kk.data(), v.data(), ref.data(), k.windows, k.T, k.heads, k.kv, k.hd, scale, k.window);
    cuda::DeviceBuffer<uint16_t> dq(q.size(), "q"), dk(kk.size(), "k"), dv(v.size(), "v"), dc(q.size(), "ctx"), dc2(q.size(), "ctx again");
    std::vector<uint16_t> h(q.size()), h2(q.size());
    for (auto [src, dst] : {std::pair{&q, &dq}, std::pair{&kk, &dk}, std::pair{&v, &dv}}) upload_16(k.dt, *src, *dst);
    cuda::flash_attention(k.dt, dq.get(), dk.get(), dv.get(), dc.get(), k.windows, k.T, k.heads, k.kv, k.hd, float(scale), k.window);
    cuda::flash_attention(k.dt, dq.get(), dk.get(), dv.get(), dc2.get(), k.windows, k.T, k.heads, k.kv, k.hd, float(scale), k.window);
    cuda::copy_to_host(h.data(), dc.get(), h.size() * 2);
    cuda::copy_to_host(h2.data(), dc2.get(), h2.size() * 2);
    const auto [rel, worst] = error_16(k.dt, h, ref);
    std::cout << "flash attention " << (k.dt == DType::F16 ? "f16" : "bf16") << " windows " << k.windows << " T " << k.T << " heads "
              << k.heads << "/" << k.kv << " hd " << k.hd << " window " << k.window << ": relative error " << rel << ", max abs " << worst << "\n";
    // P and ctx rounded to 16 bits (2^-11 relative for f16, 2^-8 for bf16); |v| ~ 1
    CHECK(rel <= (k.dt == DType::F16 ? 1e-3 : 8e-3));
    CHECK(worst <= (k.dt == DType::F16 ? 4e-3 : 3e-2));
    CHECK(h == h2);   // deterministic
  }
  CHECK_THROWS_AS(cuda::flash_attention(DType::F16, nullptr, nullptr, nullptr, nullptr, 1, 8, 2, 2, 80, 0.1f, 0), Error);
}

TEST_CASE("gpu: decode attention on tensor cores equals an fp64 reference (f16 and bf16, head_dim 64, 96 and 128, groups 1 to 8, splits, sliding window)") {
  PTQ_REQUIRE_GPU();
  // One new row per sequence at position `pos` against caches of max_len rows; splits 0: the
  // library's choice. Positions 0 (one key), 15, 16, 17 and 63, 64 (chunk and warp edges), 300.
  struct Case { DType dt; int batch, heads, kv, hd, pos, max_len, window, splits; };
  const Case cases[] = {{DType::F16, 3, 4, 4, 128, 300, 320, 0, 0},  {DType::F16, 2, 8, 2, 128, 17, 64, 0, 1},
                        {DType::BF16, 2, 8, 1, 128, 63, 80, 0, 0},  {DType::F16, 1, 16, 2, 64, 300, 512, 0, 4},
                        {DType::F16, 2, 6, 2, 96, 64, 100, 0, 3},   {DType::BF16, 3, 4, 2, 64, 200, 256, 50, 2},
                        {DType::F16, 2, 2, 2, 128, 0, 16, 0, 1},    {DType::F16, 2, 4, 1, 128, 15, 16, 0, 1},
                        {DType::F16, 2, 4, 1, 128, 16, 32, 0, 4},   {DType::BF16, 1, 32, 32, 96, 129, 192, 64, 0},
                        {DType::F16, 4, 32, 8, 128, 255, 384, 0, 0}, {DType::F16, 1, 8, 8, 128, 3, 64, 0, 8}};
  Rng r(29);
  for (const Case& k : cases) {
    const int splits = k.splits ? k.splits : cuda::decode_attention_splits(k.batch, k.heads, k.kv, k.max_len);
    if (splits > 1 && cuda::compute_capability() < 90) continue;   // the splits merge in a cluster (sm_90)
    const int64_t nq = int64_t(k.batch) * k.heads * k.hd, kvw = int64_t(k.kv) * k.hd, nk = int64_t(k.batch) * k.max_len * kvw;
    std::vector<float> q(static_cast<size_t>(nq)), kk(static_cast<size_t>(nk)), v(static_cast<size_t>(nk));
    for (auto* a : {&q, &kk, &v})
      for (auto& x : *a) x = round_to(k.dt, float(r.normal() * (a == &v ? 1.0 : 1.22)));
    const int group = k.heads / k.kv, first = k.window > 0 ? std::max(0, k.pos - k.window + 1) : 0;
    const double scale = 1.0 / std::sqrt(double(k.hd));
    std::vector<double> ref(q.size(), 0.0);
    for (int b = 0; b < k.batch; ++b)
      for (int h = 0; h < k.heads; ++h) {
        const float* qi = q.data() + (int64_t(b) * k.heads + h) * k.hd;
        std::vector<double> p(size_t(k.pos + 1), 0.0);
        double mx = -INFINITY, sum = 0;
        for (int j = first; j <= k.pos; ++j) {
          const float* kj = kk.data() + (int64_t(b) * k.max_len + j) * kvw + int64_t(h / group) * k.hd;
          double dot = 0;
          for (int d = 0; d < k.hd; ++d) dot += double(qi[d]) * double(kj[d]);
          mx = std::max(mx, p[size_t(j)] = dot * scale);
        }
        for (int j = first; j <= k.pos; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
        double* out = ref.data() + (int64_t(b) * k.heads + h) * k.hd;
        for (int j = first; j <= k.pos; ++j) {
          const float* vj = v.data() + (int64_t(b) * k.max_len + j) * kvw + int64_t(h / group) * k.hd;
          for (int d = 0; d < k.hd; ++d) out[d] += p[size_t(j)] / sum * double(vj[d]);
        }
      }
    cuda::DeviceBuffer<uint16_t> dq(q.size(), "q"), dk(kk.size(), "k"), dv(v.size(), "v"), dc(q.size(), "ctx"), dc2(q.size(), "ctx again");
    cuda::DeviceBuffer<int> dpos(1, "pos");
    cuda::copy_to_device(dpos.get(), &k.pos, 4);
    for (auto [src, dst] : {std::pair{&q, &dq}, std::pair{&kk, &dk}, std::pair{&v, &dv}}) upload_16(k.dt, *src, *dst);
    cuda::decode_attention(k.dt, dq.get(), dk.get(), dv.get(), dpos.get(), dc.get(), k.batch, k.heads, k.kv, k.hd, k.max_len, k.window, float(scale), splits, false);
    cuda::decode_attention(k.dt, dq.get(), dk.get(), dv.get(), dpos.get(), dc2.get(), k.batch, k.heads, k.kv, k.hd, k.max_len, k.window, float(scale), splits, true);
    std::vector<uint16_t> h(q.size()), h2(q.size());
    cuda::copy_to_host(h.data(), dc.get(), h.size() * 2);
    cuda::copy_to_host(h2.data(), dc2.get(), h2.size() * 2);
    const auto [rel, worst] = error_16(k.dt, h, ref);
    std::cout << "decode attention " << (k.dt == DType::F16 ? "f16" : "bf16") << " batch " << k.batch << " heads " << k.heads << "/" << k.kv << " hd "
              << k.hd << " pos " << k.pos << " window " << k.window << " splits " << splits << ": relative error " << rel << ", max abs " << worst << "\n";
    // P and ctx rounded to 16 bits (2^-11 relative for f16, 2^-8 for bf16); |v| ~ 1
    CHECK(rel <= (k.dt == DType::F16 ? 1e-3 : 8e-3));
    CHECK(worst <= (k.dt == DType::F16 ? 4e-3 : 3e-2));
    CHECK(h == h2);   // deterministic, with or without the PDL attribute
  }
  CHECK_THROWS_AS(cuda::decode_attention(DType::F16, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 8, 2, 80, 16, 0, 0.1f, 1, false), Error);
  CHECK_THROWS_AS(cuda::decode_attention(DType::F16, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 32, 2, 128, 16, 0, 0.1f, 1, false), Error);
}

TEST_CASE("gpu: the GPU forward of a MoE layer (routing, every expert) matches the fp32 CPU reference, and so do the experts' Hessians") {
  PTQ_REQUIRE_GPU();
  ptqtest::TempDir d;
  std::vector<std::string> models;
  SynthOptions o;
  o.preset = "tiny-moe";   // Qwen3-MoE shapes: 8 experts, top-2, q/k norms (f16)
  synth_model(o, d / "moe");
  models.push_back(d / "moe");
  if (ptqtest::have_assets())
    for (const char* f : {"tiny-mixtral", "tiny-qwen3-moe"}) models.push_back(ptqtest::assets() + "/models/" + f);   // bf16
  for (auto& dir : models) {
    LlamaModel m(dir);
    const LlamaConfig& c = m.config();
    const int S = 65, T = 128;   // two chunks of the GPU forward
    const MatF X = ptqtest::random_embeddings(m, S, T, 7);
    const Rope& rope = m.rope(T);
    LayerWeights w = m.load_layer(0);
    REQUIRE(w.experts.size() == size_t(c.num_experts));
    // CPU reference: xn2, the experts' inputs and activations over every row, the layer's output
    MatF xn, ctx, y, Xc = X;
    const float eps = float(c.rms_norm_eps);
    rmsnorm(Xc, w.input_layernorm, eps, xn);
    attention_core(w, c, rope, xn, S, T, ctx);
    linear(ctx, w[Proj::o], y);
    Xc += y;
    rmsnorm(Xc, w.post_attention_layernorm, eps, xn);
    Hessian h_in(c.hidden_size);
    h_in.add(xn);
    const MatD H_in = h_in.finalize();
    std::vector<MatD> H_act;
    for (auto& e : w.experts) {
      MatF act;
      swiglu(e[0], e[1], xn, act);
      Hessian h(c.moe_intermediate_size);
      h.add(act);
      H_act.push_back(h.finalize());
    }
    const Routing rt = route(c, w.router, xn);
    Xc = X;
    decoder_layer(w, c, rope, S, T, Xc);
    // GPU, the stages as the pipeline runs them
    cuda::LayerForwardCuda fw(c, rope, S, T, c.dtype);
    fw.set_input(X);
    fw.load_layer(w);
    double worst_in = 0, worst_act = 0;
    for (const LinearGroup& g : layer_schedule(c, 0).groups) {
      cuda::HessianCuda H(linear_shape(c, g.linears[0]).in, fw.dtype());
      fw.stage(g.input, g.expert, &H);
      if (g.input != Stage::expert_in && g.input != Stage::expert_act) continue;
      const MatD& want = g.input == Stage::expert_in ? H_in : H_act[size_t(g.expert)];
      const double e = (H.finalize() - want).norm() / want.norm();
      (g.input == Stage::expert_in ? worst_in : worst_act) = std::max(g.input == Stage::expert_in ? worst_in : worst_act, e);
    }
    fw.down_proj();
    const MatF Xg = fw.input();
    int64_t routed = 0, same_counts = 0;
    for (int e = 0; e < c.num_experts; ++e) {
      routed += fw.routed_tokens(e);
      same_counts += fw.routed_tokens(e) == int64_t(rt.rows[size_t(e)].size());
    }
    CHECK(routed == int64_t(S) * T * c.experts_per_token);
    // Rows: the layer's output within the 16-bit tolerance of what the layer added, except where
    // the 16-bit router flips a near-tied choice (that row then adds another expert's output).
    const double tol = fw.dtype() == DType::F16 ? 5e-3 : 1e-2;
    int64_t within = 0;
    for (Eigen::Index r = 0; r < X.rows(); ++r) within += (Xg.row(r) - Xc.row(r)).norm() <= 2 * tol * (Xc.row(r) - X.row(r)).norm();
    std::cout << dir << ": MoE layer output rows within " << 2 * tol << ": " << within << " of " << X.rows() << " (whole: "
              << (Xg - Xc).norm() / (Xc - X).norm() << "); experts' input Hessians " << worst_in << ", activation Hessians " << worst_act
              << "; experts with the CPU's routed count " << same_counts << " of " << c.num_experts << "\n";
    CHECK(worst_in <= tol);
    CHECK(worst_act <= tol);
    CHECK(within >= X.rows() * 99 / 100);
  }
}
