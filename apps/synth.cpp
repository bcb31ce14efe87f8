// synth.cpp — `ptqkit synth`: a synthetic HF-layout Llama checkpoint with a real model's shapes.
#include <cstdio>
#include <memory>

#include "command.h"
#include "core/error.h"
#include "model/config.h"
#include "model/synth.h"

namespace ptq {

namespace {

struct SynthArgs {
  std::string preset = "tiny", output, dtype = "f16";
  int layers = -1;
  uint64_t seed = 0;
  int64_t max_shard_mb = 0;
  bool force = false;
};
DType parse_float_dtype(const std::string& s) {
  if (s == "f16" || s == "float16") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "f32" || s == "float32") return DType::F32;
  fail(Errc::usage, "", "--dtype", "must be f16, bf16 or f32, got '" + s + "'");
}

int run_synth(const SynthArgs& a) {
  SynthOptions o;
  o.preset = a.preset;
  o.layers = a.layers;
  o.seed = a.seed;
  o.dtype = parse_float_dtype(a.dtype);
  o.force = a.force;
  if (a.max_shard_mb > 0) o.max_shard_bytes = size_t(a.max_shard_mb) << 20;
  synth_model(o, a.output);
  LlamaConfig c = load_config(a.output);
  std::printf("wrote %s: synthetic %s, %d layers, hidden %d, ffn %d, %d/%d heads, vocab %d, %s\n", a.output.c_str(), a.preset.c_str(),
              c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.vocab_size,
              std::string(dtype_name(o.dtype)).c_str());
  return 0;
}

}  // namespace

Command add_synth(CLI::App& app) {
  auto a = std::make_shared<SynthArgs>();
  CLI::App* sy = app.add_subcommand("synth", "write a synthetic HF-layout Llama checkpoint with a real model's shapes");
  sy->add_option("--preset", a->preset, "micro | tiny | small | llama2-7b | llama3-8b | llama2-70b")->default_val("tiny");
  sy->add_option("-o,--output", a->output, "output folder")->required();
  sy->add_option("--layers", a->layers, "number of decoder layers (default: the preset's)");
  sy->add_option("--seed", a->seed, "random seed")->default_val(0);
  sy->add_option("--dtype", a->dtype, "f16 | bf16 | f32")->default_val("f16");
  sy->add_option("--max-shard-mb", a->max_shard_mb, "shard size limit in MiB (default 2048)");
  sy->add_flag("--force", a->force, "replace an existing output folder");

  return {sy, [a] { return run_synth(*a); }};
}

}  // namespace ptq
