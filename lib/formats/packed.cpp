#include "formats/packed.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <filesystem>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/json_field.h"
#include "formats/fake.h"
#include "formats/pack.h"
#include "model/schedule.h"
#include "core/dtype.h"

namespace ptq {

using nlohmann::json;

namespace {

bool ends_with(const std::string& s, const std::string& e) { return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0; }
std::string module_of(const std::string& weight) { return weight.substr(0, weight.size() - 7); }   // strip ".weight"

template <class T>
Tensor raw(DType t, Shape s, const std::vector<T>& v) {
  Tensor x(t, std::move(s));
  std::memcpy(x.bytes.data(), v.data(), x.bytes.size());
  return x;
}
Tensor copy_of(const Checkpoint& ck, const std::string& name) {
  TensorView t = ck.get(name);
  Tensor out(t.dtype, t.shape);
  std::memcpy(out.bytes.data(), t.data, t.nbytes);
  ck.release(name);
  return out;
}
template <class T>
std::vector<T> read_raw(const Checkpoint& ck, const std::string& name, DType want) {
  TensorView t = ck.get(name);
  if (t.dtype != want) fail(Errc::format, ck.file_of(name), name, "dtype " + std::string(dtype_name(t.dtype)) + ", expected " + std::string(dtype_name(want)));
  std::vector<T> v(t.nbytes / sizeof(T));
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}
std::vector<float> read_floats(const Checkpoint& ck, const std::string& name) { return tensor_to_f32(ck.get(name)); }

// The dimensions of GPTQ module m as its tensors give them: scales [groups, out], g_idx [in].
struct GptqDims {
  int64_t groups, rows, cols;
};
GptqDims gptq_dims(const Checkpoint& ck, const std::string& m) {
  const Shape ss = ck.get(m + ".scales").shape, gs = ck.get(m + ".g_idx").shape;
  if (ss.size() != 2 || gs.size() != 1) fail(Errc::format, ck.file_of(m + ".scales"), m + ".scales", "expected scales [groups, out] and g_idx [in]");
  return {ss[0], ss[1], gs[0]};
}

// Module m of a GPTQ checkpoint, every size checked against scales [groups, out] and g_idx [in]
// before anything is unpacked (the reader of `ptqkit eval` and of the GPU kernels alike; a short
// qweight once read past its end: found by fuzzing).
GptqPacked read_gptq_packed(const Checkpoint& ck, const std::string& m, int bits) {
  GptqPacked p;
  const std::string file = ck.file_of(m + ".qweight");
  if (bits != 2 && bits != 3 && bits != 4 && bits != 8) fail(Errc::format, file, "quantization_config.bits", "must be 2, 3, 4 or 8, got " + std::to_string(bits));
  p.bits = bits;
  const GptqDims d = gptq_dims(ck, m);
  p.groups = d.groups;
  p.rows = d.rows;
  p.cols = d.cols;
  const int64_t mult = 32 / std::gcd(32, bits);   // whole int32 words along both dimensions, as check_format writes them
  if (p.rows % mult || p.cols % mult || p.groups < 1)
    fail(Errc::format, file, m + ".qweight", std::to_string(bits) + "-bit codes pack into int32 along both dimensions: [" + std::to_string(p.rows) + ", " +
                                               std::to_string(p.cols) + "] needs multiples of " + std::to_string(mult) + " and at least one group");
  p.qweight = read_raw<int32_t>(ck, m + ".qweight", DType::I32);
  p.qzeros = read_raw<int32_t>(ck, m + ".qzeros", DType::I32);
  p.scales = read_floats(ck, m + ".scales");
  p.g_idx = read_raw<int32_t>(ck, m + ".g_idx", DType::I32);
  if (int64_t(p.qweight.size()) != p.cols * bits / 32 * p.rows || int64_t(p.qzeros.size()) != p.groups * (p.rows * bits / 32) ||
      int64_t(p.scales.size()) != p.groups * p.rows)
    fail(Errc::format, file, m + ".qweight", "size does not match scales [" + std::to_string(p.groups) + ", " + std::to_string(p.rows) + "] and g_idx [" +
                                               std::to_string(p.cols) + "]");
  for (int32_t g : p.g_idx)
    if (g < 0 || g >= p.groups) fail(Errc::format, ck.file_of(m + ".g_idx"), m + ".g_idx", "group index out of range");
  return p;
}

// The Linears of the decoder layers with what the store holds for them.
std::vector<ModulePlan> plan(const ExportJob& job) {
  std::vector<ModulePlan> p;
  const auto& c = job.model->config();
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (Proj pr : kAllProj) {
      const LinearShape sh = linear_shape(c, pr);
      ModulePlan m{proj_tensor_prefix(l, pr), sh.out, sh.in, {}, false};
      QuantStore::Info info;
      if (job.store && job.store->info(m.name, &info)) { m.spec = info.spec; m.quantized = true; }
      p.push_back(m);
    }
  return p;
}
int64_t groups_of(const ModulePlan& m) { return m.spec.group_size > 0 ? (m.cols + m.spec.group_size - 1) / m.spec.group_size : 1; }

// Writes every tensor of the source, replacing the ".weight" of each module in `packed` by the
// tensors `make_specs` lists, produced by `produce_packed`; config.json gets quantization_config.
std::vector<std::string> write_model(const ExportJob& job, const std::map<std::string, std::vector<TensorSpec>>& packed,
                                     const TensorProducer& produce_packed, const json& qconfig) {
  const Checkpoint& src = job.model->checkpoint();
  std::vector<TensorSpec> specs;
  std::map<std::string, bool> is_packed;
  for (auto& n : ordered_tensor_names(src)) {
    auto it = ends_with(n, ".weight") ? packed.find(module_of(n)) : packed.end();
    if (it == packed.end()) {
      TensorView t = src.get(n);
      specs.push_back({n, t.dtype, t.shape});
    } else {
      for (auto& s : it->second) { specs.push_back(s); is_packed[s.name] = true; }
    }
  }
  auto produce = [&](const TensorSpec& s) {
    if (is_packed.count(s.name)) return produce_packed(s);
    VecF v;
    if (job.store && job.store->float_override(s.name, &v)) return tensor_from_f32(v.data(), s.shape, s.dtype);   // smoothed norms
    return copy_of(src, s.name);
  };
  std::vector<std::string> files = write_checkpoint_tensors(job.out_dir, specs, produce, job.max_shard_bytes);
  for (auto& f : copy_side_files(job.model->dir(), job.out_dir)) files.push_back(f);
  json cfg = job.model->config().raw;
  cfg["quantization_config"] = qconfig;
  write_file_atomic(job.out_dir + "/config.json", cfg.dump(2) + "\n");
  return files;
}

}  // namespace

void check_format(const std::string& fmt, const LlamaConfig& c, const std::vector<ModulePlan>& plan, int nf4_blocksize) {
  auto refuse = [&](const std::string& where, const std::string& why) { fail(Errc::usage, "", where, fmt + ": " + why); };
  const ModulePlan* first = nullptr;
  for (auto& m : plan)
    if (m.quantized) { first = &m; break; }
  if (fmt == "fake") return;
  if (fmt == "nf4") {
    if (nf4_blocksize < 32 || nf4_blocksize > 4096 || (nf4_blocksize & (nf4_blocksize - 1)))
      refuse("export.nf4_blocksize", "must be a power of two from 32 to 4096, got " + std::to_string(nf4_blocksize));
    for (auto& m : plan)
      if (m.quantized && (m.rows * m.cols) % 2) refuse(m.name, "two codes per byte need an even number of weights");
    return;
  }
  if (!first && fmt != "gguf" && !plan.empty()) refuse("export.format", "no quantized modules to write");
  for (auto& m : plan) {
    if (!m.quantized) {
      if (fmt == "gptq" || fmt == "gptq_v2")
        refuse(m.name, "every Linear of the decoder layers must be quantized; this one is left in float (see quantization.ignore)");
      continue;
    }
    const QuantSpec& a = first->spec;
    const QuantSpec& b = m.spec;
    if (fmt != "gguf" && (b.bits != a.bits || b.group_size != a.group_size || b.sym != a.sym || b.act_order != a.act_order ||
                          b.static_groups != a.static_groups))
      refuse(m.name, "one quantization setting for the whole model is written; this module's differs from " + first->name +
                         "'s (per-module overrides export as fake or gguf)");
    if (fmt == "gptq" || fmt == "gptq_v2") {
      if (fmt == "gptq" && !b.sym)
        refuse("export.format", "v1 stores zero - 1 and cannot hold asymmetric zeros of 0; write gptq_v2 or compressed-tensors");
      const int64_t mult = 32 / std::gcd(32, b.bits);
      if (m.cols % mult || m.rows % mult)
        refuse(m.name, "packs " + std::to_string(b.bits) + "-bit codes into int32 along both dimensions, which needs multiples of " +
                           std::to_string(mult) + "; shape is [" + std::to_string(m.rows) + ", " + std::to_string(m.cols) + "]");
    } else if (fmt == "compressed-tensors") {
      if (b.bits != 4 && b.bits != 8) refuse(m.name, "pack-quantized holds 4- and 8-bit weights, not " + std::to_string(b.bits) + "-bit");
    } else if (fmt == "gguf") {
      if (!b.sym || b.group_size != 32 || (b.bits != 4 && b.bits != 8) || (b.act_order && !b.static_groups))
        refuse(m.name, "holds quantized weights as Q4_0/Q8_0 blocks: symmetric 4- or 8-bit, group_size 32, no act-order permutation of groups (use static_groups)");
      if (m.cols % kQK) refuse(m.name, "blocks of 32 need in_features divisible by 32, got " + std::to_string(m.cols));
    }
  }
  if (fmt == "gguf") {
    if (c.model_type == "qwen2" || c.qkv_bias || c.o_bias || c.mlp_bias) refuse("export.format", "only bias-free llama/mistral models are written so far");
    if (c.rope_scaling) refuse("export.format", "llama3 rope scaling (rope_freqs) is not written yet");
    if (c.sliding_window) refuse("export.format", "sliding-window models are not written yet");
    if (c.dtype == DType::BF16) refuse("export.format", "block scales are f16; this bf16 model's scales are bf16");
  }
}

// ------------------------------------------------------------------ GPTQ

GptqPacked pack_gptq(const QuantizedLinear& q, bool v2) {
  GptqPacked p;
  p.bits = q.spec.bits;
  p.rows = q.rows;
  p.cols = q.cols;
  p.groups = q.groups;
  const int64_t nw = q.cols * p.bits / 32, zw = q.rows * p.bits / 32;
  p.qweight.assign(size_t(nw * q.rows), 0);
#pragma omp parallel
  {
    std::vector<uint32_t> v(static_cast<size_t>(q.cols)), wd(static_cast<size_t>(nw + 1));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < q.rows; ++r) {
      for (int64_t c = 0; c < q.cols; ++c) v[size_t(c)] = q.codes[size_t(r * q.cols + c)];
      pack_bits(v.data(), q.cols, p.bits, wd.data());
      for (int64_t w = 0; w < nw; ++w) p.qweight[size_t(w * q.rows + r)] = int32_t(wd[size_t(w)]);
    }
  }
  std::vector<uint32_t> vals(static_cast<size_t>(std::max(q.cols, q.rows))), words(static_cast<size_t>(std::max(nw, zw) + 1));
  const uint32_t mask = (1u << p.bits) - 1;
  p.qzeros.assign(size_t(q.groups * zw), 0);
  for (int64_t g = 0; g < q.groups; ++g) {
    for (int64_t r = 0; r < q.rows; ++r) vals[size_t(r)] = uint32_t(q.zeros[size_t(g * q.rows + r)] - (v2 ? 0 : 1)) & mask;   // v1: z - 1
    pack_bits(vals.data(), q.rows, p.bits, words.data());
    for (int64_t w = 0; w < zw; ++w) p.qzeros[size_t(g * zw + w)] = int32_t(words[size_t(w)]);
  }
  p.scales = q.scales;
  p.g_idx = q.g_idx;
  return p;
}

QuantizedLinear unpack_gptq(const GptqPacked& p, bool v2, bool sym) {
  QuantizedLinear q;
  q.spec.bits = p.bits;
  q.spec.sym = sym;
  q.rows = p.rows;
  q.cols = p.cols;
  q.groups = p.groups;
  const int64_t nw = p.cols * p.bits / 32, zw = p.rows * p.bits / 32;
  q.codes.resize(size_t(p.rows * p.cols));
#pragma omp parallel if (p.rows * p.cols > (int64_t(1) << 20))
  {
    std::vector<uint32_t> words(static_cast<size_t>(nw + 1));   // one row's words, this thread's
#pragma omp for schedule(static)
    for (int64_t r = 0; r < p.rows; ++r) {
      for (int64_t w = 0; w < nw; ++w) words[size_t(w)] = uint32_t(p.qweight[size_t(w * p.rows + r)]);
      for (int64_t c = 0; c < p.cols; ++c) q.codes[size_t(r * p.cols + c)] = uint8_t(unpack_bit(words.data(), c, p.bits));
    }
  }
  const uint32_t mask = (1u << p.bits) - 1;
  q.zeros.resize(size_t(p.groups * p.rows));
  for (int64_t g = 0; g < p.groups; ++g)
    for (int64_t r = 0; r < p.rows; ++r)
      q.zeros[size_t(g * p.rows + r)] =
          int32_t((unpack_bit(reinterpret_cast<const uint32_t*>(p.qzeros.data()) + g * zw, r, p.bits) + (v2 ? 0 : 1)) & (v2 ? mask : 0xFFFFFFFFu));
  q.scales = p.scales;
  q.g_idx = p.g_idx;
  return q;
}

std::vector<std::string> export_gptq(const ExportJob& job, bool v2) {
  const std::vector<ModulePlan> p = plan(job);
  check_format(v2 ? "gptq_v2" : "gptq", job.model->config(), p);
  const QuantSpec s = std::find_if(p.begin(), p.end(), [](auto& m) { return m.quantized; })->spec;
  const DType sd = job.model->config().dtype == DType::BF16 ? DType::BF16 : DType::F16;
  std::map<std::string, std::vector<TensorSpec>> packed;
  for (auto& m : p)
    packed[m.name] = {{m.name + ".qweight", DType::I32, {m.cols * s.bits / 32, m.rows}},
                      {m.name + ".qzeros", DType::I32, {groups_of(m), m.rows * s.bits / 32}},
                      {m.name + ".scales", sd, {groups_of(m), m.rows}},
                      {m.name + ".g_idx", DType::I32, {m.cols}}};
  std::map<std::string, GptqPacked> cur;   // the module being written
  auto produce = [&](const TensorSpec& t) {
    const std::string m = t.name.substr(0, t.name.rfind('.'));
    auto it = cur.find(m);
    if (it == cur.end()) {
      cur.clear();
      it = cur.emplace(m, pack_gptq(*job.store->get(m), v2)).first;
    }
    const GptqPacked& g = it->second;
    if (ends_with(t.name, ".qweight")) return raw(DType::I32, t.shape, g.qweight);
    if (ends_with(t.name, ".qzeros")) return raw(DType::I32, t.shape, g.qzeros);
    if (ends_with(t.name, ".g_idx")) return raw(DType::I32, t.shape, g.g_idx);
    return tensor_from_f32(g.scales.data(), t.shape, t.dtype);
  };
  json qc = {{"bits", s.bits}, {"group_size", s.group_size}, {"damp_percent", s.damp_percent}, {"desc_act", s.act_order},
             {"static_groups", s.static_groups}, {"sym", s.sym}, {"true_sequential", job.true_sequential}, {"model_name_or_path", nullptr},
             {"model_file_base_name", "model"}, {"quant_method", "gptq"}, {"checkpoint_format", v2 ? "gptq_v2" : "gptq"}};
  auto files = write_model(job, packed, produce, qc);
  write_file_atomic(job.out_dir + "/quantize_config.json", qc.dump(2) + "\n");
  files.push_back("quantize_config.json");
  return files;
}

// ------------------------------------------------------------------ compressed-tensors

CtPacked pack_ct(const QuantizedLinear& q) {
  CtPacked p;
  p.bits = q.spec.bits;
  p.rows = q.rows;
  p.cols = q.cols;
  p.groups = q.groups;
  p.packed_cols = (q.cols * p.bits + 31) / 32;
  p.weight_packed.assign(size_t(p.rows * p.packed_cols), 0);
  std::vector<uint32_t> vals(static_cast<size_t>(std::max(q.cols, q.rows))), words(static_cast<size_t>(std::max(p.packed_cols, q.rows) + 1));
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c = 0; c < q.cols; ++c) vals[size_t(c)] = q.codes[size_t(r * q.cols + c)];   // unsigned: q + 2^(bits-1) of the signed grid
    pack_bits(vals.data(), q.cols, p.bits, words.data());
    std::memcpy(&p.weight_packed[size_t(r * p.packed_cols)], words.data(), size_t(p.packed_cols) * 4);
  }
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
  QuantizedLinear q;
  q.spec.bits = p.bits;
  q.spec.sym = sym;
  q.rows = p.rows;
  q.cols = p.cols;
  q.groups = p.groups;
  q.codes.resize(size_t(p.rows * p.cols));
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t c = 0; c < p.cols; ++c)
      q.codes[size_t(r * p.cols + c)] = uint8_t(unpack_bit(reinterpret_cast<const uint32_t*>(&p.weight_packed[size_t(r * p.packed_cols)]), c, p.bits));
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
  json ignore = json::array({"lm_head"});
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
    if (ends_with(t.name, ".weight")) {
      std::vector<int8_t> w(q.codes.size());
      for (size_t i = 0; i < w.size(); ++i) w[i] = int8_t(int(q.codes[i]) - q.zeros[i / size_t(q.cols)]);   // one group per row
      return raw(DType::I8, t.shape, w);
    }
    if (ends_with(t.name, ".input_scale")) return raw(DType::F32, t.shape, std::vector<float>{job.store->act_quant(m).static_scale});
    return tensor_from_f32(q.scales.data(), t.shape, t.dtype);
  };
  json ignore = json::array({"lm_head"});
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

// ------------------------------------------------------------------ NF4

std::vector<std::string> export_nf4(const ExportJob& job) {
  const int bs = job.nf4_blocksize;
  if (job.nf4_modules.empty()) fail(Errc::usage, "", "export.format", "nf4: no modules to quantize");
  const auto& ws = job.model->weights();
  std::map<std::string, std::vector<TensorSpec>> packed;
  for (auto& m : job.nf4_modules) {
    const Shape s = ws.shape(m + ".weight");
    const int64_t n = numel(s), nb = (n + bs - 1) / bs;
    check_format("nf4", job.model->config(), {{m, s[0], s[1], {}, true}}, bs);
    auto& v = packed[m];
    v.push_back({m + ".weight", DType::U8, {n / 2, 1}});
    v.push_back({m + ".weight.absmax", job.nf4_double_quant ? DType::U8 : DType::F32, {nb}});
    v.push_back({m + ".weight.quant_map", DType::F32, {16}});
    if (job.nf4_double_quant) {
      v.push_back({m + ".weight.nested_absmax", DType::F32, {(nb + 255) / 256}});
      v.push_back({m + ".weight.nested_quant_map", DType::F32, {256}});
    }
    v.push_back({m + ".weight.quant_state.bitsandbytes__nf4", DType::U8, {0}});   // length set below
  }
  const std::string dtype = job.nf4_compute_dtype == DType::BF16 ? "bfloat16" : job.model->config().dtype == DType::F32 ? "float32" : "float16";
  std::map<std::string, std::pair<Nf4Tensor, std::string>> cur;
  auto state_json = [&](const std::string& m, const Nf4Tensor* t) {
    json j = {{"quant_type", "nf4"}, {"blocksize", bs}, {"dtype", dtype}, {"shape", ws.shape(m + ".weight")}};
    if (job.nf4_double_quant) {
      j["nested_blocksize"] = 256;
      j["nested_dtype"] = "float32";
      j["nested_offset"] = t ? t->offset : 0.0f;
    }
    return j.dump();
  };
  auto quantize = [&](const std::string& m) -> std::pair<Nf4Tensor, std::string>& {
    auto it = cur.find(m);
    if (it == cur.end()) {
      cur.clear();
      const Shape s = ws.shape(m + ".weight");
      std::vector<float> w(static_cast<size_t>(numel(s)));
      ws.read_f32(m + ".weight", w.data());
      Nf4Tensor t = nf4_quantize(w.data(), numel(s), bs, job.nf4_double_quant);
      std::string st = state_json(m, &t);
      it = cur.emplace(m, std::make_pair(std::move(t), std::move(st))).first;
    }
    return it->second;
  };
  // The quant_state blob's length depends on nested_offset's digits: size it from the real tensor.
  for (auto& [m, v] : packed) {
    if (!job.nf4_double_quant) v.back().shape = {int64_t(state_json(m, nullptr).size())};
    else v.back().shape = {int64_t(quantize(m).second.size())};
  }
  auto produce = [&](const TensorSpec& t) {
    const std::string m = t.name.substr(0, t.name.find(".weight"));
    auto& [q, st] = quantize(m);
    if (ends_with(t.name, ".weight")) return raw(DType::U8, t.shape, q.packed);
    if (ends_with(t.name, ".absmax")) return q.nested ? raw(DType::U8, t.shape, q.absmax_q) : raw(DType::F32, t.shape, q.absmax);
    if (ends_with(t.name, ".nested_absmax")) return raw(DType::F32, t.shape, q.nested_absmax);
    if (ends_with(t.name, ".nested_quant_map")) return raw(DType::F32, t.shape, q.nested_map);
    if (ends_with(t.name, ".quant_map")) return raw(DType::F32, t.shape, std::vector<float>(kNf4Code.begin(), kNf4Code.end()));
    return raw(DType::U8, t.shape, std::vector<uint8_t>(st.begin(), st.end()));
  };
  json skip = json::array({"lm_head"});
  json qc = {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}, {"load_in_8bit", false}, {"bnb_4bit_quant_type", "nf4"},
             {"bnb_4bit_use_double_quant", job.nf4_double_quant}, {"bnb_4bit_compute_dtype", dtype == "float32" ? "float16" : dtype},
             {"bnb_4bit_quant_storage", "uint8"}, {"llm_int8_skip_modules", skip}, {"llm_int8_threshold", 6.0},
             {"llm_int8_has_fp16_weight", false}, {"llm_int8_enable_fp32_cpu_offload", false}};
  return write_model(job, packed, produce, qc);
}

std::function<bool(const std::string&, MatF*)> nf4_dequantized(const ExportJob& job) {
  return [&job](const std::string& m, MatF* W) {
    if (std::find(job.nf4_modules.begin(), job.nf4_modules.end(), m) == job.nf4_modules.end()) return false;
    const Shape s = job.model->weights().shape(m + ".weight");
    MatF src(s[0], s[1]);
    job.model->weights().read_f32(m + ".weight", src.data());
    Nf4Tensor t = nf4_quantize(src.data(), src.size(), job.nf4_blocksize, job.nf4_double_quant);
    W->resize(s[0], s[1]);
    nf4_dequantize(t, src.size(), W->data());
    return true;
  };
}

// ------------------------------------------------------------------ reading

namespace {
// The quant_state JSON bitsandbytes stores beside NF4 weight n (blocksize, shape, nested_*).
json nf4_quant_state(const Checkpoint& ck, const std::string& n) {
  const std::string qs = n + ".quant_state.bitsandbytes__nf4";
  const TensorView t = ck.get(qs);
  try {
    return json::parse(t.data, t.data + t.nbytes);
  } catch (const json::exception& e) {
    fail(Errc::format, ck.file_of(qs), qs, std::string("malformed JSON: ") + e.what());
  }
}
}  // namespace

Nf4Tensor read_nf4(const Checkpoint& ck, const std::string& n, Shape* shape) {
  const json st = nf4_quant_state(ck, n);
  try {
    Nf4Tensor t;
    t.blocksize = st.at("blocksize").get<int>();
    if (shape) *shape = st.at("shape").get<Shape>();
    t.packed = read_raw<uint8_t>(ck, n, DType::U8);
    t.nested = st.contains("nested_blocksize");
    if (t.nested) {
      t.absmax_q = read_raw<uint8_t>(ck, n + ".absmax", DType::U8);
      t.nested_absmax = read_floats(ck, n + ".nested_absmax");
      t.nested_map = read_floats(ck, n + ".nested_quant_map");
      t.nested_blocksize = st.at("nested_blocksize").get<int>();
      t.offset = st.at("nested_offset").get<float>();
    } else {
      t.absmax = read_floats(ck, n + ".absmax");
    }
    return t;
  } catch (const json::exception& e) {
    const std::string qs = n + ".quant_state.bitsandbytes__nf4";
    fail(Errc::format, ck.file_of(qs), qs, std::string("unexpected quant state: ") + e.what());
  }
}

namespace {
class PackedSource final : public WeightSource {
 public:
  // JSON of the wrong type anywhere in quantization_config or a quant_state is a format error naming
  // the file (found by fuzzing: nlohmann's type errors used to escape unnamed).
  PackedSource(const std::string& dir, const json& qc) : ck_(dir), qc_(qc) {
    json_errors_named(Errc::format, dir + "/config.json", "", [&] { init(dir, qc); });
  }
  void init(const std::string& dir, const json& qc) {
    method_ = qc.value("quant_method", "");
    if (method_ == "gptq") {
      v2_ = qc.value("checkpoint_format", "gptq") == "gptq_v2";
      bits_ = qc.value("bits", 4);
      sym_ = qc.value("sym", true);
      group_ = qc.value("group_size", 128);
    } else if (method_ == "compressed-tensors") {
      const std::string fmt = qc.value("format", "");
      if (fmt != "pack-quantized" && fmt != "int-quantized")
        fail(Errc::format, dir + "/config.json", "quantization_config.format", "compressed-tensors format '" + fmt + "' is not read (pack-quantized and int-quantized are)");
      if (!qc.contains("config_groups") || qc["config_groups"].empty())
        fail(Errc::format, dir + "/config.json", "quantization_config.config_groups", "missing");
      // Checked before operator[]: on a const json a missing key is undefined behaviour (found by fuzzing).
      const json& g = qc["config_groups"].begin().value();
      if (!g.is_object() || !g.contains("weights") || !g["weights"].is_object())
        fail(Errc::format, dir + "/config.json", "quantization_config.config_groups.*.weights", "missing or not an object");
      const json& w = g["weights"];
      if (g.contains("input_activations") && g["input_activations"].is_object()) {
        const json& a = g["input_activations"];
        act_.mode = a.value("strategy", "") == "token" && a.value("dynamic", false) ? ActQuant::per_token
                    : a.value("strategy", "") == "tensor" && !a.value("dynamic", true) ? ActQuant::per_tensor
                    : ActQuant::none;
        if (act_.mode == ActQuant::none) fail(Errc::format, dir + "/config.json", "quantization_config.input_activations", "only int8 per-token dynamic or per-tensor static activations are read");
      }
      bits_ = w.value("num_bits", 4);
      sym_ = w.value("symmetric", true);
      group_ = w.contains("group_size") && w["group_size"].is_number() ? w["group_size"].get<int>() : -1;
    } else if (method_ != "bitsandbytes") {
      fail(Errc::format, dir + "/config.json", "quantization_config.quant_method", "unsupported quant_method '" + method_ + "'");
    }
  }
  enum Kind { Float, Gptq, Ct, Nf4, Int8 };
  Kind kind(const std::string& n) const {
    if (ck_.has(n) && ck_.get(n).dtype == DType::I8 && ends_with(n, ".weight") && ck_.has(module_of(n) + ".weight_scale")) return Int8;
    if (ck_.has(n) && !ck_.has(n + ".quant_state.bitsandbytes__nf4")) return Float;
    if (!ends_with(n, ".weight")) return Float;
    const std::string m = module_of(n);
    if (ck_.has(m + ".qweight")) return Gptq;
    if (ck_.has(m + ".weight_packed")) return Ct;
    if (ck_.has(n + ".quant_state.bitsandbytes__nf4")) return Nf4;
    return Float;
  }
  bool has(const std::string& n) const override { return ck_.has(n) || kind(n) != Float; }
  std::string file_of(const std::string& n) const override {
    switch (kind(n)) {
      case Gptq: return ck_.file_of(module_of(n) + ".qweight");
      case Ct: return ck_.file_of(module_of(n) + ".weight_packed");
      default: return ck_.file_of(n);
    }
  }
  Shape shape(const std::string& n) const override {
    return json_errors_named(Errc::format, file_of(n), "", [&] { return shape_impl(n); });
  }
  void read_f32(const std::string& n, float* out) const override {
    json_errors_named(Errc::format, file_of(n), "", [&] { read_f32_impl(n, out); });
  }
  // Float tensors (the embedding) row by row from the file; quantized ones through read_f32.
  void read_rows_f32(const std::string& n, const std::vector<int32_t>& rows, float* out) const override {
    if (kind(n) == Float) ptq::read_rows_f32(ck_, n, rows, out);
    else WeightSource::read_rows_f32(n, rows, out);
  }
  Shape shape_impl(const std::string& n) const {
    const std::string m = ends_with(n, ".weight") ? module_of(n) : n;
    switch (kind(n)) {
      case Gptq: {
        const GptqDims d = gptq_dims(ck_, m);
        return {d.rows, d.cols};
      }
      case Ct: {
        auto s = read_raw<int32_t>(ck_, m + ".weight_shape", DType::I32);
        if (s.size() != 2 || s[0] < 1 || s[1] < 1) fail(Errc::format, ck_.file_of(m + ".weight_shape"), m + ".weight_shape", "expected [out, in], both positive");
        return {s[0], s[1]};
      }
      case Nf4: return nf4_quant_state(ck_, n)["shape"].get<Shape>();
      default: return ck_.get(n).shape;   // float, and Int8 ([out, in] as stored)
    }
  }
  void read_f32_impl(const std::string& n, float* out) const {
    const Kind k = kind(n);
    if (k == Float) {
      TensorView t = ck_.get(n);
      convert_to_f32(t.dtype, t.data, out, size_t(t.numel()));
      return;
    }
    const std::string m = module_of(n);
    const Shape s = shape(n);
    if (k == Int8) {
      MatI q;
      VecF sc;
      read_int8(m, &q, &sc);
      for (int64_t r = 0; r < s[0]; ++r)
        for (int64_t c = 0; c < s[1]; ++c) out[r * s[1] + c] = float(q(r, c)) * sc[r];
      return;
    }
    if (k == Nf4) {
      const Nf4Tensor t = read_nf4(ck_, n, nullptr);
      nf4_dequantize(t, numel(s), out);
      return;
    }
    QuantizedLinear q;
    if (k == Gptq) {
      q = unpack_gptq(read_gptq_packed(ck_, m, bits_), v2_, sym_);
    } else {
      CtPacked p;
      p.bits = bits_;
      p.rows = s[0];
      p.cols = s[1];
      const std::string file = ck_.file_of(m + ".weight_packed");
      if (bits_ < 1 || bits_ > 8) fail(Errc::format, file, "quantization_config.config_groups.*.weights.num_bits", "must be 1..8, got " + std::to_string(bits_));
      // Every size checked before unpacking (the GPTQ path once read past a short qweight: found by fuzzing).
      const Shape ps = ck_.get(m + ".weight_packed").shape, ss = ck_.get(m + ".weight_scale").shape;
      if (ps.size() != 2 || ps[0] != p.rows || ps[1] * 32 < p.cols * bits_)
        fail(Errc::format, file, m + ".weight_packed", "expected [" + std::to_string(p.rows) + ", >= " + std::to_string((p.cols * bits_ + 31) / 32) + "] int32");
      if (ss.size() != 2 || ss[0] != p.rows || ss[1] < 1)
        fail(Errc::format, ck_.file_of(m + ".weight_scale"), m + ".weight_scale", "expected [" + std::to_string(p.rows) + ", groups]");
      p.packed_cols = ps[1];
      p.weight_packed = read_raw<int32_t>(ck_, m + ".weight_packed", DType::I32);
      p.scale = read_floats(ck_, m + ".weight_scale");
      p.groups = ss[1];
      if (!sym_) {
        p.zero_point = read_raw<int32_t>(ck_, m + ".weight_zero_point", DType::I32);
        if (int64_t(p.zero_point.size()) != (p.rows * bits_ + 31) / 32 * p.groups)
          fail(Errc::format, ck_.file_of(m + ".weight_zero_point"), m + ".weight_zero_point", "size does not match weight_scale");
      }
      if (ck_.has(m + ".weight_g_idx")) {
        p.g_idx = read_raw<int32_t>(ck_, m + ".weight_g_idx", DType::I32);
        if (int64_t(p.g_idx.size()) != p.cols) fail(Errc::format, ck_.file_of(m + ".weight_g_idx"), m + ".weight_g_idx", "expected one group index per input feature");
      } else {
        const int64_t gs = group_ > 0 ? group_ : p.cols;
        for (int64_t c = 0; c < p.cols; ++c) p.g_idx.push_back(int32_t(c / gs));
      }
      q = unpack_ct(p, sym_);
    }
    for (int64_t c = 0; c < q.cols; ++c)
      if (q.g_idx[size_t(c)] < 0 || q.g_idx[size_t(c)] >= q.groups) fail(Errc::format, file_of(n), m + ".g_idx", "group index out of range");
    MatF W = q.dequantize();
    std::memcpy(out, W.data(), size_t(W.size()) * 4);
  }
  ActQuant act_quant(const std::string& module) const override {
    if (act_.mode == ActQuant::none || kind(module + ".weight") != Int8) return {};
    ActQuant a = act_;
    if (a.mode == ActQuant::per_tensor) a.static_scale = read_floats(ck_, module + ".input_scale").at(0);
    return a;
  }
  bool read_int8(const std::string& m, MatI* q, VecF* scale) const override {
    if (kind(m + ".weight") != Int8) return false;
    TensorView t = ck_.get(m + ".weight");
    q->resize(t.shape[0], t.shape[1]);
    const int8_t* p = reinterpret_cast<const int8_t*>(t.data);
    for (int64_t i = 0; i < q->size(); ++i) q->data()[i] = p[i];
    auto sc = read_floats(ck_, m + ".weight_scale");
    if (int64_t(sc.size()) != t.shape[0]) fail(Errc::format, ck_.file_of(m + ".weight_scale"), m + ".weight_scale", "expected one scale per output channel");
    *scale = Eigen::Map<VecF>(sc.data(), Eigen::Index(sc.size()));
    return true;
  }
 private:
  ActQuant act_;
  Checkpoint ck_;
  json qc_;
  std::string method_;
  int bits_ = 4, group_ = 128;
  bool sym_ = true, v2_ = false;
};
}  // namespace

std::unique_ptr<WeightSource> packed_source(const std::string& dir, const json& qc) { return std::make_unique<PackedSource>(dir, qc); }

GptqReader::GptqReader(const std::string& dir) {
  const LlamaConfig c = load_config(dir);
  const json qc = c.raw.value("quantization_config", json::object());
  const std::string file = dir + "/config.json";
  if (json_field<std::string>(qc, "quant_method", "", Errc::format, file, "quantization_config.quant_method") != "gptq")
    fail(Errc::format, file, "quantization_config.quant_method", "not a gptq checkpoint");
  v2_ = json_field<std::string>(qc, "checkpoint_format", "gptq", Errc::format, file, "quantization_config.checkpoint_format") == "gptq_v2";
  bits_ = json_field<int>(qc, "bits", 4, Errc::format, file, "quantization_config.bits");
  ck_ = std::make_unique<Checkpoint>(dir);
}

bool GptqReader::has(const std::string& m) const { return ck_->has(m + ".qweight"); }

GptqPacked GptqReader::read(const std::string& m) const { return read_gptq_packed(*ck_, m, bits_); }

}  // namespace ptq
