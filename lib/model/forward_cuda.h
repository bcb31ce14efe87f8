// forward_cuda.h — the calibration forward pass of one decoder layer on the GPU, stage by stage
// in the order of the layer schedule (model/schedule.h), with the activations resident on the device.
//
// Precision (docs/numerics.md): the residual stream X stays fp32, as in the CPU reference; every
// GEMM operand (normalized activations, attention context, MLP activation, weights, Q/K/V, the
// softmax probabilities) is in the model's 16-bit dtype and every product is accumulated in fp32
// (cuBLAS GemmEx, CUBLAS_COMPUTE_32F); RMSNorm statistics, rotary, attention scores and softmax
// are fp32. The Hessians are accumulated from the same 16-bit activations the GEMMs consume.
// Memory: X (fp32 [S*T, d]), one 16-bit stage buffer [S*T, max(q_dim, ffn)], the layer's 16-bit
// weights, and chunk buffers of kChunkTokens tokens. With `spill`, X and the stage buffer live in
// page-locked host memory instead and every stage copies its chunks in and out over PCIe (each
// copy in stream order with the kernels): slower, for calibration sets the GPU cannot hold.
#pragma once
#include <functional>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda/comm.h"
#include "cuda/runtime.h"
#include "model/llama.h"
#include "model/schedule.h"

namespace ptq::cuda {

// Whether the GPU forward serves this model at this window length (else the pipeline runs the
// CPU forward and accumulates the Hessians on the GPU).
bool forward_supported(const LlamaConfig& c, int seq_len, std::string* why);

// The MoE row moves, on the thread's current stream (device pointers): out[i] = x[rows[i]] for n
// 16-bit rows of d (an expert's routed rows gathered), and X[rows[i]] += w[i] * y[i] for n fp32
// rows (its output weighted back; one expert's rows are distinct). The forward's and the decode's.
void gather_rows16(const void* x, const int32_t* rows, int64_t n, int d, void* out);
void scatter_add_rows(const float* y, const int32_t* rows, const float* w, int64_t n, int d, float* X);

// Bytes of X and the stage buffer (what `spill` moves to the host).
size_t activation_bytes(const LlamaConfig& c, int samples, int seq_len);

class LayerForwardCuda {
 public:
  // `dtype`: F16 or BF16 (the model's; F32 models compute in BF16).
  LayerForwardCuda(const LlamaConfig& c, const Rope& rope, int samples, int seq_len, DType dtype, bool spill = false);
  ~LayerForwardCuda();
  DType dtype() const;
  bool spilled() const;                     // the activations are in page-locked host memory
  void set_input(const MatF& X);            // the embeddings [S*T, d] (host fp32)
  MatF input() const;                       // the residual stream, to the host (tests)
  void load_layer(const LayerWeights& w, const void* converted = nullptr);   // norms, biases, and the seven weights in 16 bits
  // The seven weights in dtype(), one after another in kAllProj order (what load_layer takes as
  // `converted`, from page-locked memory): the conversion can run in another thread. (Phi-3's
  // fused qkv and gate_up rows are those of q, k, v and gate, up in that order: the same bytes.)
  size_t weight_bytes() const;
  void convert_weights(const LayerWeights& w, void* dst) const;
  // Fused Linears (Phi-3's qkv, gate_up) are given whole and kept as their parts.
  // Experts' Linears are LinearId(gate | up | down, expert).
  void set_weight(LinearId id, const MatF& W);   // e.g. the quantized weights, dequantized
  void set_weight_device(LinearId id, const float* W);   // the same from fp32 device memory [out, in]
  const void* weight(LinearId id) const;    // the 16-bit device weights [out, in], in dtype() (not fused ones)
  // Whether Linear id's device weights are those load_layer put there (the checkpoint's, rounded to
  // dtype()): false after set_weight or set_weight_device replaced them (SmoothQuant's smoothed
  // weights, quantized ones). Experts: always true.
  bool holds_model_weights(LinearId id) const;
  // Linear p computed by f instead of the 16-bit weights (a packed-weight kernel):
  // y [rows, out] fp32 (device) = x [rows, in] (dtype(), device) · Wᵀ + beta · y. Empty f: the weights again.
  // A fused Linear (Proj::qkv, Proj::gate_up) is served whole, its output split into its parts.
  using LinearFn = std::function<void(const void* x, int64_t rows, float* y, float beta)>;
  void set_linear(Proj p, LinearFn f);
  void set_expert_linear(LinearId id, LinearFn f);   // an expert's gate, up or down (MoE evaluation)
  void set_router(const MatF& W);                    // a MoE layer's router [experts, hidden], rounded to 16 bits
  void set_norms(const VecF& input_layernorm, const VecF& post_attention_layernorm);
  void set_head_norms(const VecF& q_norm, const VecF& k_norm);   // Qwen3's per-head q/k norms [head_dim]
  void set_bias(Proj p, const VecF& b);     // empty: none
  // out [S*T, vocab] fp32 (device) = rmsnorm(X, final_norm) · lm_headᵀ (lm_head [vocab, d] in dtype()).
  void logits(const VecF& final_norm, const void* lm_head, int64_t vocab, float* out);
  // W8A8: Linear p's input quantized to int8 before its GEMM (per token: scale max |x| / 127 of
  // each row; per tensor: act.static_scale; a zero scale taken as 1), y = s_x · (q_x · Wᵀ) with the
  // codes exact in 16 bits and fp32 sums; act.mode none turns it off. load_layer turns every
  // Linear's off; a fused Linear (Proj::qkv, Proj::gate_up) sets its parts; experts' Linears are
  // LinearId(gate | up | down, expert).
  void set_act_quant(LinearId id, const ActQuant& act);
  // Stage norm1's or norm2's norm computed again from X with the current norm weights (after
  // SmoothQuant folded factors into them), handed to `sink`; X is unchanged.
  void renorm(Stage s, DeviceRowSink* sink);
  // Stages; each hands its output (the next Linears' input) to `sink` when given (a Hessian).
  void norm1(DeviceRowSink* sink);          // xn = rmsnorm1(X)
  void attention(DeviceRowSink* sink);      // ctx = attn(q, k, v of rmsnorm1(X))
  void o_proj_norm2(DeviceRowSink* sink);   // X += ctx Wo^T (+b); xn2 = rmsnorm2(X)
  void mlp(DeviceRowSink* sink);            // act = silu(xn2 Wg^T) * (xn2 Wu^T)
  void down_proj();                         // X += act Wd^T (MoE: the last expert's output)
  // MoE layers (every layer sparse, activations resident). expert_in(-1) (every expert, all rows)
  // or expert_in(0) first adds o_proj and computes xn2 = rmsnorm2(X) and the routing (router in
  // 16 bits, fp32 logits); expert_in(e) hands e's input rows to the sink: all rows, or with
  // set_moe_calibration(false) those routed to e. expert_act(e): silu(gate_e) * up_e on the same
  // rows. Each of them first adds the previous expert's output (its quantized weights, the rows
  // routed to it, weighted) to X.
  void set_moe_calibration(bool all_experts);
  void expert_in(int e, DeviceRowSink* sink);
  void expert_act(int e, DeviceRowSink* sink);
  int64_t routed_tokens(int expert) const;  // rows routed to `expert` in the current layer (-1 before routing)
  void stage(Stage s, DeviceRowSink* sink); // the schedule's stage s (the first four above)
  void stage(Stage s, int expert, DeviceRowSink* sink);   // any stage, experts' included
  void layer();                             // all five, no sinks (replaying a finished layer)
  double take_sink_seconds();               // GPU time spent in the sinks since the last call
 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

// A stage's output statistics for SmoothQuant and W8A8, as a sink that passes every row on to
// `next` (a Hessian, or none): the max |x| of each column over all rows, and with sample > 0 the
// rows r · step, step = max(1, total / sample) (total / step of them: subsample_rows' choice), in
// fp32. Rows arrive in order, in chunks, as 16-bit values of `dtype`; they are rows
// [first, first + n) of the `total` rows of every rank (quantize --gpus N: a rank's share of the
// windows), and each sampled row lands at its place among all ranks' samples.
class StageStats final : public DeviceRowSink {
 public:
  StageStats(int64_t cols, DType dtype, DeviceRowSink* next = nullptr, int64_t total = 0, int64_t sample = 0, int64_t first = 0);
  ~StageStats() override;
  void add_device(const void* x, int64_t rows) override;
  // Every rank's statistics on every rank: the maxima by an all-reduce (exact in any order), each
  // rank's sampled rows by one broadcast. firsts: each rank's first row, then `total`.
  void across_ranks(const Comm& comm, const std::vector<int64_t>& firsts);
  VecF column_absmax() const;   // to the host
  MatF sampled_rows() const;    // to the host, [total / step, cols] (this rank's rows only, before across_ranks)
 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

}  // namespace ptq::cuda
