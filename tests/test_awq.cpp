// AWQ: the search's scales and errors against a float64 computation of AutoAWQ's formulas, and
// runs that use it: the float Linears it folds into, what every format writes, what it is worth on
// a real model, and the recipes it refuses.
#include <cmath>
#include <filesystem>
#include <map>

#include <omp.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/checkpoint.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "eval/perplexity.h"
#include "formats/gguf.h"
#include "formats/open.h"
#include "gptq/clip.h"
#include "gptq/gptq.h"
#include "model/corpus.h"
#include "model/schedule.h"
#include "pipeline/pipeline.h"
#include "smoothquant/awq.h"
#include "smoothquant/smoothquant.h"
#include "golden.h"
#include "testing.h"
#include "testing_recipe.h"

using namespace ptq;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {
using Md = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// AutoAWQ's pseudo_quantize_tensor in fp64: asymmetric min-max per group of g (GPTQ's find_params:
// the range widened to hold 0), scale = (max - min) / maxq, zero = round(-min / scale), codes
// clamped to [0, maxq], dequantized as scale · (q - zero).
Md fake_quantize(const Md& W, int bits, int g) {
  const double maxq = (1 << bits) - 1;
  Md Q(W.rows(), W.cols());
  for (Eigen::Index r = 0; r < W.rows(); ++r)
    for (Eigen::Index c0 = 0; c0 < W.cols(); c0 += g) {
      double lo = 0, hi = 0;
      for (Eigen::Index j = c0; j < c0 + g; ++j) lo = std::min(lo, W(r, j)), hi = std::max(hi, W(r, j));
      const double scale = (hi - lo) / maxq, zero = std::nearbyint(-lo / scale);
      for (Eigen::Index j = c0; j < c0 + g; ++j) Q(r, j) = scale * (std::clamp(std::nearbyint(W(r, j) / scale) + zero, 0.0, maxq) - zero);
    }
  return Q;
}
}  // namespace

namespace {
// llama2xs's perplexity over the whole evaluation text in windows of 256 (the ids read once).
double llama2xs_perplexity(const std::string& dir) {
  static const std::vector<int32_t> ids =
      encode_corpus(*load_tokenizer(ptqtest::assets() + "/models/llama2xs", 1), ptqtest::assets() + "/text/tinystories/eval.txt");
  EvalOptions o;
  o.seq_len = 256;
  return evaluate(*open_model(dir), ids, o).perplexity;
}
// A recipe for llama2xs from YAML, calibrated on 64 windows of 256 of the calibration text.
Recipe llama2xs_recipe(const std::string& yaml, const std::string& out) {
  Recipe r = parse_recipe(YAML::Load(yaml), "r.yaml");
  r.model = ptqtest::assets() + "/models/llama2xs";
  r.output = out;
  r.calibration = {ptqtest::assets() + "/text/tinystories/calib.txt", 64, 256, 0};
  return r;
}
}  // namespace

TEST_CASE("AWQ: every ratio's scales and output error equal a float64 computation of AutoAWQ's search, with tied columns too") {
  // X with a few loud channels (AWQ's salient ones), two Linears over it, 4-bit groups of 16.
  const int rows = 96, K = 64, g = 16, bits = 4, grid = 20;
  Rng rng(7);
  MatF X(rows, K), W1(24, K), W2(8, K);
  for (Eigen::Index j = 0; j < K; ++j) {
    const float loud = j % 13 == 5 ? 12.0f : 1.0f;
    for (int r = 0; r < rows; ++r) X(r, j) = loud * rng.normal();
  }
  for (MatF* W : {&W1, &W2})
    for (Eigen::Index i = 0; i < W->size(); ++i) W->data()[i] = 0.05f * rng.normal();
  QuantSpec spec;
  spec.method = "rtn";
  spec.bits = bits;
  spec.group_size = g;
  spec.sym = false;
  spec.scale_dtype = DType::F32;
  const std::vector<const MatF*> ws = {&W1, &W2};

  // the reference: x̄, w̄ (groups normalized by their max |w| + 1e-6), AutoAWQ's duo scales
  const Md Xd = X.cast<double>();
  Md Wd(W1.rows() + W2.rows(), K);
  Wd << W1.cast<double>(), W2.cast<double>();
  Eigen::VectorXd x_mean = Xd.cwiseAbs().colwise().mean().transpose(), w_mean = Eigen::VectorXd::Zero(K);
  for (Eigen::Index r = 0; r < Wd.rows(); ++r)
    for (int c0 = 0; c0 < K; c0 += g) {
      const double m = Wd.row(r).segment(c0, g).cwiseAbs().maxCoeff() + 1e-6;
      for (int j = c0; j < c0 + g; ++j) w_mean[j] += std::abs(Wd(r, j)) / m / double(Wd.rows());
    }
  auto ref_error = [&](const Eigen::VectorXd& s) {
    Md dW = fake_quantize(Wd * s.asDiagonal(), bits, g) * s.cwiseInverse().asDiagonal() - Wd;
    return (Xd * dW.transpose()).squaredNorm() / rows;
  };
  const VecF xm = mean_abs_columns(X), wm = awq_weight_mean(ws, {g, g});
  for (Eigen::Index j = 0; j < K; ++j) {
    CHECK(std::abs(xm[j] - x_mean[j]) <= 1e-6 * x_mean[j]);
    CHECK(std::abs(wm[j] - w_mean[j]) <= 1e-6 * w_mean[j]);
  }
  double best = ref_error(Eigen::VectorXd::Ones(K)), best_ratio = -1;
  const double unscaled = best;
  for (int k = 0; k < grid; ++k) {
    const double ratio = double(k) / grid;
    Eigen::VectorXd s(K);
    for (int j = 0; j < K; ++j) s[j] = std::max(std::pow(x_mean[j], ratio) / (std::pow(w_mean[j], 1 - ratio) + 1e-4), 1e-4);
    s /= std::sqrt(s.maxCoeff() * s.minCoeff());
    const VecF got = awq_scales(xm, wm, ratio);
    for (int j = 0; j < K; ++j) CHECK(std::abs(got[j] - s[j]) <= 2e-6 * s[j]);
    const double want = ref_error(s);
    MatF dW(Wd.rows(), K);
    dW << awq_delta(W1, spec, got), awq_delta(W2, spec, got);
    INFO("ratio " << ratio);
    CHECK(std::abs(output_sq_error(X, dW) - want) <= 1e-4 * want);
    if (want < best) best = want, best_ratio = ratio;
  }
  const AwqSearch a = search_awq(X, ws, {spec, spec}, grid, true);   // X is tall: the host's Gram form
  const AwqSearch p = search_awq(X, ws, {spec, spec}, grid, true, product_scorer(output_sq_error));   // the product X·dWᵀ
  CHECK(p.ratio == a.ratio);
  CHECK(std::abs(p.error - a.error) <= 1e-5 * a.error);
  CHECK(std::abs(p.error_unscaled - a.error_unscaled) <= 1e-5 * a.error_unscaled);
  CHECK(best_ratio > 0);   // the loud channels make some scaling worth it
  CHECK(a.ratio == best_ratio);
  CHECK(std::abs(a.error - best) <= 1e-4 * best);
  CHECK(std::abs(a.error_unscaled - unscaled) <= 1e-4 * unscaled);
  CHECK(a.error < 0.9 * a.error_unscaled);
  // Tied columns (tie[j] = j / 2, as two query heads read one v row): x̄ and w̄ averaged over each
  // pair in fp64 before the scales, both columns of a pair one scale, the choice the best of those.
  std::vector<int64_t> tie(K);
  Eigen::VectorXd xt(K), wt(K);
  for (int j = 0; j < K; ++j) {
    tie[size_t(j)] = j / 2;
    xt[j] = (x_mean[j & ~1] + x_mean[j | 1]) / 2, wt[j] = (w_mean[j & ~1] + w_mean[j | 1]) / 2;
  }
  double best_tied = unscaled, ratio_tied = -1;
  for (int k = 0; k < grid; ++k) {
    const double ratio = double(k) / grid;
    Eigen::VectorXd s(K);
    for (int j = 0; j < K; ++j) s[j] = std::max(std::pow(xt[j], ratio) / (std::pow(wt[j], 1 - ratio) + 1e-4), 1e-4);
    s /= std::sqrt(s.maxCoeff() * s.minCoeff());
    if (const double e = ref_error(s); e < best_tied) best_tied = e, ratio_tied = ratio;
  }
  const AwqSearch t = search_awq(X, ws, {spec, spec}, grid, true, {}, tie);
  CHECK(ratio_tied > 0);
  CHECK(t.ratio == ratio_tied);
  CHECK(std::abs(t.error - best_tied) <= 1e-4 * best_tied);
  for (int j = 0; j < K; j += 2) CHECK(t.scales[j] == t.scales[j + 1]);
  // x̄^r alone (duo_scaling false): ratio 0 is s = 1
  const VecF s0 = awq_scales(xm, VecF(), 0.0);
  CHECK(s0.minCoeff() == 1.0f);
  CHECK(s0.maxCoeff() == 1.0f);
}

namespace {
// AutoAWQ's auto_clip step for one group, in fp32 as PyTorch runs it on fp32 weights: the grid of
// w clamped to [-m, m] (fake_quantize's; symmetric: the range's larger end both ways, zero
// (maxq + 1) / 2), and the codes of w itself, saturating at the grid's ends, dequantized as
// scale · (q - zero). (AutoAWQ rounds the clamped w: where both ends are clamped, -min / scale is
// maxq / 2 to the float's last bit, and a zero rounded down leaves the clamped top one code short of
// the end, which a weight beyond it then takes too; the unclamped weight takes the end.)
std::vector<double> clamped_grid_quantize(const std::vector<float>& w, float m, int bits, bool sym) {
  const float maxq = float((1 << bits) - 1);
  std::vector<double> q(w.size());
  float lo = 0, hi = 0;
  for (float x : w) lo = std::min(lo, std::clamp(x, -m, m)), hi = std::max(hi, std::clamp(x, -m, m));
  if (sym) hi = std::max(-lo, hi), lo = -hi;
  const float scale = (hi - lo) / maxq, zero = sym ? (maxq + 1) / 2 : std::clamp(std::nearbyint(-lo / scale), 0.0f, maxq);
  for (size_t j = 0; j < w.size(); ++j) q[j] = double(scale * (std::clamp(std::nearbyint(w[j] / scale) + zero, 0.0f, maxq) - zero));
  return q;
}
}  // namespace

TEST_CASE("AWQ's ratios score rtn_fake_quantize: the floats of rtn_quantize's codes dequantized, bit for bit, on every grid form") {
  Rng rng(5);
  MatF W(40, 512);
  for (Eigen::Index i = 0; i < W.size(); ++i) W.data()[i] = 0.02f * rng.normal() * (i % 61 == 0 ? 8.0f : 1.0f);
  std::vector<QuantSpec> specs;
  for (auto [bits, group, sym] : {std::tuple{4, 128, false}, {4, 32, true}, {3, -1, false}, {8, 128, true}, {2, 64, false}}) {
    QuantSpec s;
    s.method = "rtn", s.bits = bits, s.group_size = group, s.sym = sym;
    specs.push_back(s);
  }
  for (const char* t : {"Q4_1", "Q5_1", "Q4_K", "Q5_K", "Q6_K"}) {
    QuantSpec s;
    s.method = "rtn";
    REQUIRE(apply_gguf_type(t, s).empty());
    specs.push_back(s);
  }
  for (const QuantSpec& s : specs) {
    INFO(s.bits << "-bit, group " << s.group_size << ", " << grid_form_name(s.form) << (s.sym ? ", symmetric" : ""));
    CHECK(rtn_fake_quantize(W, s) == rtn_quantize(W, s).dequantize());
  }
}

TEST_CASE("AWQ's clipping search: each group's limit is a float64 computation of AutoAWQ's auto_clip over every calibration token") {
  const int n = 256, rows = 48, cols = 320, g = 128;   // three groups a row, the last of 64 columns
  Rng rng(11);
  MatF X(n, cols), W(rows, cols);
  for (int j = 0; j < cols; ++j) {
    const float loud = j % 29 == 3 ? 10.0f : 1.0f;
    for (int t = 0; t < n; ++t) X(t, j) = loud * rng.normal();
  }
  for (Eigen::Index i = 0; i < W.size(); ++i) W.data()[i] = 0.02f * rng.normal() * (i % 97 == 0 ? 6.0f : 1.0f);   // a few outliers
  const Md Xd = X.cast<double>();
  const MatD H = (Xd.transpose() * Xd) * (2.0 / n);
  for (bool sym : {false, true})
    for (int bits : {3, 4}) {
      INFO("bits " << bits << (sym ? " symmetric" : " asymmetric"));
      QuantSpec s;
      s.method = "rtn";
      s.bits = bits;
      s.group_size = g;
      s.sym = sym;
      s.scale_dtype = DType::F32;
      s.output_clip = true;
      const ClipSearch c = output_clip_limits(W, H, s);
      REQUIRE(c.groups == rows * 3);
      const MatF Wq = rtn_quantize(W, s, &c.limits).dequantize();
      int64_t clipped = 0, near_ties = 0;
      double err_clipped = 0, err_none = 0;
      for (int r = 0; r < rows; ++r)
        for (int gi = 0; gi < 3; ++gi) {
          const int c0 = gi * g, w_n = std::min(g, cols - c0);
          std::vector<float> w(size_t(w_n), 0.0f);
          float amax = 0;
          for (int j = 0; j < w_n; ++j) w[size_t(j)] = W(r, c0 + j), amax = std::max(amax, std::abs(W(r, c0 + j)));
          // the cost of each step: the group's output error over the tokens, sum_t (sum_c x_tc e_c)^2
          std::vector<double> cost(kClipSteps);
          for (int k = 0; k < kClipSteps; ++k) {
            const float m = k == 0 ? INFINITY : float(1.0 - k / 20.0) * amax;
            const std::vector<double> q = clamped_grid_quantize(w, m, bits, sym);
            Eigen::VectorXd e(w_n);
            for (int j = 0; j < w_n; ++j) e[j] = q[size_t(j)] - double(w[size_t(j)]);
            cost[size_t(k)] = (Xd.middleCols(c0, w_n) * e).squaredNorm();
          }
          const int k_ref = int(std::min_element(cost.begin(), cost.end()) - cost.begin());   // the first least: ties keep the wider range
          const float lim = c.limits[size_t(gi * rows + r)];
          int k_got = lim == INFINITY ? 0 : -1;
          for (int k = 1; k < kClipSteps && k_got < 0; ++k)
            if (clip_limit(k, amax) == lim) k_got = k;
          INFO("row " << r << " group " << gi);
          REQUIRE(k_got >= 0);
          if (k_got != k_ref) {   // only where two steps cost the same to fp32's precision
            ++near_ties;
            CHECK(cost[size_t(k_got)] <= cost[size_t(k_ref)] * (1 + 1e-5));
          }
          clipped += k_got > 0;
          // and the quantized group is that step's: the same output error
          Eigen::VectorXd e(w_n);
          for (int j = 0; j < w_n; ++j) e[j] = double(Wq(r, c0 + j)) - double(w[size_t(j)]);
          CHECK(std::abs((Xd.middleCols(c0, w_n) * e).squaredNorm() - cost[size_t(k_got)]) <= 1e-4 * cost[size_t(k_got)]);
          err_clipped += cost[size_t(k_got)], err_none += cost[0];
        }
      CHECK(clipped == c.clipped);
      CHECK(clipped > 0);
      CHECK(near_ties <= 2);
      CHECK(err_clipped < err_none);
      // GPTQ with static groups solves on the same grids
      QuantSpec sg = s;
      sg.method = "gptq";
      sg.static_groups = sg.act_order = true;
      const QuantizedLinear qg = gptq_quantize(W, H, sg, nullptr, &c.limits), qr = rtn_quantize(W, s, &c.limits);
      CHECK(qg.scales == qr.scales);
      CHECK(qg.zeros == qr.zeros);
    }
  // no limit anywhere: the unclamped grids, bit for bit
  QuantSpec s;
  s.method = "rtn";
  const std::vector<float> none(size_t(3 * rows), INFINITY);
  CHECK(rtn_quantize(W, s, &none).packed == rtn_quantize(W, s).packed);
  CHECK(rtn_quantize(W, s, &none).scales == rtn_quantize(W, s).scales);
}

TEST_CASE("AWQ on llama2xs: RTN 4-bit g128 closer to float, a float Linear folded, the norms GGUF and the fake export write") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string a = ptqtest::assets();
  auto recipe = [&](const std::string& out, const std::string& extra, const std::string& exports = "{format: fake}") {
    const std::string grid = exports == "{format: fake}" ? "bits: 4, group_size: 128, sym: false, " : "";
    // (the norms' pairs only: the kept v_proj's check below is theirs; test "AWQ's v_proj -> o_proj..." has the others)
    std::string x = extra;
    if (const size_t at = x.find("awq: {"); at != std::string::npos) x.insert(at + 6, "pairs: [input_layernorm, post_attention_layernorm], ");
    return llama2xs_recipe("quantization: {method: rtn, " + grid + "ignore: [lm_head, model.embed_tokens, model.layers.1.self_attn.v_proj]" + x +
                               "}\nexport: " + exports + "\n",
                           d / out);
  };
  run_quantize(recipe("rtn", ""), {});
  const json rep = run_quantize(recipe("awq", ", awq: {grid: 20}"), {});   // with AWQ's clipping (on for RTN)
  run_quantize(recipe("awq-noclip", ", awq: {grid: 20, clip: false}"), {});
  // an override that makes one Linear per-channel: refused before calibrating, naming it
  CHECK_THROWS_WITH(run_quantize(recipe("bad", ", awq: {clip: true}, overrides: {down_proj: {group_size: -1}}"), {}),
                    Catch::Contains("quantization.awq.clip: model.layers.0.mlp.down_proj: the clipping search takes groups"));
  {   // the same bytes from its saved statistics (the scales folded as saved), and on one thread
    QuantizeOptions save, load;
    save.save_stats = d / "stats";
    run_quantize(recipe("awq-s", ", awq: {grid: 20}"), save);
    load.load_stats = d / "stats";
    run_quantize(recipe("awq-l", ", awq: {grid: 20}"), load);
    CHECK(sha256_file(d / "awq-l/model.safetensors") == sha256_file(d / "awq/model.safetensors"));
    CHECK_THROWS_WITH(run_quantize(recipe("rtn-l", ""), load), Catch::Contains("key.collection.awq"));
  }
  {   // stopped after layer 1 and resumed: the replayed layers' scaled norms, the same bytes
    Recipe again = recipe("awq-r", ", awq: {grid: 20}");
    QuantizeOptions stop, resume;
    stop.resume = resume.resume = true;
    stop.stop_after_layer = 1;
    CHECK_THROWS_WITH(run_quantize(again, stop), Catch::Contains("stopped after layer 1"));
    const json rr = run_quantize(again, resume);
    CHECK(rr["awq"] == rep["awq"]);
    CHECK(sha256_file(d / "awq-r/model.safetensors") == sha256_file(d / "awq/model.safetensors"));
  }
  {
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    run_quantize(recipe("awq1", ", awq: {grid: 20}"), {});
    omp_set_num_threads(threads);
    CHECK(sha256_file(d / "awq1/model.safetensors") == sha256_file(d / "awq/model.safetensors"));
  }
  // and as llama.cpp's Q4_K_M (its grids searched, the norms in the GGUF), with the fake export beside
  run_quantize(recipe("gguf", ", awq: {grid: 20}", "{format: [gguf, fake], gguf_type: Q4_K_M, gguf_output_type: float, gguf_embedding_type: float}"), {});
  const int layers = json::parse(read_text_file(a + "/models/llama2xs/config.json"))["num_hidden_layers"];
  REQUIRE(rep["awq"].size() == size_t(2 * layers));   // two pairs a layer
  int scaled = 0;
  for (auto& e : rep["awq"]) {
    CHECK(e["error"].get<double>() <= e["error_unscaled"].get<double>());
    scaled += !e["ratio"].is_null();
  }
  CHECK(scaled > 0);
  CHECK(rep["recipe"]["quantization"]["awq"]["grid"] == 20);
  CHECK(rep["recipe"]["quantization"]["awq"]["clip"] == true);
  // clipped: every quantized Linear but q and k
  int with_clip = 0;
  for (auto& m : rep["modules"]) {
    const std::string name = m["name"];
    const bool qk = name.ends_with(".q_proj") || name.ends_with(".k_proj");
    INFO(name);
    CHECK(m.contains("clipped_groups") == !qk);
    if (m.contains("clipped_groups")) {
      CHECK(m["clipped_groups"].get<double>() >= 0.0);
      CHECK(m["clipped_groups"].get<double>() <= 1.0);
      with_clip += m["clipped_groups"].get<double>() > 0;
    }
  }
  CHECK(with_clip > 0);

  const double p_float = llama2xs_perplexity(a + "/models/llama2xs");
  const double p_rtn = llama2xs_perplexity(d / "rtn"), p_awq = llama2xs_perplexity(d / "awq"), p_noclip = llama2xs_perplexity(d / "awq-noclip");
  const double p_gguf = llama2xs_perplexity(d / "gguf/gguf"), p_gguf_fake = llama2xs_perplexity(d / "gguf/fake");
  std::cout << "llama2xs 4-bit g128 RTN: perplexity float " << p_float << ", RTN " << p_rtn << ", AWQ + RTN " << p_awq << " (without clipping "
            << p_noclip << "); AWQ + Q4_K_M GGUF " << p_gguf << " (its fake export " << p_gguf_fake << ")\n";
  CHECK(p_rtn - p_noclip >= 0.15 * (p_rtn - p_float));   // the scales alone: at least 15% of RTN's gap recovered (measured: 22%)
  CHECK(p_rtn - p_awq >= 0.3 * (p_rtn - p_float));      // with the clipping: 30% (measured: 40%)
  CHECK(std::abs(p_gguf - p_gguf_fake) <= 1e-4 * p_gguf_fake);

  // The norms the GGUF and the fake export hold are the run's scaled ones (f32 model: exactly).
  Checkpoint src(a + "/models/llama2xs"), fake(d / "gguf/fake");
  GgufFile gg(d / "gguf/gguf/model.gguf");
  int moved = 0;
  for (int l = 0; l < layers; ++l)
    for (auto [hf, gn] : {std::pair{"input_layernorm", "attn_norm"}, std::pair{"post_attention_layernorm", "ffn_norm"}}) {
      const std::string p = "model.layers." + std::to_string(l) + ".", n = p + hf + ".weight";
      const std::vector<float> f = tensor_to_f32(fake.get(n));
      const GgufFile::TensorInfo* t = gg.find("blk." + std::to_string(l) + "." + gn + ".weight");
      REQUIRE(t);
      std::vector<float> v(f.size());
      gg.read_f32(*t, v.data());
      CHECK(v == f);
      moved += f != tensor_to_f32(src.get(n));
    }
  CHECK(moved > 0);
  // The kept v_proj reads the scaled norm: W'[:, j] · norm'[j] = W[:, j] · norm[j].
  const std::string n1 = "model.layers.1.input_layernorm.weight", v1 = "model.layers.1.self_attn.v_proj.weight";
  const std::vector<float> na = tensor_to_f32(src.get(n1)), nb = tensor_to_f32(fake.get(n1)), wa = tensor_to_f32(src.get(v1)),
                           wb = tensor_to_f32(fake.get(v1));
  double worst = 0, scale = 0;
  for (size_t i = 0; i < wa.size(); ++i) {
    const double want = double(wa[i]) * na[i % na.size()], got = double(wb[i]) * nb[i % nb.size()];
    worst = std::max(worst, std::abs(got - want)), scale = std::max(scale, std::abs(want));
  }
  CHECK(worst <= 1e-6 * scale);
}

TEST_CASE("AWQ's v_proj -> o_proj and up_proj -> down_proj pairs on llama2xs: closer to float, exact through float Linears, resumed and reloaded to the same bytes") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string a = ptqtest::assets();
  const std::string all = "[input_layernorm, v_proj, post_attention_layernorm, up_proj]", norms = "[input_layernorm, post_attention_layernorm]";
  auto recipe = [&](const std::string& out, int bits, const std::string& pairs, const std::string& ignore = "") {
    return llama2xs_recipe("quantization: {method: rtn, bits: " + std::to_string(bits) + ", group_size: 128, sym: false, ignore: [lm_head, model.embed_tokens" +
                               ignore + "], awq: {grid: 20, pairs: " + pairs + "}}\nexport: {format: fake}\n",
                           d / out);
  };
  const json rep = run_quantize(recipe("all", 4, all), {});
  run_quantize(recipe("norms", 4, norms), {});
  const int layers = int(rep["layers"].size());
  REQUIRE(rep["awq"].size() == size_t(4 * layers));
  std::map<std::string, int> chosen;
  const std::vector<std::string> order = {"input_layernorm", "v_proj", "post_attention_layernorm", "up_proj"};   // a layer's, as searched
  for (size_t i = 0; i < rep["awq"].size(); ++i) {
    const json& e = rep["awq"][i];
    CHECK(e["pair"] == order[i % 4]);
    CHECK(e["error"].get<double>() <= e["error_unscaled"].get<double>());
    chosen[e["pair"]] += !e["ratio"].is_null();
  }
  CHECK(chosen["v_proj"] > 0);
  CHECK(chosen["up_proj"] > 0);
  {   // stopped after layer 1 and resumed; and from its saved statistics: the same bytes
    Recipe again = recipe("all-r", 4, all);
    QuantizeOptions stop, resume, save, load;
    stop.resume = resume.resume = true;
    stop.stop_after_layer = 1;
    CHECK_THROWS_WITH(run_quantize(again, stop), Catch::Contains("stopped after layer 1"));
    CHECK(run_quantize(again, resume)["awq"] == rep["awq"]);
    CHECK(sha256_file(d / "all-r/model.safetensors") == sha256_file(d / "all/model.safetensors"));
    save.save_stats = d / "stats";
    run_quantize(recipe("all-s", 4, all), save);
    load.load_stats = d / "stats";
    run_quantize(recipe("all-l", 4, all), load);
    CHECK(sha256_file(d / "all-l/model.safetensors") == sha256_file(d / "all/model.safetensors"));
  }
  // Sources kept in float (layer 1's v_proj, layer 2's up_proj): the export holds them with the
  // scales folded in — W'[i, j] = W[i, j] · n_j / s_i, n the norm's factors, s_i the scale of the
  // o / down columns that read row i (llama2xs: 8 query heads of 8 dims on 4 KV heads, so v row i
  // is read by o columns 16 (i / 8) + i % 8 and 16 (i / 8) + 8 + i % 8) — and at 8 bits the model is
  // float's to rounding.
  QuantizeOptions keep;
  keep.save_stats = d / "stats8";
  run_quantize(recipe("all8", 8, all, ", model.layers.1.self_attn.v_proj, model.layers.2.mlp.up_proj"), keep);
  {
    Checkpoint src(a + "/models/llama2xs"), fake(d / "all8");
    for (auto [l, lin, norm, pair] : {std::tuple{1, "self_attn.v_proj", "input_layernorm", "v_proj"}, {2, "mlp.up_proj", "post_attention_layernorm", "up_proj"}}) {
      INFO(lin);
      SafetensorsFile st(d / "stats8" + "/layer-0000" + std::to_string(l) + ".safetensors");
      REQUIRE(st.has(std::string("smooth.") + pair));
      const std::vector<float> sp = tensor_to_f32(st.get(std::string("smooth.") + pair));
      const std::vector<float> sn = st.has(std::string("smooth.") + norm) ? tensor_to_f32(st.get(std::string("smooth.") + norm)) : std::vector<float>();
      const std::string n = "model.layers." + std::to_string(l) + "." + lin + ".weight";
      const TensorView t = src.get(n);
      const std::vector<float> w = tensor_to_f32(t), got = tensor_to_f32(fake.get(n));
      const int64_t rows = t.shape[0], cols = t.shape[1];
      double worst = 0;
      int64_t moved = 0;
      for (int64_t i = 0; i < rows; ++i) {
        const double si = sp[size_t(l == 1 ? 16 * (i / 8) + i % 8 : i)];
        if (l == 1) CHECK(sp[size_t(16 * (i / 8) + 8 + i % 8)] == sp[size_t(16 * (i / 8) + i % 8)]);   // the tie
        for (int64_t j = 0; j < cols; ++j) {
          const double want = double(w[size_t(i * cols + j)]) * (sn.empty() ? 1.0 : sn[size_t(j)]) / si;
          worst = std::max(worst, std::abs(got[size_t(i * cols + j)] - want) / (std::abs(want) + 1e-12));
        }
        moved += si != 1.0;
      }
      CHECK(worst <= 1e-6);
      CHECK(moved > 0);
    }
  }
  const double p_float = llama2xs_perplexity(a + "/models/llama2xs");
  const double p_all = llama2xs_perplexity(d / "all"), p_norms = llama2xs_perplexity(d / "norms"), p_all8 = llama2xs_perplexity(d / "all8");
  std::cout << "llama2xs AWQ + RTN 4-bit g128: perplexity float " << p_float << ", the norms' pairs " << p_norms << ", all four " << p_all
            << "; 8-bit with float sources " << p_all8 << "\n";
  CHECK(p_all < p_norms);   // measured 9.651 against 9.709 (float 8.941)
  CHECK(std::abs(p_all8 / p_float - 1) <= 2e-3);   // (plain RTN at 8 bits: 2.2e-4)
}

TEST_CASE("AWQ on the MoE families: the experts' norm folded into every expert and the router, each expert's up into its down, the same bytes resumed") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  for (const std::string m : {"tiny-mixtral", "tiny-qwen3-moe"}) {
    INFO(m);
    auto recipe = [&](const std::string& out, bool awq) {
      return ptqtest::fake_recipe(ptqtest::assets() + "/models/" + m, std::string("method: rtn, bits: 8, group_size: 32, sym: false") + (awq ? ", awq: {grid: 20}" : ""),
                                  d / (m + out), 16, 128);
    };
    const json rep = run_quantize(recipe("-awq", true), {});
    run_quantize(recipe("-rtn", false), {});
    const LlamaConfig c = LlamaModel(ptqtest::assets() + "/models/" + m).config();
    std::map<std::string, int> pairs;
    for (auto& e : rep["awq"]) pairs[e["pair"].get<std::string>().starts_with("experts.") ? "experts.up_proj" : e["pair"].get<std::string>()]++;
    CHECK(pairs["post_attention_layernorm"] == c.num_hidden_layers);   // the experts' shared input
    CHECK(pairs["experts.up_proj"] == c.num_hidden_layers * c.num_experts);
    // At 8 bits the model is float's to rounding, as RTN's is (measured: Mixtral KL 3.2e-5 against
    // RTN's 2.8e-4, Qwen3-MoE 9.2e-4 against 7.7e-4); the scales folded into the norm without the
    // router's columns move the routing: 2.5e-3 and 4.6e-3.
    const double kl_awq = ptqtest::golden_kl(m, d / (m + "-awq")), kl_rtn = ptqtest::golden_kl(m, d / (m + "-rtn"));
    INFO("KL awq " << kl_awq << ", rtn " << kl_rtn);
    CHECK(kl_awq <= 2 * kl_rtn);
    Recipe again = recipe("-awq-r", true);
    QuantizeOptions stop, resume;
    stop.resume = resume.resume = true;
    stop.stop_after_layer = 0;
    CHECK_THROWS_WITH(run_quantize(again, stop), Catch::Contains("stopped after layer 0"));
    CHECK(run_quantize(again, resume)["awq"] == rep["awq"]);
    CHECK(sha256_file(d / (m + "-awq-r/model.safetensors")) == sha256_file(d / (m + "-awq/model.safetensors")));
  }
}

TEST_CASE("AWQ's Linear-to-Linear folds (v_proj -> o_proj, up_proj -> down_proj) leave every family's layers computing the same") {
  PTQ_REQUIRE_ASSETS();
  // Random scales (tied where the schedule ties them) folded into every pair of a layer, and the
  // layer's output against the unfolded layer's: fp32 rounding apart, the same. llama2xs with
  // random v and up biases (qwen2's and mlp_bias's), tiny-qwen3 (head_dim 32 with hidden 64),
  // tiny-phi3 (the v rows of qkv_proj, the up rows of gate_up_proj), the MoE families (each
  // expert's up -> down) — all grouped-query attention.
  for (const std::string name : {"llama2xs", "tiny-qwen3", "tiny-phi3", "tiny-mixtral", "tiny-qwen3-moe"}) {
    INFO(name);
    LlamaModel m(ptqtest::assets() + "/models/" + name);
    const LlamaConfig& c = m.config();
    const int S = 2, T = 24;
    Rng rng(11);
    std::vector<int32_t> ids;
    for (int i = 0; i < S * T; ++i) ids.push_back(int32_t(rng.below(uint64_t(c.vocab_size))));
    const MatF X0 = m.embed(ids);
    for (int l = 0; l < std::min(c.num_hidden_layers, 2); ++l) {
      LayerWeights w = m.load_layer(l);
      if (name == "llama2xs")
        for (Proj p : {Proj::v, Proj::up}) w[p].b = VecF::NullaryExpr(w[p].W.rows(), [&] { return float(0.1 * rng.normal()); });
      LayerWeights folded = w, wrong = w;
      int pairs = 0;
      for (const LinearGroup& g : layer_schedule(c, l).groups) {
        const ScaleSource src = scale_source(c, g);
        if (src.pair.empty()) continue;
        ++pairs;
        // the source rows' scales, 1/4 to 4, expanded over the columns that read them
        VecF by_row = VecF::NullaryExpr(folded[src.id].W.rows(), [&] { return float(std::exp2(4.0 * rng.uniform() - 2.0)); }), s(g.linears.size() ? folded[g.linears[0]].W.cols() : 0);
        for (Eigen::Index j = 0; j < s.size(); ++j) s[j] = by_row[src.row[size_t(j)]];
        std::vector<MatF*> consumers;
        for (LinearId p : g.linears) consumers.push_back(&folded[p].W);
        fold_source(consumers, folded[src.id], src.row, s);
        for (LinearId p : g.linears) scale_columns(wrong[p].W, s);   // a control: the consumers alone
      }
      CHECK(pairs == (c.moe_layer(l) ? 1 + c.num_experts : 2));
      const Rope& rope = m.rope(T);
      MatF a = X0, b = X0, x = X0;
      decoder_layer(w, c, rope, S, T, a);
      decoder_layer(folded, c, rope, S, T, b);
      decoder_layer(wrong, c, rope, S, T, x);
      const double delta = (a - X0).norm();
      CHECK((b - a).norm() <= 1e-5 * delta);
      CHECK((x - a).norm() >= 1e-2 * delta);
    }
  }
  // The schedule's ties: llama2xs has 8 query heads of 8 dims on 4 KV heads, so o_proj's columns
  // 0-7 and 8-15 read v rows 0-7, 16-23 and 24-31 rows 8-15; down_proj's column j reads up row j.
  LlamaModel m(ptqtest::assets() + "/models/llama2xs");
  const LayerSchedule sched = layer_schedule(m.config(), 0);
  const ScaleSource o = scale_source(m.config(), sched.groups[1]), down = scale_source(m.config(), sched.groups[3]);
  CHECK(o.pair == "v_proj");
  CHECK(o.row[3] == 3);
  CHECK(o.row[11] == 3);
  CHECK(o.row[19] == 11);
  CHECK(o.row[63] == 31);
  CHECK(down.pair == "up_proj");
  CHECK(down.row[191] == 191);
  CHECK(scale_source(m.config(), sched.groups[0]).pair.empty());
}

TEST_CASE("AWQ recipes refuse what AWQ is not") {
  const auto err = ptqtest::recipe_error;
  CHECK(err("quantization: {method: rtn, awq: {}}\n") == "");
  CHECK(err("quantization: {method: rtn, bits: 8, group_size: -1, awq: {}, smoothquant: {}}\n").find("quantization.awq: AWQ and SmoothQuant") != std::string::npos);
  CHECK(err("quantization: {method: rtn, bits: 8, group_size: -1, awq: {}, activations: {strategy: token}}\n").find("weight-only") != std::string::npos);
  CHECK(err("quantization: {method: nf4, awq: {}}\nexport: {format: nf4}\n").find("quantization.awq: NF4 is data-free") != std::string::npos);
  CHECK(err("quantization: {awq: {grid: 0}}\n").find("quantization.awq.grid") != std::string::npos);
  CHECK(err("quantization: {awq: {pairs: [o_proj]}}\n").find("quantization.awq.pairs: unknown pair 'o_proj'") != std::string::npos);
  CHECK(err("quantization: {awq: {ratio: 2}}\n").find("quantization.awq.ratio") != std::string::npos);
  CHECK(err("quantization: {true_sequential: false, awq: {}}\n").find("true_sequential") != std::string::npos);
  // AWQ's clipping: fixed grids, groups, not beside MSE's search; resolved in the effective recipe
  CHECK(err("quantization: {method: gptq, awq: {clip: true}}\n").find("quantization.awq.clip: clipped grids are fixed before the solve") != std::string::npos);
  CHECK(err("quantization: {method: gptq, static_groups: true, awq: {clip: true}}\n") == "");
  CHECK(err("quantization: {method: rtn, group_size: -1, awq: {clip: true}}\n").find("quantization.awq.clip: the clipping search takes groups") != std::string::npos);
  CHECK(err("quantization: {method: rtn, mse: true, awq: {clip: true}}\n").find("quantization.mse runs its own") != std::string::npos);
  auto clip_of = [](const std::string& y) { return parse_recipe(YAML::Load(y), "r.yaml").to_yaml()["quantization"]["awq"]["clip"].as<bool>(); };
  CHECK(clip_of("quantization: {method: rtn, awq: {}}\n"));
  CHECK(!clip_of("quantization: {method: rtn, group_size: -1, awq: {}}\n"));   // left out: on only where it fits
  CHECK(!clip_of("quantization: {method: gptq, static_groups: true, awq: {}}\n"));   // and off for GPTQ unless asked
  CHECK(clip_of("quantization: {method: gptq, static_groups: true, awq: {clip: true}}\n"));
  // pairs: [] is the clipping alone; it reads back from the effective recipe as written
  CHECK(err("quantization: {method: rtn, awq: {pairs: [], clip: false}}\n").find("quantization.awq: no pairs and no clipping") != std::string::npos);
  const YAML::Node alone = parse_recipe(YAML::Load("quantization: {method: rtn, awq: {pairs: []}}\n"), "r.yaml").to_yaml();
  CHECK(parse_recipe(YAML::Load(YAML::Dump(alone)), "r.yaml").awq.pairs.empty());
  CHECK(parse_recipe(YAML::Load(YAML::Dump(alone)), "r.yaml").awq.clip);
  const Recipe r = parse_recipe(YAML::Load("quantization: {method: rtn, awq: {}}\n"), "r.yaml");
  CHECK(r.spec_for("model.layers.0.self_attn.v_proj").output_clip);
  CHECK(!r.spec_for("model.layers.0.self_attn.q_proj").output_clip);
  CHECK(!r.spec_for("model.layers.0.self_attn.qkv_proj").output_clip);
}
