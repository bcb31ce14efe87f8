// decode_cuda.h — token-by-token decoding on the GPU with a KV cache: the engine behind
// `ptqkit generate --device cuda` and `ptqkit bench decode`. The CPU reference is
// model/generate.h; greedy tokens of the two agree (tests/test_pipeline_cuda.cpp).
//
// Precision (as lib/model/forward_cuda.h): the residual stream is fp32; every Linear takes its
// input in the 16-bit dtype and returns fp32 (LinearFn: cuBLAS GemmEx or a packed-weight kernel,
// fp32 accumulation); the KV cache holds keys (after rotary) and values in the 16-bit dtype;
// RMSNorm, rotary, scores and softmax are fp32 (the attention of 2+ sequences rounds P to 16 bits
// for its P·V product on tensor cores: model/attention_cuda.h decode_attention).
//
// A step for B sequences of T new tokens (prefill: T = prompt length; decode: T = 1), all on the
// device, each layer: rmsnorm -> q, k, v -> head norms, rotary, KV append -> attention over the
// cache (a prompt fed from position 0, head sizes 64, 96, 128: flash attention over its own rows)
// -> X += o(ctx) -> rmsnorm -> silu(gate) * up -> X += down(act). The position is read from
// device memory by every kernel, so a step does not depend on host state.
// Serves every family ptqkit reads; a layer's q, k, v (gate, up) run as one Linear where the weights
// give one (DecodeLayer::qkv, gate_up). MoE layers route on the host: each step copies the
// residual rows there, and the CPU reference's own rmsnorm and router (model/llama.h route, fp32)
// pick the experts — the same choices as the CPU for the same residual — then the chosen experts'
// Linears run on the device for the rows routed to them and are added into the residual in expert
// order. That host round trip per MoE layer rules out CUDA graphs there: such models decode with
// plain launches.
#pragma once
#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/forward_cuda.h"
#include "model/llama.h"

namespace ptq::cuda {

using LinearFn = LayerForwardCuda::LinearFn;   // y fp32 [rows, out] = x (dt) [rows, in] · Wᵀ + beta · y

// A W8A8 Linear's product on its input already quantized: xq [rows, in] int8, sx [rows] fp32, as
// `act` quantizes x (kernels/act_quant.h). Where every Linear that reads a norm's output (q, k, v;
// gate, up), or the down projection, has this form with one spec, the decode quantizes in the
// kernel that produces its input (RMSNorm or silu·mul and the quantizer in one launch: the same
// codes as the two kernels, one launch a Linear input fewer); else it calls the LinearFn, which
// quantizes x itself.
struct Int8Linear {
  ActQuant act;
  std::function<void(const int8_t* xq, const float* sx, int64_t rows, float* y, float beta)> fn;
  explicit operator bool() const { return bool(fn); }
};

struct DecodeLayer {
  std::array<LinearFn, 7> lin;           // q, k, v, o, gate, up, down (kAllProj order); q, k, v empty where qkv
                                         // is set, gate, up where gate_up is
  LinearFn qkv, gate_up;                 // stacked: out rows q, k, v (gate, up) in order, as Phi-3 stores them
  std::array<Int8Linear, 7> lin8;        // the same Linears' int8-input form where they are W8A8 (else empty)
  Int8Linear qkv8, gate_up8;
  VecF in_norm, post_norm, q_norm, k_norm;   // q_norm, k_norm: Qwen3's per-head norms, else empty
  std::array<VecF, 3> qkv_bias;          // empty where none
  // MoE layers: the router (W [experts, hidden], fp32 on the host, as the CPU reference routes) and
  // each expert's gate, up, down.
  Linear router;
  std::vector<std::array<LinearFn, 3>> experts;
};

struct DecodeWeights {
  LlamaConfig c;
  DType dt = DType::F16;                 // the Linears' input dtype (F16 or BF16)
  std::vector<DecodeLayer> layers;
  VecF final_norm;
  const void* lm_head = nullptr;         // [vocab, hidden] in dt, device
  const void* embed = nullptr;           // [vocab, hidden] in dt, device
  std::vector<std::shared_ptr<void>> owners;   // keep the device weights the functions use alive
  double step_weight_bytes = 0;          // weight bytes one step reads (Linears, lm_head, norms)
  // One layer's Linears' bytes by stage, in step order: q, k, v (or the stacked qkv); o; gate, up
  // (or gate_up); down. Synthetic weights only (bench decode's chain floor); empty otherwise.
  std::array<std::vector<double>, 4> layer_linear_bytes;
  std::string what;                      // what runs the Linears
};

bool decode_supported(const LlamaConfig& c, std::string* why);

class DecodeCuda {
 public:
  DecodeCuda(DecodeWeights w, int batch, int max_len);
  ~DecodeCuda();
  int batch() const;
  int position() const;                  // tokens in the cache (every sequence alike)
  void reset();
  // tokens [batch, T] row-major at the current positions; afterwards logits() holds each
  // sequence's last position's logits. At T = 1, once a one-token step has run plainly, the step
  // is captured as a CUDA graph and replayed (generate's loop; unless set_graphs(false)).
  void feed(const std::vector<int32_t>& tokens, int T);
  MatF logits() const;                   // [batch, vocab] to the host
  // Greedy decoding for a host loop (generate): each sequence's argmax of the last logits (lowest
  // id on ties, as sample_token), chosen on the device; returns them [batch]. With `then_feed` they
  // are also fed at once from the device, as feed(tokens, 1) would (graph and all), and that step
  // is launched, not waited for: the caller's work on the tokens overlaps it. Only the tokens
  // cross to the host, not the logits.
  std::vector<int32_t> next_greedy(bool then_feed);
  // n greedy steps from the last logits, each sequence's argmax fed back on the device (no host
  // round trip); returns the tokens [n, batch].
  // Steps after the first run as one CUDA graph, replayed (unless set_graphs(false)).
  std::vector<int32_t> decode_greedy(int n);
  void set_graphs(bool on);
  size_t graph_held_bytes() const;       // pool blocks feed's graph keeps for its kernels' workspaces (0: none, or no graph)
  bool graph_used() const;               // whether the last decode_greedy, feed or next_greedy's feed replayed a graph
  // From 17 rows the norm and silu·mul kernels also write their output in the wgmma A16 kernel's
  // k-step order for the Linears after them (on by default; PTQKIT_DECODE_XPERM=0 turns it off).
  void set_permuted_x(bool on);
  bool permuted_x_used() const;          // whether a Linear has read it since construction
  // At 2+ rows the stacked q, k, v Linear writes q and the cache rows rotated where its kernel does
  // (a16_fold_rope; on by default; PTQKIT_DECODE_ROPE_FOLD=0 turns it off with the batch-1 fold).
  void set_rope_in_linear(bool on);
  bool rope_in_linear_used() const;      // whether a Linear has done so since construction
  // Whether a Linear at 17..32 rows has read a norm split with the Linear before it (the norm's
  // sums of squares from its writer, PTQKIT_DECODE_NORM_SPLIT) since construction.
  bool norm_split_rows_used() const;
  const DecodeWeights& weights() const;
 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

// Weights of a synthetic model with `c`'s shapes for `format` (f16, w8a16, w4a16 (g128), nf4,
// w8a8): random codes, one layer's device buffers cloned into each layer (distinct memory);
// q, k, v and gate, up stacked into one Linear each unless `stacked` is false.
DecodeWeights synthetic_decode_weights(const LlamaConfig& c, const std::string& format, bool stacked = true);

}  // namespace ptq::cuda
