// The fp32 forward pass against (a) the golden logits from HF transformers for the three shared
// models and (b) a naive fp64 implementation written here, for what the shared models lack:
// q/k/v bias (qwen2), o bias, a sliding window (mistral), head_dim != hidden/heads.
#include <cmath>
#include <filesystem>
#include <functional>

#include <omp.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/product.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "model/llama.h"
#include "golden.h"
#include "testing.h"

using namespace ptq;
using nlohmann::json;

namespace {
// The golden logits of HF transformers (fp32) for the golden ids: [T] in the older models' files,
// [S, T] in the tiny checkpoints written by transformers 5 (bf16 weights, hub names).
void check_golden(const std::string& model) {
  LlamaModel m(ptqtest::assets() + "/models/" + model);
  const ptqtest::Golden g = ptqtest::golden(model);
  const MatF got = m.forward(g.ids, g.S, g.T);
  REQUIRE(size_t(got.size()) == g.logits.size());
  double maxd = 0;
  for (size_t i = 0; i < g.logits.size(); ++i) maxd = std::max(maxd, double(std::abs(got.data()[i] - g.logits[i])));
  INFO(model << ": max |logit - golden| = " << maxd);
  CHECK(maxd < 1e-3);
}

// ---- naive fp64 reference ----
using D = std::vector<double>;
struct RefModel {
  json cfg;
  std::map<std::string, D> t;
  std::map<std::string, Shape> shape;
};

D matvec(const D& W, const Shape& s, const D& x) {
  D y(size_t(s[0]), 0.0);
  for (int64_t r = 0; r < s[0]; ++r)
    for (int64_t c = 0; c < s[1]; ++c) y[size_t(r)] += W[size_t(r * s[1] + c)] * x[size_t(c)];
  return y;
}
D rms(const D& x, const D& w, double eps) {
  double ms = 0;
  for (double v : x) ms += v * v;
  ms /= double(x.size());
  D y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] / std::sqrt(ms + eps) * w[i];
  return y;
}

std::vector<D> ref_forward(RefModel& m, const std::vector<int32_t>& ids) {
  auto& c = m.cfg;
  const int d = c["hidden_size"], nh = c["num_attention_heads"], nkv = c["num_key_value_heads"], hd = c["head_dim"];
  const int L = c["num_hidden_layers"], T = int(ids.size()), win = c.value("sliding_window", 0);
  const double eps = c["rms_norm_eps"], theta = c["rope_theta"];
  auto lin = [&](const std::string& n, const D& x) {
    D y = matvec(m.t[n + ".weight"], m.shape[n + ".weight"], x);
    if (m.t.count(n + ".bias")) for (size_t i = 0; i < y.size(); ++i) y[i] += m.t[n + ".bias"][i];
    return y;
  };
  auto rope = [&](D& v, int nheads, int pos) {
    for (int h = 0; h < nheads; ++h)
      for (int i = 0; i < hd / 2; ++i) {
        const double f = std::pow(theta, -2.0 * i / hd), a = v[size_t(h * hd + i)], b = v[size_t(h * hd + i + hd / 2)];
        v[size_t(h * hd + i)] = a * std::cos(pos * f) - b * std::sin(pos * f);
        v[size_t(h * hd + i + hd / 2)] = b * std::cos(pos * f) + a * std::sin(pos * f);
      }
  };
  std::vector<D> x(static_cast<size_t>(T));
  for (int t = 0; t < T; ++t) x[size_t(t)] = D(m.t["model.embed_tokens.weight"].begin() + ids[size_t(t)] * d,
                                               m.t["model.embed_tokens.weight"].begin() + (ids[size_t(t)] + 1) * d);
  for (int l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    const size_t nT = static_cast<size_t>(T);
    std::vector<D> q(nT), k(nT), v(nT);
    for (int t = 0; t < T; ++t) {
      D xn = rms(x[size_t(t)], m.t[p + ".input_layernorm.weight"], eps);
      q[size_t(t)] = lin(p + ".self_attn.q_proj", xn);
      k[size_t(t)] = lin(p + ".self_attn.k_proj", xn);
      v[size_t(t)] = lin(p + ".self_attn.v_proj", xn);
      rope(q[size_t(t)], nh, t);
      rope(k[size_t(t)], nkv, t);
    }
    for (int t = 0; t < T; ++t) {
      D ctx(size_t(nh * hd), 0.0);
      for (int h = 0; h < nh; ++h) {
        const int g = h / (nh / nkv);
        const int j0 = win > 0 ? std::max(0, t - win + 1) : 0;
        D s;
        double mx = -1e300, sum = 0;
        for (int j = j0; j <= t; ++j) {
          double dot = 0;
          for (int i = 0; i < hd; ++i) dot += q[size_t(t)][size_t(h * hd + i)] * k[size_t(j)][size_t(g * hd + i)];
          s.push_back(dot / std::sqrt(double(hd)));
          mx = std::max(mx, s.back());
        }
        for (auto& e : s) { e = std::exp(e - mx); sum += e; }
        for (int j = j0; j <= t; ++j)
          for (int i = 0; i < hd; ++i) ctx[size_t(h * hd + i)] += s[size_t(j - j0)] / sum * v[size_t(j)][size_t(g * hd + i)];
      }
      D o = lin(p + ".self_attn.o_proj", ctx);
      for (int i = 0; i < d; ++i) x[size_t(t)][size_t(i)] += o[size_t(i)];
      D xn = rms(x[size_t(t)], m.t[p + ".post_attention_layernorm.weight"], eps);
      D gt = lin(p + ".mlp.gate_proj", xn), up = lin(p + ".mlp.up_proj", xn);
      for (size_t i = 0; i < gt.size(); ++i) gt[i] = gt[i] / (1 + std::exp(-gt[i])) * up[i];
      D dn = lin(p + ".mlp.down_proj", gt);
      for (int i = 0; i < d; ++i) x[size_t(t)][size_t(i)] += dn[size_t(i)];
    }
  }
  std::vector<D> out;
  for (int t = 0; t < T; ++t) out.push_back(matvec(m.t["lm_head.weight"], m.shape["lm_head.weight"], rms(x[size_t(t)], m.t["model.norm.weight"], eps)));
  return out;
}

// Writes a random model for `cfg` into dir and returns the same weights in fp64.
RefModel write_random_model(const json& cfg, const std::string& dir) {
  RefModel m;
  m.cfg = cfg;
  const int d = cfg["hidden_size"], f = cfg["intermediate_size"], V = cfg["vocab_size"], q = int(cfg["num_attention_heads"]) * int(cfg["head_dim"]),
            kv = int(cfg["num_key_value_heads"]) * int(cfg["head_dim"]);
  std::vector<std::pair<std::string, Shape>> specs = {{"model.embed_tokens.weight", {V, d}}, {"model.norm.weight", {d}}, {"lm_head.weight", {V, d}}};
  for (int l = 0; l < int(cfg["num_hidden_layers"]); ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    specs.push_back({p + ".input_layernorm.weight", {d}});
    specs.push_back({p + ".post_attention_layernorm.weight", {d}});
    specs.push_back({p + ".self_attn.q_proj.weight", {q, d}});
    specs.push_back({p + ".self_attn.k_proj.weight", {kv, d}});
    specs.push_back({p + ".self_attn.v_proj.weight", {kv, d}});
    specs.push_back({p + ".self_attn.o_proj.weight", {d, q}});
    specs.push_back({p + ".mlp.gate_proj.weight", {f, d}});
    specs.push_back({p + ".mlp.up_proj.weight", {f, d}});
    specs.push_back({p + ".mlp.down_proj.weight", {d, f}});
    if (cfg["model_type"] == "qwen2" || cfg.value("attention_bias", false)) {
      specs.push_back({p + ".self_attn.q_proj.bias", {q}});
      specs.push_back({p + ".self_attn.k_proj.bias", {kv}});
      specs.push_back({p + ".self_attn.v_proj.bias", {kv}});
    }
    if (cfg.value("attention_bias", false)) specs.push_back({p + ".self_attn.o_proj.bias", {d}});
  }
  Rng rng(7);
  std::vector<NamedTensor> ts;
  for (auto& [n, s] : specs) {
    std::vector<float> x(size_t(numel(s)));
    for (auto& e : x) e = s.size() == 1 && n.find("bias") == std::string::npos ? float(1 + 0.2 * rng.normal()) : float(0.3 * rng.normal());
    m.t[n] = D(x.begin(), x.end());
    m.shape[n] = s;
    ts.push_back({n, tensor_from_f32(x.data(), s, DType::F32)});
  }
  write_safetensors(dir + "/model.safetensors", ts);
  write_file_atomic(dir + "/config.json", cfg.dump());
  return m;
}

void check_against_fp64(json cfg) {
  ptqtest::TempDir dir;
  RefModel ref = write_random_model(cfg, dir.path.string());
  LlamaModel m(dir.path.string());
  std::vector<int32_t> ids;
  Rng r(3);
  const int T = 21;
  for (int i = 0; i < 2 * T; ++i) ids.push_back(int32_t(r.below(uint64_t(cfg["vocab_size"].get<int>()))));
  MatF got = m.forward(ids, 2, T);   // two sequences: positions restart at 0 in each
  for (int s = 0; s < 2; ++s) {
    std::vector<int32_t> seq(ids.begin() + s * T, ids.begin() + (s + 1) * T);
    auto want = ref_forward(ref, seq);
    double maxd = 0, maxv = 0;
    for (int t = 0; t < T; ++t)
      for (size_t v = 0; v < want[size_t(t)].size(); ++v) {
        maxd = std::max(maxd, std::abs(double(got(s * T + t, Eigen::Index(v))) - want[size_t(t)][v]));
        maxv = std::max(maxv, std::abs(want[size_t(t)][v]));
      }
    INFO(cfg["model_type"] << ": max |fp32 - fp64| = " << maxd << " of max " << maxv);
    CHECK(maxd <= 1e-4 * maxv);
  }
}

json small_cfg(const std::string& type) {
  return {{"model_type", type}, {"hidden_size", 32}, {"intermediate_size", 48}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"head_dim", 12}, {"vocab_size", 40}, {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5},
          {"rope_theta", 100.0}, {"torch_dtype", "float32"}};
}
}  // namespace

TEST_CASE("logits match HF transformers' golden logits: stories260k") { PTQ_REQUIRE_ASSETS(); check_golden("stories260k"); }
TEST_CASE("logits match HF transformers' golden logits: llama2xs") { PTQ_REQUIRE_ASSETS(); check_golden("llama2xs"); }
TEST_CASE("logits match HF transformers' golden logits: distilled-13m (f16, sharded)") { PTQ_REQUIRE_ASSETS(); check_golden("distilled-13m"); }
TEST_CASE("logits match HF transformers' golden logits: tiny-qwen3 (per-head q/k norms, head_dim 32 with hidden 64, rope_parameters)") {
  PTQ_REQUIRE_ASSETS();
  check_golden("tiny-qwen3");
}
TEST_CASE("logits match HF transformers' golden logits: tiny-mixtral (4 experts, top-2 of the logits, softmax over the chosen)") {
  PTQ_REQUIRE_ASSETS();
  check_golden("tiny-mixtral");
}
TEST_CASE("logits match HF transformers' golden logits: tiny-qwen3-moe (8 experts, softmax then top-2, renormalized, q/k norms)") {
  PTQ_REQUIRE_ASSETS();
  check_golden("tiny-qwen3-moe");
}
TEST_CASE("logits match HF transformers' golden logits: tiny-phi3 (fused qkv_proj and gate_up_proj)") {
  PTQ_REQUIRE_ASSETS();
  check_golden("tiny-phi3");
}

// Eigen's GEMM cuts K by a depth its heuristics choose from the L1 size and the thread count
// (one thread and two gave distilled-13m's quantized model different bytes before
// fixed_depth_product): K of 700 (two whole chunks of 256 and a part), the value of an fp64
// product, the same bytes on one thread and on two, into a matrix and into a block of one.
TEST_CASE("fixed_depth_product: an fp64 product's values, the same bytes on one thread and on two") {
  Rng r{57};
  MatF A(300, 700), B(500, 700);
  for (int i = 0; i < A.size(); ++i) A.data()[i] = float(r.normal());
  for (int i = 0; i < B.size(); ++i) B.data()[i] = float(r.normal());
  const Eigen::MatrixXd ref = A.cast<double>() * B.cast<double>().transpose();
  const int threads = omp_get_max_threads();
  MatF y1, y2, wide1 = MatF::Zero(300, 600), wide2 = wide1;
  omp_set_num_threads(1);
  fixed_depth_product(A, B.transpose(), y1);
  fixed_depth_product(A, B.transpose(), wide1.middleCols(50, 500));
  omp_set_num_threads(2);
  fixed_depth_product(A, B.transpose(), y2);
  fixed_depth_product(A, B.transpose(), wide2.middleCols(50, 500));
  omp_set_num_threads(threads);
  CHECK((y1.cast<double>() - ref).cwiseAbs().maxCoeff() <= 1e-5 * ref.cwiseAbs().maxCoeff());
  CHECK(std::memcmp(y1.data(), y2.data(), sizeof(float) * size_t(y1.size())) == 0);
  CHECK(std::memcmp(wide1.data(), wide2.data(), sizeof(float) * size_t(wide1.size())) == 0);
  CHECK(MatF(wide1.middleCols(50, 500)) == y1);
  CHECK(wide1.leftCols(50).cwiseAbs().maxCoeff() == 0.0f);
}

// The whole forward (Linears with K of 384 and 1024, attention over up to 512 keys: the golden ids
// four times): the same logits, byte for byte, on one thread and on two.
TEST_CASE("the forward's logits are the same bytes on one thread and on two: distilled-13m") {
  PTQ_REQUIRE_ASSETS();
  const std::string a = ptqtest::assets();
  LlamaModel m(a + "/models/distilled-13m");
  const std::vector<int32_t> golden = ptqtest::golden("distilled-13m").ids;
  std::vector<int32_t> ids;
  for (int k = 0; k < 4; ++k) ids.insert(ids.end(), golden.begin(), golden.end());
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const MatF one = m.forward(ids, 1, int(ids.size()));
  omp_set_num_threads(2);
  const MatF two = m.forward(ids, 1, int(ids.size()));
  omp_set_num_threads(threads);
  REQUIRE(one.size() == two.size());
  CHECK(std::memcmp(one.data(), two.data(), sizeof(float) * size_t(one.size())) == 0);
}

TEST_CASE("forward matches an fp64 reference: llama with GQA and head_dim != hidden/heads") { check_against_fp64(small_cfg("llama")); }
TEST_CASE("forward matches an fp64 reference: qwen2 q/k/v bias") { check_against_fp64(small_cfg("qwen2")); }
TEST_CASE("forward matches an fp64 reference: llama attention_bias (q/k/v/o bias)") {
  json c = small_cfg("llama");
  c["attention_bias"] = true;
  check_against_fp64(c);
}
TEST_CASE("forward matches an fp64 reference: mistral sliding window") {
  json c = small_cfg("mistral");
  c["sliding_window"] = 5;
  check_against_fp64(c);
}

TEST_CASE("a tensor of the wrong shape for the config is refused naming it") {
  ptqtest::TempDir dir;
  json cfg = small_cfg("llama");
  write_random_model(cfg, dir.path.string());
  cfg["intermediate_size"] = 64;
  write_file_atomic(dir / "config.json", cfg.dump());
  try {
    LlamaModel m(dir.path.string());
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("model.layers.0.mlp.gate_proj.weight: shape [48, 32] does not match the config's [64, 32]") != std::string::npos);
  }
}

TEST_CASE("token ids outside the vocabulary are refused") {
  ptqtest::TempDir dir;
  write_random_model(small_cfg("llama"), dir.path.string());
  LlamaModel m(dir.path.string());
  CHECK_THROWS_AS(m.forward({1, 2, 99}, 1, 3), Error);
}

// A copy of a shared tiny checkpoint whose config.json is edited by `edit`; LlamaModel's error.
std::string model_error_after(const std::string& family, const std::function<void(json&)>& edit) {
  ptqtest::TempDir d;
  const std::string src = ptqtest::assets() + "/models/tiny-" + family;
  std::filesystem::copy_file(src + "/model.safetensors", d / "model.safetensors");
  json c = json::parse(read_text_file(src + "/config.json"));
  edit(c);
  write_file_atomic(d / "config.json", c.dump());
  try {
    LlamaModel m(d.path.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("MoE and fused checkpoints that do not match their config are refused naming the file and tensor") {
  PTQ_REQUIRE_ASSETS();
  // an expert the config implies is missing
  CHECK_THAT(model_error_after("mixtral", [](json& c) { c["num_local_experts"] = 5; }),
             Catch::Contains("model.safetensors: model.layers.0.block_sparse_moe.gate.weight: shape [4, 64] does not match the config's [5, 64] (the router"));
  // expert tensors of the wrong shape
  CHECK_THAT(model_error_after("qwen3-moe", [](json& c) { c["moe_intermediate_size"] = 32; }),
             Catch::Contains("model.layers.0.mlp.experts.0.gate_proj.weight: shape [48, 64] does not match the config's [32, 64]"));
  // experts of a layer the config says is dense: its dense MLP is missing
  CHECK_THAT(model_error_after("qwen3-moe", [](json& c) { c["mlp_only_layers"] = {1}; }),
             Catch::Contains("model.layers.1.mlp.gate_proj.weight: tensor missing from the checkpoint"));
  // a fused tensor whose rows do not split into the heads the config gives
  CHECK_THAT(model_error_after("phi3", [](json& c) { c["num_key_value_heads"] = 4; }),
             Catch::Contains("model.layers.0.self_attn.qkv_proj.weight: shape [128, 64] does not match the config's [192, 64] (q, k, v rows: 64 + 64 + 64"));
  CHECK_THAT(model_error_after("phi3", [](json& c) { c["intermediate_size"] = 128; }),
             Catch::Contains("model.layers.0.mlp.gate_up_proj.weight: shape [320, 64] does not match the config's [256, 64] (gate rows, then up rows"));
}
