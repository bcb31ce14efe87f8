#include "formats/gptq.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/bits.h"
#include "core/json_field.h"
#include "formats/compressed_tensors.h"
#include "model/config.h"
#include "model/schedule.h"

namespace ptq {

using nlohmann::json;
using namespace formats;

GptqDims gptq_dims(const Checkpoint& ck, const std::string& m) {
  const Shape ss = ck.get(m + ".scales").shape, gs = ck.get(m + ".g_idx").shape;
  if (ss.size() != 2 || gs.size() != 1) fail(Errc::format, ck.file_of(m + ".scales"), m + ".scales", "expected scales [groups, out] and g_idx [in]");
  return {ss[0], ss[1], gs[0]};
}

// The reader of `ptqkit eval` and of the GPU kernels alike (a short qweight once read past its
// end: found by fuzzing).
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
  const TensorView qw = ck.get(m + ".qweight");   // read where the checkpoint maps it, not copied
  if (qw.dtype != DType::I32) fail(Errc::format, file, m + ".qweight", "dtype " + std::string(dtype_name(qw.dtype)) + ", expected I32");
  p.qweight_mapped = qw.data;
  const int64_t qweight_words = int64_t(qw.nbytes / 4);
  p.qzeros = read_raw<int32_t>(ck, m + ".qzeros", DType::I32);
  p.scales = read_floats(ck, m + ".scales");
  p.g_idx = read_raw<int32_t>(ck, m + ".g_idx", DType::I32);
  if (qweight_words != p.cols * bits / 32 * p.rows || int64_t(p.qzeros.size()) != p.groups * (p.rows * bits / 32) ||
      int64_t(p.scales.size()) != p.groups * p.rows)
    fail(Errc::format, file, m + ".qweight", "size does not match scales [" + std::to_string(p.groups) + ", " + std::to_string(p.rows) + "] and g_idx [" +
                                               std::to_string(p.cols) + "]");
  for (int32_t g : p.g_idx)
    if (g < 0 || g >= p.groups) fail(Errc::format, ck.file_of(m + ".g_idx"), m + ".g_idx", "group index out of range");
  return p;
}

void check_gptq_module(const ModulePlan& m, bool v2) {
  const std::string fmt = v2 ? "gptq_v2" : "gptq";
  const QuantSpec& b = m.spec;
  if (!v2 && !b.sym)
    fail(Errc::usage, "", "export.format", fmt + ": v1 stores zero - 1 and cannot hold asymmetric zeros of 0; write gptq_v2 or compressed-tensors");
  const int64_t mult = 32 / std::gcd(32, b.bits);
  if (m.cols % mult || m.rows % mult)
    fail(Errc::usage, "", m.name, fmt + ": packs " + std::to_string(b.bits) + "-bit codes into int32 along both dimensions, which needs multiples of " +
                                      std::to_string(mult) + "; shape is [" + std::to_string(m.rows) + ", " + std::to_string(m.cols) + "]");
}

GptqPacked pack_gptq(const QuantizedLinear& q, bool v2) {
  GptqPacked p;
  p.bits = q.spec.bits;
  p.rows = q.rows;
  p.cols = q.cols;
  p.groups = q.groups;
  const int64_t nw = q.cols * p.bits / 32, zw = q.rows * p.bits / 32;   // check_gptq_module: cols * bits % 32 == 0
  if (nw != packed_words(q.cols, q.spec.bits) || int64_t(q.packed.size()) != q.rows * nw)
    fail(Errc::usage, "", q.name, "gptq: codes do not fill whole int32 words along the input");
  // qweight [nw, rows]: row r's words down column r (the store's rows, transposed).
  p.qweight.resize(size_t(nw * q.rows));
#pragma omp parallel for schedule(static) if (q.rows * nw > (int64_t(1) << 18))
  for (int64_t w = 0; w < nw; ++w)
    for (int64_t r = 0; r < q.rows; ++r) p.qweight[size_t(w * q.rows + r)] = int32_t(q.packed[size_t(r * nw + w)]);
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

QuantizedLinear unpack_gptq(const GptqPacked& p, bool v2, bool sym, bool codes) {
  QuantizedLinear q = unpacked_shape(p.bits, sym, p.rows, p.cols, p.groups);
  const int64_t nw = p.cols * p.bits / 32, zw = p.rows * p.bits / 32;   // read_gptq_packed: whole words
  // The transpose of pack_gptq: column r of qweight is row r's words. 16 rows a task: each step
  // reads 16 consecutive words of a qweight row (one 64-byte line) and gives one to each row.
  const uint8_t* qw = p.qweight_mapped ? p.qweight_mapped : reinterpret_cast<const uint8_t*>(p.qweight.data());
  q.packed.resize(codes ? size_t(p.rows * nw) : 0);
#pragma omp parallel for schedule(static) if (p.rows * nw > (int64_t(1) << 18))
  for (int64_t r0 = 0; r0 < (codes ? p.rows : 0); r0 += 16) {
    const int64_t n = std::min<int64_t>(16, p.rows - r0);
    uint32_t run[16];
    for (int64_t w = 0; w < nw; ++w) {
      std::memcpy(run, qw + size_t(w * p.rows + r0) * 4, size_t(n) * 4);   // the mapped file need not align its words
      for (int64_t i = 0; i < n; ++i) q.packed[size_t((r0 + i) * nw + w)] = run[i];
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
  const LlamaConfig& c = job.model->config();
  if (c.moe != MoeRouting::none) {
    // MoE: the quantized Linears of a block, by their names within it, as optimum's
    // modules_in_block_to_quantize (the router is not among them: it stays float).
    json block = json::array();   // the union over the layers (qwen3_moe may keep dense layers)
    for (int l = 0; l < c.num_hidden_layers; ++l)
      for (const LinearGroup& g : layer_schedule(c, l, /*experts_share_input=*/false).groups) {   // one step per expert
        json names = json::array();
        const std::string pre = "model.layers." + std::to_string(l) + ".";
        for (LinearId id : g.linears) names.push_back(linear_name(c, l, id).substr(pre.size()));
        if (std::find(block.begin(), block.end(), names) == block.end()) block.push_back(names);
      }
    qc["modules_in_block_to_quantize"] = block;
  }
  auto files = write_model(job, packed, produce, qc);
  write_file_atomic(job.out_dir + "/quantize_config.json", qc.dump(2) + "\n");
  files.push_back("quantize_config.json");
  return files;
}

GptqReader::GptqReader(const std::string& dir) {
  const LlamaConfig c = load_config(dir);
  const json qc = c.raw.value("quantization_config", json::object());
  const std::string file = dir + "/config.json";
  const std::string method = json_field<std::string>(qc, "quant_method", "", Errc::format, file, "quantization_config.quant_method");
  if (method == "compressed-tensors") {
    const std::string fmt = json_field<std::string>(qc, "format", "", Errc::format, file, "quantization_config.format");
    if (fmt != "pack-quantized") fail(Errc::format, file, "quantization_config.format", "the packed-Linear reader takes pack-quantized compressed-tensors, not '" + fmt + "'");
    const CtWeights w = json_errors_named(Errc::format, file, "quantization_config.config_groups", [&] { return ct_weights(qc, file); });
    ct_ = true, v2_ = true, bits_ = w.bits, sym_ = w.sym, group_ = w.group_size;
  } else if (method == "gptq") {
    v2_ = json_field<std::string>(qc, "checkpoint_format", "gptq", Errc::format, file, "quantization_config.checkpoint_format") == "gptq_v2";
    bits_ = json_field<int>(qc, "bits", 4, Errc::format, file, "quantization_config.bits");
  } else {
    fail(Errc::format, file, "quantization_config.quant_method", "not a gptq or compressed-tensors pack-quantized checkpoint");
  }
  ck_ = std::make_unique<Checkpoint>(dir);
}

bool GptqReader::has(const std::string& m) const { return ck_->has(m + (ct_ ? ".weight_packed" : ".qweight")); }

QuantizedLinear GptqReader::read(const std::string& m) const {
  if (!ct_) return unpack_gptq(read_gptq_packed(*ck_, m, bits_), v2_, /*sym=*/false);   // zeros as stored
  QuantizedLinear q = unpack_ct(read_ct_packed(*ck_, m, ct_weight_shape(*ck_, m), bits_, group_, sym_), sym_);
  q.name = m;
  return q;
}

QuantizedLinear GptqReader::read_grids(const std::string& m, const uint8_t** qweight) const {
  if (ct_) fail(Errc::usage, ck_->file_of(m + ".weight_packed"), m, "compressed-tensors codes are read with the grids (read)");
  const GptqPacked p = read_gptq_packed(*ck_, m, bits_);
  *qweight = p.qweight_mapped;
  return unpack_gptq(p, v2_, /*sym=*/false, /*codes=*/false);
}


}  // namespace ptq
