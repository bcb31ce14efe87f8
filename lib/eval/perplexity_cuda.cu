#include "eval/perplexity_cuda.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/env.h"
#include "core/error.h"
#include "core/progress.h"
#include "cuda/blas.h"
#include "model/forward_cuda.h"
#include "cuda/runtime.h"
#include "formats/gguf.h"
#include "formats/open.h"
#include "kernels/f16_gemv.h"
#include "formats/packed.h"
#include "kernels/a16_grid.h"
#include "kernels/act_quant.h"
#include "kernels/nf4.h"
#include "kernels/w4a16.h"
#include "kernels/w8a8.h"
#include "eval/nll_cuda.h"
#include "model/schedule.h"

namespace ptq::cuda {

bool eval_supported(const std::string& format, std::string* why) {
  if (format == "float" || format == "gptq" || format == "gptq_v2" || format == "compressed-tensors/pack-quantized" || format == "bitsandbytes-nf4") return true;
  if (format == "gguf") return true;   // every quantized block type on the W4A16 / W8A16 kernels (gguf_quantized), float tensors in 16 bits
  if (format == "compressed-tensors/int-quantized") {
    if (w8a8_supported()) return true;
    if (why) *why = "W8A8 (int-quantized) checkpoints run on the GPU's W8A8 GEMM, which needs an sm_90 device (use --device cpu)";
    return false;
  }
  if (why)
    *why = "the GPU evaluation reads float, gptq, gptq_v2, bitsandbytes-nf4, GGUF and compressed-tensors pack-quantized and int-quantized checkpoints, not " + format +
           " (use --device cpu)";
  return false;
}

struct GpuLogits::Impl {
  const LlamaModel* model = nullptr;
  LlamaConfig c;
  DType dt = DType::F16;
  // Every Linear of every layer in the layer schedule's order (experts' included): y = x·Wᵀ + beta·y on the device
  std::vector<LayerForwardCuda::LinearFn> linears;       // empty where the layer's fused Linear below serves it
  std::vector<std::array<LayerForwardCuda::LinearFn, 2>> fused;   // per layer: q, k, v and gate, up stacked (empty where kept apart)
  std::vector<Int8Linear> linears8;                       // the same Linears' int8-input form where they are W8A8 (the decode's)
  std::vector<std::array<Int8Linear, 2>> fused8;
  std::vector<std::unique_ptr<W4A16Linear>> w4;           // what the linears run on (owned here)
  size_t packed_modules = 0;                              // checkpoint modules these packed Linears hold
  size_t min_modules = 0;                                 // of those, on grids with mins (GGUF's Q4_1, Q5_1, Q4_K, Q5_K)
  std::map<std::string, size_t> dequantized;              // stored grids the kernels do not take: modules, by reason (a16_takes)
  bool gguf = false;                                      // a GGUF checkpoint: its quantized blocks on the A16 kernels
  std::vector<std::unique_ptr<Nf4Linear>> nf4;
  struct W8A8 { DeviceBuffer<int8_t> w; DeviceBuffer<float> sw; ActQuant act; int64_t out = 0, in = 0; };
  std::vector<std::unique_ptr<W8A8>> w8;                  // int8 weights, per-channel scales, the input's int8 spec
  std::vector<DeviceBuffer<uint16_t>> dense;              // 16-bit weights of Linears stored in float
  std::vector<std::pair<VecF, VecF>> norms, head_norms;   // head_norms: Qwen3's q/k norms
  std::vector<VecF> biases;                               // the same order, empty where none
  std::vector<MatF> routers;                              // MoE: each layer's router [experts, hidden] (float)
  DeviceBuffer<uint16_t> lm_head;
  VecF final_norm;
  mutable double seconds = 0;
  // Where the load's time goes (PTQKIT_LOAD_PROFILE=1 prints it): the Linears' tensors read and
  // decoded to the quantizer's form, stacked (q, k, v; gate, up: the grids, and NF4's codes),
  // uploaded and laid out for the kernels (the codes on the device: kernels/relayout.cu; 16-bit
  // tensors stored as computed: read and uploaded in one copy); the rest is norms, biases, the
  // lm_head, and W8A8 weights' upload.
  std::array<double, 3> load_s{};
  enum LoadStage { read_stage, stack_stage, layout_stage };
  template <class F>
  auto timed(LoadStage st, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    struct Add {
      double* to;
      std::chrono::steady_clock::time_point t0;
      ~Add() { *to += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
    } add{&load_s[size_t(st)], t0};
    return f();
  }
};

namespace {
DeviceBuffer<uint16_t> upload16(const MatF& W, DType dt, const char* what) {
  std::vector<uint16_t> h(size_t(W.size()));
  convert_from_f32(dt, W.data(), h.data(), h.size());
  DeviceBuffer<uint16_t> d(h.size(), what);
  copy_to_device(d.get(), h.data(), h.size() * 2);
  return d;
}

// The tensors `parts` ({name, rows}: each [rows, cols], stacked by rows) as one 16-bit matrix on
// the device in dt. A float checkpoint's tensors stored in dt already (f16 or bf16) are copied as
// they are, through pinned staging: the fp32 round trip below gives the same bytes, with the
// conversions and twice the memory traffic. Empty where a part is not so stored.
DeviceBuffer<uint16_t> upload16_stored(const WeightSource& ws, const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols, DType dt,
                                       const char* what) {
  const Checkpoint* ck = ws.checkpoint();
  if (!ck || (dt != DType::F16 && dt != DType::BF16)) return {};
  std::vector<TensorView> ts;
  int64_t rows = 0;
  for (const auto& [name, r] : parts) {
    if (!ck->has(name)) return {};
    ts.push_back(ck->get(name));
    if (ts.back().dtype != dt || ts.back().shape != Shape{r, cols}) return {};   // read_matrix names a wrong shape
    rows += r;
  }
  DeviceBuffer<uint16_t> d(size_t(rows * cols), what);
  size_t at = 0;
  for (const TensorView& t : ts) {
    copy_to_device_staged(d.get() + at, t.data, size_t(t.numel()) * 2);
    at += size_t(t.numel());
  }
  return d;
}

using LinearFn = LayerForwardCuda::LinearFn;
struct Sources {
  const WeightSource& ws;
  const GptqReader* gptq;    // gptq / gptq_v2 checkpoints, and compressed-tensors pack-quantized ones
  const Checkpoint* nf4;     // bitsandbytes NF4 checkpoints
  const GgufFile* gguf;      // GGUF: its quantized Linears as the quantizer's representation (gguf_quantized)
  int head_dim;              // GGUF's q/k row order
  // Whether the module is stored as codes on a grid the W4A16 / W8A16 kernels take.
  bool is_grid(const std::string& module) const {
    return gptq ? gptq->has(module) : gguf && gguf_quantized(*gguf, module + ".weight", head_dim, nullptr);
  }
  // The block type a GGUF module is stored in (-1: not GGUF, whose stacked parts concat_rows checks).
  int grid_type(const std::string& module) const {
    if (!gguf) return -1;
    const GgufFile::TensorInfo* t = gguf->find(hf_to_gguf_name(module + ".weight"));
    return t ? int(t->type) : -1;
  }
  QuantizedLinear read_grid(const std::string& module) const {
    if (gptq) return gptq->read(module);
    QuantizedLinear q;
    gguf_quantized(*gguf, module + ".weight", head_dim, &q);
    return q;
  }
  // The same with its codes apart, as they go to the device (*codes): GPTQ's qweight where the
  // mapped checkpoint holds it; otherwise (compressed-tensors, GGUF) the codes read, moved into *owned.
  QuantizedLinear read_grid_apart(const std::string& module, std::vector<uint32_t>* owned, StoredRows* codes) const {
    if (gptq && gptq->maps_qweight()) {
      const uint8_t* qweight = nullptr;
      QuantizedLinear q = gptq->read_grids(module, &qweight);
      *codes = {qweight, q.rows, /*by_column=*/true};
      return q;
    }
    QuantizedLinear q = read_grid(module);
    *owned = std::move(q.packed);
    *codes = {owned->data(), q.rows};
    return q;
  }
};
struct Part {
  std::string name;          // the module, "model.layers.3.self_attn.q_proj"
  int64_t out;
};
enum class Stored { grid, w8a8, nf4, dense };

// The Linear over `parts`' output rows in order, resident on the device: one part is the module as
// stored; several (q, k, v or gate, up) are their rows stacked, where every part is stored the same
// way (GPTQ with one g_idx, W8A8 with one activation spec, NF4 with one block size, or float);
// an empty function where they differ (the caller keeps them apart).
// W8A8 Linears also give their int8-input form (q8, where not null).
LinearFn load_linear(GpuLogits::Impl& m, const Sources& s, const std::vector<Part>& parts, int64_t in, Int8Linear* q8 = nullptr) {
  int64_t out = 0;
  for (const Part& p : parts) out += p.out;
  auto stored = [&](const std::string& n) {
    if (s.is_grid(n)) return Stored::grid;
    if (s.ws.act_quant(n).mode != ActQuant::none) return Stored::w8a8;
    if (s.nf4 && s.nf4->has(n + ".weight.quant_state.bitsandbytes__nf4")) return Stored::nf4;
    return Stored::dense;
  };
  Stored kind = stored(parts[0].name);
  for (const Part& p : parts)
    if (stored(p.name) != kind) return {};
  if (kind == Stored::grid) {
    // Parts stored in different block types (GGUF's Q4_K_M keeps v in Q6_K) are not stacked: known
    // before any is read, so none is decoded twice.
    for (const Part& p : parts)
      if (s.grid_type(p.name) != s.grid_type(parts[0].name)) return {};
    // The grids are read and stacked on the host; the codes go to the device part by part as
    // stored (from_quantized), never stacked or transposed here.
    std::vector<QuantizedLinear> qs;
    std::vector<std::vector<uint32_t>> owned(parts.size());
    std::vector<StoredRows> codes(parts.size());
    for (size_t i = 0; i < parts.size(); ++i)
      qs.push_back(m.timed(GpuLogits::Impl::read_stage, [&] { return s.read_grid_apart(parts[i].name, &owned[i], &codes[i]); }));
    QuantizedLinear g;
    if (!m.timed(GpuLogits::Impl::stack_stage, [&] { return concat_rows(qs, &g); })) return {};
    if (g.rows != out || g.cols != in)
      fail(Errc::format, "", parts[0].name, "quantized shape [" + std::to_string(g.rows) + ", " + std::to_string(g.cols) + "] does not match the config");
    // What the kernels do not take (a16_grid.h: a 172-wide input such as stories260k's down
    // projection, groups whose sizes share no multiple of 16 columns, a scale past f16's range) is
    // dequantized to f16; describe() says why.
    A16Refusal why;
    if (a16_takes(g, &why)) {
      m.w4.push_back(m.timed(GpuLogits::Impl::layout_stage, [&] { return W4A16Linear::from_quantized(g, codes); }));
      m.packed_modules += parts.size();
      if (m.w4.back()->has_min()) m.min_modules += parts.size();
      const W4A16Linear* q = m.w4.back().get();
      return [q](const void* x, int64_t rows, float* y, float beta) { q->gemm_f32(x, rows, y, beta); };
    }
    m.dequantized[why.field + ": " + why.reason] += parts.size();
    kind = Stored::dense;
  }
  if (kind == Stored::w8a8) {
    // The activations quantized per token (or per tensor) on the device, then the int8 GEMV / GEMM
    // with the rescale in its epilogue (lib/kernels/w8a8*.cu).
    const ActQuant act = s.ws.act_quant(parts[0].name);
    std::vector<int8_t> w8;
    std::vector<float> sw;
    bool int8 = true;
    for (const Part& p : parts) {
      MatI Wi;
      VecF si;
      const ActQuant a = s.ws.act_quant(p.name);
      if (a.mode != act.mode || a.static_scale != act.static_scale) return {};
      if (!m.timed(GpuLogits::Impl::read_stage, [&] { return s.ws.read_int8(p.name, &Wi, &si); })) {
        int8 = false;
        break;
      }
      if (Wi.rows() != p.out || Wi.cols() != in) fail(Errc::format, s.ws.file_of(p.name + ".weight"), p.name + ".weight", "int8 weight shape does not match the config");
      for (Eigen::Index k = 0; k < Wi.size(); ++k) w8.push_back(int8_t(Wi.data()[k]));
      sw.insert(sw.end(), si.data(), si.data() + si.size());
    }
    if (int8) {
      auto q = std::make_unique<GpuLogits::Impl::W8A8>();
      q->w = DeviceBuffer<int8_t>(w8.size(), "evaluation weights (int8)");
      q->sw = DeviceBuffer<float>(sw.size(), "evaluation weight scales");
      copy_to_device(q->w.get(), w8.data(), w8.size());
      copy_to_device(q->sw.get(), sw.data(), sw.size() * 4);
      q->act = act;
      q->out = out;
      q->in = in;
      m.w8.push_back(std::move(q));
      m.packed_modules += parts.size();
      const GpuLogits::Impl::W8A8* w = m.w8.back().get();
      const DType dt = m.dt;
      if (q8) {
        q8->act = act;
        q8->fn = [w](const int8_t* xq, const float* sx, int64_t rows, float* y, float beta) {
          w8a8_linear_int8_f32(xq, sx, w->w.get(), w->sw.get(), rows, w->out, w->in, y, beta);
        };
      }
      return [w, dt](const void* x, int64_t rows, float* y, float beta) { w8a8_linear_f32(x, dt, w->act, w->w.get(), w->sw.get(), rows, w->out, w->in, y, beta); };
    }
    if (parts.size() > 1) return {};
    kind = Stored::dense;   // an activation spec over float weights: the 16-bit GEMM
  }
  if (kind == Stored::nf4) {
    // The absmax values are read and stacked on the host; the codes go to the device part by part
    // from where the checkpoint maps them (from_nf4).
    std::vector<Nf4Tensor> ts;
    std::vector<int64_t> n;
    std::vector<StoredRows> codes;
    for (const Part& p : parts) {
      Shape sh;
      const uint8_t* mapped = nullptr;
      ts.push_back(m.timed(GpuLogits::Impl::read_stage, [&] { return read_nf4(*s.nf4, p.name + ".weight", &sh, &mapped); }));
      codes.push_back({mapped, p.out});
      if (sh != Shape{p.out, in}) fail(Errc::format, s.nf4->file_of(p.name + ".weight"), p.name + ".weight", "NF4 quant_state shape does not match the config");
      if (ts.back().blocksize != ts[0].blocksize) return {};
      n.push_back(p.out * in);
    }
    const Nf4Tensor t = parts.size() == 1 ? std::move(ts[0]) : m.timed(GpuLogits::Impl::stack_stage, [&] { return concat_nf4_rows(ts, n); });
    m.nf4.push_back(m.timed(GpuLogits::Impl::layout_stage, [&] { return Nf4Linear::from_nf4(t, out, in, codes); }));
    m.packed_modules += parts.size();
    const Nf4Linear* q = m.nf4.back().get();
    return [q](const void* x, int64_t rows, float* y, float beta) { q->gemm_f32(x, rows, y, beta); };
  }
  std::vector<std::pair<std::string, int64_t>> names;
  for (const Part& p : parts) names.emplace_back(p.name + ".weight", p.out);
  DeviceBuffer<uint16_t> stored16 = m.timed(GpuLogits::Impl::layout_stage, [&] { return upload16_stored(s.ws, names, in, m.dt, "evaluation weights (16-bit)"); });
  if (stored16.get()) {
    m.dense.push_back(std::move(stored16));
  } else {
    MatF W(out, in);
    int64_t r0 = 0;
    for (const Part& p : parts) {
      m.timed(GpuLogits::Impl::read_stage, [&] { W.middleRows(r0, p.out) = read_matrix(s.ws, p.name + ".weight", p.out, in); });
      r0 += p.out;
    }
    m.dense.push_back(m.timed(GpuLogits::Impl::layout_stage, [&] { return upload16(W, m.dt, "evaluation weights (16-bit)"); }));
  }
  const void* w = m.dense.back().get();
  const cudaDataType ct = m.dt == DType::F16 ? CUDA_R_16F : CUDA_R_16BF;
  if (m.dt == DType::F16)   // decode-sized M through the A16 kernel reading W in place (kernels/f16_gemv.h), else cuBLAS
    return [w, in, out](const void* x, int64_t rows, float* y, float beta) { f16_linear_f32(w, x, rows, out, in, y, beta); };
  return [w, in, out, ct](const void* x, int64_t rows, float* y, float beta) {
    const float one = 1.0f;
    PTQ_CUBLAS(cublasGemmEx(blas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(out), int(rows), int(in), &one, w, ct, int(in), x, ct, int(in), &beta, y,
                            CUDA_R_32F, int(out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
}
}  // namespace

GpuLogits::GpuLogits(const LlamaModel& model, const std::string& path) : p_(std::make_shared<Impl>()) {
  Impl& m = *p_;
  m.model = &model;
  m.c = model.config();
  const std::string fmt = model_format(path);
  std::string why;
  if (!eval_supported(fmt, &why)) fail(Errc::usage, path, "--device", why);
  if (!cuda::available()) fail(Errc::usage, "", "--device", "cuda requested, but " + cuda::describe());
  // pack-quantized holds GPTQ's codes, scales, zero points and g_idx in another layout: GptqReader
  // reads both as the quantizer's representation, which the W4A16 / W8A16 kernels load (a Linear
  // the kernels do not take is dequantized: a16_takes).
  const bool gptq = fmt == "gptq" || fmt == "gptq_v2" || fmt == "compressed-tensors/pack-quantized", nf4 = fmt == "bitsandbytes-nf4";
  // The A16 kernels take f16 activations; a float bf16 model keeps bf16.
  m.gguf = fmt == "gguf";
  m.dt = gptq || nf4 || m.gguf ? DType::F16 : (m.c.dtype == DType::BF16 ? DType::BF16 : DType::F16);
  std::unique_ptr<GptqReader> reader;
  if (gptq) reader = std::make_unique<GptqReader>(path);
  std::unique_ptr<GgufFile> gguf;
  if (m.gguf) gguf = std::make_unique<GgufFile>(gguf_path(path));
  std::unique_ptr<Checkpoint> nf4_ck;
  if (nf4) nf4_ck = std::make_unique<Checkpoint>(path);
  const LlamaConfig& c = m.c;
  if (!forward_supported(c, 2, &why)) fail(Errc::usage, path, "--device", "cuda evaluation of this model: " + why + " (evaluate with --device cpu)");
  const int64_t d = c.hidden_size;
  const WeightSource& ws = model.weights();
  const Sources src{ws, reader.get(), nf4_ck.get(), gguf.get(), c.head_dim};
  m.fused.resize(size_t(c.num_hidden_layers));
  m.fused8.resize(size_t(c.num_hidden_layers));
  // A 7B model's layers take seconds to read, relayout and upload: a line with its rate and ETA
  // on a terminal, and progress events in --log-json.
  const auto t_load = std::chrono::steady_clock::now();
  Progress bar("load (GPU)", double(c.num_hidden_layers), "layers");
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    m.norms.emplace_back(read_vector(ws, pre + "input_layernorm.weight", d), read_vector(ws, pre + "post_attention_layernorm.weight", d));
    if (c.qk_norm) m.head_norms.emplace_back(read_vector(ws, pre + "self_attn.q_norm.weight", c.head_dim), read_vector(ws, pre + "self_attn.k_norm.weight", c.head_dim));
    if (c.moe_layer(l)) m.routers.push_back(read_matrix(ws, router_name(c, l) + ".weight", c.num_experts, d));
    // q, k, v (and gate, up of a dense MLP) as one Linear each where their parts are stored alike:
    // one launch instead of three (two) at decode, and larger GEMMs in the forward.
    const std::vector<LinearId> lins = layer_schedule(c, l).linears();
    auto has = [&](Proj p) { return std::find(lins.begin(), lins.end(), LinearId{p}) != lins.end(); };
    auto fuse = [&](int slot, std::initializer_list<Proj> parts) {
      std::vector<Part> ps;
      for (Proj p : parts) {
        if (!has(p)) return;
        ps.push_back({linear_name(c, l, LinearId{p}), linear_shape(c, LinearId{p}).out});
      }
      m.fused[size_t(l)][size_t(slot)] = load_linear(m, src, ps, d, &m.fused8[size_t(l)][size_t(slot)]);
    };
    fuse(0, {Proj::q, Proj::k, Proj::v});
    fuse(1, {Proj::gate, Proj::up});
    for (LinearId p : lins) {
      const std::string name = linear_name(c, l, p);
      const int64_t out_i = linear_shape(c, p).out, in_i = linear_shape(c, p).in;
      m.biases.push_back(ws.has(name + ".bias") ? read_vector(ws, name + ".bias", out_i) : VecF());
      const bool in_fused = p.expert < 0 && (((p.proj == Proj::q || p.proj == Proj::k || p.proj == Proj::v) && m.fused[size_t(l)][0]) ||
                                             ((p.proj == Proj::gate || p.proj == Proj::up) && m.fused[size_t(l)][1]));
      m.linears8.emplace_back();
      m.linears.push_back(in_fused ? LinearFn() : load_linear(m, src, {{name, out_i}}, in_i, &m.linears8.back()));
    }
    bar.update(double(l + 1), "layer " + std::to_string(l));
  }
  m.final_norm = read_vector(ws, "model.norm.weight", d);
  const std::string head = ws.has("lm_head.weight") ? "lm_head.weight" : "model.embed_tokens.weight";
  m.lm_head = upload16_stored(ws, {{head, c.vocab_size}}, d, m.dt, "lm_head (16-bit)");
  if (!m.lm_head.get()) m.lm_head = upload16(read_matrix(ws, head, c.vocab_size, d), m.dt, "lm_head (16-bit)");
  bar.finish();
  if (env_switch("PTQKIT_LOAD_PROFILE", false)) {
    const double all = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    std::fprintf(stderr, "load profile: %.2f s: Linears read %.2f s, stacked %.2f s, laid out and uploaded %.2f s; the rest %.2f s\n", all, m.load_s[0],
                 m.load_s[1], m.load_s[2], all - m.load_s[0] - m.load_s[1] - m.load_s[2]);
  }
}

DecodeWeights GpuLogits::decode_weights() const {
  const Impl& m = *p_;
  const LlamaConfig& c = m.c;
  std::string why;
  if (!decode_supported(c, &why)) fail(Errc::usage, "", "--device", "cuda decode of this model: " + why + " (use --device cpu)");
  DecodeWeights w;
  w.c = c;
  w.dt = m.dt;
  w.owners.push_back(p_);
  const int64_t d = c.hidden_size;
  auto emb = std::make_shared<DeviceBuffer<uint16_t>>(upload16_stored(m.model->weights(), {{"model.embed_tokens.weight", c.vocab_size}}, d, m.dt, "embedding table (16-bit)"));
  if (!emb->get()) *emb = upload16(read_matrix(m.model->weights(), "model.embed_tokens.weight", c.vocab_size, d), m.dt, "embedding table (16-bit)");
  w.owners.push_back(emb);
  w.embed = emb->get();
  w.lm_head = m.lm_head.get();
  w.final_norm = m.final_norm;
  size_t k = 0, moe_k = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    DecodeLayer L;
    if (c.moe_layer(l)) {
      L.router.W = m.routers[moe_k++];
      L.experts.resize(size_t(c.num_experts));
    }
    L.in_norm = m.norms[size_t(l)].first;
    L.post_norm = m.norms[size_t(l)].second;
    if (c.qk_norm) L.q_norm = m.head_norms[size_t(l)].first, L.k_norm = m.head_norms[size_t(l)].second;
    L.qkv = m.fused[size_t(l)][0];
    L.gate_up = m.fused[size_t(l)][1];
    L.qkv8 = m.fused8[size_t(l)][0];
    L.gate_up8 = m.fused8[size_t(l)][1];
    for (LinearId p : layer_schedule(c, l).linears()) {   // the constructor's order
      const VecF& bias = m.biases[k];
      const Int8Linear& f8 = m.linears8[k];
      const LinearFn& f = m.linears[k++];
      if (p.expert >= 0) {
        if (bias.size()) fail(Errc::usage, "", "--device", "cuda decode: expert biases are not served");
        L.experts[size_t(p.expert)][size_t(expert_slot(p.proj))] = f;
        continue;
      }
      if (p.proj == Proj::qkv || p.proj == Proj::gate_up) {   // Phi-3's, as stored
        if (bias.size()) fail(Errc::usage, "", "--device", "cuda decode: biases on fused Linears are not served");
        (p.proj == Proj::qkv ? L.qkv : L.gate_up) = f;
        (p.proj == Proj::qkv ? L.qkv8 : L.gate_up8) = f8;
        continue;
      }
      int j = 0;
      while (j < 7 && kAllProj[size_t(j)] != p.proj) ++j;
      if (j < 3) L.qkv_bias[size_t(j)] = bias;
      else if (bias.size()) fail(Errc::usage, "", "--device", "cuda decode: biases on o/gate/up/down are not served");
      L.lin[size_t(j)] = f;   // empty where L.qkv / L.gate_up serves it
      L.lin8[size_t(j)] = f8;
    }
    w.layers.push_back(std::move(L));
  }
  w.what = describe();
  return w;
}

GpuLogits::~GpuLogits() = default;
double GpuLogits::forward_seconds() const { return p_->seconds; }
std::string GpuLogits::describe() const {
  const Impl& m = *p_;
  const size_t packed = m.packed_modules;
  bool stacked = false;
  for (const auto& f : m.fused) stacked = stacked || f[0] || f[1];
  // Stored grids the kernels do not take, by reason: "the rest" is these and the float Linears.
  std::string refused;
  size_t listed = 0, more = 0;
  for (const auto& [reason, modules] : m.dequantized)
    if (listed++ < 3) refused += (refused.empty() ? "; dequantized at load, " : ", ") + std::to_string(modules) + " (" + reason + ")";
    else more += modules;
  if (more) refused += ", " + std::to_string(more) + " more";
  if (packed == 0)
    return std::string("cuda: ") + (m.gguf ? "GGUF's blocks dequantized at load to " : "") + (m.dt == DType::F16 ? "f16" : "bf16") + " weights through cuBLAS" + refused;
  const char* kernels = !m.w8.empty()    ? "the W8A8 GEMM with int8 activations per token/tensor (lib/kernels/w8a8.cu)"
                        : m.nf4.empty() ? "the W4A16/W8A16 kernels (lib/kernels/w4a16.cu)"
                                        : "the NF4 kernel (lib/kernels/nf4.cu)";
  // Codes narrower than the kernel's layout (GPTQ's 2 and 3 bits, GGUF's 5 and 6), and grids with mins (GGUF's Q4_1, Q5_1, Q4_K, Q5_K).
  std::set<std::pair<int, int>> widths;
  for (const auto& q : m.w4)
    if (q->code_bits() != q->bits()) widths.insert({q->code_bits(), q->bits()});
  const size_t with_min = m.min_modules;
  std::string widened;
  for (const auto& [code, layout] : widths)
    widened += (widened.empty() ? " (" : ", ") + std::to_string(code) + "-bit codes held in the " + std::to_string(layout) + "-bit layout";
  if (!widened.empty()) widened += ")";
  // "The rest" are the Linears not counted in `packed` and the lm_head; with every Linear packed,
  // only the lm_head, which runs 16-bit (f16 as stored, or dequantized from a GGUF block type).
  const std::string rest = packed == m.linears.size() ? "the lm_head" : "the rest";
  const std::string gguf = " (GGUF's blocks as codes and grids" + (with_min ? ", " + std::to_string(with_min) + " Linears with mins" : std::string()) +
                           "), " + rest + " dequantized to f16";
  return "cuda: " + std::to_string(packed) + " of " + std::to_string(m.linears.size()) + " Linears through " + kernels + widened +
         (m.gguf ? gguf : ", " + rest + " f16") + (stacked ? " (q, k, v and gate, up stacked)" : "") + refused;
}

DeviceBuffer<float> GpuLogits::forward(const std::vector<int32_t>& tokens, int S, int T) const {
  const Impl& m = *p_;
  const LlamaConfig& c = m.c;
  const int64_t N = int64_t(S) * T, V = c.vocab_size;
  const MatF X = m.model->embed(tokens);
  LayerForwardCuda fw(c, m.model->rope(T), S, T, m.dt);
  fw.set_input(X);
  cudaEvent_t e0, e1;
  PTQ_CUDA(cudaEventCreate(&e0));
  PTQ_CUDA(cudaEventCreate(&e1));
  PTQ_CUDA(cudaEventRecord(e0));
  size_t k = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    fw.set_norms(m.norms[size_t(l)].first, m.norms[size_t(l)].second);
    if (c.qk_norm) fw.set_head_norms(m.head_norms[size_t(l)].first, m.head_norms[size_t(l)].second);
    if (!c.fused) {   // q, k, v and gate, up stacked where the constructor could (else empty: apart)
      fw.set_linear(Proj::qkv, m.fused[size_t(l)][0]);
      fw.set_linear(Proj::gate_up, m.fused[size_t(l)][1]);
    }
    for (LinearId p : layer_schedule(c, l).linears()) {   // the constructor's order
      if (p.expert >= 0) {
        fw.set_expert_linear(p, m.linears[k++]);
        continue;
      }
      fw.set_bias(p.proj, m.biases[k]);
      fw.set_linear(p.proj, m.linears[k++]);
    }
    if (c.moe_layer(l)) fw.set_router(m.routers[size_t(l)]);
    fw.layer();
  }
  DeviceBuffer<float> logits(size_t(N * V), "logits (fp32; lower --batch-tokens to need less)");
  fw.logits(m.final_norm, m.lm_head.get(), V, logits.get());
  PTQ_CUDA(cudaEventRecord(e1));
  PTQ_CUDA(cudaEventSynchronize(e1));
  float ms = 0;
  PTQ_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  m.seconds += ms / 1000.0;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return logits;
}

MatF GpuLogits::operator()(const std::vector<int32_t>& tokens, int S, int T) const {
  const int64_t N = int64_t(S) * T, V = p_->c.vocab_size;
  const DeviceBuffer<float> logits = forward(tokens, S, T);
  MatF out(N, V);
  copy_to_host(out.data(), logits.get(), size_t(N * V) * 4);
  return out;
}

std::vector<double> GpuLogits::nll(const std::vector<int32_t>& tokens, int S, int T) const {
  const DeviceBuffer<float> logits = forward(tokens, S, T);
  return nll_rows(logits.get(), tokens, S, T, p_->c.vocab_size);
}

}  // namespace ptq::cuda
