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


// The seven quantizable Linears of a decoder layer, in execution order.
enum class Proj { q, k, v, o, gate, up, down };
constexpr std::array<Proj, 7> kAllProj = {Proj::q, Proj::k, Proj::v, Proj::o, Proj::gate, Proj::up, Proj::down};
const char* proj_name(Proj p);                    // "q_proj", ...
std::string proj_tensor_prefix(int layer, Proj p); // "model.layers.3.self_attn.q_proj"


struct Linear {
  MatF W;        // [out, in] (for W8A8: the dequantized int8 weights)
  VecF b;        // [out] or empty
  ActQuant act;  // W8A8 when act.mode != none
  MatI Wi;       // int8 weight codes as int32 [out, in]: the integer path; empty = fake-quant path
  VecF w_scale;  // [out] per-channel weight scales of Wi
};

// x -> int8 codes (as int32) and per-row scales, per `a`.
void quantize_activations(const MatF& x, const ActQuant& a, MatI& q, VecF& scale);

struct LayerWeights {
  VecF input_layernorm, post_attention_layernorm;
  VecF q_norm, k_norm;   // [head_dim], per-head RMSNorm of q and k (qk_norm models: Qwen3); else empty
  std::array<Linear, 7> proj;
  Linear& operator[](Proj p) { return proj[size_t(p)]; }
  const Linear& operator[](Proj p) const { return proj[size_t(p)]; }
  size_t bytes() const;
};

// Rotary tables in the HF layout (rotate_half): cos/sin [max_len, head_dim/2], computed in fp64.
struct Rope {
  MatF cos, sin;
};
Rope make_rope(const LlamaConfig& c, int max_len);

// ---- stages (all fp32) ----
void rmsnorm(const MatF& x, const VecF& w, float eps, MatF& out);
// y [rows, heads * hd]: each head's hd values RMS-normalized and scaled by w [hd], in place (Qwen3's q/k norms).
void head_rmsnorm(MatF& y, int heads, int hd, const VecF& w, float eps);
void linear(const MatF& x, const Linear& l, MatF& y);                  // y = x W^T + b
// q/k/v projections, rotary, causal GQA softmax attention: returns the input of o_proj [S*T, q_dim].
void attention_core(const LayerWeights& w, const LlamaConfig& c, const Rope& rope, const MatF& xn, int S, int T, MatF& ctx);
// silu(x W_gate^T) * (x W_up^T): the input of down_proj [S*T, ffn].
void mlp_act(const LayerWeights& w, const MatF& xn, MatF& act);
// x <- x + o(attention(norm(x))); x <- x + down(mlp(norm(x))).
void decoder_layer(const LayerWeights& w, const LlamaConfig& c, const Rope& rope, int S, int T, MatF& x);

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
