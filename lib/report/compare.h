// compare.h — `ptqkit compare`: quantization runs side by side, read from their report.json files
// and, where given, `ptqkit eval --json` results. Nothing is recomputed; every number is one the
// runs and evaluations wrote.
//
// Per run: what it asked for (method, bits, group size, act-order, SmoothQuant's alpha, the
// activations' scheme, formats), what it cost (the bytes of the weight files it wrote, seconds, the
// device), what it did to the layers' outputs (the sum of its modules' output errors
// tr(dW H dW^T) / 2, and the geometric mean of each module's error over round-to-nearest's on the
// same inputs), and what it did to the model (perplexity, mean KL divergence and top-1 agreement
// from the evaluation whose `model` is the run's folder). An evaluation of the runs' source model
// gives the float row; without one, the source's perplexity comes from a KL reference.
// Evaluations of several texts (GPTQ's papers report wikitext-2, PTB and C4 side by side): those
// scored on the same tokens (the text's SHA-256, window length, windows, protocol) make one dataset,
// and each dataset's perplexities are measured against the float model's on it.
// Per module: each run's output error and its ratio to the first run's.
//
// What is refused (an Error naming the file and the field): a file that is not a report.json, an
// evaluation of no compared run nor its source, one text scored on other tokens than an earlier
// evaluation of it (window length, windows, protocol): their perplexities do not compare; a second
// evaluation of one model on the same tokens. What is said instead (notes):
// runs calibrated on other windows than the first run, or from another source model, whose output
// errors are measured on other inputs; modules some runs lack.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ptq {

struct CompareInputs {
  std::vector<std::string> runs;    // quantize output folders, or their report.json files
  std::vector<std::string> evals;   // `ptqkit eval --json` files, each of a run or of the source model
};

// {"runs": [...], "float": {...} or null, "datasets": [...], "notes": [...], "modules": [{"name",
// "loss": [per run], "vs_first": [per run]}]}; each run's and the float's "evals" are per dataset,
// "eval" the first dataset's: docs in README.md (compare).
nlohmann::json compare_runs(const CompareInputs& in);

// The comparison for a person: the runs' table (with one evaluated text, its perplexities; with
// several, a table of a row per text and model after it), the notes, and the `modules` modules where the
// runs' output errors differ most (by the largest ratio to the first run's, either way; with one
// run, the largest errors); -1: every module. GitHub-flavoured markdown tables when `markdown`.
std::string compare_text(const nlohmann::json& comparison, int modules, bool markdown);

}  // namespace ptq
