// backend_cuda.cpp — the GPU backend (backend.h); built only with CUDA. Its reference is
// backend_cpu.cpp: the same schedule, the same Hessians in fp64, the same solve (tests/test_gptq_cuda.cpp, test_forward_cuda.cpp, test_pipeline_cuda.cpp).
//
// With the GPU forward (true-sequential, weight-only), activations stay on the device, each
// group's Hessian is accumulated there from the 16-bit activations the GEMMs consume, the group
// is solved as one stacked matrix read from the forward's own 16-bit weights, and the quantized
// weights go straight back into the forward: the host receives only the codes and grids it
// stores. Otherwise the CPU forward runs (fp32) and the GPU accumulates its Hessians and solves.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <tuple>

#include "core/env.h"
#include "core/error.h"
#include "core/progress.h"
#include "cuda/comm.h"
#include "cuda/runtime.h"
#include "gptq/clip_cuda.h"
#include "gptq/gptq_cuda.h"
#include "gptq/hessian_cuda.h"
#include "model/forward_cuda.h"
#include "pipeline/backend.h"
#include "smoothquant/awq_cuda.h"
#include "smoothquant/smoothquant_cuda.h"

namespace ptq {

namespace {

class CudaForward final : public LayerForward {
 public:
  // input_absmax: each group's max |x| is measured (W8A8's static scales).
  CudaForward(const CalibrationPass& p, MatF&& X, bool spill, bool input_absmax, PhaseTimes& t)
      : c_(*p.config), fw_(*p.config, *p.rope, p.S, p.T, p.config->dtype, spill), t_(t), comm_(p.comm), rows_(int64_t(p.S) * p.T),
        input_absmax_(input_absmax) {
    if (comm_ && comm_->size() > 1)   // each rank's first row among all ranks' rows, then their total
      for (int k = 0; k <= comm_->size(); ++k)
        firsts_.push_back(int64_t(p.T) * (k < comm_->size() ? rank_windows(p.S_all, k, comm_->size()).first : p.S_all));
    // Each layer's weights rounded to 16 bits by the thread that reads them, into one of two
    // page-locked buffers (layer k in buffer k % 2), so that the upload is a plain DMA.
    for (auto& b : w16_) b = cuda::PinnedBuffer(fw_.weight_bytes());
    fw_.set_input(X);
    fw_.set_moe_calibration(p.calibrate_all_experts);
    X = MatF();
  }
  cuda::LayerForwardCuda& device() { return fw_; }
  void prepare(const LayerWeights& w, int layer) override { fw_.convert_weights(w, w16_[layer % 2].get()); }
  void begin_layer(int layer, LayerWeights& w) override {
    routed_.clear();
    w_ = &w;
    PhaseTimer a(t_.phase["upload"]), b(t_.upload["layer_weights"]);
    fw_.load_layer(w, w16_[layer % 2].get());
  }
  // SmoothQuant: the norm's output goes first to statistics only (every row's column maxima and
  // the search's rows, in fp32 from the 16-bit activations), the smoother folds its factors into
  // the host's weights, and the norm and the group's Linears are uploaded again and the norm
  // computed again for the Hessian. With --gpus N every rank's statistics are combined first
  // (StageStats::across_ranks): each rank then searches the same rows and folds the same factors.
  std::unique_ptr<HessianSum> collect(const LinearGroup& g, const Smoother& smooth) override {
    const int64_t cols = linear_shape(c_, g.linears[0]).in;
    auto H = std::make_unique<cuda::HessianCuda>(cols, fw_.dtype(), comm_);
    absmax_ = -1.0f;
    const bool ranks = !firsts_.empty();
    if (smooth) {
      const auto [absmax, rows] = sample(g);
      smooth(absmax, rows);
      PhaseTimer a(t_.phase["upload"]), b(t_.upload["layer_weights"]);
      fw_.set_norms(w_->input_layernorm, w_->post_attention_layernorm);
      for (LinearId p : g.linears) fw_.set_weight(p, (*w_)[p].W);
      if (g.input == Stage::expert_in) fw_.set_router(w_->router.W);   // (AWQ's fold into the experts' norm)
    }
    std::optional<cuda::StageStats> st;   // W8A8: the input's maximum on its way to the Hessian
    if (input_absmax_) st.emplace(cols, fw_.dtype(), H.get());
    cuda::DeviceRowSink* sink = st ? static_cast<cuda::DeviceRowSink*>(&*st) : H.get();
    timed_stage([&] { smooth ? fw_.renorm(g.input, sink) : fw_.stage(g.input, g.expert, sink); });
    if (st) {
      if (ranks) st->across_ranks(*comm_, firsts_);
      absmax_ = st->column_absmax().maxCoeff();
    }
    return H;
  }
  float group_input_absmax() const override { return absmax_; }
  bool takes_smoother() const override { return true; }
  bool sample_inputs() const override { return true; }
  std::pair<VecF, MatF> sample(const LinearGroup& g) override {
    const int64_t cols = linear_shape(c_, g.linears[0]).in;
    const bool ranks = !firsts_.empty();
    cuda::StageStats st(cols, fw_.dtype(), nullptr, ranks ? firsts_.back() : rows_, kSmoothRows, ranks ? firsts_[size_t(comm_->rank())] : 0);
    timed_stage([&] { fw_.stage(g.input, g.expert, &st); });
    if (ranks) st.across_ranks(*comm_, firsts_);
    return {st.column_absmax(), st.sampled_rows()};
  }
  void reload(const std::vector<LinearId>& ids, const LayerWeights& w) override {
    PhaseTimer a(t_.phase["upload"]), b(t_.upload["layer_weights"]);
    for (LinearId p : ids) {
      fw_.set_weight(p, w[p].W);
      if (w[p].b.size()) {
        if (p.expert >= 0) fail(Errc::usage, "", "reload", "MoE experts carry no bias");
        fw_.set_bias(p.proj, w[p].b);
      }
    }
  }
  // Across ranks: every rank's counts of the current layer summed once, at the first question.
  int64_t routed_tokens(int expert) const override {
    if (!comm_ || comm_->size() == 1) return fw_.routed_tokens(expert);
    if (routed_.empty()) {
      std::vector<int64_t> n(size_t(std::max(c_.num_experts, 1)));
      for (int e = 0; e < c_.num_experts; ++e) n[size_t(e)] = fw_.routed_tokens(e);
      cuda::DeviceBuffer<int64_t> d(n.size(), "routed token counts");
      cuda::copy_to_device(d.get(), n.data(), n.size() * 8);
      comm_->sum(d.get(), n.size());
      cuda::copy_to_host(n.data(), d.get(), n.size() * 8);
      routed_ = n;
    }
    return routed_[size_t(expert)];
  }
  void quantized(const std::vector<LinearId>& done, const LayerWeights& w) override {
    PhaseTimer a(t_.phase["upload"]), b(t_.upload["quantized_weights"]);
    for (LinearId p : done) {
      if (w[p].W.size()) fw_.set_weight(p, w[p].W);   // solved on the host (the others are on the device already)
      if (w[p].act.mode != ActQuant::none) fw_.set_act_quant(p, w[p].act);   // W8A8: int8 inputs from here on
    }
  }
  void end_layer() override { timed_stage([&] { fw_.down_proj(); }); }
  void replay_layer(LayerWeights& w) override {
    PhaseTimer a(t_.phase["forward"]);
    fw_.load_layer(w);
    for (int p = 0; p < kProjCount; ++p)   // (fused ones: Phi-3's qkv, gate_up)
      if (w.proj[size_t(p)].act.mode != ActQuant::none) fw_.set_act_quant(Proj(p), w.proj[size_t(p)].act);
    for (int e = 0; e < int(w.experts.size()); ++e)
      for (Proj p : {Proj::gate, Proj::up, Proj::down})
        if (w[LinearId(p, e)].act.mode != ActQuant::none) fw_.set_act_quant(LinearId(p, e), w[LinearId(p, e)].act);
    fw_.layer();
    cuda::synchronize();
  }

 private:
  const LlamaConfig& c_;
  cuda::LayerForwardCuda fw_;
  cuda::PinnedBuffer w16_[2];
  PhaseTimes& t_;
  const cuda::Comm* comm_;
  mutable std::vector<int64_t> routed_;   // the layer's routed counts summed across ranks
  int64_t rows_;                          // calibration rows on this rank
  std::vector<int64_t> firsts_;           // --gpus N: each rank's first row, then all ranks' rows (empty: one rank)
  bool input_absmax_;
  float absmax_ = -1.0f;                  // max |x| of the last collected group's input (input_absmax_)
  LayerWeights* w_ = nullptr;             // the layer's host weights (SmoothQuant folds into them)
  // A stage's GPU time, less its Hessian GEMMs (reported as "hessian").
  template <class F> void timed_stage(F&& f) {
    {
      PhaseTimer a(t_.phase["forward"]);
      f();
      cuda::synchronize();
    }
    const double hs = fw_.take_sink_seconds();
    t_.phase["forward"] -= hs;
    t_.phase["hessian"] += hs;
  }
};

class CudaSolver final : public GroupSolver {
 public:
  // fw: the GPU forward whose weights a solve reads and replaces (null: the CPU forward's run).
  // comm (--gpus N): a stacked solve is split by rows over the ranks (solve_split).
  CudaSolver(cuda::LayerForwardCuda* fw, DType model_dtype, const cuda::Comm* comm = nullptr) : fw_(fw), model_dtype_(model_dtype), comm_(comm) {}
  int64_t batch_bytes() const override { return cuda::kBatchHessianBytes; }
  std::vector<std::vector<SolvedLinear>> solve_many(const std::vector<GroupToSolve>& groups, LayerWeights& w, PhaseTimes& t) override {
    // The groups of one Linear each that a resident solve serves with the first one's spec and
    // shape, batched; the others (and any group of one) through solve().
    std::vector<std::vector<SolvedLinear>> out(groups.size());
    std::vector<size_t> batched;
    std::vector<Problem> problems;
    for (size_t i = 0; i < groups.size(); ++i) {
      const GroupToSolve& g = groups[i];
      if (g.H_host || g.jobs->size() != 1 || !resident_ok(g.jobs->front())) continue;
      const LinearJob& j = g.jobs->front();
      const LinearJob* first = problems.empty() ? nullptr : &problems[0].jobs[0];
      if (first && !(j.spec == first->spec && w[j.id].W.rows() == w[first->id].W.rows() && w[j.id].W.cols() == w[first->id].W.cols())) continue;
      HessianRef dev;
      {
        PhaseTimer a(t.phase["hessian"]);
        dev = g.H->device();
      }
      if (!dev.sum) continue;
      problems.push_back({{j}, dev});
      batched.push_back(i);
    }
    if (problems.size() > 1) {
      std::vector<SolvedLinear> solved = solve_problems(problems, w, t);
      for (size_t k = 0; k < batched.size(); ++k) out[batched[k]].push_back(std::move(solved[k]));
    } else {
      batched.clear();
    }
    for (size_t i = 0; i < groups.size(); ++i)
      if (std::find(batched.begin(), batched.end(), i) == batched.end()) out[i] = solve(*groups[i].jobs, w, *groups[i].H, groups[i].H_host, t);
    return out;
  }
  std::vector<SolvedLinear> solve(const std::vector<LinearJob>& jobs, LayerWeights& w, HessianSum& H, const MatD* H_host, PhaseTimes& t) override {
    HessianRef dev;   // the sum stays on the device unless the host copy is what the run keeps
    MatD own;
    if (!H_host) {
      PhaseTimer a(t.phase["hessian"]);
      dev = H.device();
      if (!dev.sum) { own = H.take_finalized(); H_host = &own; }   // a host sum: the solve is its last reader
    }
    auto host_H = [&]() -> const MatD& {
      if (!H_host) { PhaseTimer a(t.phase["hessian"]); own = H.finalize(); H_host = &own; }
      return *H_host;
    };
    std::vector<SolvedLinear> out;
    std::vector<LinearJob> todo = jobs;
    if (dev.sum) solve_resident(todo, w, dev, t, out);
    for (const LinearJob& j : todo) out.push_back(solve_apart(j, w[j.id].W, dev, host_H, t));
    return out;
  }

 private:
  cuda::LayerForwardCuda* fw_;
  DType model_dtype_;
  const cuda::Comm* comm_;

  // (not with AWQ's clipping: its limits are searched first, and the solve takes them, in solve_apart)
  static bool on_gpu(const QuantSpec& s) { return s.method == "gptq" && !s.output_clip && cuda::gptq_supported(s, nullptr); }
  static bool resident_ok(const LinearJob& j) { return on_gpu(j.spec); }

  // The Linears that share the Hessian and a spec the fused kernel serves, as one stacked solve.
  void solve_resident(std::vector<LinearJob>& todo, LayerWeights& w, HessianRef dev, PhaseTimes& t, std::vector<SolvedLinear>& out) {
    while (std::find_if(todo.begin(), todo.end(), resident_ok) != todo.end()) {
      const QuantSpec spec = std::find_if(todo.begin(), todo.end(), resident_ok)->spec;
      Problem p{{}, dev};
      for (const LinearJob& j : todo)
        if (j.spec == spec) p.jobs.push_back(j);
      for (SolvedLinear& s : solve_problems({p}, w, t)) out.push_back(std::move(s));
      for (const LinearJob& j : p.jobs) todo.erase(std::find_if(todo.begin(), todo.end(), [&](const LinearJob& x) { return x.id == j.id; }));
    }
  }

  // GPTQ's and RTN's output errors of rows [r0, r0 + n) of a resident solve: GPTQ's from its column
  // loop (DampedLoss: exact up to fp32 rounding), RTN's on TF32 tensor cores (~1e-4); both by fp64
  // DGEMM where the damping term would cancel most of the first.
  static std::pair<double, double> row_losses(const cuda::ResidentSolve& rs, int64_t r0, int64_t n, int64_t cols, HessianRef H) {
    const int64_t off = r0 * cols;
    const double loss = rs.damped.loss(r0, r0 + n);
    if (std::isnan(loss)) return cuda::output_errors(rs.W.get() + off, rs.Wq.get() + off, rs.Wr.get() + off, n, cols, H);
    return {loss, cuda::output_error_tf32(rs.W.get() + off, rs.Wr.get() + off, n, cols, H)};
  }

  // The resident solve (weights, RTN's and the codes kept), its phases added to the report's.
  static cuda::ResidentSolve timed_solve(const std::vector<cuda::SolveProblem>& sp, int64_t cols, const QuantSpec& spec, std::vector<SolveStats>* st,
                                         PhaseTimes& t) {
    PhaseTimer a(t.phase["solve"]);
    cuda::ResidentSolve rs = cuda::gptq_solve_cuda(sp, cols, spec, cuda::SolveKeep::weights_and_rtn, st);
    const cuda::GptqPhaseTimes pt = cuda::last_phase_times();
    t.solve["prepare"] += pt.prepare;
    t.solve["factorization"] += pt.factorization;
    t.solve["column_loop"] += pt.column_loop;
    t.solve["pack_codes"] += pt.pack;
    t.solve["dequantize_and_rtn"] += pt.download;
    return rs;
  }

  // Linears of one spec and input width that share a Hessian (one problem: a stacked solve), or
  // several such problems of equal rows (a batched solve). Their weights stay on the device for
  // the losses and (with the GPU forward) the next stage. Results in the problems' order.
  struct Problem {
    std::vector<LinearJob> jobs;
    HessianRef H;
  };
  std::vector<SolvedLinear> solve_problems(const std::vector<Problem>& problems, LayerWeights& w, PhaseTimes& t) {
    const QuantSpec spec = problems[0].jobs[0].spec;
    const int64_t cols = w[problems[0].jobs[0].id].W.cols();
    // The forward's 16-bit weights where they are the model's exactly (not SmoothQuant's smoothed
    // fp32 ones, which the host holds); fused Linears are held as parts on the device: the host's.
    auto from_forward = [&](LinearId id) {
      return fw_ && fw_->dtype() == model_dtype_ && fw_->holds_model_weights(id) && id.proj != Proj::qkv && id.proj != Proj::gate_up;
    };
    if (comm_ && fw_ && problems.size() == 1) {
      int64_t R = 0;
      bool device = true;
      for (const LinearJob& j : problems[0].jobs) {
        R += w[j.id].W.rows();
        device = device && from_forward(j.id);
      }
      if (device && R >= comm_->size()) return solve_split(problems[0], w, t);
    }
    std::vector<cuda::SolveProblem> sp;
    for (const Problem& p : problems) {
      sp.push_back({{}, p.H});
      for (const LinearJob& j : p.jobs) {
        cuda::WeightRows part;
        part.rows = w[j.id].W.rows();
        if (from_forward(j.id)) { part.device = fw_->weight(j.id); part.dtype = fw_->dtype(); }
        else part.host = &w[j.id].W;
        sp.back().parts.push_back(part);
      }
    }
    std::vector<SolveStats> st;
    cuda::ResidentSolve rs = timed_solve(sp, cols, spec, &st, t);
    std::vector<SolvedLinear> out;
    int64_t r0 = 0;
    size_t part = 0;
    for (size_t e = 0; e < problems.size(); ++e) {
      int64_t problem_rows = 0;
      for (const LinearJob& j : problems[e].jobs) problem_rows += w[j.id].W.rows();
      for (const LinearJob& j : problems[e].jobs) {
        SolvedLinear s;
        s.id = j.id;
        s.q = std::move(rs.parts[part++]);
        s.stats = st[e];
        s.rows = w[j.id].W.rows();
        s.cols = cols;
        const HessianRef dev = problems[e].H;
        {
          PhaseTimer a(t.phase["loss"]);
          std::tie(s.loss, s.rtn_loss) = row_losses(rs, r0, s.rows, cols, dev);
        }
        s.seconds = st[e].seconds * double(s.rows) / double(problem_rows);
        if (fw_) {   // the next stage reads the quantized weights from here; the host copy is not needed
          PhaseTimer a(t.phase["upload"]), b(t.upload["quantized_weights"]);
          fw_->set_weight_device(j.id, rs.Wq.get() + r0 * cols);
          w[j.id].W = MatF();
        } else {
          PhaseTimer a(t.phase["solve"]);
          w[j.id].W = s.q.dequantize();
        }
        out.push_back(std::move(s));
        r0 += out.back().rows;
        st[e].log.clear();   // said once, for the first module of the problem
      }
    }
    return out;
  }

  // --gpus N: one stacked problem split by rows over the ranks, rank k solving rows [R k / N,
  // R (k + 1) / N) of the stack against the same summed Hessian (GPTQ treats rows independently:
  // each row's codes are what the whole solve gives it, up to the GEMMs' summation order on fewer
  // rows). Then every rank receives every rank's quantized weights (its forward's next stage
  // reads them) and codes (rank 0 exports them; every rank checks the same digest), one NCCL
  // broadcast per rank each; the losses are summed across ranks. With one rank it is the
  // resident solve with the codes sent through a record per row and back (the --gpus 1 test
  // checks that the bytes come out unchanged).
  std::vector<SolvedLinear> solve_split(const Problem& p, LayerWeights& w, PhaseTimes& t) {
    const int N = comm_->size(), k = comm_->rank();
    const QuantSpec spec = p.jobs[0].spec;
    const int64_t cols = w[p.jobs[0].id].W.cols();
    std::vector<int64_t> start = {0};   // each Linear's first row in the stack
    for (const LinearJob& j : p.jobs) start.push_back(start.back() + w[j.id].W.rows());
    const int64_t R = start.back();
    auto first_row = [&](int r) { return R * r / N; };
    const int64_t lo = first_row(k), hi = first_row(k + 1);
    // This rank's rows, as pieces of the Linears they belong to (the forward's 16-bit weights).
    cuda::SolveProblem sp{{}, p.H};
    std::vector<size_t> piece_job;
    for (size_t j = 0; j < p.jobs.size(); ++j) {
      const int64_t a = std::max(lo, start[j]), b = std::min(hi, start[j + 1]);
      if (a >= b) continue;
      cuda::WeightRows part;
      part.rows = b - a;
      part.dtype = fw_->dtype();
      part.device = static_cast<const uint8_t*>(fw_->weight(p.jobs[j].id)) + size_t((a - start[j]) * cols) * dtype_size(part.dtype);
      sp.parts.push_back(part);
      piece_job.push_back(j);
    }
    std::vector<SolveStats> st;
    cuda::ResidentSolve rs = timed_solve({sp}, cols, spec, &st, t);
    // The losses of this rank's rows per Linear (GPTQ's, RTN's), then summed across the ranks.
    std::vector<double> loss(2 * p.jobs.size(), 0.0);
    {
      PhaseTimer a(t.phase["loss"]);
      int64_t r = 0;
      for (size_t s = 0; s < sp.parts.size(); ++s) {
        const int64_t n = sp.parts[s].rows;
        const auto [l, lr] = row_losses(rs, r, n, cols, p.H);
        loss[2 * piece_job[s]] += l;
        loss[2 * piece_job[s] + 1] += lr;
        r += n;
      }
      cuda::DeviceBuffer<double> dl(loss.size(), "losses (all ranks)");
      cuda::copy_to_device(dl.get(), loss.data(), loss.size() * 8);
      comm_->sum(dl.get(), loss.size());
      cuda::copy_to_host(loss.data(), dl.get(), loss.size() * 8);
    }
    // Every rank's quantized weights, [R, cols] fp32, and codes: one record of 32-bit words per
    // row — its packed codes, then its value of each grid vector ([groups, rows] layouts: scales,
    // zeros, mins, super-block d and dmin) — the same layout for every piece (one spec, one width).
    PhaseTimer up(t.phase["upload"]), upq(t.upload["quantized_weights"]);
    const QuantizedLinear& q0 = rs.parts[0];
    const int64_t wpr = int64_t(q0.packed.size()) / q0.rows;
    auto vecs = [](QuantizedLinear& q) {
      return std::vector<std::pair<std::vector<float>*, std::vector<int32_t>*>>{
          {&q.scales, nullptr}, {nullptr, &q.zeros}, {&q.mins, nullptr}, {&q.super_d, nullptr}, {&q.super_dmin, nullptr}};
    };
    std::vector<int64_t> per;   // values per row of each grid vector
    {
      QuantizedLinear& q = rs.parts[0];
      for (auto [f, i] : vecs(q)) per.push_back(int64_t(f ? f->size() : i->size()) / q.rows);
    }
    int64_t width = wpr;
    for (int64_t v : per) width += v;
    std::vector<uint32_t> rec(size_t((hi - lo) * width));
    int64_t r0 = 0;
    for (QuantizedLinear& q : rs.parts) {
      auto vs = vecs(q);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < q.rows; ++i) {
        uint32_t* o = rec.data() + (r0 + i) * width;
        std::copy(q.packed.begin() + i * wpr, q.packed.begin() + (i + 1) * wpr, o);
        o += wpr;
        for (size_t v = 0; v < vs.size(); ++v)
          for (int64_t g = 0; g < per[v]; ++g) {
            const size_t at = size_t(g * q.rows + i);
            *o++ = vs[v].first ? std::bit_cast<uint32_t>((*vs[v].first)[at]) : uint32_t((*vs[v].second)[at]);
          }
      }
      r0 += q.rows;
    }
    cuda::DeviceBuffer<float> Wq(size_t(R * cols), "quantized weights (all ranks)");
    cuda::DeviceBuffer<uint32_t> recs(size_t(R * width), "codes (all ranks)");
    cuda::copy_device(Wq.get() + lo * cols, rs.Wq.get(), size_t((hi - lo) * cols) * 4);
    cuda::copy_to_device(recs.get() + lo * width, rec.data(), rec.size() * 4);
    std::vector<size_t> wq_off, rec_off;
    for (int q = 0; q <= N; ++q) {
      wq_off.push_back(size_t(first_row(q) * cols) * 4);
      rec_off.push_back(size_t(first_row(q) * width) * 4);
    }
    comm_->share(Wq.get(), wq_off);
    comm_->share(recs.get(), rec_off);
    rec.resize(size_t(R * width));
    cuda::copy_to_host(rec.data(), recs.get(), rec.size() * 4);
    std::vector<SolvedLinear> out;
    for (size_t j = 0; j < p.jobs.size(); ++j) {
      const LinearJob& job = p.jobs[j];
      SolvedLinear s;
      s.id = job.id;
      s.rows = start[j + 1] - start[j];
      s.cols = cols;
      QuantizedLinear& q = s.q;
      q.spec = q0.spec;
      q.rows = s.rows;
      q.cols = cols;
      q.groups = q0.groups;
      q.g_idx = q0.g_idx;   // one Hessian, one spec: one column order for every piece
      q.packed.resize(size_t(q.rows * wpr));
      auto vs = vecs(q);
      for (size_t v = 0; v < vs.size(); ++v) {
        if (vs[v].first) vs[v].first->resize(size_t(per[v] * q.rows));
        else vs[v].second->resize(size_t(per[v] * q.rows));
      }
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < q.rows; ++i) {
        const uint32_t* o = rec.data() + (start[j] + i) * width;
        std::copy(o, o + wpr, q.packed.begin() + i * wpr);
        o += wpr;
        for (size_t v = 0; v < vs.size(); ++v)
          for (int64_t g = 0; g < per[v]; ++g, ++o) {
            const size_t at = size_t(g * q.rows + i);
            if (vs[v].first) (*vs[v].first)[at] = std::bit_cast<float>(*o);
            else (*vs[v].second)[at] = int32_t(*o);
          }
      }
      s.stats = st[0];
      s.loss = loss[2 * j];
      s.rtn_loss = loss[2 * j + 1];
      s.seconds = st[0].seconds * double(s.rows) / double(R);
      fw_->set_weight_device(job.id, Wq.get() + start[j] * cols);   // the next stage reads the quantized weights
      w[job.id].W = MatF();
      out.push_back(std::move(s));
      st[0].log.clear();   // said once, for the first module of the problem
    }
    return out;
  }

  // RTN (AWQ's schemes) on the device: W uploaded once for the clipping search (the device's with
  // the GPU forward; the hybrid path keeps the host's, as it keeps its AWQ errors), the grids and
  // codes (rtn_quantize's to the bit), the output error and, with the GPU forward, the next stage's
  // weights; the host receives the codes and grids. (Before, the host rounded, and W or Wq crossed
  // PCIe four times: the search, the loss's two, the forward's upload; lab run 49.)
  template <class HostH>
  SolvedLinear solve_rtn_resident(const LinearJob& j, MatF& W, HessianRef dev, HostH&& host_H, PhaseTimes& t) {
    const QuantSpec& spec = j.spec;
    const int64_t rows = W.rows(), cols = W.cols();
    SolvedLinear s;
    s.id = j.id;
    s.rows = rows;
    s.cols = cols;
    cuda::DeviceBuffer<float> dW(size_t(W.size()), "RTN weights");
    cuda::ResidentRtn r;
    {
      PhaseTimer a(t.phase["solve"]);
      const auto t0 = std::chrono::steady_clock::now();
      cuda::copy_to_device_staged(dW.get(), W.data(), size_t(W.size()) * 4);
      ClipSearch clip;
      if (spec.output_clip) {
        clip = fw_ && cuda::clip_supported(spec) ? cuda::output_clip_limits(dW.get(), rows, cols, dev, spec) : output_clip_limits(W, host_H(), spec);
        s.stats.clip_groups = clip.groups;
        s.stats.clipped_groups = clip.clipped;
      }
      r = cuda::rtn_quantize_cuda(dW.get(), rows, cols, spec, spec.output_clip ? &clip.limits : nullptr);
      s.stats.seconds = s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    {
      PhaseTimer a(t.phase["loss"]);
      std::tie(s.loss, s.rtn_loss) = cuda::output_errors(dW.get(), r.Wq.get(), nullptr, rows, cols, dev);   // fp64, as output_error on the CPU
    }
    s.q = std::move(r.q);
    if (fw_) {
      fw_->set_weight_device(j.id, r.Wq.get());   // the next stage reads the quantized weights
      W = MatF();
    } else {
      W = s.q.dequantize();   // the host forward's
    }
    return s;
  }

  // One Linear on its own: RTN, specs the fused kernel refuses, or a host Hessian (statistics).
  template <class HostH>
  SolvedLinear solve_apart(const LinearJob& j, MatF& W, HessianRef dev, HostH&& host_H, PhaseTimes& t) {
    const QuantSpec& spec = j.spec;
    const bool gptq = spec.method == "gptq";
    if (!dev.sum && !on_gpu(spec)) return solve_on_host(j, W, host_H(), t);
    if (!gptq && dev.sum && cuda::rtn_supported(spec)) return solve_rtn_resident(j, W, dev, host_H, t);
    SolveStats st;
    QuantizedLinear q, rtn;
    // GPTQ on the GPU of W (from the host) against H; limits: AWQ's clipping's
    auto gpu_gptq = [&](HessianRef H, const std::vector<float>* limits) {
      cuda::WeightRows rows;
      rows.rows = W.rows();
      rows.host = &W;
      return std::move(cuda::gptq_solve_cuda({rows}, W.cols(), H, spec, cuda::SolveKeep::codes, &st, limits).parts[0]);
    };
    {
      PhaseTimer a(t.phase["solve"]);
      if (on_gpu(spec)) {   // the host H, uploaded (already scaled)
        const MatD& H = host_H();
        cuda::DeviceBuffer<double> dH(size_t(H.size()), "Hessian");
        cuda::copy_to_device(dH.get(), H.data(), size_t(H.size()) * 8);
        q = gpu_gptq(HessianRef{dH.get(), 1.0}, nullptr);
        rtn = rtn_quantize(W, spec);
      } else if (gptq && spec.output_clip && dev.sum && cuda::gptq_supported(spec, nullptr)) {
        // AWQ's clipping: with the GPU forward the search on the device's H (no fp64 copy of it to
        // the host); the hybrid path keeps the host's search, as it keeps its AWQ errors. Then
        // GPTQ on the GPU with the static grids the limits fix (RTN's baseline too).
        const ClipSearch clip = fw_ && cuda::clip_supported(spec) ? cuda::output_clip_limits(W, dev, spec) : output_clip_limits(W, host_H(), spec);
        q = gpu_gptq(dev, &clip.limits);
        rtn = rtn_quantize(W, spec, &clip.limits);
        st.clip_groups = clip.groups;
        st.clipped_groups = clip.clipped;
      } else if (gptq || spec.output_clip) {
        q = quantize_on_host(W, host_H(), spec, st, gptq ? &rtn : nullptr);
      } else {
        q = rtn_quantize(W, spec);
      }
    }
    return finish_apart(j, std::move(q), rtn, st, W, [&](const MatF& W0, const MatF& Wq, const MatF* Wr) {
      if (dev.sum) return cuda::output_errors(W0, Wq, Wr, dev);   // fp64 on the device (cuBLAS DGEMM), as output_error on the CPU
      return host_output_errors(W0, Wq, Wr, host_H(), gptq, st);
    }, t);
  }
};

// Activations on the device when they fit beside what the rest needs there: the layer's 16-bit
// weights, the largest solve (its Hessian sum and factor in fp64, four fp32 copies of the stacked
// weights) and 2 GiB of chunk buffers and slack; else in page-locked host memory.
bool activations_spill(const Recipe& r, const LlamaConfig& c, int S, int T) {
  double other = double(c.params_per_layer()) * 2 + double(2u << 30), largest = 0;
  for (const LinearGroup& g : layer_schedule(c, 0, r.moe_calibrate_all_experts).groups) {
    const int64_t n = linear_shape(c, g.linears[0]).in;
    int64_t rows = 0;
    for (LinearId p : g.linears) rows += linear_shape(c, p).out;
    largest = std::max(largest, 16.0 * double(n * n) + 16.0 * double(rows * n));
  }
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
  return spill;
}

}  // namespace

Device select_cuda_device(const Recipe& r) {
  Device d{false, true, "cpu"};
  d.cuda = r.device != "cpu" && cuda::available();
  if (r.device == "cuda" && !d.cuda) fail(Errc::usage, r.source, "device", "cuda requested, but " + cuda::describe());
  if (d.cuda) d.description = "cuda: " + cuda::describe();
  return d;
}

double cuda_peak_mb() { return double(cuda::pool_peak_bytes()) / (1 << 20); }

Backend make_cuda_backend(const Device&, const Recipe& r, const CalibrationPass& pass, MatF&& X, PhaseTimes& t) {
  const LlamaConfig& c = *pass.config;
  // The forward on the GPU (true-sequential GPTQ/RTN, weight-only), or why not.
  std::string why;
  if (r.quant.method == "nf4") why = "data-free";
  else if (!r.true_sequential) why = "true_sequential: false";
  else if (pass.saved) why = "statistics loaded";
  else if (!r.gpu_forward) why = "gpu_forward: false in the recipe";
  else cuda::forward_supported(c, pass.T, &why);
  bool spill = false;
  if (why.empty()) {
    PhaseTimer a(t.phase["upload"]), u(t.upload["activations"]);
    spill = activations_spill(r, c, pass.S, pass.T);
    if (spill && c.moe != MoeRouting::none) why = "MoE layers need the calibration activations on the GPU, and they do not fit there (or gpu_activations: host)";
  }
  Backend b;
  if (why.empty()) {
    std::unique_ptr<CudaForward> fw;
    {
      PhaseTimer a(t.phase["upload"]), u(t.upload["activations"]);
      fw = std::make_unique<CudaForward>(pass, std::move(X), spill, r.act_mode != ActQuant::none, t);
    }
    const DType fdt = fw->device().dtype();
    b.solver = std::make_unique<CudaSolver>(&fw->device(), c.dtype, pass.comm);
    b.forward = std::move(fw);
    b.forward_description = std::string("cuda (") + (fdt == DType::F16 ? "f16" : "bf16") + " GEMMs, fp32 accumulation and residual" +
                            (spill ? "; activations in page-locked host memory" : "") + ")";
    if (r.act_mode != ActQuant::none)
      b.forward_description += std::string("; W8A8 Linears' inputs quantized to int8 ") + (r.act_mode == ActQuant::per_token ? "per token" : "per tensor") +
                               " before their GEMMs";
    if (r.smooth.enabled) {
      b.alpha_errors = cuda::smoothed_errors;
      b.forward_description += "; SmoothQuant's statistics from the 16-bit activations, its alpha search on the GPU (int8 GEMM)";
    }
    // AWQ's search on the GPU: X and W uploaded once a search, each candidate's RTN error dW formed
    // there and X · dWᵀ scored with bf16 operands on the tensor cores (cuda::awq_scorer; fp32
    // accumulation and fp64 sums; PTQKIT_AWQ_BF16=0: by cuBLAS SGEMM, within 1e-9 of the host's
    // product form on a llama2-7b layer, lab 2026-12-05-awq-clip). The hybrid path (CPU forward)
    // keeps the host's, so that its run picks device cpu's ratios exactly (tests/test_smoothquant_cuda.cpp).
    if (r.awq.enabled) {
      const bool bf16 = env_switch("PTQKIT_AWQ_BF16", true);
      b.awq_scorer = cuda::awq_scorer(bf16 ? cuda::AwqProduct::bf16 : cuda::AwqProduct::fp32);
      b.forward_description += std::string("; AWQ's statistics from the 16-bit activations, its search on the GPU (each candidate's RTN error, ") +
                               (bf16 ? "X · dWᵀ in bf16 on the tensor cores" : "X · dWᵀ by cuBLAS SGEMM") + ", fp64 sums)";
    }
    if (pass.comm) {
      b.forward_description += "; data-parallel over " + std::to_string(pass.comm->size()) + " GPUs (NCCL " + cuda::nccl_version() +
                               ", one process each, fp64 Hessian all-reduce)";
      if (pass.comm->size() > 1) b.ranks_agree = [comm = pass.comm](uint64_t d) { return comm->same(d); };
    }
    return b;
  }
  // Hessians on the GPU: the forward still runs on the CPU in fp32, so the GPU accumulates the same
  // fp32 activations (SGEMM, fp64 sums) rather than rounding them to 16 bits for the tensor cores.
  // Its SmoothQuant and W8A8 statistics are this rank's rows only: refused over several ranks.
  if (pass.comm && pass.comm->size() > 1 && (r.smooth.enabled || r.awq.enabled || r.act_mode != ActQuant::none))
    fail(Errc::usage, r.source, "gpus", "--gpus " + std::to_string(pass.comm->size()) +
                                            ": SmoothQuant and W8A8 statistics are combined across GPUs only by the GPU forward, and this run's forward is on the CPU (" +
                                            why + ")");
  if (pass.saved) b.forward = saved_statistics_forward(pass);
  else
    b.forward = cpu_forward(pass, std::move(X), r.true_sequential,
                            [comm = pass.comm](int64_t cols) { return std::make_unique<cuda::HessianCuda>(cols, DType::F32, comm); }, t);
  b.solver = std::make_unique<CudaSolver>(nullptr, c.dtype);
  b.forward_description = "cpu (fp32), Hessians on the GPU: " + why;
  if (r.smooth.enabled) {   // the alpha search's W8A8 products on the GPU too (int8 GEMM, exact int32 sums)
    b.alpha_errors = cuda::smoothed_errors;
    b.forward_description += "; SmoothQuant's alpha search on the GPU (int8 GEMM)";
  }

  if (pass.comm) {
    b.forward_description += "; data-parallel over " + std::to_string(pass.comm->size()) + " processes (NCCL " + cuda::nccl_version() + ")";
    if (pass.comm->size() > 1) b.ranks_agree = [comm = pass.comm](uint64_t d) { return comm->same(d); };
  }
  return b;
}

}  // namespace ptq
