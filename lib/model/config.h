// config.h — the config.json of the decoder families ptqkit reads (llama, mistral, qwen2, qwen3, phi3,
// and the MoE families mixtral and qwen3_moe) as ptqkit uses it.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ptq {

struct RopeScaling {          // rope_scaling of type "llama3" (Llama 3.1+)
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
};

// How a MoE family routes a token (model/llama.h: route).
enum class MoeRouting {
  none,           // dense
  topk_softmax,   // mixtral: top-k of the router logits, softmax over the k chosen
  softmax_topk,   // qwen3_moe: softmax over all experts, top-k, renormalized to sum 1 when norm_topk_prob
};

struct LlamaConfig {
  std::string model_type;     // llama | mistral | qwen2 | qwen3 | phi3 | mixtral | qwen3_moe
  int hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0;
  int num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  int vocab_size = 0, max_position_embeddings = 0;
  int sliding_window = 0;     // 0 = none (mistral may set it)
  double rope_theta = 10000.0, rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;      // qwen2 always, llama with attention_bias
  bool o_bias = false;        // llama attention_bias also biases o_proj
  bool mlp_bias = false;
  bool qk_norm = false;       // qwen3: RMSNorm of each head of q and k (self_attn.q_norm, k_norm, [head_dim]) before rotary
  bool fused = false;         // phi3: one qkv_proj (q, k, v rows) and one gate_up_proj (gate rows, then up)
  double partial_rotary_factor = 1.0;   // phi3: rotary over the first head_dim * factor dims of each head
  // MoE (mixtral, qwen3_moe): the experts' MLPs replace the dense one in the sparse layers.
  MoeRouting moe = MoeRouting::none;
  int num_experts = 0, experts_per_token = 0;   // num_local_experts (or num_experts), num_experts_per_tok
  int moe_intermediate_size = 0;                // an expert's ffn width (mixtral: intermediate_size)
  bool norm_topk_prob = true;                   // qwen3_moe: renormalize the k chosen probabilities
  int decoder_sparse_step = 1;                  // qwen3_moe: layer l is sparse when (l + 1) % step == 0 ...
  std::vector<int> mlp_only_layers;             // ... and l is not listed here
  std::optional<RopeScaling> rope_scaling;
  int bos_token_id = 1;
  DType dtype = DType::F32;   // torch_dtype: the checkpoint's float dtype
  nlohmann::json raw;         // the file as read, for writing derived configs

  int q_dim() const { return num_attention_heads * head_dim; }
  int rotary_dim() const { return int(head_dim * partial_rotary_factor) / 2 * 2; }
  bool moe_layer(int layer) const;   // this layer's MLP is the experts'
  // The k chosen experts' weights sum to 1 (mixtral: softmax over the chosen; qwen3_moe: norm_topk_prob).
  bool renormalize_topk() const { return moe == MoeRouting::topk_softmax || norm_topk_prob; }
  int kv_dim() const { return num_key_value_heads * head_dim; }
  int64_t params_per_layer() const;
};

// Parses and checks the config; errors name `file` and the field.
LlamaConfig parse_config(const nlohmann::json& j, const std::string& file);
LlamaConfig load_config(const std::string& model_dir);   // <dir>/config.json

}  // namespace ptq
