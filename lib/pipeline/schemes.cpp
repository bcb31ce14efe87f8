#include "pipeline/schemes.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "pipeline/recipe.h"

namespace ptq {

namespace {
std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
const std::string kGptq = "quantization: {method: gptq, act_order: true, static_groups: true, ";
Scheme gguf(const std::string& type, const std::string& what) {
  return {type, "gguf", "llama.cpp's " + type + " (" + what + "), GPTQ on the type's own grid",
          "quantization: {method: gptq, act_order: true}\nexport: {format: gguf, gguf_type: " + type + "}\n"};
}
}  // namespace

const std::vector<Scheme>& schemes() {
  static const std::vector<Scheme> s = {
      {"W4A16", "compressed-tensors", "4-bit weights, groups of 128, symmetric; GPTQ with act-order (static groups); 16-bit activations",
       kGptq + "bits: 4, group_size: 128, sym: true}\n"},
      {"W4A16-G32", "compressed-tensors", "as W4A16 with groups of 32 (more scales, less error)", kGptq + "bits: 4, group_size: 32, sym: true}\n"},
      {"W4A16-ASYM", "compressed-tensors", "as W4A16 with asymmetric groups (a zero point per group)", kGptq + "bits: 4, group_size: 128, sym: false}\n"},
      {"W4A16-AWQ", "compressed-tensors",
       "AWQ's activation-aware scales (20 ratios, searched per layer) and clipping, then round-to-nearest: 4-bit, groups of 128, asymmetric (AutoAWQ's settings)",
       "quantization: {method: rtn, bits: 4, group_size: 128, sym: false, awq: {grid: 20, clip: true}}\n"},
      {"W3A16", "gptq", "3-bit weights, groups of 128, symmetric; GPTQ with act-order (static groups)", kGptq + "bits: 3, group_size: 128, sym: true}\n"},
      {"W8A16", "compressed-tensors", "8-bit weights, one scale per output channel, symmetric; GPTQ", "quantization: {method: gptq, bits: 8, group_size: -1, sym: true}\n"},
      {"W8A8", "compressed-tensors",
       "8-bit weights per channel and 8-bit activations per token (dynamic); SmoothQuant with alpha searched, then GPTQ",
       "quantization: {method: gptq, bits: 8, group_size: -1, sym: true, smoothquant: {alpha: auto}}\n"},
      {"W8A8-STATIC", "compressed-tensors", "as W8A8 with one static activation scale per tensor, from the calibration",
       "quantization: {method: gptq, bits: 8, group_size: -1, sym: true, smoothquant: {alpha: auto}, activations: {strategy: tensor, dynamic: false}}\n"},
      {"NF4", "nf4", "bitsandbytes' 4-bit NormalFloat, blocks of 64, data-free (no calibration)", "quantization: {method: nf4}\n", false},
      gguf("Q4_0", "4-bit, groups of 32, symmetric"),
      gguf("Q4_1", "4-bit, groups of 32, f16 scale and min"),
      gguf("Q5_0", "5-bit, groups of 32, symmetric"),
      gguf("Q5_1", "5-bit, groups of 32, f16 scale and min"),
      gguf("Q8_0", "8-bit, groups of 32, symmetric"),
      gguf("Q4_K", "4-bit super-blocks of 256, 6-bit sub-block scales and mins"),
      gguf("Q5_K", "5-bit super-blocks of 256, 6-bit sub-block scales and mins"),
      gguf("Q6_K", "6-bit super-blocks of 256, 8-bit sub-block scales"),
      gguf("Q4_K_M", "mix: Q4_K, Q6_K for half of v_proj and down_proj"),
      gguf("Q5_K_M", "mix: Q5_K, Q6_K for half of v_proj and down_proj"),
      gguf("Q4_K_S", "mix: Q4_K, Q5_K for the first 4 v_proj and the first eighth's down_proj"),
      gguf("Q5_K_S", "mix: Q5_K throughout (Q8_0 for k_proj and v_proj of 8-expert models, as in every type)"),
  };
  return s;
}

const Scheme& find_scheme(const std::string& name) {
  const Scheme* best = nullptr;
  size_t bd = 4;
  for (const Scheme& s : schemes()) {
    if (upper(name) == s.name) return s;
    const size_t d = edit_distance(upper(name), s.name);
    if (d < bd) { bd = d; best = &s; }
  }
  fail(Errc::usage, "--scheme", name, "no such scheme" + (best ? "; did you mean " + best->name + "?" : std::string()) + " (`ptqkit schemes` lists them)");
}

const std::vector<FormatInfo>& export_formats() {
  static const std::vector<FormatInfo> f = {
      {"compressed-tensors", "pack-quantized int4/int8 weights, int-quantized W8A8: vLLM, llm-compressor, transformers"},
      {"gptq", "GPTQ v1 (AutoGPTQ's layout, symmetric, 2/3/4/8-bit): vLLM, transformers (optimum), GPTQModel"},
      {"gptq_v2", "GPTQ v2 (zeros stored as they are, asymmetric allowed): GPTQModel"},
      {"nf4", "bitsandbytes NF4 (method nf4): transformers + bitsandbytes"},
      {"gguf", "llama.cpp's GGUF v3 (Q4_0 ... Q6_K blocks, _M mixes): llama.cpp, ollama, LM Studio"},
      {"fake", "the quantized weights dequantized to the model's dtype (full size): for evaluation, not deployment"},
  };
  return f;
}

YAML::Node scheme_recipe(const Scheme& s, const std::string& model, const std::string& output, const std::string& dataset,
                         const std::string& format) {
  YAML::Node root = YAML::Load(s.yaml);
  root["model"] = model;
  if (!output.empty()) root["output"] = output;
  if (s.calibrated) {
    if (dataset.empty())
      fail(Errc::usage, "--scheme " + s.name, "--dataset",
           "calibration text is needed (a .txt or .jsonl file); `--dataset random` calibrates on random tokens, which the report then says");
    root["calibration"]["dataset"] = dataset;
  }
  if (!format.empty()) root["export"]["format"] = format;
  else if (!root["export"] || !root["export"]["format"]) root["export"]["format"] = s.format;
  return root;
}

}  // namespace ptq
