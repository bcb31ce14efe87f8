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

std::string field_text(const json& o, const char* k) {
  if (!o.is_object() || !o.contains(k) || o[k].is_null()) return "";
  return o[k].is_string() ? o[k].get<std::string>() : o[k].dump();
}

std::string group_text(const std::string& group_size) {
  return group_size.empty() || group_size == "-1" || group_size == "0" ? "one scale per output channel" : "groups of " + group_size;
}

// config.json's quantization_config as one line a reader takes in at a glance (--json keeps the
// whole object): the method, the bits, how scales are shared, symmetry, act-order, activations.
std::string describe_quantization(const json& q) {
  const std::string m = field_text(q, "quant_method");
  auto yes = [&](const json& o, const char* k) { return field_text(o, k) == "true"; };
  if (m == "gptq") {
    std::string s = "GPTQ (" + (field_text(q, "checkpoint_format").empty() ? std::string("gptq") : field_text(q, "checkpoint_format")) + "): " +
                    field_text(q, "bits") + "-bit weights, " + group_text(field_text(q, "group_size")) + ", " +
                    (yes(q, "sym") ? "symmetric" : "asymmetric") + ", act-order " + (yes(q, "desc_act") ? "yes" : "no");
    if (yes(q, "lm_head")) s += ", lm_head quantized";
    return s;
  }
  if (m == "compressed-tensors") {
    std::string s = "compressed-tensors (" + field_text(q, "format") + ")";
    if (q.contains("config_groups") && q["config_groups"].is_object())
      for (const auto& [name, g] : q["config_groups"].items()) {
        const json& w = g.contains("weights") ? g["weights"] : json();
        if (w.is_object()) {
          const std::string strategy = field_text(w, "strategy");
          s += ": " + field_text(w, "num_bits") + "-bit " + field_text(w, "type") + " weights, " +
               (strategy == "group" ? group_text(field_text(w, "group_size")) : strategy == "channel" ? "one scale per output channel" : "one scale per " + strategy) +
               ", " + (yes(w, "symmetric") ? "symmetric" : "asymmetric");
          const std::string act_order = field_text(w, "actorder");
          if (!act_order.empty()) s += ", act-order " + act_order;
        }
        const json& a = g.contains("input_activations") ? g["input_activations"] : json();
        if (a.is_object())
          s += "; " + field_text(a, "num_bits") + "-bit activations per " + field_text(a, "strategy") + ", " + (yes(a, "dynamic") ? "dynamic" : "static") + " scales";
        else
          s += "; 16-bit activations";
      }
    if (q.contains("ignore") && q["ignore"].is_array() && !q["ignore"].empty()) {
      s += "; kept in float: ";
      for (size_t i = 0; i < q["ignore"].size(); ++i) s += (i ? ", " : "") + (q["ignore"][i].is_string() ? q["ignore"][i].get<std::string>() : q["ignore"][i].dump());
    }
    return s;
  }
  if (m == "bitsandbytes") {
    if (yes(q, "load_in_8bit")) return "bitsandbytes LLM.int8(): 8-bit weights";
    return "bitsandbytes " + field_text(q, "bnb_4bit_quant_type") + ": 4-bit weights, blocks of 64, absmax " +
           (yes(q, "bnb_4bit_use_double_quant") ? "double-quantized (8-bit)" : "in fp32") + ", compute dtype " + field_text(q, "bnb_4bit_compute_dtype");
  }
  return (m.empty() ? std::string("unknown method") : m) + " (--json gives the whole quantization_config)";
}

int inspect_gguf(const InspectArgs& a, const std::string& path) {
  GgufFile f(path);
  const WeightBits w = weight_bits(f);
  struct TypeSum {
    int64_t tensors = 0, values = 0;
    size_t bytes = 0;
  };
  std::map<std::string, TypeSum> by_type;
  json tensors = json::array();
  size_t total = 0;
  int64_t values = 0;
  for (auto& t : f.tensors()) {
    int64_t n = 1;
    for (auto d : t.ne) n *= int64_t(d);
    auto& e = by_type[ggml_type_name(t.type)];
    e.tensors++;
    e.values += n;
    e.bytes += t.nbytes;
    total += t.nbytes;
    values += n;
    tensors.push_back({{"name", t.name}, {"type", ggml_type_name(t.type)}, {"ne", t.ne}, {"bytes", t.nbytes}});
  }
  if (a.json) {
    std::cout << json({{"path", path}, {"format", "gguf"}, {"metadata", f.metadata()}, {"parameters", values}, {"total_bytes", total},
                       {"bits_per_weight", values ? 8.0 * double(total) / double(values) : 0.0}, {"weights", w.to_json()},
                       {"tensors", tensors}}).dump(2) << "\n";
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
  // bits per weight as llama.cpp's loader prints it (BPW): the tensors' bytes over their values
  std::printf("  parameters    %.3f M, %.2f bits per weight; the Linears' %.3f M weights at %.2f bits each\n", double(values) / 1e6,
              values ? 8.0 * double(total) / double(values) : 0.0, double(w.linear_weights) / 1e6, w.linear_bits());
  std::printf("  tensors       %zu, %s\n", f.tensors().size(), human_bytes(double(total)).c_str());
  for (auto& [d, e] : by_type)
    std::printf("    %-8s %6lld tensors  %-12s %6.2f bits per weight\n", d.c_str(), (long long)e.tensors, human_bytes(double(e.bytes)).c_str(),
                e.values ? 8.0 * double(e.bytes) / double(e.values) : 0.0);
  if (m.contains("general.file_type"))
    std::printf("  quantization  llama.cpp file type %s (general.file_type %lld)\n", llama_ftype_name(n("general.file_type")).c_str(), n("general.file_type"));
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
                           {"torch_dtype", dtype_name(c.dtype)}, {"stored_values", params}};
    out["weights"] = weight_bits(c, ck).to_json();
    if (c.raw.contains("quantization_config")) {
      out["quantization_config"] = c.raw["quantization_config"];
      out["quantization"] = describe_quantization(c.raw["quantization_config"]);
    } else if (c.raw.contains("ptqkit_w8a8")) {
      out["quantization"] = "fake W8A8 (ptqkit_w8a8): float weights on the int8 grid, 8-bit activations at the recorded scales";
    }
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
    const json& w = out["weights"];
    std::printf("  parameters    %.3f M: the Linears' %.3f M weights at %.2f bits each, the rest %.3f M at %.2f bits\n",
                double(w["parameters"].get<int64_t>()) / 1e6, double(w["linear_weights"].get<int64_t>()) / 1e6,
                w["linear_bits_per_weight"].get<double>(), double(w["other_parameters"].get<int64_t>()) / 1e6,
                w["other_parameters"].get<int64_t>() ? 8.0 * double(w["other_bytes"].get<size_t>()) / double(w["other_parameters"].get<int64_t>()) : 0.0);
    std::printf("  tokenizer     %s\n", out["tokenizer"].get<std::string>().c_str());
  }
  std::printf("  tensors       %zu, %s\n", tensors.size(), human_bytes(double(ck.total_bytes())).c_str());
  for (auto& [d, e] : by_dtype) std::printf("    %-8s %6lld tensors  %s\n", d.c_str(), (long long)e.first, human_bytes(double(e.second)).c_str());
  std::printf("  quantization  %s\n", out.contains("quantization") ? out["quantization"].get<std::string>().c_str() : "none");
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
