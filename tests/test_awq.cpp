// AWQ: the search's scales and errors against a float64 computation of AutoAWQ's formulas, and
// runs that use it: the float Linears it folds into, what every format writes, what it is worth on
// a real model, and the recipes it refuses.
#include <cmath>
#include <filesystem>

#include <omp.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/checkpoint.h"
#include "core/rng.h"
#include "eval/perplexity.h"
#include "formats/gguf.h"
#include "formats/open.h"
#include "model/corpus.h"
#include "pipeline/pipeline.h"
#include "smoothquant/awq.h"
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

TEST_CASE("AWQ: every ratio's scales and output error equal a float64 computation of AutoAWQ's search") {
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
  const AwqSearch a = search_awq(X, ws, {spec, spec}, grid, true);
  CHECK(best_ratio > 0);   // the loud channels make some scaling worth it
  CHECK(a.ratio == best_ratio);
  CHECK(std::abs(a.error - best) <= 1e-4 * best);
  CHECK(std::abs(a.error_unscaled - unscaled) <= 1e-4 * unscaled);
  CHECK(a.error < 0.9 * a.error_unscaled);
  // x̄^r alone (duo_scaling false): ratio 0 is s = 1
  const VecF s0 = awq_scales(xm, VecF(), 0.0);
  CHECK(s0.minCoeff() == 1.0f);
  CHECK(s0.maxCoeff() == 1.0f);
}

TEST_CASE("AWQ on llama2xs: RTN 4-bit g128 closer to float, a float Linear folded, the norms GGUF and the fake export write") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string a = ptqtest::assets();
  auto recipe = [&](const std::string& out, const std::string& extra, const std::string& exports = "{format: fake}") {
    const std::string grid = exports == "{format: fake}" ? "bits: 4, group_size: 128, sym: false, " : "";
    Recipe r = parse_recipe(YAML::Load("quantization: {method: rtn, " + grid + "ignore: [lm_head, model.embed_tokens, "
                                       "model.layers.1.self_attn.v_proj]" + extra + "}\nexport: " + exports + "\n"),
                            "r.yaml");
    r.model = a + "/models/llama2xs";
    r.output = d / out;
    r.calibration = {a + "/text/tinystories/calib.txt", 64, 256, 0};
    return r;
  };
  run_quantize(recipe("rtn", ""), {});
  const json rep = run_quantize(recipe("awq", ", awq: {grid: 20}"), {});
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

  auto tok = load_tokenizer(a + "/models/llama2xs", 1);
  const auto ids = encode_corpus(*tok, a + "/text/tinystories/eval.txt");
  EvalOptions o;
  o.seq_len = 256;
  const double p_float = evaluate(*open_model(a + "/models/llama2xs"), ids, o).perplexity;
  const double p_rtn = evaluate(*open_model(d / "rtn"), ids, o).perplexity, p_awq = evaluate(*open_model(d / "awq"), ids, o).perplexity;
  const double p_gguf = evaluate(*open_model(d / "gguf/gguf"), ids, o).perplexity, p_gguf_fake = evaluate(*open_model(d / "gguf/fake"), ids, o).perplexity;
  std::cout << "llama2xs 4-bit g128 RTN: perplexity float " << p_float << ", RTN " << p_rtn << ", AWQ + RTN " << p_awq << "; AWQ + Q4_K_M GGUF "
            << p_gguf << " (its fake export " << p_gguf_fake << ")\n";
  CHECK(p_rtn - p_awq >= 0.15 * (p_rtn - p_float));   // at least 15% of RTN's gap recovered (measured: 22%)
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
}
