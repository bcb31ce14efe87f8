#include "formats/nf4.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace ptq {

using nlohmann::json;
using namespace formats;

const std::array<float, 16> kNf4Code = {-1.0f,
                                         -0.6961928009986877f,
                                         -0.5250730514526367f,
                                         -0.39491748809814453f,
                                         -0.28444138169288635f,
                                         -0.18477343022823334f,
                                         -0.09105003625154495f,
                                         0.0f,
                                         0.07958029955625534f,
                                         0.16093020141124725f,
                                         0.24611230194568634f,
                                         0.33791524171829224f,
                                         0.44070982933044434f,
                                         0.5626170039176941f,
                                         0.7229568362236023f,
                                         1.0f};

namespace {
// The midpoints between neighbouring codes, ascending: x's code is how many lie below it.
const std::array<float, 15> kNf4Mid = [] {
  std::array<float, 15> m{};
  for (size_t k = 1; k < 16; ++k) m[k - 1] = 0.5f * (kNf4Code[k - 1] + kNf4Code[k]);
  return m;
}();
}  // namespace

uint8_t nf4_index(float x) {
  int i = 0;
  for (float m : kNf4Mid) i += x > m;   // above the midpoint to code k: at least k (NaN: 0)
  return uint8_t(i);
}

std::vector<float> bnb_dynamic_map() {
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const int n = (1 << i) + 1;
    for (int k = 0; k + 1 < n; ++k) {
      const float b0 = 0.1f + 0.9f * float(k) / float(n - 1), b1 = 0.1f + 0.9f * float(k + 1) / float(n - 1);
      const float mean = (b0 + b1) / 2.0f, scale = float(std::pow(10.0, -6 + i));
      data.push_back(scale * mean);
      data.push_back(-scale * mean);
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  std::sort(data.begin(), data.end());
  return data;
}

namespace {
uint8_t nearest(const std::vector<float>& sorted, float x) {
  auto it = std::lower_bound(sorted.begin(), sorted.end(), x);
  if (it == sorted.begin()) return 0;
  if (it == sorted.end()) return uint8_t(sorted.size() - 1);
  const size_t hi = size_t(it - sorted.begin());
  return uint8_t(x - sorted[hi - 1] <= sorted[hi] - x ? hi - 1 : hi);
}
}  // namespace

Nf4Tensor nf4_quantize(const float* x, int64_t n, int blocksize, bool double_quant) {
  Nf4Tensor t;
  t.blocksize = blocksize;
  const int64_t nb = (n + blocksize - 1) / blocksize;
  t.absmax.resize(size_t(nb));
  t.packed.assign(size_t((n + 1) / 2), 0);
  // Blocks in parallel where they own whole bytes (an even block size): the same bytes in any order.
#pragma omp parallel for schedule(static) if (blocksize % 2 == 0 && n > (int64_t(1) << 20))
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t e = std::min(n, (b + 1) * blocksize);
    float m = 0;
    for (int64_t i = b * blocksize; i < e; ++i) m = std::max(m, std::abs(x[i]));
    t.absmax[size_t(b)] = m;
    const float inv = m > 0 ? 1.0f / m : 0.0f;
    for (int64_t c0 = b * blocksize; c0 < e; c0 += 256) {   // codes 256 at a time (a loop the compiler vectorizes), then two to a byte
      const int64_t c1 = std::min(e, c0 + 256);
      uint8_t q[256];
      for (int64_t i = c0; i < c1; ++i) q[i - c0] = nf4_index(x[i] * inv);
      for (int64_t i = c0; i < c1; ++i) t.packed[size_t(i / 2)] |= uint8_t(i % 2 == 0 ? q[i - c0] << 4 : q[i - c0]);
    }
  }
  if (double_quant) {
    t.nested = true;
    double mean = 0;
    for (float a : t.absmax) mean += a;
    t.offset = float(mean / double(nb));
    t.nested_map = bnb_dynamic_map();
    const int64_t nb2 = (nb + t.nested_blocksize - 1) / t.nested_blocksize;
    t.nested_absmax.resize(size_t(nb2));
    t.absmax_q.resize(size_t(nb));
    for (int64_t b = 0; b < nb2; ++b) {
      const int64_t e = std::min(nb, (b + 1) * t.nested_blocksize);
      float m = 0;
      for (int64_t i = b * t.nested_blocksize; i < e; ++i) m = std::max(m, std::abs(t.absmax[size_t(i)] - t.offset));
      t.nested_absmax[size_t(b)] = m;
      for (int64_t i = b * t.nested_blocksize; i < e; ++i)
        t.absmax_q[size_t(i)] = nearest(t.nested_map, m > 0 ? (t.absmax[size_t(i)] - t.offset) / m : 0.0f);
    }
    for (int64_t i = 0; i < nb; ++i) t.absmax[size_t(i)] = nf4_block_absmax(t, i);   // what a reader will reconstruct
  }
  return t;
}

float nf4_block_absmax(const Nf4Tensor& t, int64_t b) {
  return t.nested ? t.nested_map[t.absmax_q[size_t(b)]] * t.nested_absmax[size_t(b / t.nested_blocksize)] + t.offset : t.absmax[size_t(b)];
}

void nf4_dequantize(const Nf4Tensor& t, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t byte = t.packed[size_t(i / 2)];
    const uint8_t q = i % 2 == 0 ? byte >> 4 : byte & 15;
    out[i] = kNf4Code[q] * nf4_block_absmax(t, i / t.blocksize);
  }
}

Nf4Tensor concat_nf4_rows(const std::vector<Nf4Tensor>& parts, const std::vector<int64_t>& n) {
  if (parts.empty() || parts.size() != n.size()) fail(Errc::usage, "", "concat_nf4_rows", "one element count per part");
  Nf4Tensor t;
  t.blocksize = parts[0].blocksize;
  const bool apart = std::all_of(parts.begin(), parts.end(), [](const Nf4Tensor& p) { return p.packed.empty(); });
  for (size_t i = 0; i < parts.size(); ++i) {
    const Nf4Tensor& p = parts[i];
    if (p.blocksize != t.blocksize || n[i] % 2 || n[i] % p.blocksize || (int64_t(p.packed.size()) != n[i] / 2 && !apart))
      fail(Errc::usage, "", "concat_nf4_rows", "parts need one block size and whole blocks of an even number of codes");
    t.packed.insert(t.packed.end(), p.packed.begin(), p.packed.end());
    for (int64_t b = 0; b < n[i] / p.blocksize; ++b) t.absmax.push_back(nf4_block_absmax(p, b));
  }
  return t;
}

void check_nf4(const std::vector<ModulePlan>& plan, int nf4_blocksize) {
  if (nf4_blocksize < 32 || nf4_blocksize > 4096 || (nf4_blocksize & (nf4_blocksize - 1)))
    fail(Errc::usage, "", "export.nf4_blocksize", "nf4: must be a power of two from 32 to 4096, got " + std::to_string(nf4_blocksize));
  for (auto& m : plan)
    if (m.quantized && (m.rows * m.cols) % 2) fail(Errc::usage, "", m.name, "nf4: two codes per byte need an even number of weights");
}

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
  json skip = float_modules(job.model->config());   // (transformers matches these as substrings of module names)
  json qc = {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}, {"load_in_8bit", false}, {"bnb_4bit_quant_type", "nf4"},
             {"bnb_4bit_use_double_quant", job.nf4_double_quant}, {"bnb_4bit_compute_dtype", dtype == "float32" ? "float16" : dtype},
             {"bnb_4bit_quant_storage", "uint8"}, {"llm_int8_skip_modules", skip}, {"llm_int8_threshold", 6.0},
             {"llm_int8_has_fp16_weight", false}, {"llm_int8_enable_fp32_cpu_offload", false}};
  return write_model(job, packed, produce, qc);
}

std::function<bool(const std::string&, MatF*)> nf4_dequantized(const ExportJob& job) {
  return [&job](const std::string& tensor, MatF* W) {
    if (!tensor.ends_with(".weight")) return false;
    const std::string m = tensor.substr(0, tensor.size() - 7);
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

json nf4_quant_state(const Checkpoint& ck, const std::string& n) {
  const std::string qs = n + ".quant_state.bitsandbytes__nf4";
  const TensorView t = ck.get(qs);
  try {
    return json::parse(t.data, t.data + t.nbytes);
  } catch (const json::exception& e) {
    fail(Errc::format, ck.file_of(qs), qs, std::string("malformed JSON: ") + e.what());
  }
}

namespace {
// The block metadata a bitsandbytes NF4 weight of `count` elements holds: ceil(count / blocksize)
// absmax values (nested: that many 8-bit codes, ceil(blocks / nested_blocksize) nested absmax
// values and a 256-value map). Every reader indexes them by these counts, so a file that holds
// fewer is refused here, naming the tensor (Errc::format). (The codes' bytes: read_nf4.)
void check_nf4_sizes(const Checkpoint& ck, const std::string& n, const Nf4Tensor& t, int64_t count) {
  const std::string qs = n + ".quant_state.bitsandbytes__nf4";
  if (t.blocksize <= 0) fail(Errc::format, ck.file_of(qs), qs, "blocksize " + std::to_string(t.blocksize) + " is not positive");
  if (count < 0) fail(Errc::format, ck.file_of(qs), qs, "negative shape");
  const int64_t blocks = (count + t.blocksize - 1) / t.blocksize;
  auto expect = [&](const std::string& name, size_t have, int64_t want, const std::string& what) {
    if (int64_t(have) != want)
      fail(Errc::format, ck.file_of(name), name,
           std::to_string(have) + " values, expected " + std::to_string(want) + " (" + what + " of the quant_state's " + std::to_string(count) + " elements)");
  };
  const std::string per_block = "one a block of " + std::to_string(t.blocksize);
  if (!t.nested) {
    expect(n + ".absmax", t.absmax.size(), blocks, per_block);
    return;
  }
  if (t.nested_blocksize <= 0) fail(Errc::format, ck.file_of(qs), qs, "nested_blocksize " + std::to_string(t.nested_blocksize) + " is not positive");
  expect(n + ".absmax", t.absmax_q.size(), blocks, per_block);
  expect(n + ".nested_absmax", t.nested_absmax.size(), (blocks + t.nested_blocksize - 1) / t.nested_blocksize,
         "one a nested block of " + std::to_string(t.nested_blocksize) + " absmax values");
  expect(n + ".nested_quant_map", t.nested_map.size(), 256, "the 8-bit map's 256 values");
}
}  // namespace

Nf4Tensor read_nf4(const Checkpoint& ck, const std::string& n, Shape* shape, const uint8_t** codes) {
  const json st = nf4_quant_state(ck, n);
  try {
    Nf4Tensor t;
    t.blocksize = st.at("blocksize").get<int>();
    const int64_t count = numel(st.at("shape").get<Shape>());
    if (shape) *shape = st.at("shape").get<Shape>();
    // The codes, two a byte: checked once, then left where the checkpoint maps them or copied.
    const TensorView v = ck.get(n);
    if (v.dtype != DType::U8) fail(Errc::format, ck.file_of(n), n, "dtype " + std::string(dtype_name(v.dtype)) + ", expected U8");
    if (int64_t(v.nbytes) != (count + 1) / 2)
      fail(Errc::format, ck.file_of(n), n, std::to_string(v.nbytes) + " bytes of codes for a quant_state shape of " + std::to_string(count) + " elements");
    if (codes) *codes = v.data;
    else t.packed.assign(v.data, v.data + v.nbytes);
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
    check_nf4_sizes(ck, n, t, count);
    return t;
  } catch (const json::exception& e) {
    const std::string qs = n + ".quant_state.bitsandbytes__nf4";
    fail(Errc::format, ck.file_of(qs), qs, std::string("unexpected quant state: ") + e.what());
  }
}

}  // namespace ptq
