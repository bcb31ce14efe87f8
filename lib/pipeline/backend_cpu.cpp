// backend_cpu.cpp — the CPU backend (backend.h): the reference every other backend is held to.
//
// Precision: the forward is fp32 (lib/model/llama.h), Hessians are fp32 SYRK chunks summed in
// fp64 (lib/gptq/hessian.h), the solve is gptq.h's, losses are fp64.
#include <string>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "pipeline/backend.h"
#include "pipeline/stats.h"

namespace ptq {

namespace {

// The true-sequential forward: each stage reads the residual stream X as the layer's already
// quantized Linears left it (the stage functions of lib/model/llama.h, one stage per group).
class CpuForward final : public LayerForward {
 public:
  CpuForward(const CalibrationPass& p, MatF&& X, HessianFactory mk, PhaseTimes& t)
      : c_(*p.config), rope_(*p.rope), S_(p.S), T_(p.T), X_(std::move(X)), make_(std::move(mk)), t_(t) {}
  void begin_layer(int, LayerWeights& w) override { w_ = &w; }
  std::unique_ptr<HessianSum> collect(const LinearGroup& g, const Smoother& smooth) override {
    const float eps = float(c_.rms_norm_eps);
    {
      PhaseTimer t(t_.phase["forward"]);
      switch (g.input) {
        case Stage::norm1:
          rmsnorm(X_, w_->input_layernorm, eps, xn_);
          in_ = &xn_;
          break;
        case Stage::attention:
          attention_core(*w_, c_, rope_, xn_, S_, T_, ctx_);
          in_ = &ctx_;
          break;
        case Stage::norm2:
          linear(ctx_, (*w_)[Proj::o], y_);
          X_ += y_;
          rmsnorm(X_, w_->post_attention_layernorm, eps, xn_);
          in_ = &xn_;
          break;
        case Stage::mlp_act:
          mlp_act(*w_, xn_, ctx_);
          in_ = &ctx_;
          break;
        default: fail(Errc::usage, "", "schedule", std::string("the CPU forward has no stage ") + stage_name(g.input));
      }
    }
    if (smooth) smooth(X_, *in_);
    std::unique_ptr<HessianSum> H = make_(in_->cols());
    PhaseTimer t(t_.phase["hessian"]);
    H->add(*in_);
    return H;
  }
  const MatF* group_input() const override { return in_; }
  void end_layer() override {
    PhaseTimer t(t_.phase["forward"]);
    linear(ctx_, (*w_)[Proj::down], y_);
    X_ += y_;
  }
  void replay_layer(LayerWeights& w) override {
    PhaseTimer t(t_.phase["forward"]);
    decoder_layer(w, c_, rope_, S_, T_, X_);
  }
  bool smoothing_on_host() const override { return true; }

 private:
  const LlamaConfig& c_;
  const Rope& rope_;
  int S_, T_;
  MatF X_, xn_, ctx_, y_;
  MatF* in_ = nullptr;   // the last collected group's input (xn_ or ctx_)
  LayerWeights* w_ = nullptr;
  HessianFactory make_;
  PhaseTimes& t_;
};

// true_sequential: false — every group's Hessian from one pass of the float layer, then the
// layer's output computed again with its quantized weights.
class FloatPassForward final : public LayerForward {
 public:
  FloatPassForward(const CalibrationPass& p, MatF&& X, HessianFactory mk, PhaseTimes& t)
      : c_(*p.config), rope_(*p.rope), S_(p.S), T_(p.T), X_(std::move(X)), make_(std::move(mk)), t_(t) {}
  void begin_layer(int, LayerWeights& w) override {
    w_ = &w;
    hessians_.clear();
    CalibrationPass p;
    p.config = &c_;
    p.rope = &rope_;
    p.S = S_;
    p.T = T_;
    MatF Xf = X_;
    PhaseTimer t(t_.phase["forward"]);
    PhaseTimes inner;   // the float pass is all "forward" time, Hessians included
    CpuForward f(p, std::move(Xf), make_, inner);
    f.begin_layer(0, w);
    for (const LinearGroup& g : layer_schedule(c_).groups) hessians_[g.name] = f.collect(g, {});
  }
  std::unique_ptr<HessianSum> collect(const LinearGroup& g, const Smoother&) override { return std::move(hessians_.at(g.name)); }
  void end_layer() override {
    PhaseTimer t(t_.phase["forward"]);
    decoder_layer(*w_, c_, rope_, S_, T_, X_);
  }
  void replay_layer(LayerWeights& w) override {
    PhaseTimer t(t_.phase["forward"]);
    decoder_layer(w, c_, rope_, S_, T_, X_);
  }

 private:
  const LlamaConfig& c_;
  const Rope& rope_;
  int S_, T_;
  MatF X_;
  LayerWeights* w_ = nullptr;
  std::map<std::string, std::unique_ptr<HessianSum>> hessians_;
  HessianFactory make_;
  PhaseTimes& t_;
};

// --load-stats: the saved Hessians stand in for the forward.
class SavedStatisticsForward final : public LayerForward {
 public:
  explicit SavedStatisticsForward(const CalibrationPass& p) : saved_(p.saved), path_(p.saved_path) {}
  void begin_layer(int layer, LayerWeights&) override { layer_ = layer; }
  std::unique_ptr<HessianSum> collect(const LinearGroup& g, const Smoother&) override {
    auto it = saved_->hessians.find(g.name);
    if (it == saved_->hessians.end()) fail(Errc::format, path_, "layer " + std::to_string(layer_) + ": hessian." + g.name, "missing");
    return std::make_unique<Hessian>(Hessian::from_matrix(std::move(it->second)));
  }
  void end_layer() override {}
  void replay_layer(LayerWeights&) override {}

 private:
  LayerStats* saved_;
  std::string path_;
  int layer_ = 0;
};

class CpuSolver final : public GroupSolver {
 public:
  std::vector<SolvedLinear> solve(const std::vector<LinearJob>& jobs, LayerWeights& w, HessianSum& H, const MatD* H_host, PhaseTimes& t) override {
    MatD own;
    if (!H_host) {
      PhaseTimer tt(t.phase["hessian"]);
      own = H.finalize();
      H_host = &own;
    }
    std::vector<SolvedLinear> out;
    for (const LinearJob& j : jobs) out.push_back(solve_on_host(j, w[j.proj].W, *H_host, t));
    return out;
  }
};

}  // namespace

SolvedLinear finish_apart(const LinearJob& job, QuantizedLinear q, const QuantizedLinear& rtn, const SolveStats& stats, MatF& W,
                          const LossFn& losses, PhaseTimes& t) {
  SolvedLinear s;
  s.proj = job.proj;
  s.q = std::move(q);
  s.stats = stats;
  const bool gptq = job.spec.method == "gptq";
  MatF Wq = s.q.dequantize();
  {
    PhaseTimer tt(t.phase["loss"]);
    const MatF Wr = gptq ? rtn.dequantize() : MatF();
    std::tie(s.loss, s.rtn_loss) = losses(W, Wq, gptq ? &Wr : nullptr);
  }
  s.rows = W.rows();
  s.cols = W.cols();
  s.seconds = stats.seconds;
  W = std::move(Wq);
  return s;
}

SolvedLinear solve_on_host(const LinearJob& job, MatF& W, const MatD& H, PhaseTimes& t) {
  const QuantSpec& spec = job.spec;
  const bool gptq = spec.method == "gptq";
  SolveStats st;
  QuantizedLinear q, rtn;
  {
    PhaseTimer tt(t.phase["solve"]);
    q = gptq ? gptq_quantize(W, H, spec, &st) : rtn_quantize(W, spec);
    if (gptq) rtn = rtn_quantize(W, spec);
  }
  return finish_apart(job, std::move(q), rtn, st, W, [&H](const MatF& W0, const MatF& Wq, const MatF* Wr) {
    const double loss = output_error(W0, Wq, H);
    return std::make_pair(loss, Wr ? output_error(W0, *Wr, H) : loss);
  }, t);
}

std::unique_ptr<LayerForward> cpu_forward(const CalibrationPass& pass, MatF&& X, bool true_sequential, HessianFactory make_hessian,
                                          PhaseTimes& t) {
  if (true_sequential) return std::make_unique<CpuForward>(pass, std::move(X), std::move(make_hessian), t);
  return std::make_unique<FloatPassForward>(pass, std::move(X), std::move(make_hessian), t);
}

std::unique_ptr<LayerForward> saved_statistics_forward(const CalibrationPass& pass) { return std::make_unique<SavedStatisticsForward>(pass); }

std::unique_ptr<GroupSolver> cpu_solver() { return std::make_unique<CpuSolver>(); }

}  // namespace ptq
