// schedule.h — a decoder layer as calibration sees it: the groups of Linears that share an input,
// in execution order, and the stage of the forward that produces each group's input. One table
// per architecture family; the CPU forward, the GPU forward, the quantization pipeline, the
// exporters and the tests iterate it instead of naming Linears.
//
// For the dense Llama family (llama, mistral, qwen2) it is the GPTQ reference's
// `sequential = [[k, v, q], [o], [up, gate], [down]]`:
//
//   group  input stage  Linears           produced by                       smoothed by
//   qkv    norm1        q_proj k_proj v_proj   xn  = rmsnorm1(X)            input_layernorm
//   o      attention    o_proj            ctx = attention(q, k, v of xn)
//   mlp    norm2        gate_proj up_proj X += o(ctx); xn2 = rmsnorm2(X)    post_attention_layernorm
//   down   mlp_act      down_proj         act = silu(gate(xn2)) * up(xn2)
//   (then X += down(act): the layer's output, the next layer's input)
//
// The other families:
//   - Phi-3 (fused Linears): qkv = {qkv_proj}, mlp = {gate_up_proj}: each is one Linear whose rows
//     hold the parts, quantized as the checkpoint stores it, with one Hessian.
//   - MoE layers (mixtral; qwen3_moe but its dense layers): qkv and o as above, then
//       experts.mlp     expert_in   gate, up of every expert   xn2 = rmsnorm2(X), every row
//       experts.e.down  expert_act  down of e                  silu(gate_e(xn2)) * up_e(xn2)
//     when every calibration row goes through every expert (the default): the experts' gate/up
//     share one Hessian, so they are one group and one (stacked) solve. With routed calibration
//     (experts_share_input false) each expert has its own input rows, and its own groups:
//       experts.e.mlp   expert_in   gate, up of e   xn2 on the rows routed to e
//       experts.e.down  expert_act  down of e       silu(gate_e(xn2)) * up_e(xn2) on those rows
//     Then X += the routed experts' outputs, weighted. The router stays float. experts.mlp's
//     norm is post_attention_layernorm: AWQ and SmoothQuant fold their factors into every expert's
//     gate, up and the router's columns (the routing unchanged). Routed calibration has no shared
//     group, so no norm pair there.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/llama.h"

namespace ptq {

// The stage of the forward whose output is a group's input.
enum class Stage { norm1, attention, norm2, mlp_act, expert_in, expert_act };
const char* stage_name(Stage s);

struct LinearGroup {
  std::string name;            // "qkv", "o", "mlp", "down": its key in reports and saved statistics
  Stage input;                 // what produces the group's input
  std::vector<LinearId> linears;   // the Linears that read it, in quantization order
  std::string smooth_norm;     // SmoothQuant: the norm folded into the group ("" if none precedes it)
  int expert = -1;             // MoE groups: the expert (Stage::expert_act, routed expert_in); -1: every expert
};

struct LayerSchedule {
  std::vector<LinearGroup> groups;   // execution order
  std::vector<LinearId> linears() const; // every quantizable Linear of the layer, group by group
};

// The schedule of decoder layer `layer` (dense families: every layer alike; Qwen3-MoE may mix
// dense and sparse layers).
// experts_share_input: MoE calibration routes every row through every expert (recipe
// moe.calibrate_all_experts), so the experts' gate/up form one group.
LayerSchedule layer_schedule(const LlamaConfig& c, int layer, bool experts_share_input = true);

// AWQ's Linear-to-Linear pairs: the Linear whose output rows are group g's input channels, one
// for one — v_proj before o_proj (the attention mixes positions, never channels), up_proj before
// down_proj (silu(gate) · up is linear in up), each MoE expert's up before its down — and, for
// each input column j of g, the row of it that feeds j: with grouped-query attention every query
// head of a KV head reads the same v rows, so their columns share a row (and a scale). Phi-3's
// are row ranges of qkv_proj and gate_up_proj. `pair` is empty for the norms' groups.
struct ScaleSource {
  std::string pair;           // "v_proj" or "up_proj" (the recipe's quantization.awq.pairs name)
  std::string key;            // the factors' name in saved statistics: pair, or "experts.<e>.up_proj"
  LinearId id;                // the Linear (fused: qkv or gate_up)
  std::vector<int64_t> row;   // [g's input width]: the row of id that feeds column j
};
ScaleSource scale_source(const LlamaConfig& c, const LinearGroup& g);

// Linear p's weight shape [out, in] under config c (written once: readers, synthetic models,
// format checks and the GPU buffers take it from here).
struct LinearShape {
  int64_t out = 0, in = 0;
};
LinearShape linear_shape(const LlamaConfig& c, LinearId id);
// Whether the checkpoint carries a bias for Linear p (qwen2: q, k, v; experts never).
bool linear_has_bias(const LlamaConfig& c, LinearId id);

}  // namespace ptq
