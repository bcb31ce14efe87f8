// inspect.cpp — `ptqkit inspect`: a checkpoint (safetensors folder or file, or GGUF) described:
// architecture, tensors, dtypes, sizes, quantization.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>

#include "command.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/json_field.h"
#include "core/safetensors.h"
#include "formats/gguf.h"
#include "formats/open.h"
#include "model/config.h"
#include "model/tokenizer.h"

namespace fs = std::filesystem;

namespace ptq {

using nlohmann::json;

std::unique_ptr<Tokenizer> cli_tokenizer(const std::string& tokenizer_flag, const std::string& model_dir, int bos_hint, const std::string& ways_out) {
  if (!tokenizer_flag.empty()) return load_tokenizer(tokenizer_flag, bos_hint);
  try {
    return load_tokenizer(model_dir, bos_hint);
  } catch (const Error& e) {   // checkpoints that ship without a tokenizer (the tiny family checkpoints)
    if (e.code != Errc::io) throw;
    fail(e.code, e.file, e.field, e.message + "; " + ways_out);
  }
}

namespace {

struct InspectArgs {
  std::string path;
  bool json = false, tensors = false;
};

int inspect_gguf(const InspectArgs& a, const std::string& path) {
  GgufFile f(path);
  std::map<std::string, std::pair<int64_t, size_t>> by_type;
  json tensors = json::array();
  size_t total = 0;
  for (auto& t : f.tensors()) {
    auto& e = by_type[ggml_type_name(t.type)];
    e.first++;
    e.second += t.nbytes;
    total += t.nbytes;
    tensors.push_back({{"name", t.name}, {"type", ggml_type_name(t.type)}, {"ne", t.ne}, {"bytes", t.nbytes}});
  }
  if (a.json) {
    std::cout << json({{"path", path}, {"format", "gguf"}, {"metadata", f.metadata()}, {"tensors", tensors}}).dump(2) << "\n";
    return 0;
  }
  const json& m = f.metadata();
  auto n = [&](const char* k) { return (long long)json_field<int64_t>(m, k, 0, Errc::format, path); };
  const std::string arch = json_field<std::string>(m, "general.architecture", "?", Errc::format, path);
  auto k = [&](const char* key) { return n((arch + "." + key).c_str()); };   // llama.cpp's per-architecture keys
  std::printf("%s\n  format        GGUF v3, %s\n", path.c_str(), arch.c_str());
  std::printf("  architecture  %lld layers, hidden %lld, ffn %lld, heads %lld/%lld, context %lld", k("block_count"), k("embedding_length"),
              k("feed_forward_length"), k("attention.head_count"), k("attention.head_count_kv"), k("context_length"));
  if (k("expert_count")) std::printf(", %lld experts (%lld per token)", k("expert_count"), k("expert_used_count"));
  std::printf("\n");
  std::printf("  tokenizer     %s\n", json_field<std::string>(m, "tokenizer.ggml.model", "none", Errc::format, path).c_str());
  std::printf("  tensors       %zu, %s\n", f.tensors().size(), human_bytes(double(total)).c_str());
  for (auto& [d, e] : by_type) std::printf("    %-8s %6lld tensors  %s\n", d.c_str(), (long long)e.first, human_bytes(double(e.second)).c_str());
  if (a.tensors)
    for (auto& t : tensors) std::printf("    %-32s %-5s %s\n", t["name"].get<std::string>().c_str(), t["type"].get<std::string>().c_str(), t["ne"].dump().c_str());
  return 0;
}

int run_inspect(const InspectArgs& a) {
  if (model_format(a.path) == "gguf") return inspect_gguf(a, fs::is_directory(a.path) ? a.path + "/model.gguf" : a.path);
  json out;
  const bool dir = fs::is_directory(a.path);
  Checkpoint ck(a.path);
  std::map<std::string, std::pair<int64_t, size_t>> by_dtype;   // dtype -> (tensors, bytes)
  json tensors = json::array();
  for (auto& n : ck.names()) {
    TensorView t = ck.get(n);
    auto& e = by_dtype[std::string(dtype_name(t.dtype))];
    e.first++;
    e.second += t.nbytes;
    tensors.push_back({{"name", n}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"bytes", t.nbytes},
                       {"file", fs::path(ck.file_of(n)).filename().string()}});
  }
  out["path"] = a.path;
  out["tensor_count"] = tensors.size();
  out["total_bytes"] = ck.total_bytes();
  for (auto& [d, e] : by_dtype) out["dtypes"][d] = {{"tensors", e.first}, {"bytes", e.second}};
  if (dir && fs::exists(a.path + "/config.json")) {
    LlamaConfig c = load_config(a.path);
    int64_t params = 0;
    for (auto& t : tensors) params += numel(t["shape"].get<Shape>());
    out["architecture"] = {{"model_type", c.model_type},       {"layers", c.num_hidden_layers}, {"hidden_size", c.hidden_size},
                           {"intermediate_size", c.intermediate_size}, {"heads", c.num_attention_heads},
                           {"kv_heads", c.num_key_value_heads}, {"head_dim", c.head_dim}, {"vocab_size", c.vocab_size},
                           {"max_position_embeddings", c.max_position_embeddings}, {"rope_theta", c.rope_theta},
                           {"rope_scaling", c.rope_scaling ? "llama3" : "none"}, {"tie_word_embeddings", c.tie_word_embeddings},
                           {"torch_dtype", dtype_name(c.dtype)}, {"parameters", params}};
    if (c.raw.contains("quantization_config")) out["quantization_config"] = c.raw["quantization_config"];
    out["format"] = model_format(a.path);
    try {
      out["tokenizer"] = load_tokenizer(a.path, c.bos_token_id)->kind();
    } catch (const Error&) {
      out["tokenizer"] = "none";
    }
  }
  if (a.json) {
    out["tensors"] = tensors;
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf("%s\n", a.path.c_str());
  if (out.contains("architecture")) {
    auto& ar = out["architecture"];
    std::printf("  architecture  %s, %d layers, hidden %d, ffn %d, heads %d/%d (head_dim %d), vocab %d, context %d\n",
                ar["model_type"].get<std::string>().c_str(), ar["layers"].get<int>(), ar["hidden_size"].get<int>(),
                ar["intermediate_size"].get<int>(), ar["heads"].get<int>(), ar["kv_heads"].get<int>(), ar["head_dim"].get<int>(),
                ar["vocab_size"].get<int>(), ar["max_position_embeddings"].get<int>());
    std::printf("  rope          theta %g, scaling %s; tied embeddings %s; dtype %s\n", ar["rope_theta"].get<double>(),
                ar["rope_scaling"].get<std::string>().c_str(), ar["tie_word_embeddings"].get<bool>() ? "yes" : "no",
                ar["torch_dtype"].get<std::string>().c_str());
    std::printf("  format        %s\n", out["format"].get<std::string>().c_str());
    std::printf("  stored values %.3f M\n", double(ar["parameters"].get<int64_t>()) / 1e6);
    std::printf("  tokenizer     %s\n", out["tokenizer"].get<std::string>().c_str());
  }
  std::printf("  tensors       %zu, %s\n", tensors.size(), human_bytes(double(ck.total_bytes())).c_str());
  for (auto& [d, e] : by_dtype) std::printf("    %-8s %6lld tensors  %s\n", d.c_str(), (long long)e.first, human_bytes(double(e.second)).c_str());
  if (out.contains("quantization_config")) std::printf("  quantization  %s\n", out["quantization_config"].dump().c_str());
  else std::printf("  quantization  none\n");
  if (a.tensors)
    for (auto& t : tensors)
      std::printf("    %-56s %-5s %-16s %s\n", t["name"].get<std::string>().c_str(), t["dtype"].get<std::string>().c_str(),
                  shape_str(t["shape"].get<Shape>()).c_str(), t["file"].get<std::string>().c_str());
  return 0;
}

}  // namespace

Command add_inspect(CLI::App& app) {
  auto a = std::make_shared<InspectArgs>();
  CLI::App* in = app.add_subcommand("inspect", "describe a checkpoint: architecture, tensors, dtypes, sizes, quantization");
  in->add_option("path", a->path, "model folder, or one .safetensors, .gguf or PyTorch .bin file")->required();
  in->add_flag("--json", a->json, "machine-readable output");
  in->add_flag("--tensors", a->tensors, "list every tensor");

  return {in, [a] { return run_inspect(*a); }};
}

}  // namespace ptq
