#include "model/config.h"

#include "core/error.h"
#include "core/fsutil.h"
#include "core/json_field.h"

namespace ptq {

using nlohmann::json;

namespace {
int get_int(const json& j, const std::string& file, const char* key, std::optional<int> def = std::nullopt) {
  if (!j.contains(key) || j[key].is_null()) {
    if (def) return *def;
    fail(Errc::config, file, key, "missing");
  }
  if (!j[key].is_number_integer()) fail(Errc::config, file, key, "must be an integer");
  const int64_t v = j[key].get<int64_t>();
  if (v <= 0 || v > (int64_t(1) << 30)) fail(Errc::config, file, key, "must be a positive integer, got " + std::to_string(v));
  return int(v);
}
double get_num(const json& j, const std::string& file, const char* key, double def) {
  if (!j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_number()) fail(Errc::config, file, key, "must be a number");
  return j[key].get<double>();
}
bool get_bool(const json& j, const std::string& file, const char* key, bool def) {
  if (!j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_boolean()) fail(Errc::config, file, key, "must be true or false");
  return j[key].get<bool>();
}
}  // namespace

int64_t LlamaConfig::params_per_layer() const {
  const int64_t d = hidden_size, f = intermediate_size;
  return d * q_dim() + 2 * d * kv_dim() + q_dim() * d + 3 * d * f + 2 * d;
}

LlamaConfig parse_config(const json& j, const std::string& file) {
  if (!j.is_object()) fail(Errc::config, file, "", "config is not a JSON object");
  LlamaConfig c;
  c.raw = j;
  if (!j.contains("model_type") || !j["model_type"].is_string()) fail(Errc::config, file, "model_type", "missing");
  c.model_type = j["model_type"].get<std::string>();
  if (c.model_type != "llama" && c.model_type != "mistral" && c.model_type != "qwen2")
    fail(Errc::config, file, "model_type", "unsupported model_type '" + c.model_type + "' (supported: llama, mistral, qwen2)");
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
  c.rope_theta = get_num(j, file, "rope_theta", 10000.0);
  c.rms_norm_eps = get_num(j, file, "rms_norm_eps", 1e-6);
  if (c.rope_theta <= 0) fail(Errc::config, file, "rope_theta", "must be positive");
  if (c.rms_norm_eps <= 0) fail(Errc::config, file, "rms_norm_eps", "must be positive");
  c.tie_word_embeddings = get_bool(j, file, "tie_word_embeddings", false);
  const bool attention_bias = get_bool(j, file, "attention_bias", false);
  c.qkv_bias = c.model_type == "qwen2" ? true : attention_bias;
  c.o_bias = c.model_type == "qwen2" ? false : attention_bias;
  c.mlp_bias = get_bool(j, file, "mlp_bias", false);
  if (j.contains("sliding_window") && !j["sliding_window"].is_null() &&
      (c.model_type == "mistral" || get_bool(j, file, "use_sliding_window", false)))
    c.sliding_window = get_int(j, file, "sliding_window");
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) c.bos_token_id = j["bos_token_id"].get<int>();
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& rs = j["rope_scaling"];
    if (!rs.is_object()) fail(Errc::config, file, "rope_scaling", "must be an object or null");
    const std::string type = json_field<std::string>(rs, "rope_type", json_field<std::string>(rs, "type", "", Errc::config, file, "rope_scaling.type"),
                                                      Errc::config, file, "rope_scaling.rope_type");
    if (type == "default") {
    } else if (type == "llama3") {
      RopeScaling r;
      r.factor = get_num(rs, file, "factor", 8.0);
      r.low_freq_factor = get_num(rs, file, "low_freq_factor", 1.0);
      r.high_freq_factor = get_num(rs, file, "high_freq_factor", 4.0);
      r.original_max_position_embeddings = get_int(rs, file, "original_max_position_embeddings", 8192);
      if (r.high_freq_factor <= r.low_freq_factor)
        fail(Errc::config, file, "rope_scaling.high_freq_factor", "must exceed low_freq_factor");
      c.rope_scaling = r;
    } else {
      fail(Errc::config, file, "rope_scaling.rope_type", "unsupported rope scaling '" + type + "' (supported: llama3)");
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
  json j;
  try {
    j = json::parse(read_text_file(file));
  } catch (const json::exception& e) {
    fail(Errc::format, file, "", std::string("malformed JSON: ") + e.what());
  }
  // Every field parse_config reads is type-checked; this catch is the backstop that keeps a JSON type
  // error it missed an Error naming the file.
  try {
    return parse_config(j, file);
  } catch (const json::exception& e) {
    fail(Errc::config, file, "", std::string("unexpected JSON structure: ") + e.what());
  }
}

}  // namespace ptq
