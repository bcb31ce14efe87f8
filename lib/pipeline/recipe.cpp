#include "pipeline/recipe.h"

#include <fnmatch.h>

#include <functional>
#include <map>
#include <regex>

#include "core/error.h"
#include "formats/gguf.h"

namespace ptq {

namespace {

enum class Ty { Str, Int, Float, Bool, StrOrList, Map, PatternMap };
struct Field;
using Schema = std::map<std::string, Field>;
struct Field {
  Ty ty;
  const Schema* sub = nullptr;
};

const Schema kModuleSchema = {
    {"method", {Ty::Str}},        {"bits", {Ty::Int}},          {"group_size", {Ty::Int}},  {"sym", {Ty::Bool}},
    {"act_order", {Ty::Bool}},    {"static_groups", {Ty::Bool}}, {"damp_percent", {Ty::Float}}, {"block_size", {Ty::Int}},
    {"mse", {Ty::Bool}},
};
const Schema kOverrideSchema = [] {
  Schema s = kModuleSchema;
  s["gguf_type"] = {Ty::Str};   // per module; the model's is export.gguf_type
  return s;
}();
const Schema kCalibSchema = {{"dataset", {Ty::Str}}, {"samples", {Ty::Int}}, {"seq_len", {Ty::Int}}, {"seed", {Ty::Int}}};
const Schema kSmoothSchema = {{"alpha", {Ty::Str}}, {"pairs", {Ty::StrOrList}}};
const Schema kAwqSchema = {{"grid", {Ty::Int}}, {"duo_scaling", {Ty::Bool}}, {"pairs", {Ty::StrOrList}}, {"clip", {Ty::Bool}}};
const Schema kActSchema = {{"bits", {Ty::Int}}, {"strategy", {Ty::Str}}, {"dynamic", {Ty::Bool}}};
const Schema kQuantSchema = [] {
  Schema s = kModuleSchema;
  s["smoothquant"] = {Ty::Map, &kSmoothSchema};
  s["awq"] = {Ty::Map, &kAwqSchema};
  s["activations"] = {Ty::Map, &kActSchema};
  s["true_sequential"] = {Ty::Bool};
  s["ignore"] = {Ty::StrOrList};
  s["overrides"] = {Ty::PatternMap, &kOverrideSchema};
  return s;
}();
const Schema kExportSchema = {{"format", {Ty::StrOrList}}, {"max_shard_mb", {Ty::Int}}, {"nf4_blocksize", {Ty::Int}},
                               {"nf4_double_quant", {Ty::Bool}}, {"gguf_type", {Ty::Str}},      {"gguf_output_type", {Ty::Str}},
                               {"gguf_embedding_type", {Ty::Str}}};
const Schema kMoeSchema = {{"calibrate_all_experts", {Ty::Bool}}};
const Schema kRootSchema = {{"model", {Ty::Str}},
                            {"moe", {Ty::Map, &kMoeSchema}},
                            {"output", {Ty::Str}},
                            {"device", {Ty::Str}},
                            {"gpu_forward", {Ty::Bool}},
                            {"gpu_activations", {Ty::Str}},
                            {"gpus", {Ty::Int}},
                            {"calibration", {Ty::Map, &kCalibSchema}},
                            {"quantization", {Ty::Map, &kQuantSchema}},
                            {"export", {Ty::Map, &kExportSchema}}};

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> d(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) d[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t prev = d[0];
    d[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cur = d[j];
      d[j] = std::min({d[j] + 1, d[j - 1] + 1, prev + (a[i - 1] == b[j - 1] ? 0 : 1)});
      prev = cur;
    }
  }
  return d[b.size()];
}

namespace {

std::string join_path(const std::string& p, const std::string& k) { return p.empty() ? k : p + "." + k; }

void check_type(const YAML::Node& n, Ty ty, const std::string& file, const std::string& path) {
  auto bad = [&](const char* want) { fail(Errc::usage, file, path, std::string("must be ") + want); };
  switch (ty) {
    case Ty::Str: if (!n.IsScalar()) bad("a string"); break;
    case Ty::Int: { int64_t v; if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v)) bad("an integer"); break; }
    case Ty::Float: { double v; if (!n.IsScalar() || !YAML::convert<double>::decode(n, v)) bad("a number"); break; }
    case Ty::Bool: { bool v; if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) bad("true or false"); break; }
    case Ty::StrOrList:
      if (n.IsSequence()) { for (auto e : n) if (!e.IsScalar()) bad("a string or a list of strings"); }
      else if (!n.IsScalar()) bad("a string or a list of strings");
      break;
    case Ty::Map: case Ty::PatternMap: if (!n.IsMap() && !n.IsNull()) bad("a mapping"); break;
  }
}

void validate(const YAML::Node& n, const Schema& schema, const std::string& file, const std::string& path) {
  if (n.IsNull()) return;
  if (!n.IsMap()) fail(Errc::usage, file, path.empty() ? "(top level)" : path, "must be a mapping");
  for (auto kv : n) {
    if (!kv.first.IsScalar()) fail(Errc::usage, file, path.empty() ? "(top level)" : path, "keys must be plain names");
    const std::string key = kv.first.as<std::string>();
    const std::string p = join_path(path, key);
    auto it = schema.find(key);
    if (it == schema.end()) {
      std::string best;
      size_t bd = 4;
      for (auto& [k, f] : schema) {
        const size_t d = edit_distance(key, k);
        if (d < bd) { bd = d; best = k; }
      }
      fail(Errc::usage, file, p, "unknown key" + (best.empty() ? std::string() : "; did you mean " + best + "?"));
    }
    check_type(kv.second, it->second.ty, file, p);
    if (it->second.ty == Ty::Map) validate(kv.second, *it->second.sub, file, p);
    if (it->second.ty == Ty::PatternMap && kv.second.IsMap())
      for (auto pm : kv.second) validate(pm.second, *it->second.sub, file, join_path(p, pm.first.as<std::string>()));
  }
}

std::vector<std::string> str_list(const YAML::Node& n) {
  std::vector<std::string> r;
  if (n.IsSequence()) for (auto e : n) r.push_back(e.as<std::string>());
  else if (n.IsScalar()) r.push_back(n.as<std::string>());
  return r;
}

// A GGUF block type (or, where mix, the mixes' base type: Q4_K for Q4_K_M and Q4_K_S) as the spec's bits, group size,
// symmetry and grid; `fields`' own bits / group_size / sym must agree with it.
void apply_gguf_type_checked(const std::string& type, const YAML::Node& fields, QuantSpec& s, const std::string& file, const std::string& path,
                             bool mix) {
  const std::string base = mix && is_gguf_mix(type) ? type.substr(0, 4) : type;
  const QuantSpec asked = s;
  const std::string why = apply_gguf_type(base, s);
  if (!why.empty()) fail(Errc::usage, file, path, why + (mix ? "" : "; the mixes are export.gguf_type's"));
  if (s.method == "nf4") fail(Errc::usage, file, path, "NF4 is not a GGUF block type");
  auto clash = [&](const char* key, const std::string& mine, const std::string& theirs) {
    if (fields && fields[key] && mine != theirs)
      fail(Errc::usage, file, path, type + " holds " + key + " " + theirs + "; the recipe sets " + key + ": " + mine + " (leave it out: the type sets it)");
  };
  clash("bits", std::to_string(asked.bits), std::to_string(s.bits));
  clash("group_size", std::to_string(asked.group_size), std::to_string(s.group_size));
  clash("sym", asked.sym ? "true" : "false", s.sym ? "true" : "false");
}

void apply_module_fields(const YAML::Node& n, QuantSpec& s, const std::string& file, const std::string& path) {
  if (!n || n.IsNull()) return;
  if (n["method"]) s.method = n["method"].as<std::string>();
  if (n["bits"]) s.bits = n["bits"].as<int>();
  if (n["group_size"]) s.group_size = n["group_size"].as<int>();
  if (n["sym"]) s.sym = n["sym"].as<bool>();
  if (n["act_order"]) s.act_order = n["act_order"].as<bool>();
  if (n["static_groups"]) s.static_groups = n["static_groups"].as<bool>();
  if (n["damp_percent"]) s.damp_percent = n["damp_percent"].as<double>();
  if (n["block_size"]) s.block_size = n["block_size"].as<int>();
  if (n["mse"]) s.mse = n["mse"].as<bool>();
  if (s.method != "gptq" && s.method != "rtn" && s.method != "nf4")
    fail(Errc::usage, file, join_path(path, "method"), "must be gptq, rtn or nf4, got '" + s.method + "'");
  if (s.bits != 2 && s.bits != 3 && s.bits != 4 && s.bits != 8) fail(Errc::usage, file, join_path(path, "bits"), "must be 2, 3, 4 or 8");
  if (s.group_size == 0 || s.group_size < -1) fail(Errc::usage, file, join_path(path, "group_size"), "must be -1 (per channel) or positive");
  if (!(s.damp_percent > 0 && s.damp_percent <= 1)) fail(Errc::usage, file, join_path(path, "damp_percent"), "must be in (0, 1]");
  if (s.block_size < 1) fail(Errc::usage, file, join_path(path, "block_size"), "must be positive");
  if (n["gguf_type"]) apply_gguf_type_checked(n["gguf_type"].as<std::string>(), n, s, file, join_path(path, "gguf_type"), false);
}

}  // namespace

nlohmann::json yaml_to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    nlohmann::json j = nlohmann::json::object();
    for (auto kv : n) j[kv.first.as<std::string>()] = yaml_to_json(kv.second);
    return j;
  }
  if (n.IsSequence()) {
    nlohmann::json j = nlohmann::json::array();
    for (auto e : n) j.push_back(yaml_to_json(e));
    return j;
  }
  if (!n.IsScalar()) return nullptr;
  int64_t i;
  double d;
  bool b;
  if (n.Tag() != "!" && YAML::convert<int64_t>::decode(n, i)) return i;
  if (n.Tag() != "!" && YAML::convert<double>::decode(n, d)) return d;
  if (n.Tag() != "!" && YAML::convert<bool>::decode(n, b)) return b;
  return n.as<std::string>();
}

bool pattern_matches(const std::string& pattern, const std::string& module) {
  if (pattern.rfind("re:", 0) == 0) return std::regex_match(module, std::regex(pattern.substr(3)));
  if (pattern.find_first_of("*?[") != std::string::npos) return fnmatch(pattern.c_str(), module.c_str(), 0) == 0;
  return module == pattern || (module.size() > pattern.size() && module.compare(module.size() - pattern.size(), pattern.size(), pattern) == 0 &&
                               module[module.size() - pattern.size() - 1] == '.');
}

QuantSpec Recipe::spec_for(const std::string& module) const {
  QuantSpec s = quant;
  for (auto& [pat, node] : overrides)
    if (pattern_matches(pat, module)) apply_module_fields(node, s, source, "quantization.overrides." + pat);
  s.output_clip = awq.enabled && awq.clip && s.method != "nf4" && !reads_into_scores(module);
  return s;
}

bool Recipe::ignored(const std::string& module) const {
  for (auto& p : ignore)
    if (pattern_matches(p, module)) return true;
  return false;
}

void apply_set(YAML::Node& root, const std::string& a) {
  const auto eq = a.find('=');
  if (eq == std::string::npos || eq == 0) fail(Errc::usage, "--set", a, "expected key.path=value");
  const std::string path = a.substr(0, eq), value = a.substr(eq + 1);
  std::vector<std::string> keys;
  for (size_t p = 0;;) {
    size_t d = path.find('.', p);
    keys.push_back(path.substr(p, d - p));
    if (d == std::string::npos) break;
    p = d + 1;
  }
  // Descend by rebinding through a vector of nodes (yaml-cpp's operator= on nodes aliases).
  std::vector<YAML::Node> chain{root};
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    YAML::Node next = chain.back()[keys[i]];
    if (!next.IsMap()) { chain.back()[keys[i]] = YAML::Node(YAML::NodeType::Map); next = chain.back()[keys[i]]; }
    chain.push_back(next);
  }
  YAML::Node v;
  try { v = YAML::Load(value); } catch (const YAML::Exception& e) { fail(Errc::usage, "--set", path, std::string("bad value: ") + e.what()); }
  chain.back()[keys.back()] = v;
}

static Recipe parse_recipe_checked(YAML::Node root, const std::string& file);

// Whatever the schema check missed, yaml-cpp's own conversion errors become usage errors with a line.
Recipe parse_recipe(YAML::Node root, const std::string& file) {
  try {
    return parse_recipe_checked(root, file);
  } catch (const YAML::Exception& e) {
    fail(Errc::usage, file, "line " + std::to_string(e.mark.line + 1), "unexpected value: " + e.msg);
  }
}

static Recipe parse_recipe_checked(YAML::Node root, const std::string& file) {
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  validate(root, kRootSchema, file, "");
  Recipe r;
  r.source = file;
  if (root["model"]) r.model = root["model"].as<std::string>();
  if (root["output"]) r.output = root["output"].as<std::string>();
  if (root["device"]) r.device = root["device"].as<std::string>();
  if (r.device != "cpu" && r.device != "cuda" && r.device != "auto") fail(Errc::usage, file, "device", "must be cpu, cuda or auto");
  if (root["gpu_forward"]) r.gpu_forward = root["gpu_forward"].as<bool>();
  if (auto m = root["moe"])
    if (m["calibrate_all_experts"]) r.moe_calibrate_all_experts = m["calibrate_all_experts"].as<bool>();
  if (root["gpu_activations"]) r.gpu_activations = root["gpu_activations"].as<std::string>();
  if (r.gpu_activations != "auto" && r.gpu_activations != "device" && r.gpu_activations != "host")
    fail(Errc::usage, file, "gpu_activations", "must be auto, device or host");
  if (root["gpus"]) r.gpus = root["gpus"].as<int>();
  if (r.gpus < 0 || r.gpus > 64) fail(Errc::usage, file, "gpus", "must be 0 (one GPU, no NCCL) to 64, got " + std::to_string(r.gpus));
  if (auto c = root["calibration"]) {
    if (c["dataset"]) r.calibration.dataset = c["dataset"].as<std::string>(), r.dataset_given = true;
    if (c["samples"]) r.calibration.samples = c["samples"].as<int>();
    if (c["seq_len"]) r.calibration.seq_len = c["seq_len"].as<int>();
    if (c["seed"]) r.calibration.seed = c["seed"].as<uint64_t>();
    if (r.calibration.samples < 1) fail(Errc::usage, file, "calibration.samples", "must be positive");
    if (c["seq_len"] && (r.calibration.seq_len < 0 || r.calibration.seq_len == 1))
      fail(Errc::usage, file, "calibration.seq_len", "must be at least 2 (or 0: the model's context, at most 2048)");
  }
  if (!root["calibration"] || !root["calibration"]["seq_len"]) r.calibration.seq_len = 0;
  YAML::Node q = root["quantization"];
  apply_module_fields(q, r.quant, file, "quantization");
  if (q) {
    if (q["true_sequential"]) r.true_sequential = q["true_sequential"].as<bool>();
    if (q["ignore"]) r.ignore = str_list(q["ignore"]);
    if (auto sq = q["smoothquant"]; sq && !sq.IsNull()) {
      r.smooth.enabled = true;
      r.act_mode = ActQuant::per_token;
      if (sq["alpha"]) {
        const std::string a = sq["alpha"].as<std::string>();
        double v = 0;
        if (a == "auto") r.smooth.auto_alpha = true;
        else if (YAML::convert<double>::decode(sq["alpha"], v) && v >= 0 && v <= 1) r.smooth.alpha = v;
        else fail(Errc::usage, file, "quantization.smoothquant.alpha", "must be a number in [0, 1] or auto, got '" + a + "'");
      }
      if (sq["pairs"]) r.smooth.pairs = str_list(sq["pairs"]);
      for (auto& p : r.smooth.pairs)
        if (p != "input_layernorm" && p != "post_attention_layernorm")
          fail(Errc::usage, file, "quantization.smoothquant.pairs", "unknown pair '" + p + "' (input_layernorm -> q/k/v, post_attention_layernorm -> gate/up)");
    }
    if (auto aw = q["awq"]; aw && !aw.IsNull()) {
      r.awq.enabled = true;
      if (aw["grid"]) r.awq.grid = aw["grid"].as<int>();
      if (r.awq.grid < 1 || r.awq.grid > 1000) fail(Errc::usage, file, "quantization.awq.grid", "must be 1 to 1000 ratios, got " + std::to_string(r.awq.grid));
      if (aw["duo_scaling"]) r.awq.duo_scaling = aw["duo_scaling"].as<bool>();
      if (aw["pairs"]) r.awq.pairs = str_list(aw["pairs"]);
      for (auto& p : r.awq.pairs)
        if (p != "input_layernorm" && p != "post_attention_layernorm" && p != "v_proj" && p != "up_proj")
          fail(Errc::usage, file, "quantization.awq.pairs",
               "unknown pair '" + p + "' (input_layernorm -> q/k/v, v_proj -> o_proj, post_attention_layernorm -> gate/up, up_proj -> down_proj)");
      if (r.smooth.enabled) fail(Errc::usage, file, "quantization.awq", "AWQ and SmoothQuant both fold scales into the norms: choose one");
      if (!r.true_sequential) fail(Errc::usage, file, "quantization.true_sequential", "AWQ runs with true_sequential: true");
    }
    if (auto a = q["activations"]; a && !a.IsNull()) {
      if (a["bits"] && a["bits"].as<int>() != 8) fail(Errc::usage, file, "quantization.activations.bits", "only int8 activations (8)");
      const std::string st = a["strategy"] ? a["strategy"].as<std::string>() : "token";
      const bool dyn = a["dynamic"] ? a["dynamic"].as<bool>() : st == "token";
      if (st == "token" && dyn) r.act_mode = ActQuant::per_token;
      else if (st == "tensor" && !dyn) r.act_mode = ActQuant::per_tensor;
      else fail(Errc::usage, file, "quantization.activations", "supported: {strategy: token, dynamic: true} or {strategy: tensor, dynamic: false}");
    }
    if (r.awq.enabled && r.act_mode != ActQuant::none)
      fail(Errc::usage, file, "quantization.awq", "AWQ is for weight-only quantization; W8A8 takes SmoothQuant's factors");
    if (r.act_mode != ActQuant::none) {
      QuantSpec any = r.quant;
      if (any.bits != 8 || any.group_size != -1 || !any.sym || any.method == "nf4")
        fail(Errc::usage, file, "quantization", "W8A8 (smoothquant / activations) needs int8 symmetric per-channel weights: bits: 8, group_size: -1, sym: true, method rtn or gptq");
      for (auto& [p, n] : r.overrides)
        if (n["bits"] || n["group_size"] || n["sym"])
          fail(Errc::usage, file, "quantization.overrides." + p, "W8A8 keeps every module at int8 per channel");
      if (!r.true_sequential) fail(Errc::usage, file, "quantization.true_sequential", "SmoothQuant / W8A8 runs with true_sequential: true");
    }
    if (q["overrides"] && q["overrides"].IsMap())
      for (auto kv : q["overrides"]) {
        const std::string pat = kv.first.as<std::string>();
        if (pat.rfind("re:", 0) == 0) {
          try { std::regex re(pat.substr(3)); } catch (const std::regex_error& e) {
            fail(Errc::usage, file, "quantization.overrides." + pat, std::string("bad regular expression: ") + e.what());
          }
        }
        QuantSpec check = r.quant;
        apply_module_fields(kv.second, check, file, "quantization.overrides." + pat);   // validate now
        r.overrides.emplace_back(pat, kv.second);
      }
  }
  if (auto e = root["export"]) {
    if (e["format"]) r.formats = str_list(e["format"]);
    if (e["max_shard_mb"]) r.max_shard_mb = e["max_shard_mb"].as<int64_t>();
    if (e["nf4_blocksize"]) r.nf4_blocksize = e["nf4_blocksize"].as<int>();
    if (e["nf4_double_quant"]) r.nf4_double_quant = e["nf4_double_quant"].as<bool>();
    if (e["gguf_type"]) r.gguf_type = e["gguf_type"].as<std::string>();
    if (e["gguf_output_type"]) r.gguf_output_type = e["gguf_output_type"].as<std::string>();
    if (e["gguf_embedding_type"]) r.gguf_embedding_type = e["gguf_embedding_type"].as<std::string>();
    if (r.max_shard_mb < 1) fail(Errc::usage, file, "export.max_shard_mb", "must be positive");
  }
  for (auto& f : r.formats)
    if (f != "fake" && f != "gptq" && f != "gptq_v2" && f != "compressed-tensors" && f != "nf4" && f != "gguf")
      fail(Errc::usage, file, "export.format", "unknown format '" + f + "' (available: fake, gptq, gptq_v2, compressed-tensors, nf4, gguf)");
  if (r.formats.empty()) fail(Errc::usage, file, "export.format", "at least one format");
  const bool nf4 = r.quant.method == "nf4";
  for (auto& f : r.formats) {
    if (f == "gptq" || f == "gptq_v2" || f == "gguf" || f == "nf4")
      if (r.act_mode != ActQuant::none) fail(Errc::usage, file, "export.format", f + " holds weight-only quantization; W8A8 exports as compressed-tensors (int-quantized) or fake");
    if (f == "nf4" && !nf4) fail(Errc::usage, file, "export.format", "nf4 is data-free: it needs quantization.method: nf4");
    if (nf4 && f != "nf4" && f != "fake") fail(Errc::usage, file, "export.format", "quantization.method nf4 exports as nf4 (or fake), not " + f);
  }
  if (nf4 && r.awq.enabled) fail(Errc::usage, file, "quantization.awq", "NF4 is data-free; AWQ's scales come from calibration (method rtn or gptq)");
  for (auto& [p, n] : r.overrides)
    if (n["method"] && (n["method"].as<std::string>() == "nf4") != nf4)
      fail(Errc::usage, file, "quantization.overrides." + p + ".method", "nf4 applies to the whole model or not at all");
  // export.gguf_type: llama.cpp's block type (or mix), whose grid GPTQ solves on: it sets the
  // quantization's bits, group size, symmetry and grid; the pipeline applies the mixes' Q6_K layers
  // and the K types' fallbacks per Linear
  if (!r.gguf_type.empty()) {
    if (std::find(r.formats.begin(), r.formats.end(), "gguf") == r.formats.end())
      fail(Errc::usage, file, "export.gguf_type", "applies to the gguf format, which export.format does not list");
    apply_gguf_type_checked(r.gguf_type, q, r.quant, file, "export.gguf_type", true);
  }
  for (auto [field, v] : {std::pair<const char*, const std::string*>{"export.gguf_output_type", &r.gguf_output_type}, {"export.gguf_embedding_type", &r.gguf_embedding_type}}) {
    GgmlType t;
    if (*v != "auto" && *v != "float" && !parse_ggml_type(v->c_str(), &t))
      fail(Errc::usage, file, field, "'" + *v + "' is not auto, float or a block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)");
    if (*v != "auto" && std::find(r.formats.begin(), r.formats.end(), "gguf") == r.formats.end())
      fail(Errc::usage, file, field, "applies to the gguf format, which export.format does not list");
  }
  for (auto& [p, n] : r.overrides)
    if (n["gguf_type"] && std::find(r.formats.begin(), r.formats.end(), "gguf") == r.formats.end())
      fail(Errc::usage, file, "quantization.overrides." + p + ".gguf_type", "applies to the gguf format, which export.format does not list");
  // AWQ's clipping: asked for, it must fit the grids (the pipeline refuses a module whose override
  // makes it not fit); left out, it is on for RTN (AutoAWQ's setting) and off for GPTQ, where it
  // measured worse at 4 bits (docs/lab/2026-12-05-awq-clip.md)
  if (r.awq.enabled) {
    const std::string why = output_clip_refusal(r.quant);
    const YAML::Node aw = q ? q["awq"] : YAML::Node();
    if (aw && aw["clip"]) {
      r.awq.clip = aw["clip"].as<bool>();
      if (r.awq.clip && !why.empty()) fail(Errc::usage, file, "quantization.awq.clip", why + " (or set awq.clip: false)");
    } else {
      r.awq.clip = why.empty() && r.quant.method == "rtn";
    }
    if (r.awq.pairs.empty() && !r.awq.clip)
      fail(Errc::usage, file, "quantization.awq", "no pairs and no clipping: AWQ would do nothing (pairs: [] is the clipping search alone)");
  }
  return r;
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& sets) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    fail(Errc::io, path, "", "cannot read the recipe");
  } catch (const YAML::Exception& e) {
    fail(Errc::usage, path, "line " + std::to_string(e.mark.line + 1), "malformed YAML: " + e.msg);
  }
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  for (auto& s : sets) apply_set(root, s);
  return parse_recipe(root, path);
}

YAML::Node Recipe::to_yaml() const {
  YAML::Node n;
  n["model"] = model;
  n["output"] = output;
  n["device"] = device;
  n["gpu_forward"] = gpu_forward;
  n["gpu_activations"] = gpu_activations;
  if (gpus > 0) n["gpus"] = gpus;   // written where set: recipes of one GPU keep their bytes
  n["moe"]["calibrate_all_experts"] = moe_calibrate_all_experts;
  n["calibration"]["dataset"] = calibration.dataset;
  n["calibration"]["samples"] = calibration.samples;
  n["calibration"]["seq_len"] = calibration.seq_len;
  n["calibration"]["seed"] = calibration.seed;
  auto q = n["quantization"];
  q["method"] = quant.method;
  q["bits"] = quant.bits;
  q["group_size"] = quant.group_size;
  q["sym"] = quant.sym;
  q["act_order"] = quant.act_order;
  q["static_groups"] = quant.static_groups;
  q["damp_percent"] = quant.damp_percent;
  q["block_size"] = quant.block_size;
  q["mse"] = quant.mse;
  q["true_sequential"] = true_sequential;
  for (auto& i : ignore) q["ignore"].push_back(i);
  for (auto& [p, node] : overrides) q["overrides"][p] = node;
  if (awq.enabled) {
    q["awq"]["grid"] = awq.grid;
    q["awq"]["duo_scaling"] = awq.duo_scaling;
    q["awq"]["clip"] = awq.clip;
    q["awq"]["pairs"] = YAML::Node(YAML::NodeType::Sequence);   // (empty: clipping alone, written so that it reads back so)
    for (auto& p : awq.pairs) q["awq"]["pairs"].push_back(p);
  }
  if (smooth.enabled) {
    if (smooth.auto_alpha) q["smoothquant"]["alpha"] = "auto";
    else q["smoothquant"]["alpha"] = smooth.alpha;
    q["smoothquant"]["pairs"] = YAML::Node(YAML::NodeType::Sequence);
    for (auto& p : smooth.pairs) q["smoothquant"]["pairs"].push_back(p);
  }
  if (act_mode != ActQuant::none) {
    q["activations"]["bits"] = 8;
    q["activations"]["strategy"] = act_mode == ActQuant::per_token ? "token" : "tensor";
    q["activations"]["dynamic"] = act_mode == ActQuant::per_token;
  }
  for (auto& f : formats) n["export"]["format"].push_back(f);
  n["export"]["max_shard_mb"] = max_shard_mb;
  n["export"]["nf4_blocksize"] = nf4_blocksize;
  n["export"]["nf4_double_quant"] = nf4_double_quant;
  if (!gguf_type.empty()) n["export"]["gguf_type"] = gguf_type;
  if (std::find(formats.begin(), formats.end(), "gguf") != formats.end()) {   // (other runs' recipes keep their bytes)
    n["export"]["gguf_output_type"] = gguf_output_type;
    n["export"]["gguf_embedding_type"] = gguf_embedding_type;
  }
  return n;
}

}  // namespace ptq
