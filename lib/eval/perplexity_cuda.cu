#include "eval/perplexity_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "cuda/blas.h"
#include "cuda/forward_cuda.h"
#include "cuda/runtime.h"
#include "formats/open.h"
#include "formats/packed.h"
#include "kernels/nf4.h"
#include "kernels/w4a16.h"

namespace ptq::cuda {

bool eval_supported(const std::string& format, std::string* why) {
  if (format == "float" || format == "gptq" || format == "gptq_v2" || format == "bitsandbytes-nf4") return true;
  if (why) *why = "the GPU evaluation reads float, gptq, gptq_v2 and bitsandbytes-nf4 checkpoints, not " + format + " (use --device cpu)";
  return false;
}

struct GpuLogits::Impl {
  const LlamaModel* model = nullptr;
  LlamaConfig c;
  DType dt = DType::F16;
  int64_t outs[7], ins[7];                               // [proj]: W [out, in]
  std::vector<std::unique_ptr<W4A16Linear>> packed;     // [layer * 7 + proj], null where stored in float
  std::vector<std::unique_ptr<Nf4Linear>> nf4;          // the same for NF4 checkpoints
  std::vector<DeviceBuffer<uint16_t>> dense;             // the same, 16-bit weights where not packed
  std::vector<std::pair<VecF, VecF>> norms;
  std::vector<VecF> biases;                              // [layer * 7 + proj], empty where none
  DeviceBuffer<uint16_t> lm_head;
  VecF final_norm;
  mutable double seconds = 0;
  int packed_count = 0;
};

namespace {
DeviceBuffer<uint16_t> upload16(const MatF& W, DType dt, const char* what) {
  std::vector<uint16_t> h(size_t(W.size()));
  convert_from_f32(dt, W.data(), h.data(), h.size());
  DeviceBuffer<uint16_t> d(h.size(), what);
  copy_to_device(d.get(), h.data(), h.size() * 2);
  return d;
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
  const bool gptq = fmt == "gptq" || fmt == "gptq_v2", nf4 = fmt == "bitsandbytes-nf4";
  // The A16 kernels take f16 activations; a float bf16 model keeps bf16.
  m.dt = gptq || nf4 ? DType::F16 : (m.c.dtype == DType::BF16 ? DType::BF16 : DType::F16);
  std::unique_ptr<GptqReader> reader;
  if (gptq) reader = std::make_unique<GptqReader>(path);
  std::unique_ptr<Checkpoint> nf4_ck;
  if (nf4) nf4_ck = std::make_unique<Checkpoint>(path);
  const LlamaConfig& c = m.c;
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  const int64_t outs[7] = {c.q_dim(), c.kv_dim(), c.kv_dim(), d, f, f, d}, ins[7] = {d, d, d, c.q_dim(), d, d, f};
  std::copy(outs, outs + 7, m.outs);
  std::copy(ins, ins + 7, m.ins);
  const WeightSource& ws = model.weights();
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    m.norms.emplace_back(read_vector(ws, pre + "input_layernorm.weight", d), read_vector(ws, pre + "post_attention_layernorm.weight", d));
    for (Proj p : kAllProj) {
      const std::string name = proj_tensor_prefix(l, p);
      const int i = int(p);
      m.biases.push_back(ws.has(name + ".bias") ? read_vector(ws, name + ".bias", outs[i]) : VecF());
      m.nf4.emplace_back();
      if (reader && reader->has(name)) {
        m.packed.push_back(W4A16Linear::from_gptq(reader->read(name), reader->v2()));
        m.dense.emplace_back();
        ++m.packed_count;
      } else if (nf4_ck && nf4_ck->has(name + ".weight.quant_state.bitsandbytes__nf4")) {
        Shape sh;
        const Nf4Tensor t = read_nf4(*nf4_ck, name + ".weight", &sh);
        if (sh != Shape{outs[i], ins[i]}) fail(Errc::format, nf4_ck->file_of(name + ".weight"), name + ".weight", "NF4 quant_state shape does not match the config");
        m.nf4.back() = Nf4Linear::from_nf4(t, outs[i], ins[i]);
        m.packed.push_back(nullptr);
        m.dense.emplace_back();
        ++m.packed_count;
      } else {
        m.packed.push_back(nullptr);
        m.dense.push_back(upload16(read_matrix(ws, name + ".weight", outs[i], ins[i]), m.dt, "evaluation weights (16-bit)"));
      }
    }
  }
  m.final_norm = read_vector(ws, "model.norm.weight", d);
  const std::string head = ws.has("lm_head.weight") ? "lm_head.weight" : "model.embed_tokens.weight";
  m.lm_head = upload16(read_matrix(ws, head, c.vocab_size, d), m.dt, "lm_head (16-bit)");
}

GpuLogits::~GpuLogits() = default;
double GpuLogits::forward_seconds() const { return p_->seconds; }
std::string GpuLogits::describe() const {
  const int total = int(p_->packed.size());
  if (p_->packed_count == 0) return std::string("cuda: ") + (p_->dt == DType::F16 ? "f16" : "bf16") + " weights through cuBLAS";
  const char* kernels = p_->nf4.size() && std::any_of(p_->nf4.begin(), p_->nf4.end(), [](const auto& q) { return bool(q); })
                            ? "the NF4 kernels (lib/kernels/nf4.cu)" : "the W4A16/W8A16 kernels (lib/kernels/w4a16.cu)";
  return "cuda: " + std::to_string(p_->packed_count) + " of " + std::to_string(total) + " Linears through " + kernels + ", the rest f16 through cuBLAS";
}

MatF GpuLogits::operator()(const std::vector<int32_t>& tokens, int S, int T) const {
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
  const cudaDataType ct = m.dt == DType::F16 ? CUDA_R_16F : CUDA_R_16BF;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    fw.set_norms(m.norms[size_t(l)].first, m.norms[size_t(l)].second);
    for (Proj p : kAllProj) {
      const size_t k = size_t(l * 7 + int(p));
      fw.set_bias(p, m.biases[k]);
      if (const W4A16Linear* q = m.packed[k].get()) {
        fw.set_linear(p, [q](const void* x, int64_t rows, float* y, float beta) { q->gemm_f32(x, rows, y, beta); });
      } else if (const Nf4Linear* q4 = m.nf4[k].get()) {
        fw.set_linear(p, [q4](const void* x, int64_t rows, float* y, float beta) { q4->gemm_f32(x, rows, y, beta); });
      } else {
        const void* w = m.dense[k].get();
        const int64_t in = m.ins[int(p)], out = m.outs[int(p)];
        fw.set_linear(p, [w, in, out, ct](const void* x, int64_t rows, float* y, float beta) {
          const float one = 1.0f;
          PTQ_CUBLAS(cublasGemmEx(blas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(out), int(rows), int(in), &one, w, ct, int(in), x, ct, int(in), &beta,
                                  y, CUDA_R_32F, int(out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        });
      }
    }
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
  MatF out(N, V);
  copy_to_host(out.data(), logits.get(), size_t(N * V) * 4);
  return out;
}

}  // namespace ptq::cuda
