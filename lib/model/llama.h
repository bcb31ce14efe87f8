// llama.h — the Llama-family forward pass on the CPU, in fp32, one decoder layer at a time.
//
// Activations of S sequences of T tokens are row-major [S*T, width] matrices. Weights are loaded
// per layer (f16/bf16 converted to fp32 as they are read) and dropped after use, so resident
// memory is one layer's fp32 weights plus activations, whatever the model size.
// The stage functions below are the vocabulary the calibration pipeline is written in.
#pragma once
#include <Eigen/Core>
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "model/config.h"
#include "model/weights.h"

namespace ptq {


// The roles of a decoder layer's Linears. The dense families have the first seven, in execution
// order; Phi-3 stores q, k, v as one qkv_proj and gate, up as one gate_up_proj; a MoE layer has
// gate, up and down once per expert (LinearId::expert) beside its attention.
enum class Proj { q, k, v, o, gate, up, down, qkv, gate_up };
constexpr int kProjCount = 9;
constexpr std::array<Proj, 7> kAllProj = {Proj::q, Proj::k, Proj::v, Proj::o, Proj::gate, Proj::up, Proj::down};   // the dense seven
const char* proj_name(Proj p);                    // "q_proj", ..., "qkv_proj", "gate_up_proj"
std::string proj_tensor_prefix(int layer, Proj p); // "model.layers.3.self_attn.q_proj"

// One Linear of a layer: its role, and for an expert's Linears (gate, up, down) the expert.
struct LinearId {
  Proj proj = Proj::q;
  int expert = -1;
  LinearId() = default;
  LinearId(Proj p, int e = -1) : proj(p), expert(e) {}   // implicit: a dense Linear is its role
  bool operator==(const LinearId& o) const { return proj == o.proj && expert == o.expert; }
};
// An expert Linear's place within its expert: gate 0, up 1, down 2 (Errc::usage for other roles).
int expert_slot(Proj p);
// Its module name ("model.layers.3.mlp.experts.7.down_proj"; mixtral: block_sparse_moe.experts.7.w2).
std::string linear_name(const LlamaConfig& c, int layer, LinearId id);
// The router of a MoE layer ("model.layers.3.mlp.gate"; mixtral: block_sparse_moe.gate): left in float.
std::string router_name(const LlamaConfig& c, int layer);

struct Linear {
  MatF W;        // [out, in] (for W8A8: the dequantized int8 weights; empty on the integer path)
  VecF b;        // [out] or empty
  ActQuant act;  // W8A8 when act.mode != none
  MatF Wi;       // int8 weight codes [out, in], held as floats (exact): the integer path; empty = fake-quant path
  VecF w_scale;  // [out] per-channel weight scales of Wi
};

// x -> int8 codes (as int32) and per-row scales, per `a`.
void quantize_activations(const MatF& x, const ActQuant& a, MatI& q, VecF& scale);
// The exact int32 sums q · wᵀ of int8 codes held as floats (q [M, K], w [N, K], K < 2^17), by float
// GEMMs over K-chunks short enough that every partial sum is exact (model/llama.cpp).
MatI int8_dot(const MatF& q, const MatF& w);

struct LayerWeights {
  VecF input_layernorm, post_attention_layernorm;
  VecF q_norm, k_norm;   // [head_dim], per-head RMSNorm of q and k (qk_norm models: Qwen3); else empty
  std::array<Linear, kProjCount> proj;   // by role: a family fills the roles its layers have
  Linear router;                         // MoE layers: [experts, hidden], float
  std::vector<std::array<Linear, 3>> experts;   // MoE layers: each expert's gate, up, down
  Linear& operator[](LinearId id);
  const Linear& operator[](LinearId id) const;
  size_t bytes() const;
};

// Rotary tables in the HF layout (rotate_half): cos/sin [max_len, rotary_dim/2], computed in fp64
// (rotary_dim = head_dim but for Phi-3's partial rotary).
struct Rope {
  MatF cos, sin;
};
// The rotary inverse frequencies theta^(-2i/d), i < rotary_dim / 2, with Llama 3.1's
// frequency-dependent scaling applied where the config has it.
std::vector<double> rope_inv_freq(const LlamaConfig& c);
Rope make_rope(const LlamaConfig& c, int max_len);

// ---- stages (all fp32) ----
void rmsnorm(const MatF& x, const VecF& w, float eps, MatF& out);
// y [rows, heads * hd]: each head's hd values RMS-normalized and scaled by w [hd], in place (Qwen3's q/k norms).
void head_rmsnorm(MatF& y, int heads, int hd, const VecF& w, float eps);
void linear(const MatF& x, const Linear& l, MatF& y);                  // y = x W^T + b
// q/k/v projections, rotary, causal GQA softmax attention: returns the input of o_proj [S*T, q_dim].
void attention_core(const LayerWeights& w, const LlamaConfig& c, const Rope& rope, const MatF& xn, int S, int T, MatF& ctx);
// The same for one sequence while generating: xn [T, hidden] holds the tokens at positions
// K.rows() ... K.rows() + T - 1; their keys and values (rotated) are appended to the cache K, V
// [positions, kv_dim], and each attends over every cached position up to its own.
void attention_cached(const LayerWeights& w, const LlamaConfig& c, const Rope& rope, const MatF& xn, MatF& K, MatF& V, MatF& ctx);
// silu(x W_gate^T) * (x W_up^T): the input of down_proj [S*T, ffn] (Phi-3: both halves of gate_up_proj).
void mlp_act(const LayerWeights& w, const MatF& xn, MatF& act);
void swiglu(const Linear& gate, const Linear& up, const MatF& x, MatF& act);   // one expert's
// Which experts each row goes to, and with what weight (the family's rule, config.h MoeRouting);
// by expert, in row order: the rows routed to it and their weights.
struct Routing {
  std::vector<std::vector<int32_t>> rows;
  std::vector<std::vector<float>> weights;
};
Routing route(const LlamaConfig& c, const Linear& router, const MatF& xn);
void gather_rows(const MatF& x, const std::vector<int32_t>& rows, MatF& out);
// y[rows[i]] += weights[i] * part[i]: an expert's output into the layer's.
void scatter_add(const MatF& part, const std::vector<int32_t>& rows, const std::vector<float>& weights, MatF& y);
// The sparse MLP: y [rows, hidden] = the routed experts' outputs, weighted.
void moe_mlp(const LayerWeights& w, const LlamaConfig& c, const MatF& xn, MatF& y);
// x <- x + o(attention(norm(x))); x <- x + down(mlp(norm(x))).
void decoder_layer(const LayerWeights& w, const LlamaConfig& c, const Rope& rope, int S, int T, MatF& x);
// The same for one sequence's next tokens x [T, hidden], with the layer's KV cache (attention_cached).
void decoder_layer_cached(const LayerWeights& w, const LlamaConfig& c, const Rope& rope, MatF& K, MatF& V, MatF& x);

class LlamaModel {
 public:
  // Reads config.json and the float checkpoint; checks every tensor the config implies exists
  // with the right shape (Errc::format naming the tensor otherwise).
  explicit LlamaModel(const std::string& dir);
  // The same over any source of weights (packed formats: lib/formats/open_model).
  LlamaModel(std::string dir, LlamaConfig cfg, std::unique_ptr<WeightSource> src);
  const LlamaConfig& config() const { return cfg_; }
  const WeightSource& weights() const { return *src_; }
  // The float checkpoint; Errc::input if this model is not one (a packed checkpoint).
  const Checkpoint& checkpoint() const;
  const std::string& dir() const { return dir_; }

  MatF embed(const std::vector<int32_t>& tokens) const;               // [n, hidden]
  LayerWeights load_layer(int i) const;                                // fp32 copy; source pages released
  // Final norm and lm_head: logits [rows, vocab].
  void logits(const MatF& x, MatF& out) const;
  // W8A8 models: false evaluates the int8 activations and weights in float (fake-quant) instead
  // of through the integer GEMM.
  void set_integer_path(bool on) { integer_path_ = on; }
  // Whole forward over S sequences of T tokens (tokens row-major [S, T]), layer by layer.
  MatF forward(const std::vector<int32_t>& tokens, int S, int T) const;
  const Rope& rope(int T) const;

 private:
  std::string dir_;
  LlamaConfig cfg_;
  std::unique_ptr<WeightSource> src_;
  void validate() const;
  mutable Rope rope_;
  bool integer_path_ = true;
};

// Reads a tensor into fp32 (row-major), checking its shape.
MatF read_matrix(const WeightSource& w, const std::string& name, int64_t rows, int64_t cols);
VecF read_vector(const WeightSource& w, const std::string& name, int64_t n);

}  // namespace ptq
