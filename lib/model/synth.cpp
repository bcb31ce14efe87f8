#include "model/synth.h"

#include <algorithm>
#include <set>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/progress.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "model/schedule.h"

namespace ptq {

using nlohmann::json;

namespace {
struct Preset {
  const char* name;
  int hidden, ffn, layers, heads, kv, vocab, max_pos;
  double theta;
  bool llama3_rope;
  const char* model_type = "llama";
  int head_dim = 0;                          // 0: hidden / heads
  int experts = 0, per_token = 0, moe_ffn = 0;   // MoE
};
constexpr Preset kPresets[] = {
    {"micro", 32, 64, 1, 2, 1, 512, 64, 10000.0, false},   // fuzz seeds: the smallest valid model
    {"tiny", 128, 384, 2, 4, 2, 512, 256, 10000.0, false},
    {"small", 512, 1536, 4, 8, 4, 1024, 512, 10000.0, false},
    {"llama2-7b", 4096, 11008, 32, 32, 32, 32000, 4096, 10000.0, false},
    {"llama3-8b", 4096, 14336, 32, 32, 8, 128256, 131072, 500000.0, true},
    {"llama2-70b", 8192, 28672, 80, 64, 8, 32000, 4096, 10000.0, false},
    // the shapes of Qwen/Qwen3-8B, mistralai/Mixtral-8x7B-v0.1 and Qwen/Qwen3-30B-A3B (their config.json files)
    {"qwen3-8b", 4096, 12288, 36, 32, 8, 151936, 40960, 1000000.0, false, "qwen3", 128},
    {"mixtral-8x7b", 4096, 14336, 32, 32, 8, 32000, 32768, 1000000.0, false, "mixtral", 128, 8, 2, 14336},
    {"qwen3-30b-a3b", 2048, 6144, 48, 32, 4, 151936, 40960, 1000000.0, false, "qwen3_moe", 128, 128, 8, 768},
    // microsoft/Phi-3-mini-4k-instruct's shapes (head_dim 96; fused qkv_proj and gate_up_proj; its
    // sliding window of 2,047 positions is left out: full attention, as at prompts shorter than it)
    {"phi3-mini", 3072, 8192, 32, 32, 32, 32064, 4096, 10000.0, false, "phi3", 96},
    {"tiny-moe", 128, 384, 2, 4, 2, 512, 256, 10000.0, false, "qwen3_moe", 32, 8, 2, 64},   // tests
};
const Preset& find_preset(const std::string& n) {
  for (auto& p : kPresets)
    if (n == p.name) return p;
  std::string all;
  for (auto& p : kPresets) all += std::string(all.empty() ? "" : ", ") + p.name;
  fail(Errc::usage, "", "preset", "unknown preset '" + n + "' (known: " + all + ")");
}
}  // namespace

std::vector<std::string> synth_presets() {
  std::vector<std::string> r;
  for (auto& p : kPresets) r.push_back(p.name);
  return r;
}

json synth_config_json(const std::string& preset, int layers, DType dtype) {
  const Preset& p = find_preset(preset);
  const std::string mt = p.model_type;
  const char* arch = mt == "qwen3" ? "Qwen3ForCausalLM" : mt == "mixtral" ? "MixtralForCausalLM" : mt == "qwen3_moe" ? "Qwen3MoeForCausalLM" : mt == "phi3" ? "Phi3ForCausalLM" : "LlamaForCausalLM";
  json c = {{"architectures", {arch}},
            {"model_type", mt},
            {"hidden_size", p.hidden},
            {"intermediate_size", p.ffn},
            {"num_hidden_layers", layers > 0 ? layers : p.layers},
            {"num_attention_heads", p.heads},
            {"num_key_value_heads", p.kv},
            {"head_dim", p.head_dim ? p.head_dim : p.hidden / p.heads},
            {"vocab_size", p.vocab},
            {"max_position_embeddings", p.max_pos},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", p.theta},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", false},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"bos_token_id", 1},
            {"eos_token_id", 2},
            {"torch_dtype", dtype == DType::BF16 ? "bfloat16" : dtype == DType::F16 ? "float16" : "float32"},
            {"ptqkit_synthetic", {{"preset", p.name}}}};
  if (p.experts) {
    c["num_local_experts"] = p.experts;
    c["num_experts_per_tok"] = p.per_token;
    if (mt == "qwen3_moe") {
      c["moe_intermediate_size"] = p.moe_ffn;
      c["norm_topk_prob"] = true;
      c["decoder_sparse_step"] = 1;
      c["mlp_only_layers"] = json::array();
    }
  }
  if (p.llama3_rope)
    c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
  return c;
}

namespace {
bool is_mixtral_down(const std::string& n) { return n.size() > 10 && n.compare(n.size() - 10, 10, ".w2.weight") == 0; }   // Mixtral's down
}  // namespace

std::vector<int> outlier_channels(int hidden, uint64_t seed) {
  Rng r(seed, 0x71);
  const int k = std::max(2, hidden / 512);
  std::set<int> ch;
  while (int(ch.size()) < k) ch.insert(int(r.below(uint64_t(hidden))));
  return {ch.begin(), ch.end()};
}

void synth_model(const SynthOptions& opt, const std::string& out_dir) {
  if (!dtype_is_float16(opt.dtype) && opt.dtype != DType::F32) fail(Errc::usage, "", "dtype", "must be f16, bf16 or f32");
  json cj = synth_config_json(opt.preset, opt.layers, opt.dtype);
  const LlamaConfig c = parse_config(cj, "<synth>");
  const std::vector<int> outliers = outlier_channels(c.hidden_size, opt.seed);

  std::vector<TensorSpec> specs;
  const int64_t d = c.hidden_size;
  specs.push_back({"model.embed_tokens.weight", opt.dtype, {c.vocab_size, d}});
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    specs.push_back({p + ".input_layernorm.weight", opt.dtype, {d}});
    if (c.qk_norm)
      for (const char* n : {".self_attn.q_norm.weight", ".self_attn.k_norm.weight"}) specs.push_back({p + n, opt.dtype, {c.head_dim}});
    // the Linears in the schedule's order, the post-attention norm (and a MoE layer's router) after o_proj
    for (LinearId id : layer_schedule(c, i).linears()) {
      const LinearShape sh = linear_shape(c, id);
      specs.push_back({linear_name(c, i, id) + ".weight", opt.dtype, {sh.out, sh.in}});
      if (id.proj == Proj::o) {
        specs.push_back({p + ".post_attention_layernorm.weight", opt.dtype, {d}});
        if (c.moe_layer(i)) specs.push_back({router_name(c, i) + ".weight", opt.dtype, {c.num_experts, d}});
      }
    }
  }
  specs.push_back({"model.norm.weight", opt.dtype, {d}});
  specs.push_back({"lm_head.weight", opt.dtype, {c.vocab_size, d}});

  size_t total = 0;
  for (auto& s : specs) total += s.nbytes();
  Progress bar("synth " + opt.preset, double(total) / 1e6, "MB");
  size_t done = 0;
  auto produce = [&](const TensorSpec& s) {
    const int64_t n = numel(s.shape);
    std::vector<float> x(static_cast<size_t>(n));
    const uint64_t key = hash_str(s.name);
    const bool is_norm = s.shape.size() == 1;
    if (is_norm) {
      Rng r(opt.seed, key);
      const bool final_norm = s.name == "model.norm.weight";
      for (int64_t j = 0; j < n; ++j) x[size_t(j)] = float(1.0 + 0.1 * r.normal());
      if (!final_norm && s.name.find("layernorm") != std::string::npos)   // (not Qwen3's per-head q/k norms)
        for (int ch : outliers) x[size_t(ch)] = 24.0f;
    } else {
      const int64_t in = s.shape[1];
      double sigma = s.name.find("embed_tokens") != std::string::npos ? 1.0 : 1.0 / std::sqrt(double(in));
      if (s.name.find("o_proj") != std::string::npos || s.name.find("down_proj") != std::string::npos || is_mixtral_down(s.name))
        sigma /= std::sqrt(2.0 * c.num_hidden_layers);
      const int64_t chunk = 1 << 16;
#pragma omp parallel for schedule(static)
      for (int64_t b = 0; b < (n + chunk - 1) / chunk; ++b) {
        Rng r(opt.seed ^ key, uint64_t(b));
        for (int64_t j = b * chunk; j < std::min(n, (b + 1) * chunk); ++j) {
          double v = sigma * r.normal();
          if (r.uniform() < 1e-3) v *= 4.0;
          x[size_t(j)] = float(v);
        }
      }
    }
    done += s.nbytes();
    bar.update(double(done) / 1e6);
    return tensor_from_f32(x.data(), s.shape, s.dtype);
  };
  OutputDir out(out_dir, opt.force);
  write_checkpoint_tensors(out.path(), specs, produce, opt.max_shard_bytes);
  write_file_atomic(out.file("config.json"), cj.dump(2) + "\n");
  write_file_atomic(out.file("generation_config.json"), json({{"bos_token_id", 1}, {"eos_token_id", 2}}).dump(2) + "\n");
  write_file_atomic(out.file("tokenizer.json"), byte_level_tokenizer_json());
  bar.finish();
  out.commit();
}

}  // namespace ptq
