// command.h — the CLI is one file per subcommand: add_<name>(app) registers the subcommand and
// its options, bound to arguments the returned Command owns, and gives the function that runs it
// once parsed. main.cpp holds the global flags and runs whichever subcommand was parsed.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>

#include "model/tokenizer.h"

namespace ptq {

struct Command {
  CLI::App* app = nullptr;        // the subcommand (parsed() says whether it was asked for)
  std::function<int()> run;       // its exit code (core/error.h)
};

Command add_quantize(CLI::App& app);
Command add_schemes(CLI::App& app);   // quantize.cpp
Command add_formats(CLI::App& app);   // quantize.cpp
Command add_dist_worker(CLI::App& app);   // quantize.cpp: a rank of quantize --gpus N
Command add_eval(CLI::App& app);
Command add_generate(CLI::App& app);
Command add_synth(CLI::App& app);
Command add_inspect(CLI::App& app);
Command add_report(CLI::App& app);
Command add_compare(CLI::App& app);
// `bench` and its subcommands (eval, gptq, kernels): one Command per leaf.
std::vector<Command> add_bench(CLI::App& app);

// Shared by several commands.
// The tokenizer at --tokenizer's path when given, else in the model folder. A model folder without
// one fails (Errc::io, naming the folder) with `ways_out` added: the command's flags that avoid it.
std::unique_ptr<Tokenizer> cli_tokenizer(const std::string& tokenizer_flag, const std::string& model_dir, int bos_hint, const std::string& ways_out);

}  // namespace ptq
