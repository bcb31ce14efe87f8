#include "report/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "core/build_info.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/json_field.h"
#include "formats/open.h"

namespace ptq {

namespace {
namespace fs = std::filesystem;
using nlohmann::json;

json read_json(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(Errc::format, path, "", std::string("malformed JSON: ") + e.what());
  }
}

// A path as one spelling: resolved where it exists, normalized where it does not, no trailing '/'.
std::string same_path(const std::string& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(p, ec);
  if (ec) c = fs::absolute(p).lexically_normal();
  std::string s = c.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// The object at `key`, or an empty one (a report from another version may lack a section).
const json& section(const json& j, const char* key) {
  static const json empty = json::object();
  return j.is_object() && j.contains(key) && j[key].is_object() ? j[key] : empty;
}

// The Linears' bits per weight of a model folder (formats/open.h: weight_bits), or null where the
// folder is not one ptqkit reads (a report whose outputs were moved away).
json linear_bits(const fs::path& dir) {
  try {
    const WeightBits b = weight_bits(dir.string());
    return b.linear_weights ? json(b.linear_bits()) : json(nullptr);
  } catch (const std::exception&) {   // (ptq::Error and anything a damaged file throws)
    return nullptr;
  }
}

// The bytes of a folder's weight files (safetensors, GGUF, PyTorch .bin), or -1 if there is none.
int64_t weight_bytes(const fs::path& dir, const std::vector<std::string>& names) {
  int64_t total = -1;
  for (const std::string& n : names) {
    const fs::path f = dir / n;
    const std::string e = f.extension().string();
    std::error_code ec;
    if ((e == ".safetensors" || e == ".gguf" || e == ".bin") && fs::is_regular_file(f, ec)) total = std::max<int64_t>(total, 0) + int64_t(fs::file_size(f, ec));
  }
  return total;
}
std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// "4", or "4/8" where modules differ (overrides, GGUF mixes).
std::string distinct(const std::set<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : "/") + std::to_string(x);
  return s.empty() ? "-" : s;
}

json one_run(const std::string& arg) {
  std::error_code ec;
  if (!fs::exists(arg, ec)) fail(Errc::io, arg, "", "no such folder or file: give a quantize output folder or its report.json");
  const fs::path report = fs::is_directory(arg, ec) ? fs::path(arg) / "report.json" : fs::path(arg);
  const std::string file = report.string();
  const json rep = read_json(file);
  if (!rep.is_object() || !rep.contains("modules") || !rep["modules"].is_array()) fail(Errc::format, file, "modules", "missing: not a ptqkit report.json");
  return json_errors_named(Errc::format, file, "", [&] {
    const fs::path folder = report.parent_path().empty() ? fs::path(".") : report.parent_path();
    const json& recipe = section(rep, "recipe");
    const json& q = section(recipe, "quantization");
    const json& ex = section(recipe, "export");
    json r;
    r["report"] = file;
    r["folder"] = same_path(folder.string());
    r["model"] = json_field<std::string>(section(rep, "model"), "path", "", Errc::format, file, "model.path");
    r["model_dtype"] = json_field<std::string>(section(rep, "model"), "dtype", "", Errc::format, file, "model.dtype");
    r["method"] = json_field<std::string>(q, "method", "", Errc::format, file, "recipe.quantization.method");
    // AWQ's scales before the method (pairs: [] none), and its clipping (recipes before 2026-12-05: none)
    const json& awq = section(q, "awq");
    r["awq"] = q.contains("awq") && !(awq.contains("pairs") && awq["pairs"].empty());
    r["awq_clip"] = awq.value("clip", false);
    // SmoothQuant's alpha as the recipe gave it (a number, or "auto": each layer's is in report.json)
    r["smoothquant_alpha"] = q.contains("smoothquant") && section(q, "smoothquant").contains("alpha") ? q["smoothquant"]["alpha"] : json(nullptr);
    const json& act = section(q, "activations");
    r["activations"] = act.empty() ? json(nullptr)
                                   : json("int" + std::to_string(json_field<int>(act, "bits", 8, Errc::format, file, "recipe.quantization.activations.bits")) + " " +
                                          (json_field<bool>(act, "dynamic", true, Errc::format, file, "recipe.quantization.activations.dynamic") ? "dynamic" : "static") +
                                          " per " + json_field<std::string>(act, "strategy", "token", Errc::format, file, "recipe.quantization.activations.strategy"));
    json formats = json::array();
    if (ex.contains("format")) formats = ex["format"].is_array() ? ex["format"] : json::array({ex["format"]});
    r["gguf_type"] = ex.contains("gguf_type") ? ex["gguf_type"] : json(nullptr);
    // Bytes of the weight files each format wrote (outputs: a subfolder a format).
    json outputs = json::array();
    if (rep.contains("outputs") && rep["outputs"].is_array())
      for (const json& o : rep["outputs"]) {
        const std::string dir = json_field<std::string>(o, "dir", ".", Errc::format, file, "outputs.dir");
        std::vector<std::string> names;
        if (o.contains("files") && o["files"].is_array())
          for (const json& n : o["files"]) names.push_back(n.get<std::string>());
        const int64_t b = weight_bytes(folder / dir, names);
        outputs.push_back({{"format", json_field<std::string>(o, "format", "", Errc::format, file, "outputs.format")}, {"bytes", b >= 0 ? json(b) : json(nullptr)},
                           {"bits_per_weight", b >= 0 ? linear_bits(folder / dir) : json(nullptr)}});
      }
    if (outputs.empty())   // (a report without its outputs: the recipe's formats, sizes unknown)
      for (const json& f : formats) outputs.push_back({{"format", f}, {"bytes", nullptr}, {"bits_per_weight", nullptr}});
    r["outputs"] = outputs;
    r["seconds"] = rep.contains("total_seconds") && rep["total_seconds"].is_number() ? rep["total_seconds"] : json(nullptr);
    r["device"] = json_field<std::string>(rep, "device", "", Errc::format, file, "device");
    r["build"] = rep.contains("build") && rep["build"].is_object() ? rep["build"] : json(nullptr);   // (reports before it: null)
    r["calibration"] = section(rep, "calibration");
    // The modules: their errors, and the bits and groups they were given.
    std::set<int> bits, groups;
    std::set<std::string> methods;
    double loss = 0, rtn = 0, log_ratio = 0;
    int64_t with_loss = 0, with_ratio = 0;
    json mods = json::array();
    for (const json& m : rep["modules"]) {
      const std::string name = json_field<std::string>(m, "name", "", Errc::format, file, "modules.name");
      if (name.empty()) fail(Errc::format, file, "modules.name", "missing");
      const std::string method = json_field<std::string>(m, "method", r["method"].get<std::string>(), Errc::format, file, "modules.method");
      methods.insert(method);
      bits.insert(json_field<int>(m, "bits", method == "nf4" ? 4 : 0, Errc::format, file, "modules.bits"));
      groups.insert(json_field<int>(m, method == "nf4" ? "blocksize" : "group_size", 0, Errc::format, file, "modules.group_size"));
      const double l = json_field<double>(m, "loss", NAN, Errc::format, file, "modules.loss"), lr = json_field<double>(m, "rtn_loss", NAN, Errc::format, file, "modules.rtn_loss");
      if (std::isfinite(l)) { loss += l; ++with_loss; }
      if (std::isfinite(lr)) rtn += lr;
      if (std::isfinite(l) && std::isfinite(lr) && l > 0 && lr > 0) { log_ratio += std::log(l / lr); ++with_ratio; }
      mods.push_back({{"name", name}, {"loss", std::isfinite(l) ? json(l) : json(nullptr)}});
    }
    if (r["method"] == "") r["method"] = methods.size() == 1 ? *methods.begin() : "";
    r["formats"] = formats;
    r["bits"] = distinct(bits);
    r["group_size"] = distinct(groups);
    r["act_order"] = json_field<bool>(q, "act_order", false, Errc::format, file, "recipe.quantization.act_order");
    r["modules"] = int64_t(mods.size());
    r["loss_total"] = with_loss ? json(loss) : json(nullptr);
    r["rtn_loss_total"] = with_loss ? json(rtn) : json(nullptr);
    r["loss_vs_rtn_geomean"] = with_ratio ? json(std::exp(log_ratio / double(with_ratio))) : json(nullptr);
    r["module_losses"] = mods;
    return r;
  });
}

// An evaluation's numbers, and the tokens they were scored on. `at`: where in the file it is ("" for
// a file of one evaluation, "evals[i]." in one of several texts), for the errors' field names.
json eval_numbers(const json& e, const std::string& file, const std::string& at) {
  if (!e.is_object() || !e.contains("perplexity")) fail(Errc::format, file, at + "perplexity", "missing: not the JSON of `ptqkit eval --json`");
  return json_errors_named(Errc::format, file, "", [&] {
    json r;
    r["file"] = file;
    r["model"] = json_field<std::string>(e, "model", "", Errc::format, file, at + "model");
    if (r["model"] == "") fail(Errc::format, file, at + "model", "missing");
    r["perplexity"] = json_field<double>(e, "perplexity", NAN, Errc::format, file, at + "perplexity");
    r["perplexity_std_error"] = e.contains("perplexity_std_error") ? e["perplexity_std_error"] : json(nullptr);
    const json& kl = section(e, "kl");
    r["kl_mean"] = kl.contains("mean") ? kl["mean"] : json(nullptr);
    r["top1_agreement"] = kl.contains("top1_agreement") ? kl["top1_agreement"] : json(nullptr);
    r["reference"] = e.contains("reference") ? e["reference"] : json(nullptr);
    r["reference_perplexity"] = kl.contains("reference_perplexity") ? kl["reference_perplexity"] : json(nullptr);
    r["tokens"] = {{"data", e.value("data", "")}, {"data_sha256", e.value("data_sha256", "")}, {"seq_len", e.value("seq_len", int64_t(0))}, {"windows", e.value("windows", int64_t(0))},
                   {"scored_tokens", e.value("scored_tokens", int64_t(0))}, {"protocol", e.value("protocol", "gptq")}};
    return r;
  });
}
// The evaluations of a file: one, or those of `ptqkit eval --data A --data B ...` ({"evals": [...]}).
std::vector<json> evals_in(const std::string& file) {
  const json e = read_json(file);
  if (!e.is_object() || !e.contains("evals")) return {eval_numbers(e, file, "")};
  if (!e["evals"].is_array() || e["evals"].empty()) fail(Errc::format, file, "evals", "must be a non-empty list of evaluations");
  std::vector<json> out;
  for (size_t i = 0; i < e["evals"].size(); ++i) out.push_back(eval_numbers(e["evals"][i], file, "evals[" + std::to_string(i) + "]."));
  return out;
}

// `label`, or `label#n` for its n-th use (the first keeps its name).
std::string unique_label(std::map<std::string, int>& seen, const std::string& label) {
  const int n = ++seen[label];
  return n == 1 ? label : label + "#" + std::to_string(n);
}

// What decides the tokens an evaluation scored (its text by content, not by path).
constexpr const char* kTokenKeys[] = {"data_sha256", "seq_len", "windows", "scored_tokens", "protocol"};

// The calibration fields that decide the inputs a run's losses were measured on.
std::string calibration_difference(const json& a, const json& b) {
  for (const char* k : {"sha256", "samples", "seq_len", "seed", "offsets"})
    if (a.value(k, json()) != b.value(k, json())) return k;
  if (!a.contains("sha256") && a.value("dataset", json()) != b.value("dataset", json())) return "dataset";
  return "";
}
}  // namespace

json compare_runs(const CompareInputs& in) {
  if (in.runs.empty()) fail(Errc::usage, "", "runs", "give at least one run folder or report.json");
  json runs = json::array(), notes = json::array();
  for (const std::string& a : in.runs) runs.push_back(one_run(a));
  // Labels: the folders' names (a report under another name than report.json: its own), made unique.
  std::map<std::string, int> seen;
  for (json& r : runs) {
    const fs::path report = r["report"].get<std::string>();
    std::string label = report.filename() == "report.json" ? fs::path(r["folder"].get<std::string>()).filename().string() : report.stem().string();
    if (label.empty()) label = r["report"];
    r["label"] = unique_label(seen, label);
  }
  const json& first = runs[0];
  for (size_t i = 1; i < runs.size(); ++i) {
    const json& r = runs[i];
    if (r["model"] != first["model"])
      notes.push_back(r["label"].get<std::string>() + " quantized another model (" + r["model"].get<std::string>() + ") than " + first["label"].get<std::string>() +
                      ": its output errors are of other layers");
    else if (r["loss_total"].is_null())
      notes.push_back(r["label"].get<std::string>() + " has no output errors (" + r["method"].get<std::string>() + (r["method"] == "nf4" ? " is data-free)" : ")"));
    else if (const std::string d = calibration_difference(first["calibration"], r["calibration"]); !d.empty())
      notes.push_back(r["label"].get<std::string>() + " was calibrated on other windows than " + first["label"].get<std::string>() + " (calibration." + d +
                      " differs): its output errors are measured on other inputs");
  }
  // Runs from other builds (commit or instruction set, where both reports record one): the code
  // differs as well as the recipe.
  for (size_t i = 1; i < runs.size(); ++i)
    if (first["build"].is_object() && runs[i]["build"].is_object() && build_label(runs[i]["build"]) != build_label(first["build"]))
      notes.push_back(runs[i]["label"].get<std::string>() + " was written by another build than " + first["label"].get<std::string>() + " (" +
                      build_label(runs[i]["build"]) + " against " + build_label(first["build"]) + "): the code differs as well as the recipe");
  // Evaluations: each of a run's folder or of the source model. Those scored on the same tokens
  // (text, window length, windows, protocol) make one dataset; a text scored two ways is refused.
  const std::string source = same_path(first["model"].get<std::string>());
  const bool one_source = std::all_of(runs.begin(), runs.end(), [&](const json& r) { return same_path(r["model"].get<std::string>()) == source; });
  struct Dataset {
    json tokens;
    std::string file;                  // its first evaluation
    std::vector<json> run_evals;       // per run, or null
    json float_eval = nullptr;
  };
  std::vector<Dataset> sets;
  std::vector<json> evals;
  for (const std::string& f : in.evals)
    for (json& e : evals_in(f)) evals.push_back(std::move(e));
  for (json& e : evals) {
    const std::string f = e["file"];
    Dataset* ds = nullptr;
    for (Dataset& s : sets)
      if (std::all_of(std::begin(kTokenKeys), std::end(kTokenKeys), [&](const char* k) { return s.tokens[k] == e["tokens"][k]; })) ds = &s;
    if (!ds) {
      for (const Dataset& s : sets)
        if (s.tokens["data_sha256"] == e["tokens"]["data_sha256"])
          for (const char* k : {"seq_len", "windows", "scored_tokens", "protocol"})
            if (e["tokens"][k] != s.tokens[k])
              fail(Errc::input, f, k, "the same text scored on other tokens than " + s.file + " (" + e["tokens"][k].dump() + " against " + s.tokens[k].dump() +
                                          "): perplexities compare only on the same tokens");
      sets.push_back({e["tokens"], f, std::vector<json>(runs.size(), nullptr)});
      ds = &sets.back();
    }
    const std::string m = same_path(e["model"].get<std::string>());
    json* target = nullptr;
    for (size_t i = 0; i < runs.size(); ++i)
      if (runs[i]["folder"] == m) target = &ds->run_evals[i];
    if (!target && one_source && m == source) target = &ds->float_eval;
    if (!target) fail(Errc::input, f, "model", "'" + e["model"].get<std::string>() + "' is none of the compared runs' folders, nor their source model");
    if (!target->is_null()) fail(Errc::input, f, "model", "a second evaluation of '" + e["model"].get<std::string>() + "' on the tokens of " + ds->file);
    e.erase("tokens");
    *target = e;
  }
  // The datasets' labels: their texts' file names, made unique.
  json datasets = json::array();
  std::map<std::string, int> seen_text;
  for (const Dataset& s : sets) {
    std::string label = fs::path(s.tokens["data"].get<std::string>()).filename().string();
    if (label.empty()) label = "text";
    json d = s.tokens;
    d["label"] = unique_label(seen_text, label);
    datasets.push_back(d);
  }
  // Per dataset, the source model's perplexity: its own evaluation, else a KL reference of it.
  json flt = nullptr;
  if (one_source) {
    flt = {{"model", first["model"]}, {"dtype", first["model_dtype"]}, {"evals", json::array()}, {"perplexities", json::array()}};
    const int64_t b = weight_bytes(source, files_in(source));
    flt["bytes"] = b >= 0 ? json(b) : json(nullptr);
    flt["bits_per_weight"] = b >= 0 ? linear_bits(source) : json(nullptr);
    for (const Dataset& s : sets) {
      json ppl = nullptr, from = nullptr;
      if (!s.float_eval.is_null()) {
        ppl = s.float_eval["perplexity"];
        from = s.float_eval["file"];
      } else {
        for (const json& e : s.run_evals)
          if (e.is_object() && e["reference"].is_string() && same_path(e["reference"].get<std::string>()) == source && e["reference_perplexity"].is_number()) {
            ppl = e["reference_perplexity"];
            from = e["file"].get<std::string>() + " (its KL reference)";
            break;
          }
      }
      flt["evals"].push_back(s.float_eval);
      flt["perplexities"].push_back({{"perplexity", ppl}, {"from", from}});
    }
    // the first dataset's, as one run's evaluation is
    flt["eval"] = sets.empty() ? json(nullptr) : sets[0].float_eval;
    flt["perplexity"] = sets.empty() ? json(nullptr) : flt["perplexities"][0]["perplexity"];
    flt["perplexity_from"] = sets.empty() ? json(nullptr) : flt["perplexities"][0]["from"];
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    json evals = json::array();
    for (const Dataset& s : sets) evals.push_back(s.run_evals[i]);
    runs[i]["eval"] = sets.empty() ? json(nullptr) : evals[0];
    runs[i]["evals"] = evals;
  }
  // Per module: every run's error, against the first run's; in the order the modules first appear.
  std::vector<std::string> order;
  std::vector<std::map<std::string, json>> loss_of(runs.size());
  for (size_t i = 0; i < runs.size(); ++i)
    for (const json& m : runs[i]["module_losses"]) {
      const std::string n = m["name"];
      if (std::none_of(loss_of.begin(), loss_of.end(), [&](const auto& l) { return l.count(n); })) order.push_back(n);
      loss_of[i][n] = m["loss"];
    }
  json modules = json::array();
  for (const std::string& n : order) {
    json loss = json::array(), vs = json::array();
    for (size_t i = 0; i < runs.size(); ++i) {
      const json l = loss_of[i].count(n) ? loss_of[i][n] : json(nullptr);
      loss.push_back(l);
      const json& l0 = loss[0];
      vs.push_back(l.is_number() && l0.is_number() && l0.get<double>() > 0 ? json(l.get<double>() / l0.get<double>()) : json(nullptr));
    }
    modules.push_back({{"name", n}, {"loss", loss}, {"vs_first", vs}});
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const size_t missing = order.size() - loss_of[i].size();
    if (missing)
      notes.push_back(runs[i]["label"].get<std::string>() + " did not quantize " + std::to_string(missing) + " of the " + std::to_string(order.size()) +
                      " modules the runs list (it kept them in float)");
    runs[i].erase("module_losses");
  }
  for (const json& t : datasets)
    notes.push_back("perplexities on " + (datasets.size() > 1 ? t["label"].get<std::string>() + ": " : std::string()) + std::to_string(t["scored_tokens"].get<int64_t>()) +
                    " scored tokens (" + std::to_string(t["windows"].get<int64_t>()) + " windows of " + std::to_string(t["seq_len"].get<int64_t>()) + ", protocol " +
                    t["protocol"].get<std::string>() + ")");
  return {{"runs", runs}, {"float", flt}, {"datasets", datasets}, {"notes", notes}, {"modules", modules}};
}

namespace {
std::string num(const json& v, const char* fmt = "%.4g") {
  if (!v.is_number()) return "-";
  char s[64];
  std::snprintf(s, sizeof s, fmt, v.get<double>());
  return s;
}
std::string seconds(const json& v) {
  if (!v.is_number()) return "-";
  const double t = v.get<double>();
  char s[32];
  if (t < 60) std::snprintf(s, sizeof s, "%.1f s", t);
  else if (t < 3600) std::snprintf(s, sizeof s, "%d min %02d s", int(t) / 60, int(t) % 60);
  else std::snprintf(s, sizeof s, "%d h %02d min", int(t) / 3600, int(t) % 3600 / 60);
  return s;
}
// "cuda: NVIDIA H200" of "cuda: NVIDIA H200, sm_90, 132 SMs, 139.8 GiB" (the JSON keeps it whole).
std::string short_device(const std::string& d) { return d.substr(0, d.find(", ")); }
// Rows of cells as aligned columns (first column left, the rest right), or a markdown table.
size_t width(const std::string& cell) {   // UTF-8 characters, not bytes
  size_t n = 0;
  for (unsigned char ch : cell) n += (ch & 0xC0) != 0x80;
  return n;
}
std::string table(const std::vector<std::vector<std::string>>& rows, bool markdown) {
  std::vector<size_t> w;
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) {
      if (w.size() <= c) w.push_back(0);
      w[c] = std::max(w[c], width(r[c]));
    }
  std::ostringstream o;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    for (size_t c = 0; c < r.size(); ++c) {
      const std::string pad(w[c] - width(r[c]), ' ');
      if (markdown) o << "| " << r[c] << " ";
      else o << (c ? "  " : "") << (c ? pad + r[c] : r[c] + (c + 1 < r.size() ? pad : ""));
    }
    o << (markdown ? "|\n" : "\n");
    if (markdown && i == 0) {
      for (size_t c = 0; c < r.size(); ++c) o << (c ? "|---:" : "|---");
      o << "|\n";
    }
  }
  return o.str();
}
}  // namespace

std::string compare_text(const json& c, int modules, bool markdown) {
  return json_errors_named(Errc::format, "", "comparison", [&] {
    std::ostringstream o;
    const json& runs = c["runs"];
    const json& flt = c["float"];
    const size_t sets = c.contains("datasets") && c["datasets"].is_array() ? c["datasets"].size() : 0;
    // Dataset d's evaluation of run i (-1: the float model), its perplexity, and what a perplexity
    // there is measured against: the float model's, else the first run's.
    auto eval_of = [&](int i, size_t d) -> json {
      const json& r = i < 0 ? flt : runs[size_t(i)];
      return r.is_object() && r.contains("evals") && d < r["evals"].size() ? r["evals"][d] : json(nullptr);
    };
    auto float_ppl = [&](size_t d) -> json {
      return flt.is_object() && flt.contains("perplexities") && d < flt["perplexities"].size() ? flt["perplexities"][d]["perplexity"] : json(nullptr);
    };
    auto ppl_of = [&](int i, size_t d) -> json {
      if (i < 0) return float_ppl(d);
      const json e = eval_of(i, d);
      return e.is_object() ? e["perplexity"] : json(nullptr);
    };
    auto ref_of = [&](size_t d) -> std::pair<double, std::string> {   // (NaN, "") where nothing is
      if (float_ppl(d).is_number()) return {float_ppl(d).get<double>(), "float"};
      if (ppl_of(0, d).is_number()) return {ppl_of(0, d).get<double>(), runs[0]["label"].get<std::string>()};
      return {NAN, ""};
    };
    // Perplexity, its change against the reference, mean KL and top-1 of run i on dataset d.
    auto eval_cells = [&](int i, size_t d) -> std::vector<std::string> {
      const json ppl = ppl_of(i, d), e = i < 0 ? json(nullptr) : eval_of(i, d);
      const auto [ref, ref_name] = ref_of(d);
      const bool is_ref = ref_name == (i < 0 ? std::string("float") : runs[size_t(i)]["label"].get<std::string>());
      std::string delta = ppl.is_number() ? "" : "-";
      if (ppl.is_number() && !is_ref && std::isfinite(ref)) {
        char t[32];
        std::snprintf(t, sizeof t, "%+.2f%%", 100 * (ppl.get<double>() / ref - 1));
        delta = t;
      }
      return {ppl.is_number() ? num(ppl, "%.4f") : "-", delta, e.is_object() ? num(e["kl_mean"]) : "-", e.is_object() ? num(e["top1_agreement"], "%.3f") : "-"};
    };
    // One evaluated text: its perplexities in the runs' table; several: a table of their own.
    const bool inline_eval = sets <= 1;
    std::vector<std::string> head = {"run", "method", "bits", "group", "act-order", "SmoothQuant", "format", "size", "bits/w", "time", "Σ output error", "vs RTN"};
    if (inline_eval) {
      const std::string ref_name = sets ? ref_of(0).second : "";
      head.insert(head.end(), {"perplexity", "vs " + (ref_name.empty() ? std::string("float") : ref_name), "KL", "top-1"});
    }
    std::vector<std::vector<std::string>> rows = {head};
    auto add_eval = [&](std::vector<std::string>& row, int i) {
      if (!inline_eval) return;
      const std::vector<std::string> e = sets ? eval_cells(i, 0) : std::vector<std::string>{"-", "-", "-", "-"};
      row.insert(row.end(), e.begin(), e.end());
    };
    if (flt.is_object()) {
      std::vector<std::string> row = {"float (source)", "-", flt["dtype"] == "" ? "-" : flt["dtype"].get<std::string>(), "-", "-", "-", "-",
                                      flt["bytes"].is_number() ? human_bytes(flt["bytes"].get<double>()) : "-", num(flt["bits_per_weight"], "%.2f"), "-", "-", "-"};
      add_eval(row, -1);
      rows.push_back(row);
    }
    for (size_t i = 0; i < runs.size(); ++i) {
      const json& r = runs[i];
      std::string fmt, size, bits;
      for (const json& f : r["outputs"]) {
        std::string name = f["format"];
        if (name == "gguf" && r["gguf_type"].is_string()) name += " " + r["gguf_type"].get<std::string>();
        fmt += (fmt.empty() ? "" : ", ") + name;
        size += (size.empty() ? "" : ", ") + (f["bytes"].is_number() ? human_bytes(f["bytes"].get<double>()) : std::string("-"));
        bits += (bits.empty() ? "" : ", ") + (f.contains("bits_per_weight") ? num(f["bits_per_weight"], "%.2f") : std::string("-"));
      }
      std::string sq = r["smoothquant_alpha"].is_null() ? "-" : r["smoothquant_alpha"].is_string() ? "α " + r["smoothquant_alpha"].get<std::string>() : "α " + num(r["smoothquant_alpha"], "%g");
      if (r["activations"].is_string()) sq += ", " + r["activations"].get<std::string>();
      // act-order orders GPTQ's columns; round-to-nearest and NF4 have no order to change
      const std::string act_order = r["method"] != "gptq" ? "-" : r["act_order"].get<bool>() ? "yes" : "no";
      const std::string method = std::string(r.value("awq", false) ? "AWQ + " : "") + (r.value("awq_clip", false) ? "clip + " : "") + r["method"].get<std::string>();
      std::vector<std::string> row = {r["label"], method, r["bits"], r["group_size"], act_order, sq, fmt.empty() ? "-" : fmt, size.empty() ? "-" : size, bits.empty() ? "-" : bits,
                                      seconds(r["seconds"]) + (r["device"] == "" ? "" : " (" + short_device(r["device"]) + ")"), num(r["loss_total"]), num(r["loss_vs_rtn_geomean"], "%.3f")};
      add_eval(row, int(i));
      rows.push_back(row);
    }
    o << table(rows, markdown);
    o << "\nbits/w: what the Linears' files cost a weight (codes, scales, zeros and indices over out x in; the rest of the model aside). "
         "Σ output error: the sum over the run's modules of tr(ΔW H ΔWᵀ)/2 on its calibration inputs; vs RTN: the geometric mean of each module's error over "
         "round-to-nearest's on the same inputs.\n";
    if (!inline_eval) {
      // A row per text and model, the texts in the order given, their models as in the table above.
      std::vector<std::vector<std::string>> erows = {{"text", "run", "perplexity", "vs float", "KL", "top-1"}};
      for (size_t d = 0; d < sets; ++d) {
        const std::string ref_name = ref_of(d).second;
        for (int i = flt.is_object() ? -1 : 0; i < int(runs.size()); ++i) {
          std::vector<std::string> row = {c["datasets"][d]["label"], i < 0 ? "float (source)" : runs[size_t(i)]["label"].get<std::string>()};
          const std::vector<std::string> e = eval_cells(i, d);
          row.insert(row.end(), e.begin(), e.end());
          if (ref_name != "float" && row[3] != "" && row[3] != "-") row[3] += " (vs " + ref_name + ")";
          erows.push_back(row);
        }
      }
      o << "\nperplexity on each evaluated text (against the float model's there, else the first run's; KL and top-1 against each evaluation's reference):\n\n"
        << table(erows, markdown) << "\n";
    }
    for (const json& n : c["notes"]) o << "- " << n.get<std::string>() << "\n";
    if (flt.is_object())
      for (size_t d = 0; d < sets; ++d)
        if (flt["perplexities"][d]["from"].is_string())
          o << "- the float perplexity" << (sets > 1 ? " on " + c["datasets"][d]["label"].get<std::string>() : std::string()) << " is from "
            << flt["perplexities"][d]["from"].get<std::string>() << "\n";
    // The modules where the runs differ most: the largest |log(loss / first's)| (one run: the largest losses).
    const json& mods = c["modules"];
    if (modules != 0 && !mods.empty()) {
      std::vector<std::pair<double, size_t>> key;
      for (size_t i = 0; i < mods.size(); ++i) {
        double k = -1;
        if (runs.size() == 1) k = mods[i]["loss"][0].is_number() ? mods[i]["loss"][0].get<double>() : -1;
        else
          for (const json& v : mods[i]["vs_first"])
            if (v.is_number() && v.get<double>() > 0) k = std::max(k, std::abs(std::log(v.get<double>())));
        key.push_back({k, i});
      }
      std::stable_sort(key.begin(), key.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      const size_t n = modules < 0 ? key.size() : std::min(key.size(), size_t(modules));
      std::vector<std::vector<std::string>> mrows = {{"module"}};
      for (const json& r : runs) mrows[0].push_back(r["label"]);
      for (size_t j = 0; j < n; ++j) {
        const json& m = mods[key[j].second];
        std::vector<std::string> row = {m["name"]};
        for (size_t i = 0; i < runs.size(); ++i) {
          std::string cell = num(m["loss"][i]);
          if (i > 0 && m["vs_first"][i].is_number()) cell += " (" + num(m["vs_first"][i], "%.3g") + "x)";
          row.push_back(cell);
        }
        mrows.push_back(row);
      }
      o << "\n" << (n < key.size() ? "the " + std::to_string(n) + " of " + std::to_string(key.size()) + " modules " : "modules, ")
        << (runs.size() > 1 ? "where the runs' output errors differ most (x: against " + runs[0]["label"].get<std::string>() + ")" : "with the largest output errors") << ":\n\n"
        << table(mrows, markdown);
    }
    return o.str();
  });
}

}  // namespace ptq
