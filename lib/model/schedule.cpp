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

std::vector<Proj> LayerSchedule::linears() const {
  std::vector<Proj> all;
  for (const LinearGroup& g : groups) all.insert(all.end(), g.linears.begin(), g.linears.end());
  return all;
}

const LayerSchedule& layer_schedule(const LlamaConfig& c) {
  static const LayerSchedule dense = {{
      {"qkv", Stage::norm1, {Proj::q, Proj::k, Proj::v}, "input_layernorm"},
      {"o", Stage::attention, {Proj::o}, ""},
      {"mlp", Stage::norm2, {Proj::gate, Proj::up}, "post_attention_layernorm"},
      {"down", Stage::mlp_act, {Proj::down}, ""},
  }};
  (void)c;   // every family ptqkit reads today is dense Llama-shaped (config.cpp refuses others)
  return dense;
}

LinearShape linear_shape(const LlamaConfig& c, Proj p) {
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  switch (p) {
    case Proj::q: return {c.q_dim(), d};
    case Proj::k:
    case Proj::v: return {c.kv_dim(), d};
    case Proj::o: return {d, c.q_dim()};
    case Proj::gate:
    case Proj::up: return {f, d};
    case Proj::down: return {d, f};
  }
  fail(Errc::usage, "", "linear_shape", "unknown Linear");
}

bool linear_has_bias(const LlamaConfig& c, Proj p) {
  return (p <= Proj::v && c.qkv_bias) || (p == Proj::o && c.o_bias) || (p >= Proj::gate && c.mlp_bias);
}

}  // namespace ptq
