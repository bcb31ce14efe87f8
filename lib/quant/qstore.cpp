#include "quant/qstore.h"

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
  json j = {{"method", s.method}, {"bits", s.bits}, {"group_size", s.group_size}, {"sym", s.sym}, {"act_order", s.act_order},
            {"static_groups", s.static_groups}, {"damp_percent", s.damp_percent}, {"block_size", s.block_size}, {"mse", s.mse},
            {"scale_dtype", dtype_name(s.scale_dtype)}};
  if (s.form != GridForm::integer_zero) j["grid"] = grid_form_name(s.form);   // (absent: GPTQ's, as earlier versions wrote)
  if (s.output_clip) j["output_clip"] = true;                                 // (absent: none, as earlier versions wrote)
  return j;
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
  s.output_clip = j.value("output_clip", false);
  if (j.contains("grid") && !parse_grid_form(j.at("grid").get<std::string>(), &s.form)) s.bits = -1;   // (refused by spec_of)
  return s;
}
// A module's metadata in a layer file: the store is ptqkit's own, but a damaged file is named with
// the entry, never a bare JSON error.
template <class F>
auto from_metadata(const std::string& file, const std::string& name, const std::string& text, F&& read) {
  return json_errors_named(Errc::format, file, "__metadata__." + name, [&] { return read(json::parse(text)); });
}
// A module's spec, its code width checked (the codes are unpacked and range-checked with it).
QuantSpec spec_of(const std::string& file, const std::string& name, const std::string& text) {
  const QuantSpec s = from_metadata(file, name, text, spec_from);
  if (s.bits == -1) fail(Errc::format, file, "__metadata__." + name + ".grid", "unknown grid form");
  if (s.bits < 1 || s.bits > 8) fail(Errc::format, file, "__metadata__." + name + ".bits", "must be 1..8, got " + std::to_string(s.bits));
  return s;
}
template <class T>
Tensor raw_tensor(DType t, Shape s, const std::vector<T>& v) { return tensor_of_raw(t, std::move(s), v); }
// A tensor of a layer file with the dtype and shape write_layer gives it: a damaged or
// hand-edited file fails naming the file and the tensor instead of being misread. rank_only: the
// rank alone is known yet (the tensors the others' shapes are taken from).
TensorView layer_tensor(const SafetensorsFile& f, const std::string& name, DType dt, const Shape& shape, bool rank_only = false) {
  const TensorView t = f.get(name);
  const bool ok = t.dtype == dt && (rank_only ? t.shape.size() == shape.size() : t.shape == shape);
  if (!ok)
    fail(Errc::format, f.path(), name,
         "expected " + std::string(dtype_name(dt)) + (rank_only ? " of rank " + std::to_string(shape.size()) : " " + shape_str(shape)) + ", got " +
             std::string(dtype_name(t.dtype)) + " " + shape_str(t.shape));
  return t;
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

int QuantStore::finished_layers(int limit) const {
  int n = 0;
  while (n < limit && has_layer(n) && !layer_report(n).empty()) ++n;
  return n;
}

void QuantStore::save_layer(int layer, const std::vector<QuantizedLinear>& modules, const std::vector<std::pair<std::string, VecF>>& floats,
                            const std::vector<std::pair<std::string, ActQuant>>& acts, const std::string& report) const {
  std::filesystem::create_directories(dir_);
  if (layer == info_layer_) info_layer_ = -1;   // (rewritten: read it again)
  std::vector<NamedTensor> ts;
  std::map<std::string, std::string> meta{{"format", "ptqkit-quantized-layer"}};
  for (auto& [name, v] : floats) ts.push_back({name, tensor_from_f32(v.data(), {v.size()}, DType::F32)});
  for (auto& [m, a] : acts) meta["act:" + m] = json({{"mode", int(a.mode)}, {"static_scale", a.static_scale}}).dump();
  if (!report.empty()) meta["report"] = report;
  for (auto& q : modules) {
    const int64_t nw = packed_words(q.cols, q.spec.bits);
    if (int64_t(q.packed.size()) != q.rows * nw) fail(Errc::usage, layer_file(layer), q.name + ".qcodes", "packed codes of the wrong size");
    ts.push_back({q.name + ".qcodes", raw_tensor(DType::U32, {q.rows, nw}, q.packed)});
    ts.push_back({q.name + ".scales", raw_tensor(DType::F32, {q.groups, q.rows}, q.scales)});
    ts.push_back({q.name + ".zeros", raw_tensor(DType::I32, {q.groups, q.rows}, q.zeros)});
    ts.push_back({q.name + ".g_idx", raw_tensor(DType::I32, {q.cols}, q.g_idx)});
    if (!q.mins.empty()) ts.push_back({q.name + ".mins", raw_tensor(DType::F32, {q.groups, q.rows}, q.mins)});
    if (!q.super_d.empty()) ts.push_back({q.name + ".super_d", raw_tensor(DType::F32, {int64_t(q.super_d.size()) / q.rows, q.rows}, q.super_d)});
    if (!q.super_dmin.empty()) ts.push_back({q.name + ".super_dmin", raw_tensor(DType::F32, {int64_t(q.super_dmin.size()) / q.rows, q.rows}, q.super_dmin)});
    meta[q.name] = spec_json(q.spec).dump();
  }
  write_safetensors(layer_file(layer), ts, meta);
}

bool QuantStore::info(const std::string& module, Info* out) const {
  const int layer = layer_of(module);
  if (layer < 0 || !has_layer(layer)) return false;
  if (layer != info_layer_) {
    infos_.clear();
    info_layer_ = -1;
    SafetensorsFile f(layer_file(layer));
    for (auto& [name, spec] : f.metadata()) {
      if (name == "format" || name == "report" || name.rfind("act:", 0) == 0) continue;
      Info i;
      i.spec = spec_of(f.path(), name, spec);
      const Shape ss = layer_tensor(f, name + ".scales", DType::F32, {0, 0}, true).shape;
      i.rows = ss[1];
      i.cols = layer_tensor(f, name + ".g_idx", DType::I32, {0}, true).shape[0];
      i.groups = ss[0];
      infos_[name] = i;
    }
    info_layer_ = layer;
  }
  auto it = infos_.find(module);
  if (it == infos_.end()) return false;
  *out = it->second;
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
    q.spec = spec_of(f.path(), name, spec);
    const TensorView sc = layer_tensor(f, name + ".scales", DType::F32, {0, 0}, true);   // [groups, rows]
    q.groups = sc.shape[0];
    q.rows = sc.shape[1];
    q.cols = layer_tensor(f, name + ".g_idx", DType::I32, {0}, true).shape[0];
    if (f.has(name + ".qcodes")) {
      const TensorView w = layer_tensor(f, name + ".qcodes", DType::U32, {q.rows, packed_words(q.cols, q.spec.bits)});
      q.packed = raw_vector<uint32_t>(w);   // kept as stored: the exporters read these words
    } else {   // layer files of earlier versions: one byte per code
      const std::vector<uint8_t> codes = raw_vector<uint8_t>(layer_tensor(f, name + ".codes", DType::U8, {q.rows * q.cols}));
      const int levels = 1 << q.spec.bits;   // packed words fit by construction; bytes need not
      for (uint8_t c : codes)
        if (c >= levels) fail(Errc::format, f.path(), name + ".codes", "a code of " + std::to_string(int(c)) + " does not fit " + std::to_string(q.spec.bits) + " bits");
      q.set_codes(codes.data());
    }
    q.scales = raw_vector<float>(sc);
    q.zeros = raw_vector<int32_t>(layer_tensor(f, name + ".zeros", DType::I32, {q.groups, q.rows}));
    q.g_idx = raw_vector<int32_t>(layer_tensor(f, name + ".g_idx", DType::I32, {q.cols}));
    if (has_min(q.spec.form)) q.mins = raw_vector<float>(layer_tensor(f, name + ".mins", DType::F32, {q.groups, q.rows}));
    if (const int n = groups_per_super(q.spec.form)) {
      if (q.groups % n) fail(Errc::format, f.path(), name + ".scales", std::to_string(q.groups) + " groups are not whole super-blocks of " + std::to_string(n));
      q.super_d = raw_vector<float>(layer_tensor(f, name + ".super_d", DType::F32, {q.groups / n, q.rows}));
      if (q.spec.form == GridForm::k_min) q.super_dmin = raw_vector<float>(layer_tensor(f, name + ".super_dmin", DType::F32, {q.groups / n, q.rows}));
    }
    for (size_t k = 0; k < q.g_idx.size(); ++k)
      if (q.g_idx[k] < 0 || q.g_idx[k] >= q.groups)
        fail(Errc::format, f.path(), name + ".g_idx", "column " + std::to_string(k) + " names group " + std::to_string(q.g_idx[k]) + " of " + std::to_string(q.groups));
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
