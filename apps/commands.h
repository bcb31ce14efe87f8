// commands.h — argument structs of the CLI's subcommands and the hooks for those defined in
// other files of apps/ (quantize, bench).
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace ptq {

struct EvalArgs {
  std::string model, data, json_out, reference, tokenizer, w8a8_path = "int", device = "cpu";
  int seq_len = 0;
  int64_t max_windows = -1, batch_tokens = 16384;
  // regression gate
  std::string baseline, write_baseline;
  double max_ppl_delta = -1, max_kl = -1, min_top1 = -1;
  bool relative = false;
};
struct SynthArgs {
  std::string preset = "tiny", output, dtype = "f16";
  int layers = -1;
  uint64_t seed = 0;
  int64_t max_shard_mb = 0;
  bool force = false;
};
struct InspectArgs {
  std::string path;
  bool json = false, tensors = false;
};

void register_more_commands(CLI::App& app);
void register_quantize(CLI::App& app);
bool quantize_parsed();
int run_quantize_command();
int run_more_commands(CLI::App& app);

}  // namespace ptq
