// bench.h — the arguments of `ptqkit bench gptq` (bench_gptq.cpp), shared with its registration in bench.cpp.
#pragma once
#include <string>

namespace ptq {

struct BenchGptqArgs {
  std::string preset = "llama2-7b";
  int samples = 128, seq_len = 2048, bits = 4, group = 128;
  bool act_order = true;
  int layers = 0;            // > 0: the whole pipeline on a synthetic checkpoint of this many layers
  std::string workdir;       // where it is written (default: a temporary folder, removed after)
  std::string gpu_activations = "auto";
  bool batch = true;         // one layer: MoE expert downs in batched solves, as the pipeline solves them
};
int run_bench_gptq(const BenchGptqArgs& a);

}  // namespace ptq
