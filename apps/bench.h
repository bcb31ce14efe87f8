// bench.h — the arguments of `ptqkit bench gptq` (bench_gptq.cpp), shared with its registration in bench.cpp.
#pragma once
#include <string>
#include <vector>

namespace ptq {

struct BenchGptqArgs {
  std::string preset = "llama2-7b";
  int samples = 128, seq_len = 2048, bits = 4, group = 128;
  bool act_order = true;
  int layers = 0;            // > 0: the whole pipeline on a synthetic checkpoint of this many layers
  std::string workdir;       // where it is written (default: a temporary folder, removed after)
  std::string gpu_activations = "auto";
  bool batch = true;         // one layer: MoE expert downs in batched solves, as the pipeline solves them
  int gpus = 0;              // > 0: the pipeline data-parallel over this many GPUs (quantize --gpus); implies layers >= 1
};
int run_bench_gptq(const BenchGptqArgs& a);

struct BenchDecodeArgs {
  std::string preset = "llama2-7b";
  int layers = -1;           // -1: the preset's
  std::vector<std::string> formats{"f16", "w8a16", "w4a16", "nf4", "w8a8"};
  std::vector<int> batches{1, 8, 32};
  int prompt = 128, decode = 256;
  bool no_graph = false;     // plain launches instead of a CUDA graph per step
  bool apart = false;        // q, k, v and gate, up as separate Linears (default: stacked, one each)
  std::string json_out;
};
int run_bench_decode(const BenchDecodeArgs& a);   // bench_decode.cpp

}  // namespace ptq
