#include "formats/compressed_tensors.h"

#include <algorithm>

#include "core/bits.h"
#include "core/parallel.h"

namespace ptq {

using nlohmann::json;
using namespace formats;

void check_ct_module(const ModulePlan& m) {
  if (m.spec.bits != 4 && m.spec.bits != 8)
    fail(Errc::usage, "", m.name, "compressed-tensors: pack-quantized holds 4- and 8-bit weights, not " + std::to_string(m.spec.bits) + "-bit");
  // The library infers the group size as in_features / number of groups: with a partial last
  // group it raises, or reads the columns past the last whole group with the wrong scale.
  if (m.spec.group_size > 0 && m.cols > m.spec.group_size && m.cols % m.spec.group_size)
    fail(Errc::usage, "", m.name, "compressed-tensors: infers the group size as in_features / groups, which needs in_features " + std::to_string(m.cols) +
                                      " to be a multiple of group_size " + std::to_string(m.spec.group_size) +
                                      " (a run writing only compressed-tensors, gguf or fake keeps such Linears in float)");
}

CtPacked pack_ct(const QuantizedLinear& q) {
  CtPacked p;
  p.bits = q.spec.bits;
  p.rows = q.rows;
  p.cols = q.cols;
  p.groups = q.groups;
  p.packed_cols = (q.cols * p.bits + 31) / 32;
  // Each row one bitstream of unsigned codes (q + 2^(bits-1) of the signed grid): the words
  // QuantizedLinear holds, as they are.
  if (p.packed_cols != packed_words(q.cols, q.spec.bits) || int64_t(q.packed.size()) != q.rows * p.packed_cols)
    fail(Errc::usage, "", q.name, "compressed-tensors: packed codes of the wrong size");
  p.weight_packed.assign(q.packed.begin(), q.packed.end());
  std::vector<uint32_t> vals(static_cast<size_t>(q.rows)), words(static_cast<size_t>(q.rows + 1));
  p.scale.resize(size_t(q.rows * q.groups));
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t g = 0; g < q.groups; ++g) p.scale[size_t(r * q.groups + g)] = q.scales[size_t(g * q.rows + r)];
  if (!q.spec.sym) {
    const int64_t zw = (q.rows * p.bits + 31) / 32;
    p.zero_point.assign(size_t(zw * q.groups), 0);
    for (int64_t g = 0; g < q.groups; ++g) {
      for (int64_t r = 0; r < q.rows; ++r) vals[size_t(r)] = uint32_t(q.zeros[size_t(g * q.rows + r)]);
      pack_bits(vals.data(), q.rows, p.bits, words.data());
      for (int64_t w = 0; w < zw; ++w) p.zero_point[size_t(w * q.groups + g)] = int32_t(words[size_t(w)]);
    }
  }
  p.g_idx = q.g_idx;
  return p;
}

QuantizedLinear unpack_ct(const CtPacked& p, bool sym) {
  QuantizedLinear q = unpacked_shape(p.bits, sym, p.rows, p.cols, p.groups);
  const int64_t nw = packed_words(p.cols, p.bits);   // read_ct_packed: packed_cols >= nw
  q.packed.resize(size_t(p.rows * nw));
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t w = 0; w < nw; ++w) q.packed[size_t(r * nw + w)] = uint32_t(p.weight_packed[size_t(r * p.packed_cols + w)]);
  q.scales.resize(size_t(p.rows * p.groups));
  q.zeros.resize(size_t(p.rows * p.groups));
  const int64_t zw = (p.rows * p.bits + 31) / 32;
  std::vector<uint32_t> col(static_cast<size_t>(zw + 1));
  for (int64_t g = 0; g < p.groups; ++g) {
    if (!sym) for (int64_t w = 0; w < zw; ++w) col[size_t(w)] = uint32_t(p.zero_point[size_t(w * p.groups + g)]);
    for (int64_t r = 0; r < p.rows; ++r) {
      q.scales[size_t(g * p.rows + r)] = p.scale[size_t(r * p.groups + g)];
      q.zeros[size_t(g * p.rows + r)] = sym ? (1 << (p.bits - 1)) : int32_t(unpack_bit(col.data(), r, p.bits));
    }
  }
  q.g_idx = p.g_idx;
  return q;
}

std::vector<std::string> export_compressed_tensors(const ExportJob& job) {
  const std::vector<ModulePlan> p = plan(job);
  check_format("compressed-tensors", job.model->config(), p);
  const QuantSpec s = std::find_if(p.begin(), p.end(), [](auto& m) { return m.quantized; })->spec;
  const DType sd = job.model->config().dtype;
  const bool g_idx = s.act_order && !s.static_groups && s.group_size > 0;
  std::map<std::string, std::vector<TensorSpec>> packed;
  std::vector<std::string> float_linears;
  for (auto& m : p) {
    if (!m.quantized) { float_linears.push_back(m.name); continue; }
    auto& v = packed[m.name];
    v.push_back({m.name + ".weight_packed", DType::I32, {m.rows, (m.cols * s.bits + 31) / 32}});
    v.push_back({m.name + ".weight_scale", sd, {m.rows, groups_of(m)}});
    if (!s.sym) v.push_back({m.name + ".weight_zero_point", DType::I32, {(m.rows * s.bits + 31) / 32, groups_of(m)}});
    v.push_back({m.name + ".weight_shape", DType::I32, {2}});
    if (g_idx) v.push_back({m.name + ".weight_g_idx", DType::I32, {m.cols}});
  }
  std::map<std::string, CtPacked> cur;
  auto produce = [&](const TensorSpec& t) {
    const std::string m = t.name.substr(0, t.name.rfind('.'));
    auto it = cur.find(m);
    if (it == cur.end()) {
      cur.clear();
      it = cur.emplace(m, pack_ct(*job.store->get(m))).first;
    }
    const CtPacked& c = it->second;
    if (ends_with(t.name, ".weight_packed")) return raw(DType::I32, t.shape, c.weight_packed);
    if (ends_with(t.name, ".weight_zero_point")) return raw(DType::I32, t.shape, c.zero_point);
    if (ends_with(t.name, ".weight_g_idx")) return raw(DType::I32, t.shape, c.g_idx);
    if (ends_with(t.name, ".weight_shape")) return raw(DType::I32, t.shape, std::vector<int32_t>{int32_t(c.rows), int32_t(c.cols)});
    return tensor_from_f32(c.scale.data(), t.shape, t.dtype);
  };
  json ignore = float_modules(job.model->config());
  for (auto& m : float_linears) ignore.push_back(m);
  json weights = {{"num_bits", s.bits}, {"type", "int"}, {"symmetric", s.sym}, {"strategy", s.group_size > 0 ? "group" : "channel"},
                  {"group_size", s.group_size > 0 ? json(s.group_size) : json(nullptr)},
                  {"actorder", !s.act_order ? json(nullptr) : g_idx ? json("group") : json("weight")}, {"dynamic", false},
                  {"observer", s.mse ? "mse" : "minmax"}, {"block_structure", nullptr}, {"observer_kwargs", json::object()}};
  json qc = {{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"}, {"quantization_status", "compressed"},
             {"ignore", ignore}, {"kv_cache_scheme", nullptr}, {"global_compression_ratio", nullptr},
             {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", nullptr}, {"output_activations", nullptr}, {"format", "pack-quantized"}}}}}};
  return write_model(job, packed, produce, qc);
}

// W8A8, format "int-quantized": P.weight int8 [out, in], P.weight_scale [out, 1], and for
// static per-tensor activations P.input_scale [1].
std::vector<std::string> export_ct_int8(const ExportJob& job) {
  const std::vector<ModulePlan> p = plan(job);
  const DType sd = job.model->config().dtype;
  ActQuant act0;
  std::map<std::string, std::vector<TensorSpec>> packed;
  std::vector<std::string> float_linears;
  for (auto& m : p) {
    if (!m.quantized) { float_linears.push_back(m.name); continue; }
    if (m.spec.bits != 8 || m.spec.group_size != -1 || !m.spec.sym) fail(Errc::usage, "", m.name, "int-quantized holds int8 symmetric per-channel weights");
    const ActQuant a = job.store->act_quant(m.name);
    if (a.mode == ActQuant::none) fail(Errc::usage, "", m.name, "int-quantized: this module has no int8 activation spec");
    act0 = a;
    auto& v = packed[m.name];
    v.push_back({m.name + ".weight", DType::I8, {m.rows, m.cols}});
    v.push_back({m.name + ".weight_scale", sd, {m.rows, 1}});
    if (a.mode == ActQuant::per_tensor) v.push_back({m.name + ".input_scale", DType::F32, {1}});
  }
  auto produce = [&](const TensorSpec& t) {
    const std::string m = t.name.substr(0, t.name.rfind('.'));
    const QuantizedLinear& q = *job.store->get(m);
    if (ends_with(t.name, ".weight")) {   // q - z, one group a row; rows on the threads (a 7B's 6.5 G codes)
      std::vector<int8_t> w(size_t(q.rows * q.cols));
      parallel_for(q.rows, [&](int64_t r) {
        thread_local std::vector<uint8_t> code;
        code.resize(size_t(q.cols));
        q.row_codes(r, code.data());
        const int z = q.zeros[size_t(r)];
        int8_t* row = w.data() + r * q.cols;
        for (int64_t c = 0; c < q.cols; ++c) row[c] = int8_t(int(code[size_t(c)]) - z);
      });
      return raw(DType::I8, t.shape, w);
    }
    if (ends_with(t.name, ".input_scale")) return raw(DType::F32, t.shape, std::vector<float>{job.store->act_quant(m).static_scale});
    return tensor_from_f32(q.scales.data(), t.shape, t.dtype);
  };
  json ignore = float_modules(job.model->config());
  for (auto& m : float_linears) ignore.push_back(m);
  const bool dyn = act0.mode == ActQuant::per_token;
  json weights = {{"num_bits", 8}, {"type", "int"}, {"symmetric", true}, {"strategy", "channel"}, {"group_size", nullptr},
                  {"actorder", nullptr}, {"dynamic", false}, {"observer", "minmax"}, {"block_structure", nullptr}, {"observer_kwargs", json::object()}};
  json acts = {{"num_bits", 8}, {"type", "int"}, {"symmetric", true}, {"strategy", dyn ? "token" : "tensor"}, {"group_size", nullptr},
               {"dynamic", dyn}, {"observer", dyn ? json(nullptr) : json("minmax")}, {"actorder", nullptr}, {"block_structure", nullptr},
               {"observer_kwargs", json::object()}};
  json qc = {{"quant_method", "compressed-tensors"}, {"format", "int-quantized"}, {"quantization_status", "compressed"},
             {"ignore", ignore}, {"kv_cache_scheme", nullptr}, {"global_compression_ratio", nullptr},
             {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", acts}, {"output_activations", nullptr}, {"format", "int-quantized"}}}}}};
  return write_model(job, packed, produce, qc);
}

// Module m of a pack-quantized checkpoint, shape s = [out, in], every size checked before anything
// is unpacked (the GPTQ path once read past a short qweight: found by fuzzing).
CtPacked read_ct_packed(const Checkpoint& ck, const std::string& m, const Shape& s, int bits, int group, bool sym) {
  CtPacked p;
  p.bits = bits;
  p.rows = s[0];
  p.cols = s[1];
  const std::string file = ck.file_of(m + ".weight_packed");
  if (bits < 1 || bits > 8) fail(Errc::format, file, "quantization_config.config_groups.*.weights.num_bits", "must be 1..8, got " + std::to_string(bits));
  const Shape ps = ck.get(m + ".weight_packed").shape, ss = ck.get(m + ".weight_scale").shape;
  if (ps.size() != 2 || ps[0] != p.rows || ps[1] * 32 < p.cols * bits)
    fail(Errc::format, file, m + ".weight_packed", "expected [" + std::to_string(p.rows) + ", >= " + std::to_string((p.cols * bits + 31) / 32) + "] int32");
  if (ss.size() != 2 || ss[0] != p.rows || ss[1] < 1)
    fail(Errc::format, ck.file_of(m + ".weight_scale"), m + ".weight_scale", "expected [" + std::to_string(p.rows) + ", groups]");
  p.packed_cols = ps[1];
  p.weight_packed = read_raw<int32_t>(ck, m + ".weight_packed", DType::I32);
  p.scale = read_floats(ck, m + ".weight_scale");
  p.groups = ss[1];
  if (!sym) {
    p.zero_point = read_raw<int32_t>(ck, m + ".weight_zero_point", DType::I32);
    if (int64_t(p.zero_point.size()) != (p.rows * bits + 31) / 32 * p.groups)
      fail(Errc::format, ck.file_of(m + ".weight_zero_point"), m + ".weight_zero_point", "size does not match weight_scale");
  }
  const bool stored = ck.has(m + ".weight_g_idx");
  if (stored) {
    p.g_idx = read_raw<int32_t>(ck, m + ".weight_g_idx", DType::I32);
    if (int64_t(p.g_idx.size()) != p.cols) fail(Errc::format, ck.file_of(m + ".weight_g_idx"), m + ".weight_g_idx", "expected one group index per input feature");
  } else {
    const int64_t gs = group > 0 ? group : p.cols;
    for (int64_t c = 0; c < p.cols; ++c) p.g_idx.push_back(int32_t(c / gs));
  }
  for (int32_t g : p.g_idx)
    if (g < 0 || g >= p.groups)
      fail(Errc::format, ck.file_of(m + (stored ? ".weight_g_idx" : ".weight_scale")), m + (stored ? ".weight_g_idx" : ".weight_scale"),
           stored ? "group index out of range" : "fewer groups than in_features / group_size");
  return p;
}

Shape ct_weight_shape(const Checkpoint& ck, const std::string& m) {
  const auto s = read_raw<int32_t>(ck, m + ".weight_shape", DType::I32);
  if (s.size() != 2 || s[0] < 1 || s[1] < 1) fail(Errc::format, ck.file_of(m + ".weight_shape"), m + ".weight_shape", "expected [out, in], both positive");
  return {s[0], s[1]};
}

CtWeights ct_weights(const json& qc, const std::string& file) {
  // Checked before operator[]: on a const json a missing key is undefined behaviour (found by fuzzing).
  if (!qc.contains("config_groups") || qc["config_groups"].empty()) fail(Errc::format, file, "quantization_config.config_groups", "missing");
  const json& g = qc["config_groups"].begin().value();
  if (!g.is_object() || !g.contains("weights") || !g["weights"].is_object())
    fail(Errc::format, file, "quantization_config.config_groups.*.weights", "missing or not an object");
  const json& w = g["weights"];
  return {&g, w.value("num_bits", 4), w.value("symmetric", true), w.contains("group_size") && w["group_size"].is_number() ? w["group_size"].get<int>() : -1};
}

}  // namespace ptq
