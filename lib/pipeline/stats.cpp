#include "pipeline/stats.h"

#include <cstring>
#include <filesystem>
#include <numeric>

#include "core/checkpoint.h"
#include "core/error.h"
#include "core/json_field.h"
#include "core/progress.h"

namespace ptq {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {
std::string layer_name(int l) {
  char b[40];
  std::snprintf(b, sizeof b, "layer-%05d.safetensors", l);
  return b;
}
// The first differing field of two JSON objects, as a dotted path ("" if equal).
std::string first_difference(const json& a, const json& b, const std::string& path = "key") {
  if (a.is_object() && b.is_object()) {
    for (auto& [k, v] : a.items()) {
      if (!b.contains(k)) return path + "." + k;
      std::string d = first_difference(v, b[k], path + "." + k);
      if (!d.empty()) return d;
    }
    for (auto& [k, v] : b.items())
      if (!a.contains(k)) return path + "." + k;
    return "";
  }
  return a == b ? "" : path;
}
// The weight files the loader reads (core/checkpoint.h: the safetensors shards, or failing them
// the PyTorch .bin shards), by name.
std::vector<std::string> weight_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const std::string& p : Checkpoint(dir).files()) files.push_back(fs::path(p).filename().string());
  std::sort(files.begin(), files.end());
  return files;
}
}  // namespace

std::string model_digest(const std::string& dir) {
  // config.json, then the weight files. Until 2026-12-04 this took every *.safetensors of the
  // folder and nothing else, so two .bin checkpoints of one config (a model and its fine-tune)
  // shared a key; a safetensors folder's key is what it was.
  std::vector<std::string> files = weight_files(dir);
  files.insert(files.begin(), "config.json");
  std::vector<double> mb;
  for (auto& f : files) mb.push_back(double(fs::file_size(dir + "/" + f)) / 1e6);
  Progress bar("hashing the model files (the statistics key)", std::accumulate(mb.begin(), mb.end(), 0.0), "MB");
  std::string all;
  double done = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    all += files[i] + ":" + sha256_file(dir + "/" + files[i], [&](size_t n) { bar.update(done + double(n) / 1e6, files[i]); }) + "\n";
    done += mb[i];
  }
  bar.finish();
  return sha256_bytes(all);
}

json model_sample(const std::string& dir) {
  const std::vector<std::string> files = weight_files(dir);
  json out = json::array();
  constexpr size_t kEnd = size_t(1) << 20;
  for (const std::string& f : files) {
    const MappedFile m(dir + "/" + f);
    const auto* b = reinterpret_cast<const char*>(m.data());
    const size_t n = m.size(), head = std::min(n, kEnd), tail = std::min(n - head, kEnd);
    std::string ends;
    if (n > 0) ends.assign(b, head).append(b + n - tail, tail);
    out.push_back({{"file", f}, {"bytes", n}, {"ends_sha256", sha256_bytes(ends)}});
  }
  return out;
}

json stats_key(const std::string& digest, const json& calibration, const Recipe& r) {
  const json q = yaml_to_json(r.to_yaml())["quantization"];
  json shape = {{"true_sequential", r.true_sequential}};
  for (const char* k : {"smoothquant", "activations"}) shape[k] = q.contains(k) ? q[k] : json();
  if (q.contains("awq")) shape["awq"] = q["awq"];   // (absent without AWQ, as below)
  if (!r.moe_calibrate_all_experts) shape["moe_calibrate_all_experts"] = false;   // (absent when true: keys of earlier runs stay valid)
  json cal = calibration;
  if (cal.contains("sha256")) cal.erase("dataset");   // the file's digest, not where it lies, identifies it
  return {{"model_sha256", digest}, {"calibration", cal}, {"collection", shape}};
}

StatsWriter::StatsWriter(const std::string& dir, bool force, bool resume, json key)
    : out_(dir, force, resume, /*keep_on_failure=*/resume), key_(std::move(key)) {}

void StatsWriter::save_layer(int layer, const LayerStats& s) {
  std::vector<NamedTensor> ts;
  for (auto& [g, H] : s.hessians) {
    Tensor t(DType::F64, {H.rows(), H.cols()});
    std::memcpy(t.bytes.data(), H.data(), t.bytes.size());
    ts.push_back({"hessian." + g, std::move(t)});
  }
  for (auto& [n, v] : s.smoothing) {
    Tensor t(DType::F32, {v.size()});
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    ts.push_back({"smooth." + n, std::move(t)});
  }
  write_safetensors(out_.file(layer_name(layer)), ts, {{"format", "ptqkit-stats"}, {"layer", s.meta.dump()}});
}

void StatsWriter::commit(int layers) {
  write_file_atomic(out_.file("stats.json"), json({{"ptqkit_stats", 1}, {"key", key_}, {"layers", layers}}).dump(2) + "\n");
  out_.commit();
}

StatsReader::StatsReader(const std::string& dir, const json& expected) : dir_(dir) {
  const std::string f = dir + "/stats.json";
  if (!fs::exists(f)) {
    if (fs::exists(dir + ".partial")) fail(Errc::input, dir, "--load-stats", "unfinished: the run that saved it did not complete (" + dir + ".partial)");
    fail(Errc::io, f, "", "not found: --load-stats needs a folder written by --save-stats");
  }
  json j;
  try { j = json::parse(read_text_file(f)); } catch (const json::exception& e) { fail(Errc::format, f, "", std::string("malformed JSON: ") + e.what()); }
  if (!j.is_object() || json_field<int>(j, "ptqkit_stats", 0, Errc::format, f) != 1 || !j.contains("key") || !j.contains("layers"))
    fail(Errc::format, f, "ptqkit_stats", "not a ptqkit statistics file (version 1)");
  const int layers = json_field<int>(j, "layers", -1, Errc::format, f);
  if (layers < 0) fail(Errc::format, f, "layers", "must be a non-negative integer");
  const std::string d = first_difference(j["key"], expected);
  if (!d.empty()) {
    std::string what = d.rfind("key.model", 0) == 0 ? "another model" : d.rfind("key.calibration", 0) == 0 ? "other calibration data" : "other collection settings";
    fail(Errc::input, f, d, "the statistics were collected from " + what + " than this run's; recollect them (--save-stats) or use the recipe they were saved with");
  }
  layers_ = layers;
}

LayerStats StatsReader::load_layer(int layer) const {
  if (layer >= layers_) fail(Errc::input, dir_ + "/stats.json", "layers", "has " + std::to_string(layers_) + " layers, the model more");
  SafetensorsFile f(dir_ + "/" + layer_name(layer));
  LayerStats s;
  for (auto& n : f.names()) {
    TensorView t = f.get(n);
    if (n.rfind("hessian.", 0) == 0) {
      if (t.dtype != DType::F64 || t.shape.size() != 2 || t.shape[0] != t.shape[1]) fail(Errc::format, f.path(), n, "must be F64 [n, n]");
      MatD H(t.shape[0], t.shape[1]);
      std::memcpy(H.data(), t.data, t.nbytes);
      s.hessians[n.substr(8)] = std::move(H);
    } else if (n.rfind("smooth.", 0) == 0) {
      if (t.dtype != DType::F32 || t.shape.size() != 1) fail(Errc::format, f.path(), n, "must be F32 [n]");
      VecF v(t.shape[0]);
      std::memcpy(v.data(), t.data, t.nbytes);
      s.smoothing[n.substr(7)] = std::move(v);
    }
  }
  auto it = f.metadata().find("layer");
  if (it == f.metadata().end()) fail(Errc::format, f.path(), "__metadata__.layer", "missing");
  try { s.meta = json::parse(it->second); } catch (const json::exception& e) { fail(Errc::format, f.path(), "__metadata__.layer", e.what()); }
  return s;
}

}  // namespace ptq
