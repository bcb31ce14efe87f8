#include "pipeline/export.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "core/fsutil.h"
#include "formats/fake.h"
#include "formats/gguf.h"
#include "formats/open.h"
#include "formats/packed.h"

namespace ptq {

using nlohmann::json;

namespace {

// Dequantized weights (for NF4: the NF4 values) in the source dtype; W8A8 runs record their int8
// activations in config.json, so that ptqkit evaluates the checkpoint as W8A8.
std::vector<std::string> export_fake_dir(const Recipe& r, const ExportJob& job, const std::vector<std::string>& known) {
  const bool nf4 = r.quant.method == "nf4";
  const LlamaModel& model = *job.model;
  std::vector<std::string> files = export_fake(model.checkpoint(), nf4 ? nf4_dequantized(job) : dequantized_from(*job.store), job.out_dir, job.max_shard_bytes);
  for (auto& s : copy_side_files(r.model, job.out_dir)) files.push_back(s);
  if (r.act_mode != ActQuant::none) {
    json cfg = model.config().raw, scales = json::object();
    for (auto& m : known)
      if (layer_of(m) >= 0 && job.store->act_quant(m).mode != ActQuant::none) scales[m] = job.store->act_quant(m).static_scale;
    cfg["ptqkit_w8a8"] = {{"strategy", r.act_mode == ActQuant::per_token ? "token" : "tensor"}, {"input_scales", scales}};
    write_file_atomic(job.out_dir + "/config.json", cfg.dump(2) + "\n");
  }
  return files;
}

}  // namespace

void gguf_tables_ahead(const Recipe& r, const LlamaModel& model, GgufTablesAhead& out) {
  if (r.quant.mse || std::find(r.formats.begin(), r.formats.end(), "gguf") == r.formats.end()) return;
  const auto [output, embedding] = gguf_table_names(model.checkpoint());
  std::vector<std::pair<std::string, GgmlType>> todo;
  GgmlType t;
  if (!output.empty() && parse_ggml_type(r.gguf_output_type.c_str(), &t)) todo.push_back({output, t});
  if (!embedding.empty() && parse_ggml_type(r.gguf_embedding_type.c_str(), &t)) todo.push_back({embedding, t});
  if (todo.empty()) return;
  const int threads = std::max(1, omp_get_max_threads() / 2);   // half the run's (--threads): the other half stays its own
  out.tables = std::async(std::launch::async, [&model, todo, threads, &seconds = out.seconds] {
    const auto t0 = std::chrono::steady_clock::now();
    omp_set_num_threads(threads);   // this thread's OpenMP teams
    std::map<std::string, GgufTable> m;
    for (const auto& [hf, type] : todo) m[hf] = GgufTable{type, gguf_table_bytes(model, hf, type)};
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return m;
  });
}

json export_formats(const Recipe& r, const LlamaModel& model, const QuantStore& store, const std::string& out_dir,
                    const std::vector<std::string>& known, json& modules, const VocabInfo* vocab, const std::map<std::string, GgufTable>* tables) {
  const bool nf4 = r.quant.method == "nf4";
  ExportJob job;
  job.model = &model;
  job.vocab = vocab;
  job.store = &store;
  job.max_shard_bytes = size_t(r.max_shard_mb) << 20;
  job.true_sequential = r.true_sequential;
  job.nf4_blocksize = r.nf4_blocksize;
  job.nf4_double_quant = r.nf4_double_quant;
  auto block_type = [](const std::string& v) -> std::optional<GgmlType> {   // (pipeline.cpp's plan_gguf_beside has resolved "auto")
    GgmlType t;
    return parse_ggml_type(v.c_str(), &t) ? std::optional<GgmlType>(t) : std::nullopt;
  };
  job.gguf_output = block_type(r.gguf_output_type);
  job.gguf_embedding = block_type(r.gguf_embedding_type);
  job.gguf_mse = r.quant.mse;
  job.gguf_type = r.gguf_type;
  job.gguf_tables = tables;
  for (auto& m : known)
    if (nf4 && layer_of(m) >= 0 && !r.ignored(m)) {
      job.nf4_modules.push_back(m);
      modules.push_back({{"name", m}, {"method", "nf4"}, {"blocksize", r.nf4_blocksize}, {"double_quant", r.nf4_double_quant}});
    }
  json outputs = json::array();
  for (auto& f : r.formats) {
    job.out_dir = r.formats.size() == 1 ? out_dir : out_dir + "/" + f;
    std::filesystem::create_directories(job.out_dir);
    std::vector<std::string> files;
    if (f == "fake") files = export_fake_dir(r, job, known);
    else if (f == "gptq" || f == "gptq_v2") files = export_gptq(job, f == "gptq_v2");
    else if (f == "compressed-tensors") files = r.act_mode != ActQuant::none ? export_ct_int8(job) : export_compressed_tensors(job);
    else if (f == "nf4") files = export_nf4(job);
    else if (f == "gguf") files = export_gguf(job);
    // what the format's tensors take, and the Linears' share of it a weight (formats/open.h)
    const WeightBits b = weight_bits(job.out_dir);
    outputs.push_back({{"format", f}, {"dir", r.formats.size() == 1 ? "." : f}, {"files", files}, {"tensor_bytes", b.linear_bytes + b.other_bytes},
                       {"linear_bits_per_weight", b.linear_bits()}});
  }
  return outputs;
}

}  // namespace ptq
