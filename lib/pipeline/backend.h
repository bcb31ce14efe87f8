// backend.h — what the quantization pipeline asks of the machine, chosen once per run
// (backend.cpp, the one file of lib/pipeline that knows whether CUDA was built):
//
//   LayerForward  the calibration forward of one decoder layer over every window, stage by stage
//                 in the layer schedule's order, producing each group's Hessian: on the CPU (fp32,
//                 the reference), on the GPU (16-bit GEMMs, activations resident), as one float
//                 pass before any solve (true_sequential: false), or replayed from saved statistics.
//   GroupSolver   quantizes the Linears of one group from their shared Hessian: on the CPU, or on
//                 the GPU (one stacked solve, weights left on the device for the next stage).
//
// Every implementation computes what its reference computes (backend_cpu.cpp): the GPU ones are
// compared against it in the GPU tests (tests/test_*_cuda.cpp), the CPU ones byte for byte against earlier trees
// (tests/baselines/output-hashes.txt).
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gptq/gptq.h"
#include "model/llama.h"
#include "model/schedule.h"
#include "pipeline/recipe.h"
#include "smoothquant/awq.h"
#include "smoothquant/smoothquant.h"

namespace ptq {

namespace cuda { class Comm; }

// Seconds by phase, for report.json: `phase` adds up to the run; `solve` and `upload` split two
// of its entries.
struct PhaseTimes {
  std::map<std::string, double> phase, solve, upload;
};
// Adds the time of a scope to a named phase.
struct PhaseTimer {
  double& acc;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  explicit PhaseTimer(double& a) : acc(a) {}
  ~PhaseTimer() { acc += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

// SmoothQuant's hook between a norm stage and its Hessian. Given the statistics of the group's
// unsmoothed input (its per-channel max |x| over every calibration row, and its rows, or the
// evenly strided subset of at most kSmoothRows of them that the search takes), it chooses the
// factors, folds them into the norm and the group's weights (in the LayerWeights the forward got
// at begin_layer) and returns the norm's new weights; the forward then computes the norm again.
using Smoother = std::function<const VecF&(const VecF& absmax, const MatF& rows)>;
constexpr int64_t kSmoothRows = 4096;

class LayerForward {
 public:
  virtual ~LayerForward() = default;
  // The loading thread's work on layer `layer`'s float weights before begin_layer (the GPU
  // forward rounds them to 16 bits into a page-locked buffer there).
  virtual void prepare(const LayerWeights& w, int layer) {}
  // w: the layer's float weights; the solver replaces the quantized Linears in it.
  virtual void begin_layer(int layer, LayerWeights& w) = 0;
  // Runs the layer up to group g's input and returns g's Hessian. `smooth` (only where
  // takes_smoother()) runs before the Hessian sees the input.
  virtual std::unique_ptr<HessianSum> collect(const LinearGroup& g, const Smoother& smooth) = 0;
  // max |x| over the last collected group's input (W8A8's static scales), or -1 where the forward
  // has none (saved statistics).
  virtual float group_input_absmax() const { return -1.0f; }
  // Group g's Linears `done` are quantized; those in w still hold their weights (the others the
  // solver left on the device), and w[p].act says how each takes its input from here on (W8A8).
  virtual void quantized(const std::vector<LinearId>& done, const LayerWeights& w) {}
  // MoE layers: the calibration rows the router sent to `expert` in the current layer (after the
  // norm2 stage), or -1 where the forward does not route (saved statistics).
  virtual int64_t routed_tokens(int expert) const { return -1; }
  // AWQ's Linear-to-Linear pairs (model/schedule.h's ScaleSource): group g's input as the layer's
  // weights now compute it — before the Linears that produce it are quantized — for statistics
  // only (no Hessian): every row's column maxima and the evenly strided subset of at most
  // kSmoothRows rows (with --gpus N, every rank's). The forward is left as it was: collect(g)
  // computes the input again. Where sample_inputs() is false the pairs are not searched.
  virtual bool sample_inputs() const { return false; }
  virtual std::pair<VecF, MatF> sample(const LinearGroup& g) { return {}; }
  // Linears whose float weights (and biases) the pipeline changed in w since begin_layer (AWQ's
  // folds into a source Linear and its consumer): the forward reads them from here on.
  virtual void reload(const std::vector<LinearId>& ids, const LayerWeights& w) {}
  virtual void end_layer() = 0;                    // the residual stream <- the layer's output
  virtual void replay_layer(LayerWeights& w) = 0;  // the same for a finished layer (resume)
  virtual bool takes_smoother() const { return false; }   // collect runs SmoothQuant's hook
};

// One Linear of a group, as the recipe quantizes it.
struct LinearJob {
  LinearId id;
  std::string name;   // "model.layers.3.self_attn.q_proj"
  QuantSpec spec;
};
// Its result: the codes, the report's numbers, and where its quantized weights are.
struct SolvedLinear {
  LinearId id;
  QuantizedLinear q;
  SolveStats stats;
  int64_t rows = 0, cols = 0;
  double loss = 0, rtn_loss = 0, seconds = 0;
};

// A group's jobs and Hessian, as solve() takes them.
struct GroupToSolve {
  const std::vector<LinearJob>* jobs = nullptr;
  HessianSum* H = nullptr;
  const MatD* H_host = nullptr;
};

class GroupSolver {
 public:
  virtual ~GroupSolver() = default;
  // Quantizes `jobs` (one group's Linears, all reading the input whose Hessian is H). `H_host`:
  // H already finalized on the host (saved or to be saved statistics: the solve must use exactly
  // it), else null. Each w[p].W becomes the dequantized weights, or is emptied where the solver
  // left them on the device for the forward. Results in quantization order.
  virtual std::vector<SolvedLinear> solve(const std::vector<LinearJob>& jobs, LayerWeights& w, HessianSum& H, const MatD* H_host,
                                          PhaseTimes& t) = 0;
  // Groups whose Hessians were all collected before any is solved (inputs that do not depend on
  // each other's results: an MoE layer's expert downs), solved together where the solver batches
  // them. Results per group, each as solve() gives it.
  virtual std::vector<std::vector<SolvedLinear>> solve_many(const std::vector<GroupToSolve>& groups, LayerWeights& w, PhaseTimes& t) {
    std::vector<std::vector<SolvedLinear>> out;
    for (const GroupToSolve& g : groups) out.push_back(solve(*g.jobs, w, *g.H, g.H_host, t));
    return out;
  }
  // The bytes of fp64 Hessians (cols^2 x 8 each) that solve_many takes at once; 0: one at a time.
  virtual int64_t batch_bytes() const { return 0; }
};

// The device a run uses, decided before anything is read (recipe `device`: auto, cpu, cuda).
struct Device {
  bool cuda = false;         // GPU Hessians and solves (and, where it serves, the GPU forward)
  bool cuda_built = false;   // this build has CUDA (report.json then has peak_gpu_mb)
  std::string description;   // report.json's "device"
  double peak_gpu_mb() const;
};
Device select_device(const Recipe& r);

// What the forward runs on: S windows of T tokens, embeddings X (taken: the forward owns the
// residual stream from here).
struct LayerStats;
struct CalibrationPass {
  const LlamaConfig* config = nullptr;
  const Rope* rope = nullptr;
  int S = 0, T = 0;
  // MoE (recipe moe.calibrate_all_experts): every expert's Hessians from every calibration row
  // (true), or from the rows routed to it only; the layer's output uses the routed experts either way.
  bool calibrate_all_experts = true;
  // --load-stats: no forward at all; each group's Hessian is taken from *saved (the current
  // layer's statistics, loaded by the pipeline) and errors name `saved_path`.
  LayerStats* saved = nullptr;
  std::string saved_path;
  // quantize --gpus N (pipeline/distributed.h): this process's share of the windows runs here
  // (rank_windows(S_all, ...)), each Hessian (and MoE routing count) is summed across the ranks
  // before anything reads it, and SmoothQuant's and W8A8's statistics are every rank's.
  const cuda::Comm* comm = nullptr;
  int S_all = 0;   // every rank's windows (with comm; S is this rank's)
};
// Rank k of n runs windows [S k / n, S (k + 1) / n).
inline std::pair<int64_t, int64_t> rank_windows(int64_t S, int k, int n) { return {S * k / n, S * (k + 1) / n}; }
struct Backend {
  std::unique_ptr<LayerForward> forward;
  std::unique_ptr<GroupSolver> solver;
  std::string forward_description;   // report.json's "forward": where it runs, in what precision, and why
  // SmoothQuant's alpha search: the W8A8 errors of each candidate alpha, on the host (the
  // reference) or on the GPU (cuda::smoothed_errors) where the run has one.
  AlphaErrors alpha_errors = smoothed_errors;
  // AWQ's search: each candidate's output error; unset: the host's (search_awq picks the product
  // or the Gram form); cuda::awq_scorer (X, W and each candidate's dW on the GPU) where the forward
  // runs there.
  AwqScorer awq_scorer;
  // --gpus N: whether every rank holds the same digest of a group's codes (solved there or received
  // from the rank that solved them; a difference would mean the ranks' models differ from here on).
  // Unset: one rank.
  std::function<bool(uint64_t)> ranks_agree;
};
Backend make_backend(const Device& dev, const Recipe& r, const CalibrationPass& pass, MatF&& X, PhaseTimes& t);
// The GPU's half of the factory (backend_cuda.cpp, built with CUDA only).
Device select_cuda_device(const Recipe& r);
Backend make_cuda_backend(const Device& dev, const Recipe& r, const CalibrationPass& pass, MatF&& X, PhaseTimes& t);
double cuda_peak_mb();

// The CPU implementations (backend_cpu.cpp), which the GPU backend also falls back to.
// `make_hessian` gives each group's accumulator (on the GPU where the run has one).
using HessianFactory = std::function<std::unique_ptr<HessianSum>(int64_t cols)>;
std::unique_ptr<LayerForward> cpu_forward(const CalibrationPass& pass, MatF&& X, bool true_sequential, HessianFactory make_hessian,
                                          PhaseTimes& t);
std::unique_ptr<LayerForward> saved_statistics_forward(const CalibrationPass& pass);
std::unique_ptr<GroupSolver> cpu_solver();
// One Linear solved on the host from the finalized H (GPTQ or RTN), with the report's losses.
SolvedLinear solve_on_host(const LinearJob& job, MatF& W, const MatD& H, PhaseTimes& t);
// Its codes: GPTQ's or RTN's, and in GPTQ runs RTN's too (*rtn, the report's baseline), both on
// the grids AWQ's clipping search fixes where spec.output_clip (gptq/clip.h; counted in st).
QuantizedLinear quantize_on_host(const MatF& W, const MatD& H, const QuantSpec& spec, SolveStats& st, QuantizedLinear* rtn);
// The end of a Linear solved on its own: the report's losses of GPTQ's weights and (GPTQ runs)
// RTN's, by `losses(W, Wq, Wr or null)`, then W replaced by the dequantized weights.
using LossFn = std::function<std::pair<double, double>(const MatF& W, const MatF& Wq, const MatF* Wr)>;
SolvedLinear finish_apart(const LinearJob& job, QuantizedLinear q, const QuantizedLinear& rtn, const SolveStats& stats, MatF& W,
                          const LossFn& losses, PhaseTimes& t);

}  // namespace ptq
