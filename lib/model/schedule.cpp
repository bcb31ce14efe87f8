#include "model/schedule.h"

#include "core/error.h"

namespace ptq {

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::norm1: return "norm1";
    case Stage::attention: return "attention";
    case Stage::norm2: return "norm2";
    case Stage::mlp_act: return "mlp_act";
    case Stage::expert_in: return "expert_in";
    case Stage::expert_act: return "expert_act";
  }
  return "?";
}

std::vector<LinearId> LayerSchedule::linears() const {
  std::vector<LinearId> all;
  for (const LinearGroup& g : groups) all.insert(all.end(), g.linears.begin(), g.linears.end());
  return all;
}

LayerSchedule layer_schedule(const LlamaConfig& c, int layer, bool experts_share_input) {
  LayerSchedule s;
  if (c.fused) {
    s.groups = {{"qkv", Stage::norm1, {Proj::qkv}, "input_layernorm"},
                {"o", Stage::attention, {Proj::o}, ""},
                {"mlp", Stage::norm2, {Proj::gate_up}, "post_attention_layernorm"},
                {"down", Stage::mlp_act, {Proj::down}, ""}};
    return s;
  }
  s.groups = {{"qkv", Stage::norm1, {Proj::q, Proj::k, Proj::v}, "input_layernorm"}, {"o", Stage::attention, {Proj::o}, ""}};
  if (!c.moe_layer(layer)) {
    s.groups.push_back({"mlp", Stage::norm2, {Proj::gate, Proj::up}, "post_attention_layernorm"});
    s.groups.push_back({"down", Stage::mlp_act, {Proj::down}, ""});
    return s;
  }
  if (experts_share_input) {
    // (its norm feeds the router too: AWQ's and SmoothQuant's factors fold into the router's
    // columns as well)
    LinearGroup in{"experts.mlp", Stage::expert_in, {}, "post_attention_layernorm", -1};
    for (int e = 0; e < c.num_experts; ++e) in.linears.insert(in.linears.end(), {{Proj::gate, e}, {Proj::up, e}});
    s.groups.push_back(in);
  }
  for (int e = 0; e < c.num_experts; ++e) {
    const std::string n = "experts." + std::to_string(e);
    if (!experts_share_input) s.groups.push_back({n + ".mlp", Stage::expert_in, {{Proj::gate, e}, {Proj::up, e}}, "", e});
    s.groups.push_back({n + ".down", Stage::expert_act, {{Proj::down, e}}, "", e});
  }
  return s;
}

ScaleSource scale_source(const LlamaConfig& c, const LinearGroup& g) {
  ScaleSource s;
  if (g.input == Stage::attention) {
    const int64_t hd = c.head_dim, group = c.num_attention_heads / c.num_key_value_heads;
    const int64_t row0 = c.fused ? c.q_dim() + int64_t(c.kv_dim()) : 0;   // qkv_proj's rows: q, k, v
    s = {"v_proj", "v_proj", c.fused ? LinearId(Proj::qkv) : LinearId(Proj::v), {}};
    s.row.resize(size_t(c.q_dim()));
    for (int64_t j = 0; j < c.q_dim(); ++j) s.row[size_t(j)] = row0 + (j / hd / group) * hd + j % hd;
  } else if (g.input == Stage::mlp_act || g.input == Stage::expert_act) {
    const bool expert = g.input == Stage::expert_act;
    const int64_t f = expert ? c.moe_intermediate_size : c.intermediate_size;
    const int64_t row0 = c.fused ? f : 0;   // gate_up_proj's rows: gate, up
    s = {"up_proj", expert ? "experts." + std::to_string(g.expert) + ".up_proj" : "up_proj",
         c.fused ? LinearId(Proj::gate_up) : LinearId(Proj::up, expert ? g.expert : -1), {}};
    s.row.resize(size_t(f));
    for (int64_t j = 0; j < f; ++j) s.row[size_t(j)] = row0 + j;
  }
  return s;
}

LinearShape linear_shape(const LlamaConfig& c, LinearId id) {
  const int64_t d = c.hidden_size, f = id.expert >= 0 ? c.moe_intermediate_size : c.intermediate_size;
  switch (id.proj) {
    case Proj::q: return {c.q_dim(), d};
    case Proj::k:
    case Proj::v: return {c.kv_dim(), d};
    case Proj::o: return {d, c.q_dim()};
    case Proj::gate:
    case Proj::up: return {f, d};
    case Proj::down: return {d, f};
    case Proj::qkv: return {c.q_dim() + 2 * int64_t(c.kv_dim()), d};
    case Proj::gate_up: return {2 * f, d};
  }
  fail(Errc::usage, "", "linear_shape", "unknown Linear");
}

bool linear_has_bias(const LlamaConfig& c, LinearId id) {
  const Proj p = id.proj;
  if (id.expert >= 0) return false;
  return (p <= Proj::v && c.qkv_bias) || (p == Proj::o && c.o_bias) || (p >= Proj::gate && p <= Proj::down && c.mlp_bias);
}

}  // namespace ptq
