#include "pipeline/pipeline.h"

#include <omp.h>
#include <sys/resource.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <future>
#include <tuple>
#include <map>

#include "calib/calibration.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/progress.h"
#include "formats/fake.h"
#include "formats/gguf.h"
#include "formats/packed.h"
#include "gptq/gptq.h"
#include "gptq/qstore.h"
#include "model/llama.h"
#include "pipeline/stats.h"
#include "report/report_html.h"
#include "smoothquant/smoothquant.h"
#ifdef PTQKIT_HAVE_CUDA
#include "cuda/forward_cuda.h"
#include "cuda/gptq_cuda.h"
#include "cuda/runtime.h"
#endif

namespace ptq {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

namespace {

// Adds the time of a scope to a named phase.
struct PhaseTimer {
  double& acc;
  Clock::time_point t0 = Clock::now();
  explicit PhaseTimer(double& a) : acc(a) {}
  ~PhaseTimer() { acc += std::chrono::duration<double>(Clock::now() - t0).count(); }
};

void check_finite(const MatF& m, const std::string& tensor, const WeightSource& ck) {
  // Exponent bits all ones = Inf or NaN; a vectorized pass (Eigen's allFinite took 1 s per 7B layer).
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(m.data());
  bool ok = true;
#pragma omp parallel for reduction(&& : ok) schedule(static)
  for (int64_t i = 0; i < int64_t(m.size()); ++i) ok = ok && (bits[i] & 0x7f800000u) != 0x7f800000u;
  if (ok) return;
  for (Eigen::Index r = 0; r < m.rows(); ++r)
    for (Eigen::Index c = 0; c < m.cols(); ++c)
      if (!std::isfinite(m(r, c)))
        fail(Errc::numeric, ck.file_of(tensor), tensor, "contains NaN/Inf (first at [" + std::to_string(r) + ", " + std::to_string(c) + "])");
}

// A Linear input's Hessian, accumulated on the GPU when the run uses one.
struct AnyHessian {
  Hessian cpu;
#ifdef PTQKIT_HAVE_CUDA
  std::unique_ptr<cuda::HessianCuda> gpu;
#endif
  AnyHessian(int64_t cols, bool on_gpu, DType dtype) : cpu(on_gpu ? 0 : cols) {
#ifdef PTQKIT_HAVE_CUDA
    if (on_gpu) gpu = std::make_unique<cuda::HessianCuda>(cols, dtype);
#endif
  }
  void add(const MatF& X) {
#ifdef PTQKIT_HAVE_CUDA
    if (gpu) return gpu->add(X);
#endif
    cpu.add(X);
  }
  MatD finalize() const {
#ifdef PTQKIT_HAVE_CUDA
    if (gpu) return gpu->finalize();
#endif
    return cpu.finalize();
  }
#ifdef PTQKIT_HAVE_CUDA
  cuda::HessianCuda* device() const { return gpu.get(); }
#endif
  void release() {   // its Linears are quantized: the memory goes to the next ones
#ifdef PTQKIT_HAVE_CUDA
    gpu.reset();
#endif
    cpu = Hessian(0);
  }
};

void check_patterns(const Recipe& r, const std::vector<std::string>& known) {
  auto check = [&](const std::string& pat, const std::string& field) {
    for (auto& m : known)
      if (pattern_matches(pat, m)) return;
    fail(Errc::usage, r.source, field, "pattern '" + pat + "' matches no module of this model (e.g. " + known[0] + ")");
  };
  for (auto& p : r.ignore) check(p, "quantization.ignore");
  for (auto& [p, n] : r.overrides) check(p, "quantization.overrides." + p);
}

}  // namespace

json run_quantize(const Recipe& recipe, const QuantizeOptions& opt) {
  const auto t_start = Clock::now();
  Recipe r = recipe;
  if (r.model.empty()) fail(Errc::usage, r.source, "model", "missing: set it in the recipe or with --model");
  if (r.output.empty()) fail(Errc::usage, r.source, "output", "missing: set it in the recipe or with --output");
  bool use_cuda = false;
  std::string device_desc = "cpu";
#ifdef PTQKIT_HAVE_CUDA
  use_cuda = r.device != "cpu" && cuda::available();
  if (r.device == "cuda" && !use_cuda) fail(Errc::usage, r.source, "device", "cuda requested, but " + cuda::describe());
  if (use_cuda) device_desc = "cuda: " + cuda::describe();
#else
  if (r.device == "cuda") fail(Errc::usage, r.source, "device", "this build has no CUDA (nvcc was not found when it was built); use cpu or auto");
#endif
  std::map<std::string, double> phase;
  std::map<std::string, double> solve_phase;   // the GPU solve's parts (inside phase["solve"])
  std::map<std::string, double> upload_phase;  // what phase["upload"] moved (inside it)
  OutputDir out(r.output, opt.force, opt.resume, /*keep_on_failure=*/opt.resume);   // never destroy what --resume was asked to continue

  std::unique_ptr<LlamaModel> model;
  {
    PhaseTimer t(phase["load"]);
    model = std::make_unique<LlamaModel>(r.model);
  }
  const LlamaConfig& c = model->config();
  if (r.calibration.seq_len == 0) r.calibration.seq_len = std::min(2048, c.max_position_embeddings);
  if (r.calibration.seq_len > c.max_position_embeddings)
    fail(Errc::input, r.source, "calibration.seq_len",
         std::to_string(r.calibration.seq_len) + " exceeds the model's max_position_embeddings " + std::to_string(c.max_position_embeddings));
  std::vector<std::string> known;
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (Proj p : kAllProj) known.push_back(proj_tensor_prefix(l, p));
  for (const char* n : {"lm_head", "model.embed_tokens", "model.norm"}) known.push_back(n);
  check_patterns(r, known);
  const DType scale_dtype = c.dtype == DType::BF16 ? DType::BF16 : DType::F16;
  {   // every format must be able to hold what the recipe asks for: refuse before calibrating
    std::vector<ModulePlan> plan;
    const int64_t d = c.hidden_size, f = c.intermediate_size;
    const int64_t outs[7] = {c.q_dim(), c.kv_dim(), c.kv_dim(), d, f, f, d}, ins[7] = {d, d, d, c.q_dim(), d, d, f};
    for (int l = 0; l < c.num_hidden_layers; ++l)
      for (Proj p : kAllProj) {
        const std::string m = proj_tensor_prefix(l, p);
        QuantSpec s = r.spec_for(m);
        s.scale_dtype = scale_dtype;
        plan.push_back({m, outs[int(p)], ins[int(p)], s, !r.ignored(m)});
      }
    for (auto& fmt : r.formats) check_format(fmt, c, plan, r.nf4_blocksize);
  }

  const bool nf4 = r.quant.method == "nf4";
  // Calibration (none for NF4: it is data-free)
  CalibData cd;
  MatF X;
  {
    PhaseTimer t(phase["calibration"]);
    if (nf4) r.calibration = {"none", 0, 0, 0};
    std::unique_ptr<Tokenizer> tok;
    if (!nf4 && r.calibration.dataset != "random") tok = load_tokenizer(r.model, c.bos_token_id);
    if (!nf4) {
      cd = load_calibration(r.calibration, tok.get(), c.vocab_size, tok ? tok->bos_id : c.bos_token_id);
      if (opt.load_stats.empty()) X = model->embed(cd.tokens);
    }
  }
  // Saved statistics: keyed by the model's files, the calibration windows and the collection settings.
  std::unique_ptr<StatsWriter> stats_out;
  std::unique_ptr<StatsReader> stats_in;
  json stats_info;
  if (!opt.save_stats.empty() || !opt.load_stats.empty()) {
    if (nf4) fail(Errc::usage, r.source, "quantization.method", "nf4 is data-free: there are no statistics to save or load");
    if (!opt.save_stats.empty() && !opt.load_stats.empty()) fail(Errc::usage, "", "--save-stats", "cannot be combined with --load-stats");
    PhaseTimer t(phase["calibration"]);
    std::fprintf(stderr, "ptqkit: hashing the model files for the statistics key\n");
    const json key = stats_key(model_digest(r.model), cd.describe(r.calibration), r);
    if (!opt.save_stats.empty()) {
      stats_out = std::make_unique<StatsWriter>(opt.save_stats, opt.force, opt.resume, key);
      stats_info = {{"saved_to", opt.save_stats}, {"key_sha256", sha256_bytes(key.dump())}};
    } else {
      stats_in = std::make_unique<StatsReader>(opt.load_stats, key);
      stats_info = {{"loaded_from", opt.load_stats}, {"key_sha256", sha256_bytes(key.dump())}};
    }
  }
  // What a resumed run must share with the interrupted one: the effective recipe (less the output
  // folder), the model's config and the calibration windows.
  Recipe fr = r;
  fr.output.clear();
  const json fingerprint = {{"recipe", yaml_to_json(fr.to_yaml())}, {"config_sha256", sha256_file(r.model + "/config.json")},
                            {"calibration", nf4 ? json() : cd.describe(r.calibration)}};
  const std::string fp_file = out.file(".resume.json");
  int resume_from = 0;
  if (opt.resume && std::filesystem::exists(fp_file)) {
    if (json::parse(read_text_file(fp_file)) != fingerprint)
      fail(Errc::usage, out.path(), "--resume", "the interrupted run used another recipe, model or calibration; run without --resume to start over");
    QuantStore done(out.path() + "/.layers");
    while (resume_from < c.num_hidden_layers && done.has_layer(resume_from) && !done.layer_report(resume_from).empty()) ++resume_from;
    if (resume_from == 0) std::fprintf(stderr, "ptqkit: resuming %s: no layer was finished, starting at layer 0\n", r.output.c_str());
    else std::fprintf(stderr, "ptqkit: resuming %s: layers 0..%d are done, continuing at layer %d\n", r.output.c_str(), resume_from - 1, resume_from);
    log_event("resume", {{"output", r.output}, {"first_layer", resume_from}});
  } else {
    std::filesystem::remove_all(out.path() + "/.layers");
    write_file_atomic(fp_file, fingerprint.dump() + "\n");
  }
  const int S = cd.samples, T = cd.seq_len;
  const Rope& rope = model->rope(T);
  const float eps = float(c.rms_norm_eps);
  // The forward pass on the GPU (true-sequential GPTQ/RTN, weight-only): activations stay on the
  // device, Hessians come from the 16-bit activations the GEMMs consume. Otherwise the CPU forward
  // runs and the GPU, when present, accumulates the Hessians and solves.
  bool gpu_forward = false;
  std::string forward_desc = "cpu (fp32)";
#ifdef PTQKIT_HAVE_CUDA
  std::unique_ptr<cuda::LayerForwardCuda> fw;
  {
    std::string why;
    if (!use_cuda) why = "no GPU";
    else if (nf4) why = "data-free";
    else if (!r.true_sequential) why = "true_sequential: false";
    else if (r.smooth.enabled || r.act_mode != ActQuant::none) why = "SmoothQuant/W8A8 statistics are collected on the CPU";
    else if (stats_in) why = "statistics loaded";
    else if (!r.gpu_forward) why = "gpu_forward: false in the recipe";
    else if (!cuda::forward_supported(c, T, &why)) {}
    else gpu_forward = true;
    if (gpu_forward) {
      PhaseTimer t(phase["upload"]), tu(upload_phase["activations"]);
      // Activations on the device when they fit beside what the rest needs there: the layer's
      // 16-bit weights, the largest solve (its Hessian sum and factor in fp64, four fp32 copies of
      // the stacked weights) and 2 GiB of chunk buffers and slack; else in page-locked host memory.
      const int64_t d = c.hidden_size, f = c.intermediate_size, qd = c.q_dim(), kv = c.kv_dim();
      const int64_t solve_n[4] = {d, qd, d, f}, solve_rows[4] = {qd + 2 * kv, d, 2 * f, d};
      double other = double(c.params_per_layer()) * 2 + double(2u << 30);
      double largest = 0;
      for (int k = 0; k < 4; ++k) largest = std::max(largest, 16.0 * double(solve_n[k] * solve_n[k]) + 16.0 * double(solve_rows[k] * solve_n[k]));
      other += largest;
      const double acts = double(cuda::activation_bytes(c, S, T)), free_b = double(cuda::device_free_bytes());
      const bool spill = r.gpu_activations == "host" || (r.gpu_activations == "auto" && acts > free_b - other);
      if (spill && r.gpu_activations == "auto") {
        char m[256];
        std::snprintf(m, sizeof m, "calibration activations (%.1f GiB) do not fit beside the solve (~%.1f GiB) in %.1f GiB free on the GPU: "
                      "kept in page-locked host memory (slower: every stage copies them over PCIe)", acts / (1u << 30), other / (1u << 30), free_b / (1u << 30));
        std::fprintf(stderr, "ptqkit: %s\n", m);
        log_event("warning", {{"message", m}});
      }
      fw = std::make_unique<cuda::LayerForwardCuda>(c, rope, S, T, c.dtype, spill);
      fw->set_input(X);
      X = MatF();
      forward_desc = std::string("cuda (") + (fw->dtype() == DType::F16 ? "f16" : "bf16") + " GEMMs, fp32 accumulation and residual" +
                     (spill ? "; activations in page-locked host memory" : "") + ")";
    } else if (use_cuda) {
      forward_desc = "cpu (fp32), Hessians on the GPU: " + why;
    }
  }
#endif

  QuantStore store(out.path() + "/.layers");
  // Hessians on the GPU: the forward still runs on the CPU in fp32, so the GPU accumulates the same
  // fp32 activations (SGEMM, fp64 sums) rather than rounding them to 16 bits for the tensor cores.
  DType hdt = DType::F32;
#ifdef PTQKIT_HAVE_CUDA
  if (gpu_forward) hdt = fw->dtype();
#endif
  json modules = json::array(), layers = json::array(), smoothing = json::array();
  const bool w8a8 = r.act_mode != ActQuant::none;
  auto smooth_pair = [&](const std::string& pair) {
    return r.smooth.enabled && std::find(r.smooth.pairs.begin(), r.smooth.pairs.end(), pair) != r.smooth.pairs.end();
  };
  Progress bar("quantize", nf4 ? 0 : c.num_hidden_layers, "layers");
  // GPU forward: each layer's weights rounded to 16 bits by the thread that reads them, into one
  // of two page-locked buffers (layer k in buffer k % 2), so that the upload is a plain DMA.
  std::function<void(const LayerWeights&, int)> convert16;
#ifdef PTQKIT_HAVE_CUDA
  cuda::PinnedBuffer w16[2];
  if (gpu_forward) {
    for (auto& b : w16) b = cuda::PinnedBuffer(fw->weight_bytes());
    convert16 = [&w16, &fw](const LayerWeights& lw, int k) { fw->convert_weights(lw, w16[k % 2].get()); };
  }
#endif
  std::future<LayerWeights> next_layer;   // read (and converted to fp32) while this layer computes
  double prefetch_seconds = 0;            // its time in the background thread (the "load" phase is the wait)
  std::future<void> pending_save;         // the previous layer's file, written in the background
  double save_seconds = 0;                // its time there (the "save" phase is the wait)
  for (int l = 0; l < (nf4 ? 0 : c.num_hidden_layers); ++l) {
    const auto t_layer = Clock::now();
    LayerWeights w;
    {
      PhaseTimer t(phase["load"]);
      auto load_checked = [&model, &convert16](int k) {
        LayerWeights lw = model->load_layer(k);
        for (Proj p : kAllProj) check_finite(lw[p].W, proj_tensor_prefix(k, p) + ".weight", model->weights());
        if (convert16) convert16(lw, k);
        return lw;
      };
      w = next_layer.valid() ? next_layer.get() : load_checked(l);
      // Half the cores: it overlaps the layer's compute, while the main thread keeps the other
      // half for its own host work (RTN, dequantization, packing into the layer store).
      if (l + 1 < c.num_hidden_layers)
        next_layer = std::async(std::launch::async, [load_checked, &prefetch_seconds, l] {
          omp_set_num_threads(std::max(1, omp_get_num_procs() / 2));
          const auto t0 = Clock::now();
          LayerWeights lw = load_checked(l + 1);
          prefetch_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
          return lw;
        });
    }
    if (l < resume_from) {   // done by the interrupted run: replay the quantized layer to get the next input
      PhaseTimer t(phase["forward"]);
      for (Proj p : kAllProj) {
        const std::string name = proj_tensor_prefix(l, p);
        if (const QuantizedLinear* q = store.get(name)) w[p].W = q->dequantize();
        w[p].act = store.act_quant(name);
      }
      VecF v;
      if (store.float_override("model.layers." + std::to_string(l) + ".input_layernorm.weight", &v)) w.input_layernorm = v;
      if (store.float_override("model.layers." + std::to_string(l) + ".post_attention_layernorm.weight", &v)) w.post_attention_layernorm = v;
      json rep = json::parse(store.layer_report(l));
      for (auto& m : rep["modules"]) modules.push_back(m);
      for (auto& e : rep["smoothquant"]) smoothing.push_back(e);
#ifdef PTQKIT_HAVE_CUDA
      if (gpu_forward) { fw->load_layer(w); fw->layer(); cuda::synchronize(); }
      else
#endif
      if (!stats_in) decoder_layer(w, c, rope, S, T, X);
      layers.push_back({{"layer", l}, {"seconds", 0.0}, {"resumed", true}});
      bar.update(l + 1);
      continue;
    }
    const size_t modules_before = modules.size(), smoothing_before = smoothing.size();
    std::vector<QuantizedLinear> qs;
    std::array<bool, 7> resident{};   // the forward already holds this Linear's quantized weights
    int groups_done = 0;
    LayerStats ls_in, ls_out;
    if (stats_in) ls_in = stats_in->load_layer(l);
    auto quantize_group = [&](std::initializer_list<Proj> projs, const std::string& group, const AnyHessian* hess) {
      bar.update(l + groups_done++ / 4.0, "layer " + std::to_string(l) + ": " + proj_tensor_prefix(l, *projs.begin()).substr(proj_tensor_prefix(l, *projs.begin()).rfind('.') + 1));
      MatD H;
#ifdef PTQKIT_HAVE_CUDA
      // On the GPU the Hessian stays there; the host copy is made only if something needs it.
      double* dsum = nullptr;
      int64_t ntok = 0;
      if (!stats_in && !stats_out && use_cuda && hess->device()) {
        PhaseTimer t(phase["hessian"]);
        dsum = hess->device()->device_sum();
        ntok = hess->device()->tokens();
      }
      auto host_H = [&] {
        if (H.size() == 0) { PhaseTimer t(phase["hessian"]); H = hess->finalize(); }
      };
#else
      auto host_H = [] {};
#endif
      if (stats_in) {
        auto it = ls_in.hessians.find(group);
        if (it == ls_in.hessians.end()) fail(Errc::format, opt.load_stats, "layer " + std::to_string(l) + ": hessian." + group, "missing");
        H = std::move(it->second);
      } else {
#ifdef PTQKIT_HAVE_CUDA
        if (!dsum)
#endif
        {
          PhaseTimer t(phase["hessian"]);
          H = hess->finalize();
        }
      }
      auto record = [&](const std::string& name, const QuantSpec& spec, int64_t rows, int64_t cols, const SolveStats& st, double loss,
                        double rtn_loss, double seconds) {
#ifndef NDEBUG
        if (spec.method == "gptq" && loss > rtn_loss * (1 + 1e-6) + 1e-12)
          fail(Errc::numeric, "", name, "GPTQ loss " + std::to_string(loss) + " exceeds RTN's " + std::to_string(rtn_loss) + " (debug check)");
#endif
        for (auto& line : st.log) {
          std::fprintf(stderr, "ptqkit: %s: %s\n", name.c_str(), line.c_str());
          log_event("warning", {{"module", name}, {"message", line}});
        }
        modules.push_back({{"name", name}, {"method", spec.method}, {"bits", spec.bits}, {"group_size", spec.group_size},
                           {"sym", spec.sym}, {"act_order", spec.act_order}, {"static_groups", spec.static_groups},
                           {"rows", rows}, {"cols", cols}, {"damp_percent", spec.method == "gptq" ? st.damp_percent : 0.0},
                           {"damp_retries", st.retries}, {"dead_columns", st.dead_columns}, {"loss", loss}, {"rtn_loss", rtn_loss},
                           {"loss_ratio_vs_rtn", rtn_loss > 0 ? loss / rtn_loss : 1.0}, {"seconds", seconds}});
      };
      std::vector<Proj> todo;
      for (Proj p : projs)
        if (!r.ignored(proj_tensor_prefix(l, p))) todo.push_back(p);
      auto spec_of = [&](Proj p) {
        QuantSpec sp = r.spec_for(proj_tensor_prefix(l, p));
        sp.scale_dtype = scale_dtype;
        return sp;
      };
#ifdef PTQKIT_HAVE_CUDA
      // With the Hessian on the device, GPTQ's weights stay there: the Linears that share this
      // Hessian and a spec are solved as one stacked matrix (from the forward's 16-bit weights when
      // they hold the model's weights exactly), then the loss, and the next stage's weights.
      auto resident_ok = [&](Proj p) { const QuantSpec sp = spec_of(p); return sp.method == "gptq" && cuda::gptq_supported(sp, nullptr); };
      for (auto first = todo.begin(); dsum && (first = std::find_if(todo.begin(), todo.end(), resident_ok)) != todo.end();) {
        const QuantSpec spec = spec_of(*first);
        std::vector<Proj> batch;
        for (Proj p : todo)
          if (spec_of(p) == spec) batch.push_back(p);
        const bool from_forward = gpu_forward && fw->dtype() == c.dtype;
        std::vector<cuda::WeightRows> parts;
        int64_t all_rows = 0;
        const int64_t cols = w[batch[0]].W.cols();
        for (Proj p : batch) {
          cuda::WeightRows part;
          part.rows = w[p].W.rows();
          if (from_forward) { part.device = fw->weight(p); part.dtype = fw->dtype(); }
          else part.host = &w[p].W;
          parts.push_back(part);
          all_rows += part.rows;
        }
        SolveStats st;
        cuda::ResidentSolve rs;
        {
          PhaseTimer t(phase["solve"]);
          rs = cuda::gptq_quantize_resident(parts, cols, dsum, ntok, spec, true, &st);
          const cuda::GptqPhaseTimes pt = cuda::last_phase_times();
          solve_phase["prepare"] += pt.prepare;
          solve_phase["factorization"] += pt.factorization;
          solve_phase["column_loop"] += pt.column_loop;
          solve_phase["pack_codes"] += pt.pack;
          solve_phase["dequantize_and_rtn"] += pt.download;
        }
        int64_t r0 = 0;
        size_t part = 0;
        for (Proj p : batch) {
          const std::string name = proj_tensor_prefix(l, p);
          const int64_t rows = w[p].W.rows();
          QuantizedLinear q = std::move(rs.parts[part++]);
          double loss, rtn_loss;
          {
            // GPTQ's loss from its column loop (DampedLoss: exact up to fp32 rounding), RTN's on TF32
            // tensor cores (~1e-4); both by fp64 DGEMM where the damping term would cancel most of the first.
            PhaseTimer t(phase["loss"]);
            const int64_t off = r0 * cols;
            const double hs = ntok > 0 ? 2.0 / double(ntok) : 1.0;
            loss = rs.damped.loss(r0, r0 + rows);
            if (std::isnan(loss))
              std::tie(loss, rtn_loss) = cuda::output_errors(rs.W.get() + off, rs.Wq.get() + off, rs.Wr.get() + off, rows, cols, dsum, hs);
            else
              rtn_loss = cuda::output_error_tf32(rs.W.get() + off, rs.Wr.get() + off, rows, cols, dsum, hs);
          }
          record(name, spec, rows, cols, st, loss, rtn_loss, st.seconds * double(rows) / double(all_rows));
          if (gpu_forward) {   // the next stage reads the quantized weights from here; the host copy is not needed
            PhaseTimer t(phase["upload"]), tu(upload_phase["quantized_weights"]);
            fw->set_weight_device(p, rs.Wq.get() + r0 * cols);
            resident[size_t(p)] = true;
            w[p].W = MatF();
          } else {
            PhaseTimer t(phase["solve"]);
            w[p].W = q.dequantize();
          }
          q.name = name;
          qs.push_back(std::move(q));
          r0 += rows;
          st.log.clear();   // said once, for the first module of the batch
          todo.erase(std::find(todo.begin(), todo.end(), p));
        }
      }
#endif
      for (Proj p : todo) {   // on the host, or (RTN, specs the GPU kernel refuses) solved apart
        const std::string name = proj_tensor_prefix(l, p);
        const QuantSpec spec = spec_of(p);
        MatF& W = w[p].W;
        SolveStats st;
        QuantizedLinear q, rtn;
        {
          PhaseTimer t(phase["solve"]);
#ifdef PTQKIT_HAVE_CUDA
          if (use_cuda && spec.method == "gptq" && cuda::gptq_supported(spec, nullptr)) {
            q = cuda::gptq_quantize(W, H, spec, &st);
          } else
#endif
          {
            host_H();
            q = spec.method == "gptq" ? gptq_quantize(W, H, spec, &st) : rtn_quantize(W, spec);
          }
          rtn = spec.method == "gptq" ? rtn_quantize(W, spec) : q;
        }
        MatF Wq = q.dequantize();
        double loss, rtn_loss;
        {
          PhaseTimer t(phase["loss"]);
#ifdef PTQKIT_HAVE_CUDA
          if (dsum) {   // fp64 on the device (cuBLAS DGEMM), as output_error does on the CPU
            const double hs = ntok > 0 ? 2.0 / double(ntok) : 1.0;
            const MatF Wr = spec.method == "gptq" ? rtn.dequantize() : MatF();
            std::tie(loss, rtn_loss) = cuda::output_errors(W, Wq, spec.method == "gptq" ? &Wr : nullptr, dsum, hs);
          } else
#endif
          {
            host_H();
            loss = output_error(W, Wq, H);
            rtn_loss = spec.method == "gptq" ? output_error(W, rtn.dequantize(), H) : loss;
          }
        }
        record(name, spec, W.rows(), W.cols(), st, loss, rtn_loss, st.seconds);
        W = std::move(Wq);
        q.name = name;
        qs.push_back(std::move(q));
      }
      if (stats_out) ls_out.hessians[group] = std::move(H);
    };
    MatF xn, ctx, y;
    std::vector<std::pair<std::string, VecF>> smoothed;
    std::vector<std::pair<std::string, ActQuant>> acts;
    // SmoothQuant on one norm -> Linears pair: statistics of the unsmoothed input, alpha, fold.
    auto smooth = [&](const std::string& norm_name, VecF& norm, std::initializer_list<Proj> projs, const MatF& x_in, MatF& x) {
      VecF absmax;
      update_channel_absmax(x, absmax);
      json entry = {{"layer", l}, {"pair", norm_name}, {"outlier_ratio_before", outlier_ratio(absmax)}};
      if (!smooth_pair(norm_name)) return;
      PhaseTimer t(phase["smoothquant"]);
      std::vector<const MatF*> ws;
      std::vector<MatF*> wm;
      for (Proj p : projs) { ws.push_back(&w[p].W); wm.push_back(&w[p].W); }
      const ActQuant act{r.act_mode, 0};
      AlphaSearch a = r.smooth.auto_alpha ? search_alpha(x, absmax, ws, act) : evaluate_alpha(x, absmax, ws, act, r.smooth.alpha);
      const VecF sf = smoothing_factors(absmax, ws, a.alpha);
      fold_smoothing(norm, wm, sf);
      rmsnorm(x_in, norm, eps, x);   // the smoothed input, computed as the deployed (and a resumed) model computes it
      entry["alpha"] = a.alpha;
      entry["outlier_ratio_after"] = outlier_ratio(absmax.cwiseQuotient(sf));
      entry["w8a8_error"] = a.error;
      entry["w8a8_error_unsmoothed"] = a.error_unsmoothed;
      smoothing.push_back(entry);
      smoothed.emplace_back("model.layers." + std::to_string(l) + "." + norm_name + ".weight", norm);
      if (stats_out) ls_out.smoothing[norm_name] = sf;
    };
    // --load-stats: the saving run's smoothing factors, folded as it folded them.
    auto smooth_saved = [&](const std::string& norm_name, VecF& norm, std::initializer_list<Proj> projs) {
      auto it = ls_in.smoothing.find(norm_name);
      if (it == ls_in.smoothing.end()) return;
      std::vector<MatF*> wm;
      for (Proj p : projs) wm.push_back(&w[p].W);
      fold_smoothing(norm, wm, it->second);
      smoothed.emplace_back("model.layers." + std::to_string(l) + "." + norm_name + ".weight", norm);
    };
    // W8A8: the group's Linears take int8 inputs from here on (static scale: calibrated absmax / 127).
    auto quantize_inputs = [&](std::initializer_list<Proj> projs, const std::string& group, const MatF* x) {
      if (!w8a8) return;
      float scale = 0;
      if (r.act_mode == ActQuant::per_tensor) scale = x ? x->cwiseAbs().maxCoeff() / 127.0f : ls_in.meta["act_scales"].value(group, 0.0f);
      if (stats_out) ls_out.meta["act_scales"][group] = scale;
      const ActQuant a{r.act_mode, scale};
      for (Proj p : projs) {
        const std::string name = proj_tensor_prefix(l, p);
        if (r.ignored(name)) continue;
        w[p].act = a;
        acts.emplace_back(name, a);
      }
    };
    // One Hessian per distinct input: q/k/v share one, gate/up share one.
    AnyHessian h_qkv(c.hidden_size, use_cuda, hdt), h_o(c.q_dim(), use_cuda, hdt), h_mlp(c.hidden_size, use_cuda, hdt),
        h_down(c.intermediate_size, use_cuda, hdt);
    if (stats_in) {   // the saved statistics stand in for the forward pass
      for (auto& e : ls_in.meta.value("smoothquant", json::array())) smoothing.push_back(e);
      smooth_saved("input_layernorm", w.input_layernorm, {Proj::q, Proj::k, Proj::v});
      quantize_group({Proj::q, Proj::k, Proj::v}, "qkv", nullptr);
      quantize_inputs({Proj::q, Proj::k, Proj::v}, "qkv", nullptr);
      quantize_group({Proj::o}, "o", nullptr);
      quantize_inputs({Proj::o}, "o", nullptr);
      smooth_saved("post_attention_layernorm", w.post_attention_layernorm, {Proj::gate, Proj::up});
      quantize_group({Proj::gate, Proj::up}, "mlp", nullptr);
      quantize_inputs({Proj::gate, Proj::up}, "mlp", nullptr);
      quantize_group({Proj::down}, "down", nullptr);
      quantize_inputs({Proj::down}, "down", nullptr);
    }
#ifdef PTQKIT_HAVE_CUDA
    else if (gpu_forward) {   // the same stages on the GPU; quantized weights go back up after each group
      auto gpu_stage = [&](auto&& f) {
        {
          PhaseTimer t(phase["forward"]);
          f();
          cuda::synchronize();
        }
        const double hs = fw->take_hessian_seconds();
        phase["forward"] -= hs;
        phase["hessian"] += hs;
      };
      auto upload = [&](std::initializer_list<Proj> projs) {
        PhaseTimer t(phase["upload"]), tu(upload_phase["quantized_weights"]);
        for (Proj p : projs)
          if (!resident[size_t(p)] && !r.ignored(proj_tensor_prefix(l, p))) fw->set_weight(p, w[p].W);
      };
      { PhaseTimer t(phase["upload"]), tu(upload_phase["layer_weights"]); fw->load_layer(w, w16[l % 2].get()); }
      gpu_stage([&] { fw->norm1(h_qkv.device()); });
      quantize_group({Proj::q, Proj::k, Proj::v}, "qkv", &h_qkv);
      h_qkv.release();
      upload({Proj::q, Proj::k, Proj::v});
      gpu_stage([&] { fw->attention(h_o.device()); });
      quantize_group({Proj::o}, "o", &h_o);
      h_o.release();
      upload({Proj::o});
      gpu_stage([&] { fw->o_proj_norm2(h_mlp.device()); });
      quantize_group({Proj::gate, Proj::up}, "mlp", &h_mlp);
      h_mlp.release();
      upload({Proj::gate, Proj::up});
      gpu_stage([&] { fw->mlp(h_down.device()); });
      quantize_group({Proj::down}, "down", &h_down);
      h_down.release();
      upload({Proj::down});
      gpu_stage([&] { fw->down_proj(); });
    }
#endif
    else if (r.true_sequential) {
      { PhaseTimer t(phase["forward"]); rmsnorm(X, w.input_layernorm, eps, xn); }
      smooth("input_layernorm", w.input_layernorm, {Proj::q, Proj::k, Proj::v}, X, xn);
      { PhaseTimer t(phase["hessian"]); h_qkv.add(xn); }
      quantize_group({Proj::q, Proj::k, Proj::v}, "qkv", &h_qkv);
      quantize_inputs({Proj::q, Proj::k, Proj::v}, "qkv", &xn);
      { PhaseTimer t(phase["forward"]); attention_core(w, c, rope, xn, S, T, ctx); }
      { PhaseTimer t(phase["hessian"]); h_o.add(ctx); }
      quantize_group({Proj::o}, "o", &h_o);
      quantize_inputs({Proj::o}, "o", &ctx);
      {
        PhaseTimer t(phase["forward"]);
        linear(ctx, w[Proj::o], y);
        X += y;
        rmsnorm(X, w.post_attention_layernorm, eps, xn);
      }
      smooth("post_attention_layernorm", w.post_attention_layernorm, {Proj::gate, Proj::up}, X, xn);
      { PhaseTimer t(phase["hessian"]); h_mlp.add(xn); }
      quantize_group({Proj::gate, Proj::up}, "mlp", &h_mlp);
      quantize_inputs({Proj::gate, Proj::up}, "mlp", &xn);
      { PhaseTimer t(phase["forward"]); mlp_act(w, xn, ctx); }
      { PhaseTimer t(phase["hessian"]); h_down.add(ctx); }
      quantize_group({Proj::down}, "down", &h_down);
      quantize_inputs({Proj::down}, "down", &ctx);
      {
        PhaseTimer t(phase["forward"]);
        linear(ctx, w[Proj::down], y);
        X += y;
      }
    } else {
      // All four inputs from the float layer, then the quantized layer's output.
      {
        MatF Xf = X;
        PhaseTimer t(phase["forward"]);
        rmsnorm(Xf, w.input_layernorm, eps, xn);
        h_qkv.add(xn);
        attention_core(w, c, rope, xn, S, T, ctx);
        h_o.add(ctx);
        linear(ctx, w[Proj::o], y);
        Xf += y;
        rmsnorm(Xf, w.post_attention_layernorm, eps, xn);
        h_mlp.add(xn);
        mlp_act(w, xn, ctx);
        h_down.add(ctx);
      }
      quantize_group({Proj::q, Proj::k, Proj::v}, "qkv", &h_qkv);
      quantize_group({Proj::o}, "o", &h_o);
      quantize_group({Proj::gate, Proj::up}, "mlp", &h_mlp);
      quantize_group({Proj::down}, "down", &h_down);
      PhaseTimer t(phase["forward"]);
      decoder_layer(w, c, rope, S, T, X);
    }
    {
      PhaseTimer t(phase["save"]);
      json rep = {{"modules", json::array()}, {"smoothquant", json::array()}};
      for (size_t i = modules_before; i < modules.size(); ++i) rep["modules"].push_back(modules[i]);
      for (size_t i = smoothing_before; i < smoothing.size(); ++i) rep["smoothquant"].push_back(smoothing[i]);
      if (stats_out) {
        ls_out.meta["smoothquant"] = rep["smoothquant"];
        stats_out->save_layer(l, ls_out);
      }
      // The layer file (the resume point, fsynced) is written while the next layer computes.
      if (pending_save.valid()) pending_save.get();
      pending_save = std::async(std::launch::async, [&store, &save_seconds, l, qs = std::move(qs), smoothed, acts, rep = rep.dump()] {
        const auto t0 = Clock::now();
        store.save_layer(l, qs, smoothed, acts, rep);
        save_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      });
    }
    layers.push_back({{"layer", l}, {"seconds", std::chrono::duration<double>(Clock::now() - t_layer).count()}});
    bar.update(l + 1);
  }
  if (pending_save.valid()) {
    PhaseTimer t(phase["save"]);
    pending_save.get();
  }
  bar.finish();
  X = MatF();
  if (next_layer.valid()) next_layer.wait();
#ifdef PTQKIT_HAVE_CUDA
  fw.reset();
#endif

  json outputs = json::array();
  {
    PhaseTimer t(phase["export"]);
    ExportJob job;
    job.model = model.get();
    job.store = &store;
    job.max_shard_bytes = size_t(r.max_shard_mb) << 20;
    job.true_sequential = r.true_sequential;
    job.nf4_blocksize = r.nf4_blocksize;
    job.nf4_double_quant = r.nf4_double_quant;
    for (auto& m : known)
      if (nf4 && layer_of(m) >= 0 && !r.ignored(m)) {
        job.nf4_modules.push_back(m);
        modules.push_back({{"name", m}, {"method", "nf4"}, {"blocksize", r.nf4_blocksize}, {"double_quant", r.nf4_double_quant}});
      }
    // One format: its files in the output folder; several: one subfolder each.
    for (auto& f : r.formats) {
      job.out_dir = r.formats.size() == 1 ? out.path() : out.path() + "/" + f;
      std::filesystem::create_directories(job.out_dir);
      std::vector<std::string> files;
      if (f == "fake") {   // dequantized weights (for NF4: the NF4 values) in the source dtype
        files = export_fake(model->checkpoint(), nf4 ? nf4_dequantized(job) : dequantized_from(store), job.out_dir, job.max_shard_bytes);
        for (auto& s : copy_side_files(r.model, job.out_dir)) files.push_back(s);
        if (w8a8) {   // record the int8 activations, so that ptqkit evaluates this as W8A8
          json cfg = c.raw, scales = json::object();
          for (auto& m : known)
            if (layer_of(m) >= 0 && store.act_quant(m).mode != ActQuant::none) scales[m] = store.act_quant(m).static_scale;
          cfg["ptqkit_w8a8"] = {{"strategy", r.act_mode == ActQuant::per_token ? "token" : "tensor"}, {"input_scales", scales}};
          write_file_atomic(job.out_dir + "/config.json", cfg.dump(2) + "\n");
        }
      } else if (f == "gptq" || f == "gptq_v2") {
        files = export_gptq(job, f == "gptq_v2");
      } else if (f == "compressed-tensors") {
        files = w8a8 ? export_ct_int8(job) : export_compressed_tensors(job);
      } else if (f == "nf4") {
        files = export_nf4(job);
      } else if (f == "gguf") {
        files = export_gguf(job);
      }
      outputs.push_back({{"format", f}, {"dir", r.formats.size() == 1 ? "." : f}, {"files", files}});
    }
    std::filesystem::remove_all(out.path() + "/.layers");
    std::filesystem::remove(fp_file);
    if (stats_out) stats_out->commit(c.num_hidden_layers);
  }
  double total = std::chrono::duration<double>(Clock::now() - t_start).count();
  json report = {{"ptqkit_version", "0.1.0"},
                 {"recipe", yaml_to_json(r.to_yaml())},
                 {"device", device_desc},
                 {"forward", forward_desc},
                 {"model", {{"path", r.model}, {"model_type", c.model_type}, {"layers", c.num_hidden_layers}, {"hidden_size", c.hidden_size},
                            {"intermediate_size", c.intermediate_size}, {"dtype", dtype_name(c.dtype)}}},
                 {"calibration", nf4 ? json{{"dataset", "none (NF4 is data-free)"}} : cd.describe(r.calibration)},
                 {"modules", modules},
                 {"smoothquant", smoothing},
                 {"statistics", stats_info},
                 {"layers", layers},
                 {"phases_seconds", phase},
                 {"solve_phases_seconds", solve_phase},
                 {"upload_phases_seconds", upload_phase},
                 {"background_seconds", {{"load_next_layer", prefetch_seconds}, {"save_layer", save_seconds}}},
                 {"total_seconds", total},
                 {"peak_rss_mb", peak_rss_mb()},
#ifdef PTQKIT_HAVE_CUDA
                 {"peak_gpu_mb", use_cuda ? double(cuda::pool_peak_bytes()) / (1 << 20) : 0.0},
#endif
                 {"outputs", outputs}};
  YAML::Emitter em;
  em << r.to_yaml();
  write_file_atomic(out.file("recipe.yaml"), std::string("# effective recipe written by ptqkit\n") + em.c_str() + "\n");
  write_file_atomic(out.file("report.json"), report.dump(2) + "\n");
  write_file_atomic(out.file("report.html"), report_html(report));
  out.commit();
  return report;
}

}  // namespace ptq
