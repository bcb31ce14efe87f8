#include "core/fsutil.h"
#include "core/safetensors.h"
#include "model/llama.h"
#include "model/synth.h"
#include "model/schedule.h"

#include <cmath>
#include <set>
#include "testing.h"

using namespace ptq;

TEST_CASE("presets carry the published shapes of the real models") {
  auto c7 = parse_config(synth_config_json("llama2-7b", -1, DType::F16), "x");
  CHECK(c7.hidden_size == 4096);
  CHECK(c7.intermediate_size == 11008);
  CHECK(c7.num_hidden_layers == 32);
  CHECK(c7.num_key_value_heads == 32);
  CHECK(c7.vocab_size == 32000);
  CHECK(c7.params_per_layer() == 202383360);   // 4*4096^2 + 3*4096*11008 + 2*4096
  auto c8 = parse_config(synth_config_json("llama3-8b", -1, DType::BF16), "x");
  CHECK(c8.intermediate_size == 14336);
  CHECK(c8.num_key_value_heads == 8);
  CHECK(c8.vocab_size == 128256);
  CHECK(c8.rope_theta == 500000.0);
  CHECK(c8.rope_scaling);
  auto c70 = parse_config(synth_config_json("llama2-70b", -1, DType::F16), "x");
  CHECK(c70.hidden_size == 8192);
  CHECK(c70.intermediate_size == 28672);
  CHECK(c70.num_hidden_layers == 80);
  CHECK(c70.num_attention_heads == 64);
  CHECK(c70.num_key_value_heads == 8);
}

TEST_CASE("synth is deterministic by seed, sharded, loadable, with outlier norm channels") {
  ptqtest::TempDir d;
  SynthOptions o;
  o.preset = "tiny";
  o.seed = 5;
  o.max_shard_bytes = 200000;
  synth_model(o, d / "a");
  synth_model(o, d / "b");
  o.seed = 6;
  synth_model(o, d / "c");
  CHECK(std::filesystem::exists(d / "a/model.safetensors.index.json"));
  Checkpoint a(d / "a"), b(d / "b"), c(d / "c");
  for (auto& n : a.names()) CHECK(sha256_file(a.file_of(n)) == sha256_file(b.file_of(n)));
  CHECK(sha256_file(a.file_of("model.layers.0.mlp.up_proj.weight")) != sha256_file(c.file_of("model.layers.0.mlp.up_proj.weight")));
  LlamaModel m(d / "a");
  CHECK(m.config().hidden_size == 128);
  auto norm = tensor_to_f32(a.get("model.layers.1.input_layernorm.weight"));
  for (int ch : outlier_channels(128, 5)) CHECK(norm[size_t(ch)] == 24.0f);
  // weights have the intended scale: std of q_proj ~ 1/sqrt(128)
  auto q = tensor_to_f32(a.get("model.layers.0.self_attn.q_proj.weight"));
  double ss = 0;
  for (float v : q) ss += double(v) * v;
  CHECK(std::sqrt(ss / double(q.size())) == Approx(1 / std::sqrt(128.0)).epsilon(0.1));
  MatF logits = m.forward(std::vector<int32_t>(16, 7), 1, 16);
  CHECK(logits.allFinite());
}

TEST_CASE("synth refuses an existing output without force, and unknown presets") {
  ptqtest::TempDir d;
  SynthOptions o;
  synth_model(o, d / "a");
  CHECK_THROWS_WITH(synth_model(o, d / "a"), Catch::Contains("--force"));
  o.preset = "llama9";
  CHECK_THROWS_WITH(synth_model(o, d / "z"), Catch::Contains("unknown preset 'llama9'"));
}

TEST_CASE("the Qwen3, MoE and Phi-3 presets carry their published sizes (Qwen3-8B 8.2B, Mixtral-8x7B 46.7B, Qwen3-30B-A3B 30.5B, Phi-3-mini 3.82B parameters)") {
  struct Want { const char* preset; double params; };
  for (const Want w : {Want{"qwen3-8b", 8.2e9}, Want{"mixtral-8x7b", 46.7e9}, Want{"qwen3-30b-a3b", 30.5e9}, Want{"phi3-mini", 3.82e9}}) {
    const LlamaConfig c = parse_config(synth_config_json(w.preset, -1, DType::BF16), "x");
    const double total = double(c.params_per_layer()) * c.num_hidden_layers + 2.0 * double(c.vocab_size) * c.hidden_size;
    INFO(w.preset << ": " << total);
    CHECK(std::abs(total - w.params) <= 0.005 * w.params);   // the published figures have three digits
  }
  const LlamaConfig m = parse_config(synth_config_json("qwen3-30b-a3b", -1, DType::BF16), "x");
  CHECK((m.num_experts == 128 && m.experts_per_token == 8 && m.moe_intermediate_size == 768 && m.head_dim == 128 && m.qk_norm && m.moe_layer(47)));
  const LlamaConfig phi = parse_config(synth_config_json("phi3-mini", -1, DType::BF16), "x");
  CHECK((phi.fused && phi.head_dim == 96 && phi.num_key_value_heads == 32 && phi.vocab_size == 32064));
}

