// forward_cuda.h — the calibration forward pass of one decoder layer on the GPU, stage by stage
// in the order of pipeline.h, with the activations resident on the device.
//
// Precision (docs/numerics.md): the residual stream X stays fp32, as in the CPU reference; every
// GEMM operand (normalized activations, attention context, MLP activation, weights, Q/K/V, the
// softmax probabilities) is in the model's 16-bit dtype and every product is accumulated in fp32
// (cuBLAS GemmEx, CUBLAS_COMPUTE_32F); RMSNorm statistics, rotary, attention scores and softmax
// are fp32. The Hessians are accumulated from the same 16-bit activations the GEMMs consume.
// Memory: X (fp32 [S*T, d]), one 16-bit stage buffer [S*T, max(q_dim, ffn)], the layer's 16-bit
// weights, and chunk buffers of kChunkTokens tokens. With `spill`, X and the stage buffer live in
// page-locked host memory instead and every stage copies its chunks in and out over PCIe (each
// copy in stream order with the kernels): slower, for calibration sets the GPU cannot hold.
#pragma once
#include <functional>
#include <memory>
#include <utility>
#include <string>

#include "core/dtype.h"
#include "cuda/gptq_cuda.h"
#include "model/llama.h"

namespace ptq::cuda {

// Whether the GPU forward serves this model at this window length (else the pipeline runs the
// CPU forward and accumulates the Hessians on the GPU).
bool forward_supported(const LlamaConfig& c, int seq_len, std::string* why);

// Bytes of X and the stage buffer (what `spill` moves to the host).
size_t activation_bytes(const LlamaConfig& c, int samples, int seq_len);

class LayerForwardCuda {
 public:
  // `dtype`: F16 or BF16 (the model's; F32 models compute in BF16).
  LayerForwardCuda(const LlamaConfig& c, const Rope& rope, int samples, int seq_len, DType dtype, bool spill = false);
  ~LayerForwardCuda();
  DType dtype() const;
  bool spilled() const;                     // the activations are in page-locked host memory
  void set_input(const MatF& X);            // the embeddings [S*T, d] (host fp32)
  MatF input() const;                       // the residual stream, to the host (tests)
  void load_layer(const LayerWeights& w, const void* converted = nullptr);   // norms, biases, and the seven weights in 16 bits
  // The seven weights in dtype(), one after another in kAllProj order (what load_layer takes as
  // `converted`, from page-locked memory): the conversion can run in another thread.
  size_t weight_bytes() const;
  void convert_weights(const LayerWeights& w, void* dst) const;
  void set_weight(Proj p, const MatF& W);   // e.g. the quantized weights, dequantized
  void set_weight_device(Proj p, const float* W);   // the same from fp32 device memory [out, in]
  const void* weight(Proj p) const;         // the 16-bit device weights [out, in], in dtype()
  // Linear p computed by f instead of the 16-bit weights (a packed-weight kernel):
  // y [rows, out] fp32 (device) = x [rows, in] (dtype(), device) · Wᵀ + beta · y. Empty f: the weights again.
  using LinearFn = std::function<void(const void* x, int64_t rows, float* y, float beta)>;
  void set_linear(Proj p, LinearFn f);
  void set_norms(const VecF& input_layernorm, const VecF& post_attention_layernorm);
  void set_bias(Proj p, const VecF& b);     // empty: none
  // out [S*T, vocab] fp32 (device) = rmsnorm(X, final_norm) · lm_headᵀ (lm_head [vocab, d] in dtype()).
  void logits(const VecF& final_norm, const void* lm_head, int64_t vocab, float* out);
  // Stages; each adds its output (the next Linears' input) to `h` when given.
  void norm1(HessianCuda* h);          // xn = rmsnorm1(X)                      -> H_qkv
  void attention(HessianCuda* h);      // ctx = attn(q, k, v of rmsnorm1(X))    -> H_o
  void o_proj_norm2(HessianCuda* h);   // X += ctx Wo^T (+b); xn2 = rmsnorm2(X) -> H_mlp
  void mlp(HessianCuda* h);            // act = silu(xn2 Wg^T) * (xn2 Wu^T)     -> H_down
  void down_proj();                    // X += act Wd^T
  void layer();                        // all five, no Hessians (replaying a finished layer)
  double take_hessian_seconds();       // GPU time of the Hessian GEMMs since the last call
 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

// The CPU's output_error (lib/gptq) for GPTQ's Wq and, when given, RTN's Wr (else the second is
// the first): sum(E H E^T) / 2 with E = W - Wq (fp32, as on the CPU), H = hscale * dH (fp64,
// device, symmetric); fp64 DGEMMs on the device. W, Wq, Wr: fp32 [rows, cols] on the device.
std::pair<double, double> output_errors(const float* W, const float* Wq, const float* Wr, int64_t rows, int64_t cols, const double* dH, double hscale);
// sum(E H E^T) / 2 with the products on TF32 tensor cores (E and H rounded to 10-bit mantissas,
// fp32 accumulation, fp64 row sums): ~1e-4 relative, an order of magnitude faster than fp64; for
// the report's RTN baseline, whose errors are not fitted to H (GPTQ's are, and cancel: not for them).
double output_error_tf32(const float* W, const float* Wq, int64_t rows, int64_t cols, const double* dH, double hscale);
// The same from host matrices (uploaded).
std::pair<double, double> output_errors(const MatF& W, const MatF& Wq, const MatF* Wr, const double* dH, double hscale);

}  // namespace ptq::cuda
