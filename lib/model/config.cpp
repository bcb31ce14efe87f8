#include "model/config.h"

#include <algorithm>
#include <filesystem>

#include "core/checkpoint.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/json_field.h"

namespace ptq {

using nlohmann::json;

namespace {
// `where` names the field in errors when `j` is nested (rope_scaling.factor), default `key`.
int get_int(const json& j, const std::string& file, const char* key, std::optional<int> def = std::nullopt, std::string where = "") {
  if (where.empty()) where = key;
  if (!j.contains(key) || j[key].is_null()) {
    if (def) return *def;
    fail(Errc::config, file, where, "missing");
  }
  if (!j[key].is_number_integer()) fail(Errc::config, file, where, "must be an integer");
  const int64_t v = j[key].get<int64_t>();
  if (v <= 0 || v > (int64_t(1) << 30)) fail(Errc::config, file, where, "must be a positive integer, got " + std::to_string(v));
  return int(v);
}
}  // namespace

int64_t LlamaConfig::params_per_layer() const {
  const int64_t d = hidden_size, f = intermediate_size, attn = d * q_dim() + 2 * d * kv_dim() + q_dim() * d;
  if (moe != MoeRouting::none && moe_layer(0)) return attn + int64_t(num_experts) * (3 * d * moe_intermediate_size + d) + 2 * d;
  return attn + 3 * d * f + 2 * d;
}

bool LlamaConfig::moe_layer(int layer) const {
  if (moe == MoeRouting::none) return false;
  for (int l : mlp_only_layers)
    if (l == layer) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

LlamaConfig parse_config(const json& j, const std::string& file) {
  if (!j.is_object()) fail(Errc::config, file, "", "config is not a JSON object");
  LlamaConfig c;
  c.raw = j;
  if (!j.contains("model_type") || !j["model_type"].is_string()) fail(Errc::config, file, "model_type", "missing");
  c.model_type = j["model_type"].get<std::string>();
  const std::string& mt = c.model_type;
  if (mt != "llama" && mt != "mistral" && mt != "qwen2" && mt != "qwen3" && mt != "phi3" && mt != "mixtral" && mt != "qwen3_moe")
    fail(Errc::config, file, "model_type", "unsupported model_type '" + mt + "' (supported: llama, mistral, qwen2, qwen3, phi3, mixtral, qwen3_moe)");
  c.qk_norm = mt == "qwen3" || mt == "qwen3_moe";
  c.fused = mt == "phi3";
  c.hidden_size = get_int(j, file, "hidden_size");
  c.intermediate_size = get_int(j, file, "intermediate_size");
  c.num_hidden_layers = get_int(j, file, "num_hidden_layers");
  c.num_attention_heads = get_int(j, file, "num_attention_heads");
  c.num_key_value_heads = get_int(j, file, "num_key_value_heads", c.num_attention_heads);
  c.vocab_size = get_int(j, file, "vocab_size");
  c.max_position_embeddings = get_int(j, file, "max_position_embeddings", 2048);
  if (c.hidden_size % c.num_attention_heads != 0 && !j.contains("head_dim"))
    fail(Errc::config, file, "hidden_size", "not divisible by num_attention_heads and no head_dim given");
  c.head_dim = get_int(j, file, "head_dim", c.hidden_size / c.num_attention_heads);
  if (c.head_dim % 2) fail(Errc::config, file, "head_dim", "must be even for rotary embeddings");
  if (c.num_attention_heads % c.num_key_value_heads)
    fail(Errc::config, file, "num_key_value_heads", "must divide num_attention_heads (" + std::to_string(c.num_attention_heads) + ")");
  // transformers 5 writes rope_theta and the scaling into one rope_parameters object; earlier
  // versions write a top-level rope_theta and rope_scaling. Both spellings are read.
  const bool rope_params = j.contains("rope_parameters") && !j["rope_parameters"].is_null();
  if (rope_params && !j["rope_parameters"].is_object()) fail(Errc::config, file, "rope_parameters", "must be an object or null");
  c.rope_theta = rope_params ? json_field<double>(j["rope_parameters"], "rope_theta", json_field<double>(j, "rope_theta", 10000.0, Errc::config, file),
                                                  Errc::config, file, "rope_parameters.rope_theta")
                             : json_field<double>(j, "rope_theta", 10000.0, Errc::config, file);
  c.rms_norm_eps = json_field<double>(j, "rms_norm_eps", 1e-6, Errc::config, file);
  if (c.rope_theta <= 0) fail(Errc::config, file, "rope_theta", "must be positive");
  if (c.rms_norm_eps <= 0) fail(Errc::config, file, "rms_norm_eps", "must be positive");
  c.tie_word_embeddings = json_field<bool>(j, "tie_word_embeddings", false, Errc::config, file);
  if (mt == "mixtral" || mt == "qwen3_moe") {
    c.moe = mt == "mixtral" ? MoeRouting::topk_softmax : MoeRouting::softmax_topk;
    const char* ne = j.contains("num_local_experts") ? "num_local_experts" : "num_experts";   // transformers 5 / 4 spellings
    c.num_experts = get_int(j, file, ne);
    c.experts_per_token = get_int(j, file, "num_experts_per_tok");
    if (c.experts_per_token > c.num_experts)
      fail(Errc::config, file, "num_experts_per_tok", std::to_string(c.experts_per_token) + " exceeds the " + std::to_string(c.num_experts) + " experts (" + ne + ")");
    if (mt == "mixtral") {
      c.moe_intermediate_size = c.intermediate_size;
    } else {
      c.moe_intermediate_size = get_int(j, file, "moe_intermediate_size");
      c.norm_topk_prob = json_field<bool>(j, "norm_topk_prob", false, Errc::config, file);
      c.decoder_sparse_step = get_int(j, file, "decoder_sparse_step", 1);
      if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
        if (!j["mlp_only_layers"].is_array()) fail(Errc::config, file, "mlp_only_layers", "must be a list of layer indices");
        for (auto& v : j["mlp_only_layers"]) {
          if (!v.is_number_integer()) fail(Errc::config, file, "mlp_only_layers", "must be a list of layer indices");
          c.mlp_only_layers.push_back(v.get<int>());
        }
      }
    }
  }
  const bool attention_bias = json_field<bool>(j, "attention_bias", false, Errc::config, file);
  c.qkv_bias = c.model_type == "qwen2" ? true : attention_bias;
  c.o_bias = c.model_type == "qwen2" ? false : attention_bias;
  c.mlp_bias = json_field<bool>(j, "mlp_bias", false, Errc::config, file);
  // Sliding-window attention, layer by layer as transformers chooses it: `layer_types` where the
  // config has it (transformers 5 writes it); else every layer of a Mistral with a window; else,
  // with use_sliding_window (Qwen2, Qwen3), layers i >= max_window_layers (default 28) and full
  // attention below. ptqkit computes one kind of attention for every layer, so a config that mixes
  // the two is refused rather than computed wrong.
  const bool window_given = j.contains("sliding_window") && !j["sliding_window"].is_null();
  const int L = c.num_hidden_layers;
  int sliding_layers = 0;
  std::string sliding_field = "sliding_window";
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    sliding_field = "layer_types";
    const json& t = j["layer_types"];
    if (!t.is_array() || int(t.size()) != L) fail(Errc::config, file, "layer_types", "must list one entry per layer (num_hidden_layers)");
    for (const json& e : t) {
      if (e != "full_attention" && e != "sliding_attention") fail(Errc::config, file, "layer_types", "entries must be \"full_attention\" or \"sliding_attention\"");
      sliding_layers += e == "sliding_attention";
    }
  } else if (window_given && c.model_type == "mistral") {
    sliding_layers = L;
  } else if (window_given && json_field<bool>(j, "use_sliding_window", false, Errc::config, file)) {
    sliding_field = "max_window_layers";
    const int full = json_field<int>(j, "max_window_layers", 28, Errc::config, file);   // the first `full` layers attend fully
    if (full < 0) fail(Errc::config, file, "max_window_layers", "must not be negative");
    sliding_layers = std::clamp(L - full, 0, L);
  }
  if (sliding_layers > 0) {
    if (!window_given) fail(Errc::config, file, "sliding_window", "missing, but " + sliding_field + " gives layers sliding-window attention");
    if (sliding_layers < L)
      fail(Errc::config, file, sliding_field, std::to_string(sliding_layers) + " of " + std::to_string(L) +
                                                  " layers use sliding-window attention and the rest full attention: ptqkit computes one kind for every layer (not supported yet)");
    c.sliding_window = get_int(j, file, "sliding_window");
  }
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) c.bos_token_id = j["bos_token_id"].get<int>();
  if (mt == "phi3") {   // partial rotary: top level (transformers 4) or in rope_parameters (5)
    c.partial_rotary_factor = json_field<double>(j, "partial_rotary_factor", 1.0, Errc::config, file);
    if (rope_params) c.partial_rotary_factor = json_field<double>(j["rope_parameters"], "partial_rotary_factor", c.partial_rotary_factor, Errc::config, file, "rope_parameters.partial_rotary_factor");
    if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1) || c.rotary_dim() < 2)
      fail(Errc::config, file, "partial_rotary_factor", "must be in (0, 1] and leave at least 2 rotary dims");
  }
  const char* rs_key = rope_params ? "rope_parameters" : "rope_scaling";
  if (j.contains(rs_key) && !j[rs_key].is_null()) {
    const json& rs = j[rs_key];
    const std::string at = std::string(rs_key) + ".";
    if (!rs.is_object()) fail(Errc::config, file, rs_key, "must be an object or null");
    const std::string type = json_field<std::string>(rs, "rope_type", json_field<std::string>(rs, "type", rope_params ? "default" : "", Errc::config, file, at + "type"),
                                                      Errc::config, file, at + "rope_type");
    if (type == "default") {
    } else if (type == "llama3") {
      RopeScaling r;
      r.factor = json_field<double>(rs, "factor", 8.0, Errc::config, file, at + "factor");
      r.low_freq_factor = json_field<double>(rs, "low_freq_factor", 1.0, Errc::config, file, at + "low_freq_factor");
      r.high_freq_factor = json_field<double>(rs, "high_freq_factor", 4.0, Errc::config, file, at + "high_freq_factor");
      r.original_max_position_embeddings = get_int(rs, file, "original_max_position_embeddings", 8192, at + "original_max_position_embeddings");
      if (r.high_freq_factor <= r.low_freq_factor)
        fail(Errc::config, file, at + "high_freq_factor", "must exceed low_freq_factor");
      c.rope_scaling = r;
    } else {
      fail(Errc::config, file, at + "rope_type", "unsupported rope scaling '" + type + "' (supported: default, llama3)");
    }
  }
  for (const char* k : {"quantization_config", "ptqkit_w8a8"})
    if (j.contains(k) && !j[k].is_object()) fail(Errc::config, file, k, "must be an object");
  const std::string td = json_field<std::string>(j, "torch_dtype", json_field<std::string>(j, "dtype", "float32", Errc::config, file), Errc::config, file);
  if (td == "float16") c.dtype = DType::F16;
  else if (td == "bfloat16") c.dtype = DType::BF16;
  else if (td == "float32") c.dtype = DType::F32;
  else fail(Errc::config, file, "torch_dtype", "unsupported dtype '" + td + "'");
  return c;
}

LlamaConfig load_config(const std::string& model_dir) {
  const std::string file = model_dir + "/config.json";
  if (std::filesystem::is_directory(model_dir) && !std::filesystem::exists(file)) {
    const std::string hint = model_subfolders_hint(model_dir);
    if (!hint.empty()) fail(Errc::io, file, "", "no such file" + hint);
  }
  json j;
  try {
    j = json::parse(read_text_file(file));
  } catch (const json::exception& e) {
    fail(Errc::format, file, "", std::string("malformed JSON: ") + e.what());
  }
  // Every field parse_config reads is type-checked; this catch is the backstop that keeps a JSON type
  // error it missed an Error naming the file.
  return json_errors_named(Errc::config, file, "", [&] { return parse_config(j, file); });
}

}  // namespace ptq
