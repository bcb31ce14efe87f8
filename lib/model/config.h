// config.h — the Llama-family config.json (llama, mistral, qwen2, qwen3) as ptqkit uses it.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/dtype.h"

namespace ptq {

struct RopeScaling {          // rope_scaling of type "llama3" (Llama 3.1+)
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
};

struct LlamaConfig {
  std::string model_type;     // llama | mistral | qwen2 | qwen3
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
  std::optional<RopeScaling> rope_scaling;
  int bos_token_id = 1;
  DType dtype = DType::F32;   // torch_dtype: the checkpoint's float dtype
  nlohmann::json raw;         // the file as read, for writing derived configs

  int q_dim() const { return num_attention_heads * head_dim; }
  int kv_dim() const { return num_key_value_heads * head_dim; }
  int64_t params_per_layer() const;
};

// Parses and checks the config; errors name `file` and the field.
LlamaConfig parse_config(const nlohmann::json& j, const std::string& file);
LlamaConfig load_config(const std::string& model_dir);   // <dir>/config.json

}  // namespace ptq
