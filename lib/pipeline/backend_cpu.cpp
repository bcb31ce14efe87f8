// backend_cpu.cpp — the CPU backend (backend.h): the reference every other backend is held to.
//
// Precision: the forward is fp32 (lib/model/llama.h), Hessians are fp32 SYRK chunks summed in
// fp64 (lib/gptq/hessian.h), the solve is gptq.h's, losses gptq.h's
// (fp64 for GPTQ's, fp32 products summed in fp64 for RTN's).
#include <string>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "gptq/clip.h"
#include "pipeline/backend.h"
#include "pipeline/stats.h"

namespace ptq {

namespace {

// The true-sequential forward: each stage reads the residual stream X as the layer's already
// quantized Linears left it (the stage functions of lib/model/llama.h, one stage per group).
class CpuForward final : public LayerForward {
 public:
  CpuForward(const CalibrationPass& p, MatF&& X, HessianFactory mk, PhaseTimes& t)
      : c_(*p.config), rope_(*p.rope), S_(p.S), T_(p.T), all_experts_(p.calibrate_all_experts), X_(std::move(X)), make_(std::move(mk)), t_(t) {}
  void begin_layer(int, LayerWeights& w) override {
    w_ = &w;
    pending_.clear();
  }
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
          residual_and_norm2();
          in_ = &xn_;
          break;
        case Stage::mlp_act:
          mlp_act(*w_, xn_, ctx_);
          in_ = &ctx_;
          break;
        case Stage::expert_in:   // the experts' input: xn2, all rows (every expert's group) or the expert's routed rows
          if (g.expert < 0 && !all_experts_) fail(Errc::usage, "", "schedule", "one group for every expert needs all-experts calibration");
          if (g.expert <= 0) {   // the first expert group follows the attention: norm2 and the routing first
            residual_and_norm2();
            routing_ = route(c_, w_->router, xn_);
            moe_y_.setZero(xn_.rows(), xn_.cols());
          }
          finish_expert();
          if (all_experts_) {
            in_ = &xn_;
          } else {
            gather_rows(xn_, routing_.rows[size_t(g.expert)], xe_);
            in_ = &xe_;
          }
          break;
        case Stage::expert_act: {   // the expert's activation on the same rows, with its quantized gate and up
          // (the previous experts' outputs wait for the end of the layer: their downs may be
          // solved after this Hessian, together)
          const auto& e = w_->experts[size_t(g.expert)];
          // (routed: xe_ still holds the rows expert_in gathered; nothing was pending in between)
          swiglu(e[0], e[1], all_experts_ ? xn_ : xe_, ctx_);
          in_ = &ctx_;
          pending_.push_back(g.expert);
          break;
        }
      }
    }
    if (smooth) {   // (only the norms' groups have a smoother: X_ is the norm's input)
      VecF absmax;
      update_channel_absmax(*in_, absmax);
      rmsnorm(X_, smooth(absmax, *in_), eps, *in_);
      if (g.input == Stage::expert_in) routing_ = route(c_, w_->router, xn_);   // its router's columns took the factors too
    }
    std::unique_ptr<HessianSum> H = make_(in_->cols());
    PhaseTimer t(t_.phase["hessian"]);
    if (in_->rows()) H->add(*in_);   // an expert the router sent no row to (routed calibration) has an empty Hessian
    return H;
  }
  bool sample_inputs() const override { return true; }
  std::pair<VecF, MatF> sample(const LinearGroup& g) override {
    PhaseTimer t(t_.phase["forward"]);
    MatF in;
    switch (g.input) {
      case Stage::attention: attention_core(*w_, c_, rope_, xn_, S_, T_, in); break;
      case Stage::mlp_act: mlp_act(*w_, xn_, in); break;
      case Stage::expert_act: {
        const auto& e = w_->experts[size_t(g.expert)];
        swiglu(e[0], e[1], all_experts_ ? xn_ : xe_, in);
        break;
      }
      default: fail(Errc::usage, "", "sample", std::string("no Linear produces the input of stage ") + stage_name(g.input));
    }
    VecF absmax;
    update_channel_absmax(in, absmax);
    if (in.rows() > kSmoothRows) in = subsample_rows(in, kSmoothRows);
    return {std::move(absmax), std::move(in)};
  }
  float group_input_absmax() const override {
    if (!in_) return -1.0f;
    return in_->size() ? in_->cwiseAbs().maxCoeff() : 0.0f;   // (an expert the router sent no row to)
  }
  int64_t routed_tokens(int expert) const override {
    return size_t(expert) < routing_.rows.size() ? int64_t(routing_.rows[size_t(expert)].size()) : -1;
  }
  void end_layer() override {
    PhaseTimer t(t_.phase["forward"]);
    if (!w_->experts.empty()) {
      finish_expert();
      X_ += moe_y_;
      return;
    }
    linear(ctx_, (*w_)[Proj::down], y_);
    X_ += y_;
  }
  void replay_layer(LayerWeights& w) override {
    PhaseTimer t(t_.phase["forward"]);
    decoder_layer(w, c_, rope_, S_, T_, X_);
  }
  bool takes_smoother() const override { return true; }

 private:
  const LlamaConfig& c_;
  const Rope& rope_;
  int S_, T_;
  bool all_experts_;
  MatF X_, xn_, ctx_, y_, xe_, act_, moe_y_;
  MatF* in_ = nullptr;   // the last collected group's input (xn_, ctx_ or xe_)
  LayerWeights* w_ = nullptr;
  Routing routing_;      // MoE: this layer's routing of xn2 (the router in float)
  std::vector<int> pending_;   // MoE: the experts whose outputs are not yet added, in expert order
  HessianFactory make_;
  PhaseTimes& t_;

  // X += o_proj(ctx); xn2 = rmsnorm2(X).
  void residual_and_norm2() {
    linear(ctx_, (*w_)[Proj::o], y_);
    X_ += y_;
    rmsnorm(X_, w_->post_attention_layernorm, float(c_.rms_norm_eps), xn_);
  }
  // The pending experts' outputs, through their quantized Linears, added to the layer's for the
  // rows routed to them, in expert order. Computed as model/llama.cpp moe_mlp computes them (the
  // routed rows gathered first, then gate, up and down), so that a resumed run replays a finished
  // layer byte for byte.
  void finish_expert() {
    for (int p : pending_) {
      const size_t e = size_t(p);
      if (routing_.rows[e].empty()) continue;
      gather_rows(xn_, routing_.rows[e], xe_);
      swiglu(w_->experts[e][0], w_->experts[e][1], xe_, act_);
      linear(act_, w_->experts[e][2], y_);
      scatter_add(y_, routing_.rows[e], routing_.weights[e], moe_y_);
    }
    pending_.clear();
  }
};

// true_sequential: false — every group's Hessian from one pass of the float layer, then the
// layer's output computed again with its quantized weights.
class FloatPassForward final : public LayerForward {
 public:
  FloatPassForward(const CalibrationPass& p, MatF&& X, HessianFactory mk, PhaseTimes& t)
      : c_(*p.config), rope_(*p.rope), S_(p.S), T_(p.T), all_experts_(p.calibrate_all_experts), X_(std::move(X)), make_(std::move(mk)), t_(t) {}
  void begin_layer(int layer, LayerWeights& w) override {
    w_ = &w;
    hessians_.clear();
    CalibrationPass p;
    p.config = &c_;
    p.rope = &rope_;
    p.S = S_;
    p.T = T_;
    p.calibrate_all_experts = all_experts_;
    MatF Xf = X_;
    PhaseTimer t(t_.phase["forward"]);
    PhaseTimes inner;   // the float pass is all "forward" time, Hessians included
    CpuForward f(p, std::move(Xf), make_, inner);
    f.begin_layer(layer, w);
    for (const LinearGroup& g : layer_schedule(c_, layer, all_experts_).groups) hessians_[g.name] = f.collect(g, {});
    routed_.clear();
    for (int e = 0; e < int(w.experts.size()); ++e) routed_.push_back(f.routed_tokens(e));
  }
  int64_t routed_tokens(int expert) const override { return size_t(expert) < routed_.size() ? routed_[size_t(expert)] : -1; }
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
  bool all_experts_;
  MatF X_;
  LayerWeights* w_ = nullptr;
  std::map<std::string, std::unique_ptr<HessianSum>> hessians_;
  std::vector<int64_t> routed_;
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
      own = H.take_finalized();   // the solve is its last reader
      H_host = &own;
    }
    std::vector<SolvedLinear> out;
    for (const LinearJob& j : jobs) out.push_back(solve_on_host(j, w[j.id].W, *H_host, t));
    return out;
  }
};

}  // namespace

SolvedLinear finish_apart(const LinearJob& job, QuantizedLinear q, const QuantizedLinear& rtn, const SolveStats& stats, MatF& W,
                          const LossFn& losses, PhaseTimes& t) {
  SolvedLinear s;
  s.id = job.id;
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

QuantizedLinear quantize_on_host(const MatF& W, const MatD& H, const QuantSpec& spec, SolveStats& st, QuantizedLinear* rtn) {
  ClipSearch clip;
  if (spec.output_clip) {
    clip = output_clip_limits(W, H, spec);
    st.clip_groups = clip.groups;
    st.clipped_groups = clip.clipped;
  }
  const std::vector<float>* limits = spec.output_clip ? &clip.limits : nullptr;
  if (rtn) *rtn = rtn_quantize(W, spec, limits);
  return spec.method == "gptq" ? gptq_quantize(W, H, spec, &st, limits) : rtn_quantize(W, spec, limits);
}

SolvedLinear solve_on_host(const LinearJob& job, MatF& W, const MatD& H, PhaseTimes& t) {
  const QuantSpec& spec = job.spec;
  const bool gptq = spec.method == "gptq";
  SolveStats st;
  QuantizedLinear q, rtn;
  {
    PhaseTimer tt(t.phase["solve"]);
    q = quantize_on_host(W, H, spec, st, gptq ? &rtn : nullptr);
  }
  return finish_apart(job, std::move(q), rtn, st, W, [&](const MatF& W0, const MatF& Wq, const MatF* Wr) {
    return host_output_errors(W0, Wq, Wr, H, gptq, st);
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
