// ptqkit — command-line entry point: the global flags, then whichever subcommand was parsed (one
// file each: command.h). Each subcommand is a thin layer over lib/: parse options, call the
// library, print a summary to stdout and write JSON where asked.
// Errors: "ptqkit: error: FILE: FIELD: message" on stderr, exit code by kind (core/error.h).
#include <omp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <vector>

#include "command.h"
#include "core/build_info.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/progress.h"
#ifdef PTQKIT_HAVE_CUDA
#include "cuda/comm.h"
#endif

namespace {
// --version: the build (core/build_info.h), and where the build has NCCL whether this machine's
// libnccl opens (cuda/libs.cpp opens it for --gpus alone; --version asks, 0.03 s here).
std::string version_text() {
  std::string s = ptq::describe_build();
#ifdef PTQKIT_HAVE_CUDA
  if (ptq::cuda::nccl_built()) {
    try {
      s += " (libnccl " + ptq::cuda::nccl_version() + " opens here)";
    } catch (const ptq::Error&) {
      s += " (but libnccl cannot be opened here: quantize --gpus is refused)";
    }
  }
#endif
  return s;
}

// SIGINT / SIGTERM: say what happened and what is left, then exit non-zero at once. Output folders
// are only ever complete under their final name; an interrupted quantization leaves OUT.partial,
// which `ptqkit quantize ... --resume` continues.
extern "C" void on_signal(int sig) {
  const char msg[] = "\nptqkit: interrupted; nothing was committed (an unfinished quantization stays in OUTPUT.partial: rerun with --resume)\n";
  ssize_t ignored = ::write(2, msg, sizeof msg - 1);
  (void)ignored;
  ::_exit(128 + sig);
}
}  // namespace

int main(int argc, char** argv) {
  using namespace ptq;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  tune_allocator();
  CLI::App app{"ptqkit: post-training quantization of Llama-family models (GPTQ, RTN, SmoothQuant) on CPU and CUDA"};
  app.require_subcommand(1);
  bool quiet = false;
  int threads = 0;
  std::string log_json;
  app.add_flag("-q,--quiet", quiet, "no progress output");
  app.add_option("--log-json", log_json, "write progress, results and errors as JSON lines to this file (batch jobs)");
  app.add_option("--threads", threads, "OpenMP threads (default: all cores)");
  app.set_version_flag("--version", version_text, "the version, the git commit, the compiler and instruction set, GPU support");

  std::vector<Command> commands = {add_quantize(app), add_schemes(app), add_formats(app), add_eval(app), add_generate(app), add_synth(app), add_inspect(app), add_report(app), add_compare(app), add_dist_worker(app)};
  for (Command& c : add_bench(app)) commands.push_back(std::move(c));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  Progress::set_quiet(quiet);
  if (threads > 0) omp_set_num_threads(threads);
  try {
    if (!log_json.empty()) {
      open_json_log(log_json);
      log_event("command", {{"argv", std::vector<std::string>(argv, argv + argc)}, {"build", build_json()}});
    }
    for (Command& c : commands)
      if (c.app->parsed()) return c.run();
    fail(Errc::usage, "", "", "no command given; see --help");
  } catch (const Error& e) {
    std::fprintf(stderr, "ptqkit: error: %s\n", e.what());
    log_event("error", {{"exit_code", int(e.code)}, {"file", e.file}, {"field", e.field}, {"message", e.what()}});
    return int(e.code);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ptqkit: error: %s\n", e.what());
    log_event("error", {{"exit_code", 1}, {"message", e.what()}});
    return 1;
  }
}
