#include "gptq/qstore.h"

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/bits.h"
#include "core/error.h"
#include "core/json_field.h"
#include "core/safetensors.h"

namespace ptq {

using nlohmann::json;

namespace {
json spec_json(const QuantSpec& s) {
  return {{"method", s.method}, {"bits", s.bits}, {"group_size", s.group_size}, {"sym", s.sym}, {"act_order", s.act_order},
          {"static_groups", s.static_groups}, {"damp_percent", s.damp_percent}, {"block_size", s.block_size}, {"mse", s.mse},
          {"scale_dtype", dtype_name(s.scale_dtype)}};
}
// at(): a missing key throws (operator[] on a const json would be undefined).
QuantSpec spec_from(const json& j) {
  QuantSpec s;
  s.method = j.at("method");
  s.bits = j.at("bits");
  s.group_size = j.at("group_size");
  s.sym = j.at("sym");
  s.act_order = j.at("act_order");
  s.static_groups = j.at("static_groups");
  s.damp_percent = j.at("damp_percent");
  s.block_size = j.at("block_size");
  s.mse = j.at("mse");
  parse_dtype(j.at("scale_dtype").get<std::string>(), &s.scale_dtype);
  return s;
}
// A module's metadata in a layer file: the store is ptqkit's own, but a damaged file is named with
// the entry, never a bare JSON error.
template <class F>
auto from_metadata(const std::string& file, const std::string& name, const std::string& text, F&& read) {
  return json_errors_named(Errc::format, file, "__metadata__." + name, [&] { return read(json::parse(text)); });
}
template <class T>
Tensor raw_tensor(DType t, Shape s, const std::vector<T>& v) {
  Tensor x(t, std::move(s));
  std::memcpy(x.bytes.data(), v.data(), x.bytes.size());
  return x;
}
template <class T>
std::vector<T> raw_vector(const TensorView& t) {
  std::vector<T> v(t.nbytes / sizeof(T));
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}
}  // namespace

int layer_of(const std::string& m) {
  const std::string k = "model.layers.";
  if (m.rfind(k, 0) != 0) return -1;
  return std::atoi(m.c_str() + k.size());
}

std::string QuantStore::layer_file(int layer) const {
  char b[64];
  std::snprintf(b, sizeof b, "/layer-%05d.safetensors", layer);
  return dir_ + b;
}

bool QuantStore::has_layer(int layer) const { return std::filesystem::exists(layer_file(layer)); }

void QuantStore::save_layer(int layer, const std::vector<QuantizedLinear>& modules, const std::vector<std::pair<std::string, VecF>>& floats,
                            const std::vector<std::pair<std::string, ActQuant>>& acts, const std::string& report) const {
  std::filesystem::create_directories(dir_);
  std::vector<NamedTensor> ts;
  std::map<std::string, std::string> meta{{"format", "ptqkit-quantized-layer"}};
  for (auto& [name, v] : floats) ts.push_back({name, tensor_from_f32(v.data(), {v.size()}, DType::F32)});
  for (auto& [m, a] : acts) meta["act:" + m] = json({{"mode", int(a.mode)}, {"static_scale", a.static_scale}}).dump();
  if (!report.empty()) meta["report"] = report;
  for (auto& q : modules) {
    const int64_t nw = packed_words(q.cols, q.spec.bits);
    if (q.packed.empty()) {   // packed here (the GPU solve packs on the device)
      std::vector<uint32_t> words(size_t(q.rows * nw));
      pack_rows(q.codes.data(), q.rows, q.cols, q.spec.bits, words.data());
      ts.push_back({q.name + ".qcodes", raw_tensor(DType::U32, {q.rows, nw}, words)});
    } else {
      if (int64_t(q.packed.size()) != q.rows * nw) fail(Errc::usage, layer_file(layer), q.name + ".qcodes", "packed codes of the wrong size");
      ts.push_back({q.name + ".qcodes", raw_tensor(DType::U32, {q.rows, nw}, q.packed)});
    }
    ts.push_back({q.name + ".scales", raw_tensor(DType::F32, {q.groups, q.rows}, q.scales)});
    ts.push_back({q.name + ".zeros", raw_tensor(DType::I32, {q.groups, q.rows}, q.zeros)});
    ts.push_back({q.name + ".g_idx", raw_tensor(DType::I32, {q.cols}, q.g_idx)});
    meta[q.name] = spec_json(q.spec).dump();
  }
  write_safetensors(layer_file(layer), ts, meta);
}

bool QuantStore::info(const std::string& module, Info* out) const {
  const int layer = layer_of(module);
  if (layer < 0 || !has_layer(layer)) return false;
  SafetensorsFile f(layer_file(layer));
  auto it = f.metadata().find(module);
  if (it == f.metadata().end()) return false;
  out->spec = from_metadata(f.path(), module, it->second, spec_from);
  const Shape ss = f.get(module + ".scales").shape, gs = f.get(module + ".g_idx").shape;
  out->rows = ss[1];
  out->cols = gs[0];
  out->groups = ss[0];
  return true;
}

void QuantStore::load(int layer) const {
  if (layer == cached_layer_) return;
  cache_.clear();
  floats_.clear();
  acts_.clear();
  cached_layer_ = -1;   // the layer counts as loaded only once all of it is (a damaged file fails again)
  if (!has_layer(layer)) {
    cached_layer_ = layer;
    return;
  }
  SafetensorsFile f(layer_file(layer));
  for (auto& [name, spec] : f.metadata()) {
    if (name == "format" || name == "report") continue;
    if (name.rfind("act:", 0) == 0) {
      acts_[name.substr(4)] = from_metadata(f.path(), name, spec, [](const json& a) {
        return ActQuant{ActQuant::Mode(a.at("mode").get<int>()), a.at("static_scale").get<float>()};
      });
      continue;
    }
    QuantizedLinear q;
    q.name = name;
    q.spec = from_metadata(f.path(), name, spec, spec_from);
    TensorView sc = f.get(name + ".scales");
    q.rows = sc.shape[1];
    q.cols = f.get(name + ".g_idx").shape[0];
    if (f.has(name + ".qcodes")) {
      TensorView w = f.get(name + ".qcodes");
      if (w.dtype != DType::U32 || w.shape.size() != 2 || w.shape[0] != q.rows || w.shape[1] != packed_words(q.cols, q.spec.bits))
        fail(Errc::format, layer_file(layer), name + ".qcodes", "expected U32 [rows, packed words of cols]");
      const std::vector<uint32_t> words = raw_vector<uint32_t>(w);
      q.codes.resize(size_t(q.rows * q.cols));
      unpack_rows(words.data(), q.rows, q.cols, q.spec.bits, q.codes.data());
    } else {   // layer files of earlier versions: one byte per code
      q.codes = raw_vector<uint8_t>(f.get(name + ".codes"));
    }
    q.groups = sc.shape[0];
    q.scales = raw_vector<float>(sc);
    q.zeros = raw_vector<int32_t>(f.get(name + ".zeros"));
    q.g_idx = raw_vector<int32_t>(f.get(name + ".g_idx"));
    cache_[name] = std::move(q);
  }
  for (auto& n : f.names()) {   // replaced float tensors are the ".weight" ones (smoothed norms)
    if (n.size() < 7 || n.compare(n.size() - 7, 7, ".weight") != 0) continue;
    auto v = tensor_to_f32(f.get(n));
    floats_[n] = Eigen::Map<VecF>(v.data(), Eigen::Index(v.size()));
  }
  cached_layer_ = layer;
}

const QuantizedLinear* QuantStore::get(const std::string& module) const {
  const int layer = layer_of(module);
  if (layer < 0) return nullptr;
  load(layer);
  auto it = cache_.find(module);
  return it == cache_.end() ? nullptr : &it->second;
}

std::string QuantStore::layer_report(int layer) const {
  if (!has_layer(layer)) return "";
  SafetensorsFile f(layer_file(layer));
  auto it = f.metadata().find("report");
  return it == f.metadata().end() ? "" : it->second;
}

bool QuantStore::float_override(const std::string& tensor, VecF* v) const {
  const int layer = layer_of(tensor);
  if (layer < 0) return false;
  load(layer);
  auto it = floats_.find(tensor);
  if (it == floats_.end()) return false;
  *v = it->second;
  return true;
}

ActQuant QuantStore::act_quant(const std::string& module) const {
  const int layer = layer_of(module);
  if (layer < 0) return {};
  load(layer);
  auto it = acts_.find(module);
  return it == acts_.end() ? ActQuant{} : it->second;
}

}  // namespace ptq
