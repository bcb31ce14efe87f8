// SmoothQuant and W8A8 on the GPU against their references on the host: the alpha search
// (cuda::smoothed_errors against smoothed_errors: every alpha's error, the alpha each picks), the
// GPU forward's stage statistics, recomputed norm and int8 inputs (dense and MoE layers against the
// fp32 CPU layer), and whole W8A8 runs with device cuda against device cpu (hybrid path: the same
// bytes; GPU forward: the same quality).
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/dtype.h"
#include "core/fsutil.h"
#include "core/checkpoint.h"
#include "core/safetensors.h"
#include "core/rng.h"
#include "model/corpus.h"
#include "eval/perplexity.h"
#include "formats/open.h"
#include "model/forward_cuda.h"
#include "model/schedule.h"
#include "model/synth.h"
#include "model/tokenizer.h"
#include "model/weights.h"
#include "pipeline/pipeline.h"
#include "smoothquant/awq.h"
#include "smoothquant/awq_cuda.h"
#include "smoothquant/smoothquant.h"
#include "smoothquant/smoothquant_cuda.h"
#include "golden.h"
#include "testing.h"
#include "testing_cuda.h"
#include "testing_recipe.h"

using namespace ptq;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {
// distilled-13m quantized by `yaml` (a recipe) on 16 windows of 256 tokens of the calibration text,
// on device cpu into `out` (replaced): the recipe (for the GPU arms to change), the run's report,
// and its perplexity on e's windows.
struct CpuRun {
  Recipe r;
  json report;
  double ppl;
};
CpuRun distilled_cpu_run(const std::string& yaml, const std::string& out, const ptqtest::DistilledEval& e) {
  CpuRun c{parse_recipe(YAML::Load(yaml), "r.yaml"), {}, 0};
  c.r.model = e.model;
  c.r.calibration = {ptqtest::assets() + "/text/tinystories/calib.txt", 16, 256, 0};
  c.r.device = "cpu";
  c.r.output = out;
  std::filesystem::remove_all(out);
  c.report = run_quantize(c.r, {});
  c.ppl = evaluate(*open_model(out), e.ids, e.windows).perplexity;
  return c;
}

// Every .safetensors file of the run in `a` has the bytes of its namesake in `b`.
void check_same_safetensors(const fs::path& a, const fs::path& b) {
  int files = 0;
  for (const auto& e : fs::directory_iterator(a))
    if (e.path().extension() == ".safetensors") {
      ++files;
      INFO(e.path().filename());
      CHECK(read_text_file(e.path().string()) == read_text_file((b / e.path().filename()).string()));
    }
  CHECK(files > 0);
}

// The GPU's errors against the host's: every alpha within `tol` relative, the GPU's pick as good
// as the host's by the host's own measure, and the same errors on a second GPU call (bit for bit).
void check_against_host(const MatF& X, const std::vector<const MatF*>& ws, const ActQuant& act, double tol) {
  VecF am;
  update_channel_absmax(X, am);
  const std::vector<double> alphas = alpha_grid();
  const VecF wm = weight_absmax(ws);
  const std::vector<double> h = smoothed_errors(X, am, wm, ws, act, alphas), g = cuda::smoothed_errors(X, am, wm, ws, act, alphas);
  const std::vector<double> g2 = cuda::smoothed_errors(X, am, wm, ws, act, alphas);
  double worst = 0;
  size_t hbest = 1, gbest = 1;
  for (size_t k = 0; k < alphas.size(); ++k) {
    INFO("alpha " << alphas[k] << ": host " << h[k] << " GPU " << g[k]);
    CHECK(h[k] > 0);
    CHECK(std::abs(g[k] / h[k] - 1) <= tol);
    CHECK(g2[k] == g[k]);
    worst = std::max(worst, std::abs(g[k] / h[k] - 1));
    if (k > 0 && h[k] < h[hbest]) hbest = k;
    if (k > 0 && g[k] < g[gbest]) gbest = k;
  }
  std::cout << "alpha search " << X.rows() << " x " << X.cols() << " -> " << ws.size() << " Linears, act mode " << int(act.mode)
            << ": worst relative difference " << worst << "; alpha host " << alphas[hbest] << " GPU " << alphas[gbest] << "\n";
  CHECK(h[gbest] <= h[hbest] * (1 + tol));
}
}  // namespace

TEST_CASE("gpu: the alpha search's W8A8 errors on the GPU equal the host's (2e-4 relative) on distilled-13m's activations") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  const std::string a = ptqtest::assets();
  LlamaModel m(a + "/models/distilled-13m");
  auto tok = load_tokenizer(a + "/models/distilled-13m", 1);
  std::vector<int32_t> ids = encode_corpus(*tok, a + "/text/tinystories/calib.txt");
  ids.resize(2048);
  const MatF x0 = m.embed(ids);
  const float eps = float(m.config().rms_norm_eps);
  for (int l : {0, 5}) {
    const LayerWeights w = m.load_layer(l);
    MatF xn;
    rmsnorm(x0, w.input_layernorm, eps, xn);
    for (auto mode : {ActQuant::per_token, ActQuant::per_tensor})
      check_against_host(xn, {&w[Proj::q].W, &w[Proj::k].W, &w[Proj::v].W}, ActQuant{mode, 0}, 2e-4);
    rmsnorm(x0, w.post_attention_layernorm, eps, xn);   // statistics of any input define valid factors
    check_against_host(xn, {&w[Proj::gate].W, &w[Proj::up].W}, ActQuant{ActQuant::per_token, 0}, 2e-4);
  }
}

TEST_CASE("gpu: the alpha search on the GPU at odd shapes, with outlier channels, a zero row and a given static scale") {
  PTQ_REQUIRE_GPU();
  Rng r(11);
  // M = 203 rows, K = 100 (neither a multiple of 4 or 16), Linears of 37 and 50 rows (N = 87).
  MatF X(203, 100), W1(37, 100), W2(50, 100);
  for (int64_t i = 0; i < X.size(); ++i) X.data()[i] = float(r.normal());
  for (int64_t i = 0; i < W1.size(); ++i) W1.data()[i] = float(0.05 * r.normal());
  for (int64_t i = 0; i < W2.size(); ++i) W2.data()[i] = float(0.05 * r.normal());
  for (int c : {3, 41, 97}) X.col(c) *= 40.0f;   // activation outliers, as SmoothQuant assumes
  X.row(17).setZero();                            // a zero token (scale 1)
  W2.row(9).setZero();                            // a zero weight row (absmax taken as 1)
  check_against_host(X, {&W1, &W2}, ActQuant{ActQuant::per_token, 0}, 2e-4);
  check_against_host(X, {&W1, &W2}, ActQuant{ActQuant::per_tensor, 0}, 2e-4);
  check_against_host(X, {&W1, &W2}, ActQuant{ActQuant::per_tensor, 0.5f}, 2e-4);
}

// The hybrid path (gpu_forward: false: the CPU forward, the alpha search on the GPU) must pick the
// CPU's alphas, so RTN's codes are the CPU's byte for byte. The GPU forward takes its statistics
// from 16-bit activations: alphas may move by a grid step, and the model's perplexity stays within
// 0.2% of the CPU run's.
TEST_CASE("gpu: SmoothQuant W8A8 runs with device cuda: the hybrid path writes device cpu's bytes, the GPU forward its perplexity") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const ptqtest::DistilledEval e = ptqtest::distilled_eval();
  const auto& [model, ids, o] = e;
  for (const char* acts : {"activations: {strategy: token, dynamic: true}", "activations: {strategy: tensor, dynamic: false}"}) {
    auto [r, rc, ppl_cpu] = distilled_cpu_run(std::string("quantization: {method: rtn, bits: 8, group_size: -1, smoothquant: {alpha: auto}, ") + acts +
                                                  "}\nexport: {format: [compressed-tensors]}\n",
                                              d / "cpu", e);
    for (bool gpu_forward : {false, true}) {
      r.device = "cuda";
      r.gpu_forward = gpu_forward;
      r.output = d / (gpu_forward ? "gpu" : "hybrid");
      std::filesystem::remove_all(r.output);
      const json rg = run_quantize(r, {});
      const std::string fwd = rg["forward"].get<std::string>();
      std::cout << "--- " << acts << ", forward: " << fwd << "\n";
      CHECK(fwd.find("alpha search on the GPU") != std::string::npos);
      CHECK((fwd.rfind("cuda", 0) == 0) == gpu_forward);
      REQUIRE(rc["smoothquant"].size() == rg["smoothquant"].size());
      REQUIRE(rc["smoothquant"].size() == 16);   // 8 layers x (input_layernorm, post_attention_layernorm)
      std::string alphas;
      int same = 0;
      for (size_t i = 0; i < rc["smoothquant"].size(); ++i) {
        const json &c = rc["smoothquant"][i], &g = rg["smoothquant"][i];
        INFO("layer " << c["layer"] << " " << c["pair"]);
        alphas += " " + c["alpha"].dump() + "/" + g["alpha"].dump();
        same += g["alpha"] == c["alpha"];
        if (!gpu_forward) {
          CHECK(g["alpha"] == c["alpha"]);
          CHECK(std::abs(g["w8a8_error"].get<double>() / c["w8a8_error"].get<double>() - 1) <= 2e-4);
          CHECK(std::abs(g["w8a8_error_unsmoothed"].get<double>() / c["w8a8_error_unsmoothed"].get<double>() - 1) <= 2e-4);
        } else {
          CHECK(std::abs(g["alpha"].get<double>() - c["alpha"].get<double>()) <= 0.1 + 1e-9);
        }
      }
      const double ppl = evaluate(*open_model(r.output), ids, o).perplexity;
      std::cout << "    alphas cpu/gpu:" << alphas << " (" << same << " of 16 equal); perplexity " << ppl << " against the CPU run's " << ppl_cpu
                << " (relative " << ppl / ppl_cpu - 1 << ")\n";
      CHECK(std::abs(ppl / ppl_cpu - 1) <= (gpu_forward ? 2e-3 : 0.0));
      if (gpu_forward) continue;
      check_same_safetensors(d / "cpu", r.output);
    }
  }
}

TEST_CASE("gpu: AWQ's search error on the GPU equals the host's (1e-5 relative), the same every call, over several chunks of rows") {
  PTQ_REQUIRE_GPU();
  Rng rng(3);
  for (auto [M, K, N] : {std::array<int64_t, 3>{4096, 1024, 20000}, {37, 96, 5}, {1, 256, 8192}}) {
    MatF X(M, K), dW(N, K);
    for (Eigen::Index i = 0; i < X.size(); ++i) X.data()[i] = float(rng.normal()) * (i % K == 7 ? 20.0f : 1.0f);
    for (Eigen::Index i = 0; i < dW.size(); ++i) dW.data()[i] = 1e-3f * float(rng.normal());
    const double host = output_sq_error(X, dW), gpu = cuda::output_sq_error(X, dW);
    INFO(M << " x " << K << ", " << N << " rows: host " << host << ", gpu " << gpu);
    CHECK(std::abs(gpu / host - 1) <= 1e-5);
    CHECK(cuda::output_sq_error(X, dW) == gpu);
  }
}

TEST_CASE("gpu: AWQ's resident search (dW formed on the GPU) scores every candidate as the host's awq_delta and product do, and declines llama.cpp's grids") {
  PTQ_REQUIRE_GPU();
  Rng rng(5);
  const int64_t K = 200;   // groups of 128 and 64 with a short last one
  MatF X(300, K);
  for (Eigen::Index i = 0; i < X.size(); ++i) X.data()[i] = float(rng.normal()) * (i % K == 3 ? 25.0f : 1.0f);
  auto random = [&](int64_t rows) {
    MatF W(rows, K);
    for (Eigen::Index i = 0; i < W.size(); ++i) W.data()[i] = 0.02f * float(rng.normal());
    return W;
  };
  // 9,000 rows: two of the scorer's chunks; every spec field the grid reads
  const MatF A = random(9000), B = random(40), C = random(17);
  QuantSpec a, b, c;
  a.method = b.method = c.method = "rtn";
  a.sym = false;
  b.bits = 3, b.group_size = 64, b.scale_dtype = DType::BF16;
  c.bits = 8, c.group_size = -1, c.sym = false, c.scale_dtype = DType::F32;
  const std::vector<const MatF*> ws = {&A, &B, &C};
  const std::vector<QuantSpec> specs = {a, b, c};
  const AwqErrorAt gpu = cuda::awq_scorer()(X, ws, specs), host = product_scorer(output_sq_error)(X, ws, specs);
  const AwqErrorAt gpu16 = cuda::awq_scorer(cuda::AwqProduct::bf16)(X, ws, specs);
  REQUIRE(gpu);
  REQUIRE(gpu16);
  const VecF x_mean = mean_abs_columns(X), w_mean = awq_weight_mean(ws, {128, 64, -1});
  // The bf16 products' reference: X and the host's dW rounded to bf16, their products and sums in
  // fp64 (what the tensor cores compute but for their fp32 accumulation).
  auto bf16_reference = [&](const VecF& s) {
    auto bf16 = [](const MatF& m) { return m.unaryExpr([](float v) { return round_to(DType::BF16, v); }).cast<double>().eval(); };
    const Eigen::MatrixXd Xb = bf16(X);
    double e = 0;
    for (size_t k = 0; k < ws.size(); ++k) e += (Xb * bf16(awq_delta(*ws[k], specs[k], s.size() ? s : VecF::Ones(K))).transpose()).squaredNorm();
    return e / double(X.rows());
  };
  for (double ratio : {-1.0, 0.0, 0.3, 0.75}) {
    const VecF s = ratio < 0 ? VecF() : awq_scales(x_mean, w_mean, ratio);
    const double g = gpu(s), h = host(s), g16 = gpu16(s), r16 = bf16_reference(s);
    INFO("ratio " << ratio << ": host " << h << ", gpu " << g << ", gpu bf16 products " << g16 << " (their fp64 reference " << r16 << ")");
    CHECK(std::abs(g / h - 1) <= 1e-5);
    CHECK(gpu(s) == g);   // the same value every call
    // bf16 products (awq_cuda.cu): the operands' rounding moves the error itself, here by -1.7e-4
    // (ratio none) to -1.4e-5 (0.75) from the fp32 one (an outlier column carries most of each
    // sum), by 5e-5 at most on a llama2-7b layer (lab run 47); the GPU's value is its fp64
    // reference's to the fp32 accumulation (run 47: 6e-7 at ratios none and 0)
    CHECK(std::abs(g16 / r16 - 1) <= 1e-5);
    CHECK(std::abs(g16 / h - 1) <= 5e-4);
    CHECK(gpu16(s) == g16);
  }
  // The search picks the host's ratio.
  const AwqSearch hs = search_awq(X, ws, specs, 10, true, product_scorer(output_sq_error)), gs = search_awq(X, ws, specs, 10, true, cuda::awq_scorer());
  CHECK(gs.ratio == hs.ratio);
  CHECK(std::abs(gs.error / hs.error - 1) <= 1e-5);
  const AwqSearch gs16 = search_awq(X, ws, specs, 10, true, cuda::awq_scorer(cuda::AwqProduct::bf16));
  std::cout << "AWQ search ratio: host " << hs.ratio << ", resident " << gs.ratio << ", bf16 products " << gs16.ratio << "; errors " << hs.error << " / "
            << gs.error << " / " << gs16.error << "\n";
  CHECK(gs16.ratio == hs.ratio);
  CHECK(std::abs(gs16.error / hs.error - 1) <= 5e-4);   // (run 47: 9e-5)
  // llama.cpp's grids (and the MSE search) are the host's alone.
  QuantSpec k = a;
  k.form = GridForm::k_min;
  CHECK_FALSE(cuda::awq_scorer()(X, {&A}, {k}));
  QuantSpec m = a;
  m.mse = true;
  CHECK_FALSE(cuda::awq_scorer()(X, {&A}, {m}));
}

TEST_CASE("gpu: AWQ runs with device cuda: the hybrid path picks device cpu's ratios (without clipping: all of them), the GPU forward reaches its perplexity") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const ptqtest::DistilledEval e = ptqtest::distilled_eval();
  const auto& [model, ids, o] = e;
  for (bool clip : {false, true}) {
    INFO("clip " << clip);
    // every pair: the norms' (the forward's fold and renorm) and the Linears' (its samples of o's and
    // down's inputs before v and up are quantized, and the folded weights uploaded again)
    const std::string arm = clip ? "-clip" : "";   // each arm its own folders (a second run into one is refused)
    auto [r, rc, ppl_cpu] = distilled_cpu_run(std::string("quantization: {method: rtn, bits: 3, group_size: 128, sym: false, awq: {grid: 20, clip: ") +
                                                  (clip ? "true" : "false") + ", pairs: [input_layernorm, v_proj, post_attention_layernorm, up_proj]}}\n",
                                              d / ("cpu" + arm), e);
    REQUIRE(rc["awq"].size() == 4 * rc["layers"].size());
    for (bool gpu_forward : {false, true}) {
      if (gpu_forward && !clip) continue;
      r.device = "cuda";
      r.gpu_forward = gpu_forward;
      r.output = d / ((gpu_forward ? "gpu" : "hybrid") + arm);
      const json rg = run_quantize(r, {});
      const std::string fwd = rg["forward"].get<std::string>();
      REQUIRE(rc["awq"].size() == rg["awq"].size());
      std::string ratios;
      size_t same = 0;
      for (size_t i = 0; i < rc["awq"].size(); ++i) {
        const json &c = rc["awq"][i], &g = rg["awq"][i];
        ratios += " " + c["ratio"].dump() + "/" + g["ratio"].dump();
        same += g["ratio"] == c["ratio"];
        // The hybrid path reads the same fp32 rows: the same errors to the GEMMs' rounding, where
        // nothing before them differs. Its Hessians are the GPU's (fp32 GEMM sums), which only the
        // clipping search reads in an RTN run: where they round a near-tie of its costs the other
        // way, a group's range and so the next layers' inputs differ (lab run 44: with clipping,
        // from layer 6's up_proj pair on; 28 of 32 ratios equal, perplexity 7.9e-4 apart).
        if (!gpu_forward && (!clip || c["layer"] == 0)) {
          CHECK(g["ratio"] == c["ratio"]);
          CHECK(std::abs(g["error"].get<double>() / c["error"].get<double>() - 1) <= 1e-5);
        }
      }
      if (!gpu_forward) CHECK(same >= rc["awq"].size() * 3 / 4);
      // Without clipping nothing the hybrid run rounds reads its Hessians, and RTN on the device
      // takes rtn_quantize's grids and codes: device cpu's bytes.
      if (!gpu_forward && !clip) check_same_safetensors(d / ("cpu" + arm), r.output);
      const double ppl = evaluate(*open_model(r.output), ids, o).perplexity;
      std::cout << "AWQ + RTN 3-bit" << (clip ? " + clip" : "") << ", forward " << fwd << "\n    ratios cpu/gpu:" << ratios << "; perplexity " << ppl
                << " against the CPU run's " << ppl_cpu << "\n";
      CHECK(std::abs(ppl / ppl_cpu - 1) <= (gpu_forward ? 5e-3 : clip ? 2e-3 : 1e-4));
    }
  }
}

TEST_CASE("gpu: AWQ with GPTQ and clipping on device cuda: the GPU solve takes the searched limits (hybrid and GPU forward), near device cpu's perplexity") {
  // GPTQ with AWQ's clipping used to solve on the host in a GPU run (its grids fixed by the limits
  // before the solve); now the limits (the device's search with the GPU forward, the host's in the
  // hybrid path) go to the GPU solve. Its codes differ from the CPU solve's as any GPU solve's do
  // (the first GPTQ case of test_gptq_cuda), so the runs are held to the perplexity of the CPU run.
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const ptqtest::DistilledEval e = ptqtest::distilled_eval();
  const auto& [model, ids, o] = e;
  auto [r, rc, ppl_cpu] = distilled_cpu_run("quantization: {method: gptq, bits: 3, group_size: 128, sym: false, static_groups: true, "
                                            "awq: {grid: 20, clip: true, pairs: [input_layernorm, post_attention_layernorm]}}\n",
                                            d / "cpu", e);
  for (bool gpu_forward : {false, true}) {
    r.device = "cuda";
    r.gpu_forward = gpu_forward;
    r.output = d / (gpu_forward ? "gpu" : "hybrid");
    const json rg = run_quantize(r, {});
    REQUIRE(rg["modules"].size() == rc["modules"].size());
    double clipped_cpu = 0, clipped_gpu = 0;
    for (size_t i = 0; i < rc["modules"].size(); ++i) {
      const json &c = rc["modules"][i], &g = rg["modules"][i];
      CHECK(c.contains("clipped_groups") == g.contains("clipped_groups"));   // q/k are not clipped
      clipped_cpu += c.value("clipped_groups", 0.0), clipped_gpu += g.value("clipped_groups", 0.0);
    }
    const double ppl = evaluate(*open_model(r.output), ids, o).perplexity;
    std::cout << "AWQ + GPTQ 3-bit + clip, forward " << rg["forward"].get<std::string>() << ": perplexity " << ppl << " against the CPU run's " << ppl_cpu
              << "; clipped groups (sum of shares) " << clipped_gpu << " against " << clipped_cpu << "\n";
    CHECK(clipped_gpu > 0);
    CHECK(std::abs(clipped_gpu / clipped_cpu - 1) <= 0.1);
    CHECK(std::abs(ppl / ppl_cpu - 1) <= 5e-3);
  }
}

TEST_CASE("gpu: AWQ on Mixtral and Qwen3-MoE with the GPU forward: the experts' norm refolded with the router, each expert's up into its down") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  for (const std::string m : {"tiny-mixtral", "tiny-qwen3-moe"}) {
    INFO(m);
    auto run = [&](const std::string& device, bool awq) {
      Recipe r = ptqtest::fake_recipe(ptqtest::assets() + "/models/" + m, std::string("method: rtn, bits: 8, group_size: 32, sym: false") + (awq ? ", awq: {grid: 20}" : ""),
                                      d / (m + "-" + device + (awq ? "-awq" : "-rtn")), 16, 128);
      r.device = device;
      r.gpu_forward = true;
      const json rep = run_quantize(r, {});
      return std::pair{rep, ptqtest::golden_kl(m, r.output)};
    };
    const auto [cpu, kl_cpu] = run("cpu", true);
    const auto [gpu, kl_gpu] = run("cuda", true);
    const double kl_rtn = run("cuda", false).second;
    std::cout << m << " AWQ + RTN 8-bit: KL from float, device cpu " << kl_cpu << ", the GPU forward " << kl_gpu << " (RTN " << kl_rtn << ")\n    " << gpu["forward"] << "\n";
    CHECK(gpu["forward"].get<std::string>().find("AWQ") != std::string::npos);
    REQUIRE(gpu["awq"].size() == cpu["awq"].size());
    for (size_t i = 0; i < cpu["awq"].size(); ++i) CHECK(gpu["awq"][i]["pair"] == cpu["awq"][i]["pair"]);
    CHECK(kl_gpu <= 2 * kl_rtn);   // a norm refolded without its router's columns: 8-17x RTN's (test_awq)
    CHECK(kl_gpu <= 2 * kl_cpu + 1e-4);
  }
}

TEST_CASE("gpu: the GPU forward's stage statistics are exact, its norm recomputed after a fold, and its int8 inputs match the fp32 CPU reference") {
  PTQ_REQUIRE_GPU();
  ptqtest::TempDir d;
  std::string dir = d / "tiny";
  if (ptqtest::have_assets()) dir = ptqtest::assets() + "/models/distilled-13m";
  else {
    SynthOptions o;
    o.preset = "tiny";
    o.seed = 11;
    synth_model(o, dir);
  }
  LlamaModel m(dir);
  const LlamaConfig& c = m.config();
  const int S = 65, T = 128;   // two chunks of the GPU forward (8192 tokens, then one window)
  const MatF X = ptqtest::random_embeddings(m, S, T, 5);
  const Rope& rope = m.rope(T);
  LayerWeights w = m.load_layer(0);
  cuda::LayerForwardCuda fw(c, rope, S, T, c.dtype);
  {
    // Statistics: every row sampled (sample = total), so the column maxima must equal the host's
    // maxima of the same rows, bit for bit; then norm2's weights halved and the norm computed again:
    // every value exactly half (a power of two), the residual stream untouched.
    fw.set_input(X);
    fw.load_layer(w);
    const int64_t N = int64_t(S) * T;
    cuda::StageStats s1(c.hidden_size, fw.dtype(), nullptr, N, N);
    fw.stage(Stage::norm1, nullptr);
    fw.stage(Stage::attention, nullptr);
    fw.stage(Stage::norm2, &s1);
    const MatF a = s1.sampled_rows();
    REQUIRE(a.rows() == N);
    const VecF am = s1.column_absmax();
    CHECK(std::memcmp(am.data(), VecF(a.cwiseAbs().colwise().maxCoeff().transpose()).data(), size_t(am.size()) * 4) == 0);
    const MatF X1 = fw.input();
    fw.set_norms(w.input_layernorm, w.post_attention_layernorm * 0.5f);
    cuda::StageStats s2(c.hidden_size, fw.dtype(), nullptr, N, 1000);   // step 8: rows 0, 8, ...
    fw.renorm(Stage::norm2, &s2);
    const MatF b = s2.sampled_rows();
    REQUIRE(b.rows() == N / 8);
    // (exactly half but where f16 rounds in its subnormal range, 2^-24 apart)
    CHECK((b - subsample_rows(a, 1000) * 0.5f).cwiseAbs().maxCoeff() <= 0x1p-24f);
    CHECK(fw.input() == X1);
    // A rank's share (quantize --gpus N): these rows as rows [1000, 1000 + N) of N + 1000. The rows
    // the one-GPU run over all N + 1000 samples (every step-th) land at their places among all the
    // samples; the places of the rows before it (another rank's) stay zero until across_ranks.
    cuda::StageStats s3(c.hidden_size, fw.dtype(), nullptr, N + 1000, 1000, 1000);
    fw.renorm(Stage::norm2, &s3);
    const MatF e = s3.sampled_rows();
    const int64_t step = (N + 1000) / 1000, k0 = (1000 + step - 1) / step;
    REQUIRE(e.rows() == (N + 1000) / step);
    CHECK(e.topRows(k0).cwiseAbs().maxCoeff() == 0.0f);
    float dmax = 0;
    for (int64_t k = k0; k < e.rows(); ++k) dmax = std::max(dmax, (e.row(k) - a.row(k * step - 1000) * 0.5f).cwiseAbs().maxCoeff());
    CHECK(dmax <= 0x1p-24f);
    const VecF m2 = s2.column_absmax(), m3 = s3.column_absmax();
    CHECK(std::memcmp(m2.data(), m3.data(), size_t(m2.size()) * 4) == 0);
  }
  // int8 inputs on all seven Linears, per token and per tensor, against the CPU's decoder_layer
  // with the same ActQuant (its fake-quant path, fp32). Beyond the float forward's 16-bit rounding
  // (<= 5e-3 of what the layer adds, test_forward_cuda.cpp), an input that 16 bits move across a
  // code's rounding boundary takes the neighbouring code (a whole step of its row's scale), so the
  // bound is looser; and the two must differ by much less than int8 inputs differ from float ones.
  MatF Xf = X;
  decoder_layer(w, c, rope, S, T, Xf);
  for (const ActQuant act : {ActQuant{ActQuant::per_token, 0}, ActQuant{ActQuant::per_tensor, 0.02f}}) {
    for (Proj p : kAllProj) w[p].act = act;
    MatF Xc = X;
    decoder_layer(w, c, rope, S, T, Xc);
    fw.set_input(X);
    fw.load_layer(w);
    for (Proj p : kAllProj) fw.set_act_quant(p, act);
    fw.layer();
    const MatF Xg = fw.input();
    const double ex = (Xg - Xc).norm() / (Xc - X).norm();   // relative to what the layer added
    const double eq = (Xg - Xc).norm() / (Xc - Xf).norm();  // relative to what int8 inputs change
    std::cout << dir << ": int8 inputs (mode " << int(act.mode) << "): layer output rel. error " << ex << ", " << eq
              << " of the int8 inputs' own error\n";
    CHECK(ex <= (fw.dtype() == DType::F16 ? 2.5e-2 : 5e-2));
    CHECK(eq <= 0.5);
  }
}

// The other families through the GPU forward (q/k norms, fused Linears, experts with int8 inputs):
// every Linear int8, and the quantized model (its logits on the host's integer path) about as far
// from the float model as the CPU run's. Not nearer to the CPU run's model than that: these bf16
// checkpoints round activations to 8-bit mantissas, so the GPU's statistics move α on many layers,
// and a weight moved by another α flips near-tied choices of the random MoE routers; each run is
// one draw of W8A8's error (measured on the H200, runs 440-441: the two runs' logits 0.030-0.145
// apart; from float, CPU / GPU forward: qwen3 0.0298 / 0.0301, mixtral 0.0446 / 0.0267, qwen3-moe
// 0.131 / 0.087, phi3 0.0287 / 0.0295).
TEST_CASE("gpu: W8A8 (SmoothQuant) of Qwen3, Mixtral, Qwen3-MoE and Phi-3 with the GPU forward: every Linear int8, as near float as device cpu's") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  for (const std::string family : {"qwen3", "mixtral", "qwen3-moe", "phi3"}) {
    ptqtest::TempDir d;
    Recipe r = parse_recipe(YAML::Load("quantization: {method: rtn, bits: 8, group_size: -1, smoothquant: {alpha: auto}}\n"
                                       "export: {format: [compressed-tensors]}\n"),
                            "r.yaml");
    const auto [rc, rg] = ptqtest::tiny_runs_cpu_gpu(r, family, d);
    INFO(family << ": forward " << rg["forward"]);
    CHECK(rg["forward"].get<std::string>().rfind("cuda", 0) == 0);
    CHECK(rg["smoothquant"].size() == rc["smoothquant"].size());
    const LlamaConfig c = LlamaModel(r.model).config();
    Checkpoint ck(d / "gpu");
    for (int l = 0; l < c.num_hidden_layers; ++l)
      for (LinearId id : layer_schedule(c, l).linears()) CHECK(ck.get(linear_name(c, l, id) + ".weight").dtype == DType::I8);
    const ptqtest::Golden g = ptqtest::golden("tiny-" + family);
    const std::vector<int32_t>& ids = g.ids;
    const int S = g.S, T = g.T;
    const MatF lg = open_model(d / "gpu")->forward(ids, S, T), lc = open_model(d / "cpu")->forward(ids, S, T),
               lf = open_model(r.model)->forward(ids, S, T);
    const double run = (lg - lc).norm() / lc.norm(), cpu = (lc - lf).norm() / lf.norm(), gpu = (lg - lf).norm() / lf.norm();
    std::cout << "tiny-" << family << " W8A8: logits against float: CPU run " << cpu << ", GPU-forward run " << gpu << " (the two runs " << run
              << " apart)\n";
    CHECK(gpu <= 1.5 * cpu);
  }
}

// The experts' int8 inputs: a MoE layer (the f16 synthetic Qwen3-MoE shapes: 8 experts, top-2) with
// int8 inputs on every Linear and expert, the GPU's layer against the CPU's decoder_layer. Row by
// row: an input the 16-bit rounding moves across a code's boundary takes the neighbouring code (as
// in the dense case above), and where the router, fed by those, flips a near-tied choice the row
// adds another expert's output wholesale: so most rows, not all, within the bound (run 441: 8,309
// of 8,320; the whole layer 2.0% of what it adds, 0.29 of what int8 inputs change).
TEST_CASE("gpu: the GPU forward's int8 expert inputs match the fp32 CPU reference on a MoE layer (rows)") {
  PTQ_REQUIRE_GPU();
  ptqtest::TempDir d;
  SynthOptions o;
  o.preset = "tiny-moe";
  synth_model(o, d / "moe");
  LlamaModel m(d / "moe");
  const LlamaConfig& c = m.config();
  const int S = 65, T = 128;
  const MatF X = ptqtest::random_embeddings(m, S, T, 7);
  const Rope& rope = m.rope(T);
  LayerWeights w = m.load_layer(0);
  REQUIRE(!w.experts.empty());
  MatF Xf = X;
  decoder_layer(w, c, rope, S, T, Xf);
  const ActQuant act{ActQuant::per_token, 0};
  for (Proj p : {Proj::q, Proj::k, Proj::v, Proj::o}) w[p].act = act;
  for (auto& e : w.experts)
    for (auto& l : e) l.act = act;
  MatF Xc = X;
  decoder_layer(w, c, rope, S, T, Xc);
  cuda::LayerForwardCuda fw(c, rope, S, T, c.dtype);
  fw.set_input(X);
  fw.load_layer(w);
  for (Proj p : {Proj::q, Proj::k, Proj::v, Proj::o}) fw.set_act_quant(p, act);
  for (int e = 0; e < c.num_experts; ++e)
    for (Proj p : {Proj::gate, Proj::up, Proj::down}) fw.set_act_quant(LinearId(p, e), act);
  fw.layer();
  const MatF Xg = fw.input();
  const double tol = fw.dtype() == DType::F16 ? 5e-3 : 1e-2;   // the float forward's (test_forward_cuda.cpp)
  int64_t within = 0;
  for (Eigen::Index r = 0; r < X.rows(); ++r)
    within += (Xg.row(r) - Xc.row(r)).norm() <= 2 * tol * (Xc.row(r) - X.row(r)).norm() + 1.5 * (Xc.row(r) - Xf.row(r)).norm();
  std::cout << "tiny-moe with int8 inputs: rows within bound " << within << " of " << X.rows() << "; whole layer " << (Xg - Xc).norm() / (Xc - X).norm()
            << " of what it adds, " << (Xg - Xc).norm() / (Xc - Xf).norm() << " of what int8 inputs change\n";
  CHECK(within >= X.rows() * 95 / 100);
}
