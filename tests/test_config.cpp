#include "core/error.h"
#include "model/config.h"
#include "model/llama.h"
#include "testing.h"

using namespace ptq;
using nlohmann::json;

static json base() {
  return {{"model_type", "llama"}, {"hidden_size", 64}, {"intermediate_size", 172}, {"num_hidden_layers", 2},
          {"num_attention_heads", 8}, {"num_key_value_heads", 4}, {"vocab_size", 512}, {"max_position_embeddings", 512},
          {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0}, {"torch_dtype", "float32"}};
}

static std::string error_of(const json& j) {
  try {
    parse_config(j, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("llama config: GQA, head_dim, defaults") {
  LlamaConfig c = parse_config(base(), "config.json");
  CHECK(c.head_dim == 8);
  CHECK(c.kv_dim() == 32);
  CHECK_FALSE(c.qkv_bias);
  CHECK_FALSE(c.tie_word_embeddings);
  json j = base();
  j["head_dim"] = 16;
  CHECK(parse_config(j, "x").q_dim() == 128);
}

TEST_CASE("qwen2 has q/k/v bias, mistral keeps its sliding window") {
  json j = base();
  j["model_type"] = "qwen2";
  LlamaConfig q = parse_config(j, "x");
  CHECK(q.qkv_bias);
  CHECK_FALSE(q.o_bias);
  j["model_type"] = "mistral";
  j["sliding_window"] = 4096;
  CHECK(parse_config(j, "x").sliding_window == 4096);
}

// transformers' rule: layer_types where given; else every layer of a Mistral with a window; else,
// with use_sliding_window, layers i >= max_window_layers (default 28). One kind for every layer, or
// refused naming the field.
TEST_CASE("sliding windows as transformers assigns them to layers, and a mix of sliding and full layers is refused") {
  json j = base();   // 2 layers
  j["model_type"] = "qwen2";
  j["sliding_window"] = 16;
  CHECK(parse_config(j, "x").sliding_window == 0);   // use_sliding_window false (the default)
  j["use_sliding_window"] = true;
  CHECK(parse_config(j, "x").sliding_window == 0);   // max_window_layers 28 >= 2 layers: all full
  j["max_window_layers"] = 0;
  CHECK(parse_config(j, "x").sliding_window == 16);
  j["max_window_layers"] = 1;
  CHECK_THAT(error_of(j), Catch::Contains("max_window_layers") && Catch::Contains("1 of 2 layers"));
  j.erase("max_window_layers");
  j["layer_types"] = {"sliding_attention", "sliding_attention"};
  CHECK(parse_config(j, "x").sliding_window == 16);
  j["layer_types"] = {"full_attention", "sliding_attention"};
  CHECK_THAT(error_of(j), Catch::Contains("layer_types"));
  j["layer_types"] = {"full_attention"};
  CHECK_THAT(error_of(j), Catch::Contains("layer_types") && Catch::Contains("one entry per layer"));
  j["model_type"] = "mistral";
  j["layer_types"] = {"full_attention", "full_attention"};
  CHECK(parse_config(j, "x").sliding_window == 0);
  j.erase("layer_types");
  CHECK(parse_config(j, "x").sliding_window == 16);
  j["sliding_window"] = nullptr;
  j["layer_types"] = {"sliding_attention", "sliding_attention"};
  CHECK_THAT(error_of(j), Catch::Contains("sliding_window"));
}

TEST_CASE("llama3 rope scaling matches the published formula (values from an fp64 computation)") {
  json j = base();
  j["hidden_size"] = 1024;
  j["num_attention_heads"] = 8;   // head_dim 128
  j["num_key_value_heads"] = 8;
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  LlamaConfig c = parse_config(j, "x");
  REQUIRE(c.rope_scaling);
  Rope r = make_rope(c, 1001);
  // i = 20: high frequency, unchanged; i = 30, 32: smoothed band; i = 40, 63: divided by 8.
  CHECK(r.cos(1000, 20) == Approx(-0.6581203423130288).margin(2e-6));
  CHECK(r.sin(1000, 20) == Approx(-0.752912753932208).margin(2e-6));
  CHECK(r.cos(1000, 30) == Approx(0.1975938422192489).margin(2e-6));
  CHECK(r.sin(1000, 32) == Approx(0.5010798781674073).margin(2e-6));
  CHECK(r.sin(1000, 40) == Approx(0.03427430791044675).margin(2e-7));
  CHECK(r.sin(1000, 63) == Approx(0.0003068925940741034).margin(1e-9));
}

TEST_CASE("transformers 5 spellings: rope_parameters and dtype read as rope_theta, rope_scaling and torch_dtype (every family)") {
  for (const char* family : {"llama", "mistral", "qwen2", "qwen3"}) {
    json old = base(), now = base();
    old["model_type"] = now["model_type"] = family;
    old["rope_theta"] = 500000.0;
    old["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 8192}};
    old["torch_dtype"] = "bfloat16";
    now.erase("rope_theta");
    now.erase("torch_dtype");
    now["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
    now["dtype"] = "bfloat16";
    const LlamaConfig a = parse_config(old, "x"), b = parse_config(now, "x");
    CHECK(b.rope_theta == 500000.0);
    REQUIRE(b.rope_scaling);
    CHECK(b.rope_scaling->factor == a.rope_scaling->factor);
    CHECK(b.rope_scaling->original_max_position_embeddings == 8192);
    CHECK(b.dtype == DType::BF16);
    CHECK(b.qk_norm == (std::string(family) == "qwen3"));
    now["rope_parameters"] = {{"rope_theta", 1e6}, {"rope_type", "default"}};
    CHECK_FALSE(parse_config(now, "x").rope_scaling);
    now["rope_parameters"] = {{"rope_theta", 1e6}, {"rope_type", "yarn"}};
    CHECK_THAT(error_of(now), Catch::Contains("rope_parameters.rope_type") && Catch::Contains("yarn"));
  }
}

TEST_CASE("bad configs are refused naming the field") {
  json j = base();
  j["model_type"] = "gpt_neox";
  CHECK(error_of(j).find("model_type: unsupported model_type 'gpt_neox'") != std::string::npos);
  j = base();
  j["num_key_value_heads"] = 3;
  CHECK(error_of(j).find("num_key_value_heads: must divide") != std::string::npos);
  j = base();
  j.erase("hidden_size");
  CHECK(error_of(j).find("config.json: hidden_size: missing") != std::string::npos);
  j = base();
  j["hidden_size"] = "64";
  CHECK(error_of(j).find("hidden_size: must be an integer") != std::string::npos);
  j = base();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  CHECK(error_of(j).find("rope_scaling.rope_type") != std::string::npos);
  // Fields of the wrong JSON type are Errors naming the field, not nlohmann type errors (the CI fuzz
  // run of 2026-11-23 found torch_dtype: <number> escaping as a type_error).
  j = base();
  j["torch_dtype"] = 16;
  CHECK(error_of(j).find("config.json: torch_dtype: must be a string") != std::string::npos);
  j = base();
  j.erase("torch_dtype");
  j["dtype"] = json::array();
  CHECK(error_of(j).find("config.json: dtype: must be a string") != std::string::npos);
  j["dtype"] = "bfloat16";
  CHECK(parse_config(j, "x").dtype == DType::BF16);
  j = base();
  j["rope_scaling"] = {{"rope_type", 3}};
  CHECK(error_of(j).find("rope_scaling.rope_type: must be a string") != std::string::npos);
  j["rope_scaling"] = {{"type", false}};
  CHECK(error_of(j).find("rope_scaling.type: must be a string") != std::string::npos);
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", "8"}};
  CHECK(error_of(j).find("rope_scaling.factor: must be a number") != std::string::npos);
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"original_max_position_embeddings", 0}};
  CHECK(error_of(j).find("rope_scaling.original_max_position_embeddings: must be a positive integer") != std::string::npos);
  j = base();
  j["tie_word_embeddings"] = "yes";
  CHECK(error_of(j).find("config.json: tie_word_embeddings: must be true or false") != std::string::npos);
  j = base();
  j["quantization_config"] = "gptq";
  CHECK(error_of(j).find("quantization_config: must be an object") != std::string::npos);
}

TEST_CASE("MoE and Phi-3 configs: experts, routing, sparse layers, partial rotary") {
  json m = base();
  m["model_type"] = "qwen3_moe";
  m["num_experts"] = 128;   // transformers 4's spelling (5 writes num_local_experts)
  m["num_experts_per_tok"] = 8;
  m["moe_intermediate_size"] = 768;
  m["norm_topk_prob"] = true;
  m["decoder_sparse_step"] = 2;
  m["mlp_only_layers"] = {2};
  m["num_hidden_layers"] = 6;
  LlamaConfig c = parse_config(m, "config.json");
  CHECK(c.moe == MoeRouting::softmax_topk);
  CHECK(c.qk_norm);
  CHECK((c.num_experts == 128 && c.experts_per_token == 8 && c.moe_intermediate_size == 768));
  // sparse when (l + 1) % 2 == 0 and l is not an mlp-only layer: layers 1, 3, 5
  CHECK(!c.moe_layer(0));
  CHECK(c.moe_layer(1));
  CHECK(!c.moe_layer(2));
  CHECK(c.moe_layer(3));
  CHECK(!c.moe_layer(4));
  m["num_experts_per_tok"] = 129;
  CHECK_THAT(error_of(m), Catch::Contains("config.json: num_experts_per_tok: 129 exceeds the 128 experts (num_experts)"));
  m["num_experts_per_tok"] = 2;
  m.erase("moe_intermediate_size");
  CHECK_THAT(error_of(m), Catch::Contains("moe_intermediate_size: missing"));
  m["moe_intermediate_size"] = 768;
  m["mlp_only_layers"] = "2";
  CHECK_THAT(error_of(m), Catch::Contains("mlp_only_layers: must be a list of layer indices"));

  json x = base();
  x["model_type"] = "mixtral";
  x["num_local_experts"] = 8;
  x["num_experts_per_tok"] = 2;
  c = parse_config(x, "config.json");
  CHECK((c.moe == MoeRouting::topk_softmax && c.moe_intermediate_size == c.intermediate_size && c.moe_layer(0)));
  x.erase("num_local_experts");
  CHECK_THAT(error_of(x), Catch::Contains("num_experts: missing"));

  json p = base();
  p["model_type"] = "phi3";
  p["rope_parameters"] = {{"rope_theta", 10000.0}, {"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
  c = parse_config(p, "config.json");
  CHECK((c.fused && c.rotary_dim() == c.head_dim / 2));
  p["rope_parameters"]["rope_type"] = "longrope";
  CHECK_THAT(error_of(p), Catch::Contains("rope_parameters.rope_type: unsupported rope scaling 'longrope' (supported: default, llama3)"));
  p["rope_parameters"]["rope_type"] = "default";
  p["rope_parameters"]["partial_rotary_factor"] = 1.5;
  CHECK_THAT(error_of(p), Catch::Contains("partial_rotary_factor: must be in (0, 1]"));
}
