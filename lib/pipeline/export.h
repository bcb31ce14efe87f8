// export.h — the pipeline's last step: every format the recipe asks for, written from the layer
// store (one format: its files in the output folder; several: one subfolder each).
#pragma once
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/common.h"
#include "model/llama.h"
#include "pipeline/recipe.h"
#include "quant/qstore.h"

namespace ptq {

// Writes r.formats into out_dir from `store` (NF4: from the model itself) and returns report.json's
// "outputs". NF4 runs add their modules to `modules` (the report's list). `known`: every module name.
// `vocab`: the model's vocabulary where the caller has loaded it (GGUF embeds it), else null.
// `tables`: GGUF's output and embedding blocks formed ahead (gguf_tables_ahead), else null.
nlohmann::json export_formats(const Recipe& r, const LlamaModel& model, const QuantStore& store, const std::string& out_dir,
                              const std::vector<std::string>& known, nlohmann::json& modules, const VocabInfo* vocab = nullptr,
                              const std::map<std::string, GgufTable>* tables = nullptr);

// GGUF's output.weight and token_embd.weight in a block type (the recipe's resolved
// export.gguf_output_type / gguf_embedding_type, without quantization.mse) are llama.cpp's
// quantizer's rounding of the float model: no calibration enters them. A run with a GPU forms them
// on a thread of their own while the GPU calibrates (half the OpenMP threads; 3.5-3.9 s of a 7B
// Q4_K_M export on 16 cores), the same bytes the writer would form. Empty (no valid future) where the
// recipe writes no such table.
struct GgufTablesAhead {
  std::future<std::map<std::string, GgufTable>> tables;
  double seconds = 0;   // the thread's time (report.json's background_seconds)
};
void gguf_tables_ahead(const Recipe& r, const LlamaModel& model, GgufTablesAhead& out);

}  // namespace ptq
