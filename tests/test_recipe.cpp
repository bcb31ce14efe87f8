#include <filesystem>

#include "core/error.h"
#include "core/fsutil.h"
#include "pipeline/recipe.h"
#include "pipeline/schemes.h"
#include "testing.h"
#include "testing_recipe.h"

using namespace ptq;

static std::string error_of(const std::string& yaml) { return ptqtest::recipe_error(yaml); }

TEST_CASE("recipe: unknown keys and wrong types name their path") {
  CHECK(error_of("quantization:\n  group_sise: 32\n") == "r.yaml: quantization.group_sise: unknown key; did you mean group_size?");
  CHECK(error_of("quantisation:\n  bits: 4\n") == "r.yaml: quantisation: unknown key; did you mean quantization?");
  CHECK(error_of("quantization:\n  bits: four\n") == "r.yaml: quantization.bits: must be an integer");
  CHECK(error_of("quantization:\n  sym: maybe\n") == "r.yaml: quantization.sym: must be true or false");
  CHECK(error_of("quantization:\n  bits: 5\n") == "r.yaml: quantization.bits: must be 2, 3, 4 or 8");
  CHECK(error_of("quantization:\n  method: awq\n").find("quantization.method: must be gptq, rtn or nf4") != std::string::npos);
  CHECK(error_of("calibration:\n  samples: 0\n").find("calibration.samples") != std::string::npos);
  CHECK(error_of("quantization:\n  overrides:\n    '*.down_proj': {bitz: 8}\n").find("quantization.overrides.*.down_proj.bitz: unknown key; did you mean bits?") !=
        std::string::npos);
  CHECK(error_of("export:\n  format: ggml\n").find("export.format: unknown format 'ggml'") != std::string::npos);
  CHECK(error_of("export:\n  format: nf4\n").find("nf4 is data-free: it needs quantization.method: nf4") != std::string::npos);
  CHECK(error_of("device: tpu\n").find("device: must be cpu, cuda or auto") != std::string::npos);
  CHECK(error_of("gpu_activations: disk\n") == "r.yaml: gpu_activations: must be auto, device or host");
}

TEST_CASE("recipe: --set overrides any field, creating what is missing") {
  YAML::Node root = YAML::Load("quantization:\n  bits: 4\n");
  apply_set(root, "quantization.bits=3");
  apply_set(root, "calibration.seed=42");
  apply_set(root, "quantization.sym=false");
  Recipe r = parse_recipe(root, "r.yaml");
  CHECK(r.quant.bits == 3);
  CHECK(r.calibration.seed == 42);
  CHECK_FALSE(r.quant.sym);
  CHECK_THROWS_WITH(apply_set(root, "novalue"), Catch::Contains("expected key.path=value"));
}

TEST_CASE("recipe: override patterns, ignore defaults, the effective recipe round-trips") {
  Recipe r = parse_recipe(YAML::Load(R"(
quantization:
  bits: 4
  overrides:
    "*.down_proj": {bits: 8}
    "re:model\\.layers\\.0\\..*": {group_size: 64}
    "v_proj": {method: rtn}
)"),
                          "r.yaml");
  CHECK(r.spec_for("model.layers.3.mlp.down_proj").bits == 8);
  CHECK(r.spec_for("model.layers.3.mlp.up_proj").bits == 4);
  CHECK(r.spec_for("model.layers.0.mlp.down_proj").group_size == 64);
  CHECK(r.spec_for("model.layers.0.mlp.down_proj").bits == 8);
  CHECK(r.spec_for("model.layers.2.self_attn.v_proj").method == "rtn");
  CHECK(r.ignored("lm_head"));
  CHECK(r.ignored("model.embed_tokens"));
  CHECK_FALSE(r.ignored("model.layers.0.mlp.down_proj"));
  CHECK(pattern_matches("down_proj", "model.layers.1.mlp.down_proj"));
  CHECK_FALSE(pattern_matches("own_proj", "model.layers.1.mlp.down_proj"));
  Recipe again = parse_recipe(r.to_yaml(), "effective.yaml");
  CHECK(YAML::Dump(again.to_yaml()) == YAML::Dump(r.to_yaml()));
  CHECK(again.spec_for("model.layers.3.mlp.down_proj").bits == 8);
}

TEST_CASE("every recipe shipped in configs/ is valid") {
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(std::string(PTQKIT_SOURCE_DIR) + "/configs")) {
    if (e.path().extension() != ".yaml") continue;
    INFO(e.path());
    CHECK_NOTHROW(load_recipe(e.path().string()));
    ++n;
  }
  CHECK(n >= 4);
}

TEST_CASE("recipe: export.gguf_type names llama.cpp's type (or mix) and sets the quantization's bits, groups and grid") {
  const std::string q4 = "quantization:\n  bits: 4\n  group_size: 32\n  sym: true\n";
  CHECK(error_of(q4 + "export:\n  format: gguf\n  gguf_type: Q4_0\n").empty());
  CHECK(error_of("quantization:\n  bits: 8\n  group_size: 32\n  sym: true\nexport:\n  format: gguf\n  gguf_type: Q8_0\n").empty());
  CHECK(error_of(q4 + "export:\n  format: gguf\n  gguf_type: Q3_Z\n") ==
        "r.yaml: export.gguf_type: unknown GGUF type 'Q3_Z' (llama.cpp's names: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; the mixes Q4_K_M, Q5_K_M, Q4_K_S and Q5_K_S)");
  CHECK(error_of(q4 + "export:\n  format: gguf\n  gguf_type: Q8_0\n") ==
        "r.yaml: export.gguf_type: Q8_0 holds bits 8; the recipe sets bits: 4 (leave it out: the type sets it)");
  CHECK(error_of(q4 + "export:\n  format: gguf\n  gguf_type: Q4_1\n") ==
        "r.yaml: export.gguf_type: Q4_1 holds sym false; the recipe sets sym: true (leave it out: the type sets it)");
  // the type sets what the recipe leaves out
  const Recipe k = parse_recipe(YAML::Load("quantization:\n  act_order: true\nexport:\n  format: gguf\n  gguf_type: Q4_K_M\n"), "r.yaml");
  CHECK(k.quant.bits == 4);
  CHECK(k.quant.group_size == 32);
  CHECK(!k.quant.sym);
  CHECK(k.quant.form == GridForm::k_min);
  CHECK(k.quant.static_groups);
  const Recipe ks = parse_recipe(YAML::Load("export:\n  format: gguf\n  gguf_type: Q5_K_S\n"), "r.yaml");   // the _S mixes too
  CHECK(ks.quant.bits == 5);
  CHECK(ks.quant.form == GridForm::k_min);
  const Recipe six = parse_recipe(YAML::Load("export:\n  format: gguf\n  gguf_type: Q6_K\n"), "r.yaml");
  CHECK(six.quant.bits == 6);
  CHECK(six.quant.group_size == 16);
  CHECK(six.quant.form == GridForm::k_sym);
  // per module, in quantization.overrides (a mix only model-wide)
  const Recipe o = parse_recipe(YAML::Load("quantization:\n  overrides:\n    down_proj: {gguf_type: Q6_K}\nexport:\n  format: gguf\n  gguf_type: Q4_K\n"), "r.yaml");
  CHECK(o.spec_for("model.layers.0.mlp.down_proj").form == GridForm::k_sym);
  CHECK(o.spec_for("model.layers.0.mlp.up_proj").form == GridForm::k_min);
  // output.weight's and token_embd.weight's types: auto (the default), float or a block type
  CHECK(k.gguf_output_type == "auto");
  CHECK(k.gguf_embedding_type == "auto");
  CHECK(error_of(q4 + "export:\n  format: gguf\n  gguf_output_type: Q6_K\n  gguf_embedding_type: float\n").empty());
  CHECK(error_of(q4 + "export:\n  format: gguf\n  gguf_output_type: F16\n") ==
        "r.yaml: export.gguf_output_type: 'F16' is not auto, float or a block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)");
  CHECK(error_of(q4 + "export:\n  format: gptq\n  gguf_embedding_type: float\n") ==
        "r.yaml: export.gguf_embedding_type: applies to the gguf format, which export.format does not list");
  CHECK(error_of("quantization:\n  overrides:\n    down_proj: {gguf_type: Q4_K_M}\nexport:\n  format: gguf\n").find(
            "quantization.overrides.down_proj.gguf_type: unknown GGUF type 'Q4_K_M'") != std::string::npos);
  CHECK(error_of("quantization:\n  overrides:\n    down_proj: {gguf_type: Q6_K}\nexport:\n  format: fake\n") ==
        "r.yaml: quantization.overrides.down_proj.gguf_type: applies to the gguf format, which export.format does not list");
  CHECK(error_of(q4 + "export:\n  format: fake\n  gguf_type: Q4_0\n") ==
        "r.yaml: export.gguf_type: applies to the gguf format, which export.format does not list");
  // written back only when set (recipes without it keep their bytes)
  CHECK(parse_recipe(YAML::Load(q4 + "export:\n  format: gguf\n  gguf_type: Q4_0\n"), "r.yaml").to_yaml()["export"]["gguf_type"].as<std::string>() == "Q4_0");
  CHECK(!parse_recipe(YAML::Load(q4 + "export:\n  format: gguf\n"), "r.yaml").to_yaml()["export"]["gguf_type"]);
}

TEST_CASE("schemes: every named scheme is a valid recipe with its deployable format, names and datasets checked") {
  for (const Scheme& s : schemes()) {
    INFO(s.name);
    const Recipe r = parse_recipe(scheme_recipe(s, "m", "o", "random", ""), "--scheme " + s.name);
    REQUIRE(r.formats.size() == 1);
    CHECK(r.formats[0] == s.format);
    CHECK(r.model == "m");
    if (s.calibrated) CHECK(r.calibration.dataset == "random");
  }
  const Recipe w4 = parse_recipe(scheme_recipe(find_scheme("w4a16"), "m", "o", "c.txt", ""), "s");
  CHECK(w4.quant.bits == 4);
  CHECK(w4.quant.group_size == 128);
  CHECK(w4.quant.sym);
  CHECK(w4.quant.act_order);
  CHECK(w4.quant.static_groups);
  CHECK(w4.calibration.dataset == "c.txt");
  const Recipe w8a8 = parse_recipe(scheme_recipe(find_scheme("W8A8"), "m", "o", "c.txt", ""), "s");
  CHECK(w8a8.smooth.enabled);
  CHECK(w8a8.smooth.auto_alpha);
  CHECK(w8a8.act_mode == ActQuant::per_token);
  CHECK(parse_recipe(scheme_recipe(find_scheme("W8A8-STATIC"), "m", "o", "c.txt", ""), "s").act_mode == ActQuant::per_tensor);
  CHECK(parse_recipe(scheme_recipe(find_scheme("NF4"), "m", "o", "", ""), "s").quant.method == "nf4");   // data-free: no dataset needed
  const Recipe k = parse_recipe(scheme_recipe(find_scheme("Q4_K_M"), "m", "o", "c.txt", ""), "s");
  CHECK(k.gguf_type == "Q4_K_M");
  CHECK(k.quant.form == GridForm::k_min);
  CHECK(parse_recipe(scheme_recipe(find_scheme("W4A16"), "m", "o", "c.txt", "gptq"), "s").formats == std::vector<std::string>{"gptq"});
  CHECK_THROWS_WITH(find_scheme("W4A61"), "--scheme: W4A61: no such scheme; did you mean W4A16? (`ptqkit schemes` lists them)");
  CHECK_THROWS_WITH(scheme_recipe(find_scheme("W4A16"), "m", "o", "", ""),
                    Catch::Contains("--dataset: calibration text is needed") && Catch::Contains("`--dataset random`"));
  // W8A8 with a format that holds only weights: the recipe's own check names the format
  CHECK_THROWS_WITH(parse_recipe(scheme_recipe(find_scheme("W8A8"), "m", "o", "c.txt", "gguf"), "--scheme W8A8"),
                    Catch::Contains("export.format: gguf holds weight-only quantization"));
}

TEST_CASE("recipe: gpus is 0 (one GPU, no NCCL) to 64, written to the effective recipe only where set") {
  const Recipe one = parse_recipe(YAML::Load("model: m\n"), "r.yaml");
  CHECK(one.gpus == 0);
  CHECK_FALSE(one.to_yaml()["gpus"]);
  const Recipe four = parse_recipe(YAML::Load("gpus: 4\n"), "r.yaml");
  CHECK(four.gpus == 4);
  CHECK(four.to_yaml()["gpus"].as<int>() == 4);
  CHECK_THROWS_WITH(parse_recipe(YAML::Load("gpus: -1\n"), "r.yaml"), Catch::Contains("gpus"));
  CHECK_THROWS_WITH(parse_recipe(YAML::Load("gpus: two\n"), "r.yaml"), Catch::Contains("gpus"));
}
