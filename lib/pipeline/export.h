// export.h — the pipeline's last step: every format the recipe asks for, written from the layer
// store (one format: its files in the output folder; several: one subfolder each).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/llama.h"
#include "pipeline/recipe.h"
#include "quant/qstore.h"

namespace ptq {

// Writes r.formats into out_dir from `store` (NF4: from the model itself) and returns report.json's
// "outputs". NF4 runs add their modules to `modules` (the report's list). `known`: every module name.
// `vocab`: the model's vocabulary where the caller has loaded it (GGUF embeds it), else null.
nlohmann::json export_formats(const Recipe& r, const LlamaModel& model, const QuantStore& store, const std::string& out_dir,
                              const std::vector<std::string>& known, nlohmann::json& modules, const VocabInfo* vocab = nullptr);

}  // namespace ptq
