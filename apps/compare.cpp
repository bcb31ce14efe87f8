// compare.cpp — `ptqkit compare`: quantization runs side by side (report/compare.h).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "command.h"
#include "core/fsutil.h"
#include "report/compare.h"

namespace ptq {

Command add_compare(CLI::App& app) {
  struct Args {
    CompareInputs in;
    int modules = 10;
    bool markdown = false;
    std::string json_out;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("compare", "quantization runs side by side: recipe, size, time, output error against RTN, perplexity and KL, and the modules that differ most");
  sub->add_option("runs", a->in.runs, "quantize output folders (or their report.json)")->required();
  sub->add_option("--eval", a->in.evals, "`ptqkit eval --json` results of these runs (matched by their model folder) and of the source model (the float row), on one text or several (a row per text and model)");
  sub->add_option("--modules", a->modules, "how many modules to list, those where the runs differ most (-1: all, 0: none)")->capture_default_str();
  sub->add_flag("--markdown", a->markdown, "GitHub markdown tables");
  sub->add_option("--json", a->json_out, "write the comparison as JSON here");
  return {sub, [a] {
            const nlohmann::json c = compare_runs(a->in);
            std::fputs(compare_text(c, a->modules, a->markdown).c_str(), stdout);
            if (!a->json_out.empty()) write_file_atomic(a->json_out, c.dump(1) + "\n");
            return 0;
          }};
}

}  // namespace ptq
