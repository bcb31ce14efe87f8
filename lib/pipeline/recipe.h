// recipe.h — a quantization run described in YAML (configs/*.yaml), validated against a schema:
// an unknown key or a wrong type is an error naming its path, with a suggestion for typos.
#pragma once
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "calib/calibration.h"
#include "quant/quantizer.h"

namespace ptq {

struct Recipe {
  std::string source;                       // the recipe file ("" when built in code)
  std::string model, output, device = "auto";
  bool gpu_forward = true;                  // with a GPU: run the forward there too (else only Hessians and solves)
  // Where the GPU forward keeps the calibration activations: device, host (page-locked memory,
  // copied in and out by chunks), or auto (device when they fit beside the solve's needs).
  std::string gpu_activations = "auto";
  // Data-parallel calibration over this many GPUs of the machine, one process each, through NCCL
  // (pipeline/distributed.h); 0: one GPU, no NCCL. `--gpus N` on the command line.
  int gpus = 0;
  // MoE models: every expert's Hessians from every calibration token (true: llm-compressor's
  // convention, no expert goes unseen), or from the tokens the router sends it (false; an expert
  // with fewer tokens than its input width is rounded to nearest, with a warning). The layer's
  // output always uses the routed experts only.
  bool moe_calibrate_all_experts = true;
  CalibSpec calibration;                    // seq_len 0 = min(2048, the model's context)
  bool dataset_given = false;               // calibration.dataset was written (the CLI refuses a silent random default)
  QuantSpec quant;                          // defaults for every quantized module
  bool true_sequential = true;
  std::vector<std::string> ignore = {"lm_head", "model.embed_tokens"};
  std::vector<std::pair<std::string, YAML::Node>> overrides;   // pattern -> fields of QuantSpec
  std::vector<std::string> formats = {"fake"};
  int64_t max_shard_mb = 2048;
  // export.gguf_type: a block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) or llama.cpp's
  // mix Q4_K_M / Q5_K_M; "": the type the quantization settings map to
  std::string gguf_type;
  // export.gguf_output_type / gguf_embedding_type: the types of output.weight and token_embd.weight
  // in a GGUF file: auto (llama.cpp's quantizer's choice for the file's type, pipeline.cpp's
  // plan_gguf_beside, which writes the resolved type into the run's recipe), float (the model's
  // float type), or a block type (rounded to nearest on its grid)
  std::string gguf_output_type = "auto", gguf_embedding_type = "auto";
  int nf4_blocksize = 64;
  bool nf4_double_quant = false;
  // SmoothQuant and W8A8 (int8 activations)
  struct Smooth {
    bool enabled = false;
    bool auto_alpha = false;   // alpha: auto
    double alpha = 0.5;
    std::vector<std::string> pairs = {"input_layernorm", "post_attention_layernorm"};
  } smooth;
  ActQuant::Mode act_mode = ActQuant::none;   // quantization.activations (implied per_token by smoothquant)
  // AWQ's activation-aware scales (smoothquant/awq.h) for weight-only quantization: searched per
  // pair over `grid` ratios, folded into what feeds the group (a norm, or the rows of v_proj /
  // up_proj: model/schedule.h's ScaleSource) before RTN or GPTQ. The default is AutoAWQ's four.
  struct Awq {
    bool enabled = false;
    int grid = 20;
    bool duo_scaling = true;   // s = x̄^r / w̄^(1-r) (AutoAWQ's and llm-compressor's default); false: x̄^r
    std::vector<std::string> pairs = {"input_layernorm", "v_proj", "post_attention_layernorm", "up_proj"};
    // AutoAWQ's clipping search (gptq/clip.h) on every quantized Linear but q/k (RTN, or GPTQ with
    // static groups); unset in the file: on for RTN, off for GPTQ; written out resolved
    bool clip = true;
  } awq;

  QuantSpec spec_for(const std::string& module) const;   // quant with matching overrides applied in order
  bool ignored(const std::string& module) const;
  YAML::Node to_yaml() const;                            // the effective recipe, every field explicit
};

// Parses and validates. `sets` are "key.path=value" overrides applied before validation.
Recipe load_recipe(const std::string& path, const std::vector<std::string>& sets = {});
Recipe parse_recipe(YAML::Node root, const std::string& file);
void apply_set(YAML::Node& root, const std::string& assignment);   // "quantization.bits=3"

// Module patterns: "re:<regex>" (full match), a glob with * and ?, or a plain name that matches
// the module itself or any module ending in ".<name>" ("down_proj", "lm_head").
nlohmann::json yaml_to_json(const YAML::Node& n);   // scalars typed as int, float, bool or string

bool pattern_matches(const std::string& pattern, const std::string& module);

size_t edit_distance(const std::string& a, const std::string& b);   // Levenshtein (the "did you mean" suggestions)

}  // namespace ptq
