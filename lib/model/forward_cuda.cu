// forward_cuda.cu — one decoder layer of the calibration forward on the GPU (forward_cuda.h).
//
// Contract. Activations: S windows of T tokens, rows [S*T, width] row-major, token (s, t) at row
// s*T + t. X (fp32) is the residual stream; Linears read 16-bit inputs and 16-bit weights
// [out, in] and accumulate in fp32 (GemmEx). Processed in chunks of whole windows of at most
// kChunkTokens tokens. Attention: flash_attention (attention_cuda.cu) for head_dim 64, 96 and 128;
// otherwise per window, scores = Q K^T for all heads (strided-batched GEMM, fp32 out; GQA by one
// batched call per query head of a KV group), causal (and sliding-window) softmax in fp32 to
// 16-bit P, ctx = P V in 16-bit. The reference is lib/model/llama.cpp
// (attention_core, mlp_act, rmsnorm, apply_rope) in fp32; tests/test_forward_cuda.cpp compares the two.
// Roofline: GEMM-bound (2 * params * tokens + 4 * T^2 * q_dim * S FLOPs per layer on tensor
// cores); the elementwise kernels move each activation once.
// Size (~660 lines): the stages of one decoder layer and the elementwise kernels only they launch
// (RMSNorm, rotary, softmax, SiLU-gate, bias), each beside the stage that uses it; attention, the
// one kernel that stands alone, is attention_cuda.cu.
#include <cublas_v2.h>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "model/attention_cuda.h"
#include "model/forward_cuda.h"
#include "model/schedule.h"
#include "cuda/blas.h"
#include "cuda/act8.cuh"
#include "cuda/half.cuh"
#include "cuda/runtime.h"
#include "kernels/rotary.cuh"

namespace ptq::cuda {

namespace {
constexpr int64_t kChunkTokens = 8192;

cublasHandle_t blas() { return blas_handle(); }
int blocks(int64_t n, int t = 256) { return int((n + t - 1) / t); }
cudaDataType ctype(DType t) { return t == DType::F16 ? CUDA_R_16F : CUDA_R_16BF; }


// Block-wide reductions (blockDim.x a multiple of 32, at most 1024).
__device__ float block_sum(float v, float* sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  v = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : 0.0f;
  if (threadIdx.x < 32)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x == 0) sh[0] = v;
  __syncthreads();
  return sh[0];
}
__device__ float block_max(float v, float* sh) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  v = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : -INFINITY;
  if (threadIdx.x < 32)
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x == 0) sh[0] = v;
  __syncthreads();
  return sh[0];
}

// V consecutive floats from p (V = 4: one 16-byte load; the caller guarantees the alignment), and
// V values rounded to 16 bits into q (V = 4: one 8-byte store).
template <int V> struct Floats { float v[V]; };
template <int V>
__device__ __forceinline__ Floats<V> load(const float* p) {
  Floats<V> r;
  if constexpr (V == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    r.v[0] = t.x; r.v[1] = t.y; r.v[2] = t.z; r.v[3] = t.w;
  } else {
    for (int i = 0; i < V; ++i) r.v[i] = p[i];
  }
  return r;
}
template <class T> __device__ uint32_t pack2(float a, float b);
template <> __device__ uint32_t pack2<__half>(float a, float b) { const __half2 h = __floats2half2_rn(a, b); return *reinterpret_cast<const uint32_t*>(&h); }
template <> __device__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <int V, class T>
__device__ __forceinline__ void store(T* q, const Floats<V>& x) {
  if constexpr (V == 4) *reinterpret_cast<uint2*>(q) = make_uint2(pack2<T>(x.v[0], x.v[1]), pack2<T>(x.v[2], x.v[3]));
  else
    for (int i = 0; i < V; ++i) q[i] = from_f<T>(x.v[i]);
}

// out[r] = (x[r] / sqrt(mean(x[r]^2) + eps)) * w, one block per row (= rmsnorm in llama.cpp);
// V = 4 when d % 4 == 0.
template <class T, int V>
__global__ void rmsnorm_kernel(const float* x, const float* w, T* out, int d, float eps) {
  __shared__ float sh[32];
  const float* xr = x + int64_t(blockIdx.x) * d;
  float s = 0;
  for (int j = threadIdx.x * V; j < d; j += blockDim.x * V) {
    const Floats<V> a = load<V>(xr + j);
    for (int i = 0; i < V; ++i) s += a.v[i] * a.v[i];
  }
  s = block_sum(s, sh);
  const float inv = 1.0f / sqrtf(s / float(d) + eps);
  for (int j = threadIdx.x * V; j < d; j += blockDim.x * V) {
    Floats<V> a = load<V>(xr + j);
    const Floats<V> g = load<V>(w + j);
    for (int i = 0; i < V; ++i) a.v[i] = a.v[i] * inv * g.v[i];
    store<V>(out + int64_t(blockIdx.x) * d + j, a);
  }
}

__global__ void add_bias_kernel(float* y, const float* b, int64_t rows, int cols) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < rows * cols) y[i] += b[i % cols];
}

// Rotary (HF rotate_half: pairs (k, k + half) for k < half, half = rotary_dim / 2; the dims from
// rotary_dim to hd pass through: Phi-3's partial rotary) on fp32 projections, written as 16 bits;
// one block per row of the chunk, whose rows start at global row row0 (position = row % T), V
// pairs per thread step (V = 4 when hd and rotary_dim are multiples of 8). rotate = false: a plain
// cast (half = hd / 2).
template <class T, int V>
__global__ void rope_cast_kernel(const float* y, T* out, const float* cs, const float* sn, int heads, int hd, int half, int Tlen, int64_t row0,
                                 bool rotate) {
  const int steps = half / V, rest = (hd - 2 * half) / V;
  const int64_t r = blockIdx.x;
  const float* yr = y + r * heads * hd;
  T* qr = out + r * heads * hd;
  const int pos = int((row0 + r) % Tlen);
  for (int j = threadIdx.x; j < heads * steps; j += blockDim.x) {
    const int h = j / steps, k = (j - h * steps) * V;
    Floats<V> a = load<V>(yr + h * hd + k), b = load<V>(yr + h * hd + k + half);
    if (rotate) {
      const Floats<V> c = load<V>(cs + pos * half + k), s = load<V>(sn + pos * half + k);
      for (int i = 0; i < V; ++i) {
        const float a0 = a.v[i], b0 = b.v[i];
        a.v[i] = rotary_lo(a0, b0, c.v[i], s.v[i]);
        b.v[i] = rotary_hi(a0, b0, c.v[i], s.v[i]);
      }
    }
    store<V>(qr + h * hd + k, a);
    store<V>(qr + h * hd + k + half, b);
  }
  for (int j = threadIdx.x; j < heads * rest; j += blockDim.x) {   // the pass-through dims
    const int h = j / rest, k = 2 * half + (j - h * rest) * V;
    store<V>(qr + h * hd + k, load<V>(yr + h * hd + k));
  }
}

// Qwen3's q/k norms: each head's hd values of y [rows, heads * hd] (fp32, in place) RMS-normalized
// and scaled by w [hd], as model/llama.h head_rmsnorm; one block per row, one warp per head.
__global__ void head_rmsnorm_kernel(float* y, const float* w, int heads, int hd, float eps) {
  float* yr = y + int64_t(blockIdx.x) * heads * hd;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int h = warp; h < heads; h += warps) {
    float* v = yr + h * hd;
    float ss = 0;
    for (int i = lane; i < hd; i += 32) ss += v[i] * v[i];
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.0f / sqrtf(ss / float(hd) + eps);
    for (int i = lane; i < hd; i += 32) v[i] = v[i] * inv * w[i];
  }
}

// P = softmax(scale * S) over j <= i (and i - j < window), zero elsewhere; one block per (head, i).
template <class T>
__global__ void causal_softmax_kernel(const float* S, T* P, int Tlen, float scale, int window) {
  __shared__ float sh[32];
  const int64_t row = blockIdx.x;
  const int i = int(row % Tlen), j0 = window > 0 ? max(0, i - window + 1) : 0;
  const float* s = S + row * Tlen;
  T* p = P + row * Tlen;
  float m = -INFINITY;
  for (int j = j0 + threadIdx.x; j <= i; j += blockDim.x) m = fmaxf(m, s[j] * scale);
  m = block_max(m, sh);
  float sum = 0;
  for (int j = j0 + threadIdx.x; j <= i; j += blockDim.x) sum += expf(s[j] * scale - m);
  sum = block_sum(sum, sh);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < Tlen; j += blockDim.x) p[j] = from_f<T>(j >= j0 && j <= i ? expf(s[j] * scale - m) * inv : 0.0f);
}

// out = silu(g) * u, V elements per thread (V = 4 when n % 4 == 0).
template <class T, int V>
__global__ void silu_mul_kernel(const float* g, const float* u, T* out, int64_t n) {
  const int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * V;
  if (i >= n) return;
  Floats<V> a = load<V>(g + i);
  const Floats<V> b = load<V>(u + i);
  for (int k = 0; k < V; ++k) a.v[k] = a.v[k] / (1.0f + expf(-a.v[k])) * b.v[k];
  store<V>(out + i, a);
}

// MoE routing, one row per thread (= model/llama.cpp route): softmax over the E router logits
// (fp32, max subtracted), the K largest in the order (logit descending, expert ascending), their
// probabilities renormalized to sum 1 when `renorm`.
__global__ void topk_route_kernel(const float* logits, int64_t rows, int E, int K, bool renorm, int32_t* ids, float* wts) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  const float* l = logits + r * E;
  float m = -INFINITY, sum = 0, chosen = 0;
  for (int e = 0; e < E; ++e) m = fmaxf(m, l[e]);
  for (int e = 0; e < E; ++e) sum += expf(l[e] - m);
  int prev = -1;
  float prev_v = INFINITY;
  for (int k = 0; k < K; ++k) {   // the next in that order after (prev_v, prev)
    int best = -1;
    float bv = -INFINITY;
    for (int e = 0; e < E; ++e) {
      const float v = l[e];
      if ((v < prev_v || (v == prev_v && e > prev)) && (best < 0 || v > bv)) { best = e; bv = v; }
    }
    const float p = expf(bv - m) / sum;
    ids[r * K + k] = best;
    wts[r * K + k] = p;
    chosen += p;
    prev = best;
    prev_v = bv;
  }
  if (renorm)
    for (int k = 0; k < K; ++k) wts[r * K + k] /= chosen;
}

// out[i] = x[rows[i]] (16-bit rows of d), one block per output row.
__global__ void gather_rows_kernel(const uint16_t* x, const int32_t* rows, int d, uint16_t* out) {
  const uint16_t* src = x + int64_t(rows[blockIdx.x]) * d;
  uint16_t* dst = out + int64_t(blockIdx.x) * d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) dst[j] = src[j];
}

// X[rows[i]] += w[i] * y[i] (fp32 rows of d; the rows of one expert are distinct), one block per row.
__global__ void scatter_add_kernel(const float* y, const int32_t* rows, const float* w, int d, float* X) {
  float* xr = X + int64_t(rows[blockIdx.x]) * d;
  const float* yr = y + int64_t(blockIdx.x) * d;
  const float wi = w[blockIdx.x];
  for (int j = threadIdx.x; j < d; j += blockDim.x) xr[j] += wi * yr[j];
}

// out[r, j] = y[r, off + j], j < w: one part of a fused Linear's output y [rows, width].
__global__ void split_cols_kernel(const float* y, int64_t rows, int width, int off, int w, float* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * w) return;
  const int64_t r = i / w;
  out[i] = y[r * width + off + int(i - r * w)];
}

// fp32 weights to the forward's 16-bit dtype (1: f16, 2: bf16), round to nearest even.
__global__ void narrow_kernel(const float* x, int64_t n, int dt, void* y) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  if (dt == 1) static_cast<__half*>(y)[i] = __float2half_rn(x[i]);
  else static_cast<__nv_bfloat16*>(y)[i] = __float2bfloat16_rn(x[i]);
}
// W8A8 inputs (set_act_quant; the reference is quantize_rows in model/llama.cpp): row blockIdx.x
// of x as int8 codes held in T (every integer of [-128, 127] is exact in f16 and bf16) and its
// scale, by the deployed quantizer's arithmetic (cuda/act8.cuh): max |x| / 127 per token, or
// `static_scale` for the tensor; a zero scale taken as 1.
template <class T>
__global__ void act_codes_kernel(const T* x, int64_t cols, bool per_token, float static_scale, T* q, float* sx) {
  const T* row = x + blockIdx.x * cols;
  float m = 0.0f;
  if (per_token)
    for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) m = fmaxf(m, fabsf(to_f(row[k])));
  const float s = act8::row_scale(m, per_token, static_scale, sx);
  for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) q[blockIdx.x * cols + k] = from_f<T>(float(act8::code_of(to_f(row[k]), s)));
}
// y[r, n] = s_x[r] · p[r, n] + beta · y[r, n] (beta 0: y is not read).
__global__ void scale_rows_kernel(const float* p, const float* sx, int64_t rows, int64_t cols, float beta, float* y) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  const float v = sx[i / cols] * p[i];
  y[i] = beta == 0.0f ? v : v + beta * y[i];
}
// StageStats: amax[c] = max |x[r, c]| over a chunk's rows (the non-negative floats' bit patterns
// order as integers: atomicMax on them is the exact maximum in any order), blocks of 256 columns
// by 64 rows.
template <class T>
__global__ void column_absmax_kernel(const T* x, int64_t rows, int64_t cols, int* amax) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const int64_t r0 = blockIdx.y * int64_t(64), r1 = min(rows, r0 + 64);
  float m = 0.0f;
  for (int64_t r = r0; r < r1; ++r) m = fmaxf(m, fabsf(to_f(x[r * cols + c])));
  atomicMax(amax + c, __float_as_int(m));
}
// out[k, :] = fp32(x[first + k * step, :]), a block per sampled row.
template <class T>
__global__ void sample_rows_kernel(const T* x, int64_t cols, int64_t first, int64_t step, float* out) {
  const T* row = x + (first + blockIdx.x * step) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[blockIdx.x * cols + c] = to_f(row[c]);
}
// Row-major Y[rows, out] = alpha * X[rows, in] W[out, in]^T + beta * Y (fp32 accumulation).
void linear_gemm(const void* X, const void* W, void* Y, cudaDataType ytype, int64_t rows, int64_t in, int64_t out, DType dt, float beta) {
  const float alpha = 1.0f;
  PTQ_CUBLAS(cublasGemmEx(blas(), CUBLAS_OP_T, CUBLAS_OP_N, int(out), int(rows), int(in), &alpha, W, ctype(dt), int(in), X, ctype(dt), int(in),
                          &beta, Y, ytype, int(out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
}  // namespace

void gather_rows16(const void* x, const int32_t* rows, int64_t n, int d, void* out) {
  if (n == 0) return;
  gather_rows_kernel<<<unsigned(n), 256, 0, static_cast<cudaStream_t>(current_stream())>>>(static_cast<const uint16_t*>(x), rows, d,
                                                                                           static_cast<uint16_t*>(out));
  PTQ_CUDA_LAUNCH("gather_rows_kernel");
}

void scatter_add_rows(const float* y, const int32_t* rows, const float* w, int64_t n, int d, float* X) {
  if (n == 0) return;
  scatter_add_kernel<<<unsigned(n), 256, 0, static_cast<cudaStream_t>(current_stream())>>>(y, rows, w, d, X);
  PTQ_CUDA_LAUNCH("scatter_add_kernel");
}

bool forward_supported(const LlamaConfig& c, int seq_len, std::string* why) {
  auto no = [&](const std::string& w) { if (why) *why = w; return false; };
  if (c.head_dim % 2) return no("odd head_dim");
  for (int l = 0; c.moe != MoeRouting::none && l < c.num_hidden_layers; ++l)
    if (!c.moe_layer(l)) return no("MoE models with dense layers (mlp_only_layers, decoder_sparse_step) are not in the GPU forward yet");
  if (c.num_attention_heads % c.num_key_value_heads) return no("heads not a multiple of KV heads");
  if (!flash_attention_supported(c.head_dim) && int64_t(seq_len) * seq_len * c.num_attention_heads * 6 > (int64_t(8) << 30))
    return no("attention scores of one window exceed 8 GiB (head_dim " + std::to_string(c.head_dim) + " has no flash attention)");
  return true;
}

struct LayerForwardCuda::Impl {
  LlamaConfig c;
  int S, T;
  int64_t N, chunk_rows, F;   // F: the stage buffer's row width, max(q_dim, ffn)
  DType dt;
  size_t es = 2;
  bool flash = false;   // attention by flash_attention (head_dim 64, 96 or 128), else cuBLAS + softmax
  // Spill: X and the stage buffer live in page-locked host memory (hX, hStage) and each chunk is
  // copied into X / stage (then one chunk each) and back, in stream order.
  bool spill = false;
  PinnedBuffer hX, hStage;
  // Resident, when F >= q_dim + d: the stage buffer's last N * d elements hold rmsnorm1(X) (kept
  // = 1, from norm1 for attention) or rmsnorm2(X) (kept = 2, from o_proj_norm2 for mlp), so each
  // norm is computed once. The context [N, q_dim] and the MLP activation, written chunk by chunk
  // from the front, never reach the rows of the tail that are still to be read.
  bool keep_norm = false;
  int kept = 0;
  float eps;
  DeviceBuffer<float> X, cs, sn, norm1, norm2, q_norm, k_norm, y32, scores;
  DeviceBuffer<float> bias[kProjCount];
  LayerForwardCuda::LinearFn override_[kProjCount];   // fused ones (qkv, gate_up): a kernel over the whole Linear (evaluation)
  DeviceBuffer<float> fused_y;                          // (chunk) a fused override's output before the split
  DeviceBuffer<uint8_t> W[7], stage, xn, q16, k16, v16, P;
  int64_t outs[7], ins[7];
  // W8A8 inputs (set_act_quant): each Linear's mode (experts': [e * 3 + slot]); the chunk's codes,
  // row scales and the GEMM's fp32 output before the scales (Scratch holds them while any Linear
  // quantizes its input).
  ActQuant act[7];
  std::vector<ActQuant> expert_act;
  bool model_w[7] = {};   // holds_model_weights
  DeviceBuffer<uint8_t> act_q;
  DeviceBuffer<float> act_s, act_y;
  bool any_act() const {
    for (const ActQuant& a : act)
      if (a.mode != ActQuant::none) return true;
    for (const ActQuant& a : expert_act)
      if (a.mode != ActQuant::none) return true;
    return false;
  }
  // MoE (every layer sparse; activations resident): the router [E, d] and every expert's gate
  // [Fe, d], up [Fe, d], down [d, Fe] one after another, in 16 bits; xn2 = rmsnorm2(X) for all
  // rows, which every expert reads; the routing, by expert (rows ascending, as the CPU's).
  bool moe = false, all_experts = true;
  int E = 0, K = 0;
  int64_t Fe = 0;
  DeviceBuffer<uint8_t> router, experts, moe_xn, moe_act;
  DeviceBuffer<int32_t> route_rows;
  DeviceBuffer<float> route_w;
  std::vector<int64_t> route_off;   // expert e's rows: [route_off[e], route_off[e + 1])
  std::vector<int> pending;         // the experts whose outputs are not yet in X, in expert order
  void* expert_w(int e, int slot) const { return at(experts, (int64_t(e) * 3 + slot) * Fe * c.hidden_size); }
  void* expert_w(LinearId id) const {
    if (!moe || id.expert >= E) fail(Errc::usage, "", proj_name(id.proj), "no such expert");
    return expert_w(id.expert, expert_slot(id.proj));
  }
  std::vector<LayerForwardCuda::LinearFn> expert_override;   // [e * 3 + slot]: a packed-weight kernel instead (evaluation)
  // y [rows, out] fp32 = x · W^T of expert e's gate (0), up (1) or down (2)
  void expert_linear(int e, int slot, const void* x, int64_t rows, float* y) {
    if (!expert_override.empty() && expert_override[size_t(e * 3 + slot)]) return expert_override[size_t(e * 3 + slot)](x, rows, y, 0.0f);
    const int64_t d = c.hidden_size, in = slot == 2 ? Fe : d, out = slot == 2 ? d : Fe;
    if (!expert_act.empty() && expert_act[size_t(e * 3 + slot)].mode != ActQuant::none)
      return int8_input_linear(expert_act[size_t(e * 3 + slot)], x, expert_w(e, slot), in, out, y, rows, 0.0f);
    linear_gemm(x, expert_w(e, slot), y, CUDA_R_32F, rows, in, out, dt, 0.0f);
  }
  std::vector<cudaEvent_t> events;   // pairs around each Hessian accumulation, read when asked
  size_t events_used = 0;
  double sink_seconds = 0;
  // sink += rows of x, timed with events (a Hessian's GEMMs are reported apart from the forward); the
  // host does not wait here, so the next chunk's kernels queue behind the GEMMs.
  void sink_add(DeviceRowSink* h, const void* x, int64_t rows) {
    if (!h || rows == 0) return;
    if (events_used >= 512) collect_sink_times();   // callers that never ask
    while (events.size() < events_used + 2) {
      cudaEvent_t e;
      PTQ_CUDA(cudaEventCreate(&e));
      events.push_back(e);
    }
    PTQ_CUDA(cudaEventRecord(events[events_used]));
    h->add_device(x, rows);
    PTQ_CUDA(cudaEventRecord(events[events_used + 1]));
    events_used += 2;
  }
  void collect_sink_times() {
    for (size_t i = 0; i < events_used; i += 2) {
      PTQ_CUDA(cudaEventSynchronize(events[i + 1]));
      float ms = 0;
      PTQ_CUDA(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
      sink_seconds += ms / 1000.0;
    }
    events_used = 0;
  }
  ~Impl() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
  void* at(const DeviceBuffer<uint8_t>& b, int64_t elems) const { return b.get() + size_t(elems) * es; }
  // Rows [r0, r0 + rows) of X on the device (spill: copied in when `read`); x_back writes them
  // back to the host when spilled.
  float* x_rows(int64_t r0, int64_t rows, bool read) {
    const int64_t d = c.hidden_size;
    if (!spill) return X.get() + r0 * d;
    if (read)
      PTQ_CUDA(cudaMemcpyAsync(X.get(), static_cast<float*>(hX.get()) + r0 * d, size_t(rows * d) * 4, cudaMemcpyHostToDevice));
    return X.get();
  }
  void x_back(int64_t r0, int64_t rows) {
    const int64_t d = c.hidden_size;
    if (spill) PTQ_CUDA(cudaMemcpyAsync(static_cast<float*>(hX.get()) + r0 * d, X.get(), size_t(rows * d) * 4, cudaMemcpyDeviceToHost));
  }
  // The same for the stage buffer's rows of `width` elements (context: q_dim, activation: ffn).
  void* stage_rows(int64_t r0, int64_t rows, int64_t width, bool read) {
    if (!spill) return at(stage, r0 * width);
    if (read)
      PTQ_CUDA(cudaMemcpyAsync(stage.get(), static_cast<uint8_t*>(hStage.get()) + size_t(r0 * width) * es, size_t(rows * width) * es,
                               cudaMemcpyHostToDevice));
    return stage.get();
  }
  void stage_back(int64_t r0, int64_t rows, int64_t width) {
    if (spill)
      PTQ_CUDA(cudaMemcpyAsync(static_cast<uint8_t*>(hStage.get()) + size_t(r0 * width) * es, stage.get(), size_t(rows * width) * es,
                               cudaMemcpyDeviceToHost));
  }
  void* kept_rows(int64_t r0) const { return at(stage, N * (F - c.hidden_size) + r0 * c.hidden_size); }
  // y [rows, out_p] fp32 = x [rows, in_p] W_p^T + beta y: the 16-bit weights, or the Linear's override.
  void linear(int p, const void* x, float* y, int64_t rows, float beta) {
    if (override_[p]) return override_[p](x, rows, y, beta);
    if (act[p].mode != ActQuant::none) return int8_input_linear(act[p], x, at(W[p], 0), ins[p], outs[p], y, rows, beta);
    linear_gemm(x, at(W[p], 0), y, CUDA_R_32F, rows, ins[p], outs[p], dt, beta);
  }
  // The same with the input quantized to int8 first (set_act_quant): y = s_x · (q_x · W^T) + beta y
  // for W [out, in] (16-bit, device).
  void int8_input_linear(const ActQuant& a, const void* x, const void* W_, int64_t in, int64_t out, float* y, int64_t rows, float beta) {
    if (rows == 0) return;
    const bool per_token = a.mode == ActQuant::per_token;
    if (dt == DType::F16)
      act_codes_kernel<__half><<<unsigned(rows), 256>>>(static_cast<const __half*>(x), in, per_token, a.static_scale, static_cast<__half*>(at(act_q, 0)),
                                                        act_s.get());
    else
      act_codes_kernel<__nv_bfloat16><<<unsigned(rows), 256>>>(static_cast<const __nv_bfloat16*>(x), in, per_token, a.static_scale,
                                                               static_cast<__nv_bfloat16*>(at(act_q, 0)), act_s.get());
    PTQ_CUDA_LAUNCH("act_codes_kernel");
    linear_gemm(at(act_q, 0), W_, act_y.get(), CUDA_R_32F, rows, in, out, dt, 0.0f);
    scale_rows_kernel<<<blocks(rows * out), 256>>>(act_y.get(), act_s.get(), rows, out, beta, y);
    PTQ_CUDA_LAUNCH("scale_rows_kernel");
  }
  // The chunk buffers live only while a stage runs (from the pool, so no cudaMalloc after the
  // first layer): between stages the GPTQ solve has that memory.
  struct Scratch {
    Impl& m;
    explicit Scratch(Impl& im) : m(im) {
      const int64_t d = m.c.hidden_size, f = m.c.intermediate_size, qd = m.c.q_dim(), kv = m.c.kv_dim(), T = m.T;
      m.xn = DeviceBuffer<uint8_t>(size_t(m.chunk_rows * d) * m.es, "normalized activations (chunk)");
      m.y32 = DeviceBuffer<float>(size_t(m.chunk_rows * std::max({qd + 2 * kv, m.moe ? 2 * m.Fe : 2 * f, int64_t(m.E), d})), "projections (chunk, fp32)");
      if (m.moe) m.moe_act = DeviceBuffer<uint8_t>(size_t(m.chunk_rows * m.Fe) * m.es, "expert activation (chunk)");
      if (m.override_[int(Proj::qkv)] || m.override_[int(Proj::gate_up)])
        m.fused_y = DeviceBuffer<float>(size_t(m.chunk_rows * std::max(qd + 2 * kv, 2 * f)), "fused Linear output (chunk, fp32)");
      m.q16 = DeviceBuffer<uint8_t>(size_t(m.chunk_rows * qd) * m.es, "queries (chunk)");
      m.k16 = DeviceBuffer<uint8_t>(size_t(m.chunk_rows * kv) * m.es, "keys (chunk)");
      m.v16 = DeviceBuffer<uint8_t>(size_t(m.chunk_rows * kv) * m.es, "values (chunk)");
      if (!m.flash) {
        m.scores = DeviceBuffer<float>(size_t(m.c.num_attention_heads) * T * T, "attention scores (one window)");
        m.P = DeviceBuffer<uint8_t>(size_t(m.c.num_attention_heads) * T * T * m.es, "attention probabilities (one window)");
      }
      if (m.any_act()) {
        const int64_t wmax = std::max({d, qd, kv, f, m.Fe});
        m.act_q = DeviceBuffer<uint8_t>(size_t(m.chunk_rows * wmax) * m.es, "int8 input codes (chunk)");
        m.act_s = DeviceBuffer<float>(size_t(m.chunk_rows), "int8 input scales (chunk)");
        m.act_y = DeviceBuffer<float>(size_t(m.chunk_rows * wmax), "int8-input Linear output (chunk, fp32)");
      }
    }
    ~Scratch() {
      m.xn = {}; m.y32 = {}; m.q16 = {}; m.k16 = {}; m.v16 = {}; m.scores = {}; m.P = {}; m.moe_act = {}; m.fused_y = {};
      m.act_q = {}; m.act_s = {}; m.act_y = {};
    }
  };
  template <class F_>
  void by_chunks(F_&& f) {   // f(row0, rows): whole windows, at most chunk_rows tokens
    for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) f(r0, std::min(chunk_rows, N - r0));
  }
  // rmsnorm(x rows, w) in 16 bits into out
  void rmsnorm(const DeviceBuffer<float>& w, const float* x, void* out, int64_t rows) {
    const int d = c.hidden_size;
    const bool v4 = d % 4 == 0;
    if (dt == DType::F16) {
      if (v4) rmsnorm_kernel<__half, 4><<<unsigned(rows), 256>>>(x, w.get(), static_cast<__half*>(out), d, eps);
      else rmsnorm_kernel<__half, 1><<<unsigned(rows), 256>>>(x, w.get(), static_cast<__half*>(out), d, eps);
    } else {
      if (v4) rmsnorm_kernel<__nv_bfloat16, 4><<<unsigned(rows), 256>>>(x, w.get(), static_cast<__nv_bfloat16*>(out), d, eps);
      else rmsnorm_kernel<__nv_bfloat16, 1><<<unsigned(rows), 256>>>(x, w.get(), static_cast<__nv_bfloat16*>(out), d, eps);
    }
    PTQ_CUDA_LAUNCH("rmsnorm_kernel");
  }
  // rmsnorm `which` (1 or 2) of the chunk's rows x: where a stage keeps it for the next (keep), or
  // already kept by the previous stage, or computed into the chunk buffer xn.
  const void* normed(int which, const float* x, int64_t r0, int64_t rows, bool keep) {
    if (kept == which) return kept_rows(r0);
    void* out = keep && keep_norm ? kept_rows(r0) : at(xn, 0);
    rmsnorm(which == 1 ? norm1 : norm2, x, out, rows);
    return out;
  }
  // rmsnorm `which` (1 or 2) of every row of X, handed to h and kept for the next stage where it
  // can be (norm1; norm2 again after SmoothQuant's fold: X is not changed).
  void norm_all(int which, DeviceRowSink* h) {
    Scratch scratch(*this);
    kept = 0;
    by_chunks([&](int64_t r0, int64_t rows) {
      const void* out = normed(which, x_rows(r0, rows, true), r0, rows, true);
      sink_add(h, out, rows);
    });
    if (keep_norm) kept = which;
  }
  // A fused Linear's override, if set: y = x · W^T over all its rows, then split by columns into
  // `parts` (each [rows, width]) as the separate Linears would have written them.
  bool split_linear(Proj whole, const void* x, int64_t rows, const std::vector<std::pair<float*, int64_t>>& parts) {
    if (!override_[int(whole)]) return false;
    int64_t width = 0, off = 0;
    for (auto& p : parts) width += p.second;
    override_[int(whole)](x, rows, fused_y.get(), 0.0f);
    for (auto& [out, w] : parts) {
      split_cols_kernel<<<blocks(rows * w), 256>>>(fused_y.get(), rows, int(width), int(off), int(w), out);
      PTQ_CUDA_LAUNCH("split_cols_kernel");
      off += w;
    }
    return true;
  }
  void bias_add(int p, float* y, int64_t rows) {
    if (!bias[p].get()) return;
    add_bias_kernel<<<blocks(rows * outs[p]), 256>>>(y, bias[p].get(), rows, int(outs[p]));
    PTQ_CUDA_LAUNCH("add_bias_kernel");
  }
  void rope_cast(const float* y, DeviceBuffer<uint8_t>& out, int64_t rows, int heads, int64_t r0, bool rotate) {
    const bool v4 = c.head_dim % 8 == 0 && c.rotary_dim() % 8 == 0;
    const int hd = c.head_dim, half = rotate ? c.rotary_dim() / 2 : hd / 2;
    if (dt == DType::F16) {
      __half* o = static_cast<__half*>(at(out, 0));
      if (v4) rope_cast_kernel<__half, 4><<<unsigned(rows), 256>>>(y, o, cs.get(), sn.get(), heads, hd, half, T, r0, rotate);
      else rope_cast_kernel<__half, 1><<<unsigned(rows), 256>>>(y, o, cs.get(), sn.get(), heads, hd, half, T, r0, rotate);
    } else {
      __nv_bfloat16* o = static_cast<__nv_bfloat16*>(at(out, 0));
      if (v4) rope_cast_kernel<__nv_bfloat16, 4><<<unsigned(rows), 256>>>(y, o, cs.get(), sn.get(), heads, hd, half, T, r0, rotate);
      else rope_cast_kernel<__nv_bfloat16, 1><<<unsigned(rows), 256>>>(y, o, cs.get(), sn.get(), heads, hd, half, T, r0, rotate);
    }
    PTQ_CUDA_LAUNCH("rope_cast_kernel");
  }
  void head_norm(float* y, const DeviceBuffer<float>& w, int64_t rows, int heads) {
    head_rmsnorm_kernel<<<unsigned(rows), 128>>>(y, w.get(), heads, c.head_dim, eps);
    PTQ_CUDA_LAUNCH("head_rmsnorm_kernel");
  }
  void silu_mul(const float* g, const float* u, void* out, int64_t n, int64_t width) {   // width: the row length (4-aligned rows: vector path)
    const bool v4 = width % 4 == 0;
    if (dt == DType::F16) {
      if (v4) silu_mul_kernel<__half, 4><<<blocks(n / 4), 256>>>(g, u, static_cast<__half*>(out), n);
      else silu_mul_kernel<__half, 1><<<blocks(n), 256>>>(g, u, static_cast<__half*>(out), n);
    } else {
      if (v4) silu_mul_kernel<__nv_bfloat16, 4><<<blocks(n / 4), 256>>>(g, u, static_cast<__nv_bfloat16*>(out), n);
      else silu_mul_kernel<__nv_bfloat16, 1><<<blocks(n), 256>>>(g, u, static_cast<__nv_bfloat16*>(out), n);
    }
    PTQ_CUDA_LAUNCH("silu_mul_kernel");
  }

  // ---- MoE layers (the reference: model/llama.cpp moe_mlp, pipeline/backend_cpu.cpp CpuForward)
  // X += ctx Wo^T (+b); moe_xn = rmsnorm2(X), all rows.
  void moe_norm2() {
    const int64_t qd = c.q_dim(), d = c.hidden_size;
    kept = 0;
    by_chunks([&](int64_t r0, int64_t rows) {
      const void* ctx = stage_rows(r0, rows, qd, true);
      float* x = x_rows(r0, rows, true);
      linear(3, ctx, x, rows, 1.0f);
      bias_add(3, x, rows);
      rmsnorm(norm2, x, at(moe_xn, r0 * d), rows);
    });
  }
  // The router's choice for every row, bucketed by expert on the host (rows ascending) and uploaded.
  void route_all() {
    const int64_t d = c.hidden_size;
    DeviceBuffer<int32_t> ids(size_t(N * K), "MoE routing (experts)");
    DeviceBuffer<float> wts(size_t(N * K), "MoE routing (weights)");
    const bool renorm = c.renormalize_topk();
    by_chunks([&](int64_t r0, int64_t rows) {
      linear_gemm(at(moe_xn, r0 * d), router.get(), y32.get(), CUDA_R_32F, rows, d, E, dt, 0.0f);
      topk_route_kernel<<<blocks(rows, 128), 128>>>(y32.get(), rows, E, K, renorm, ids.get() + r0 * K, wts.get() + r0 * K);
      PTQ_CUDA_LAUNCH("topk_route_kernel");
    });
    std::vector<int32_t> hid(size_t(N * K));
    std::vector<float> hw(size_t(N * K));
    copy_to_host(hid.data(), ids.get(), hid.size() * 4);
    copy_to_host(hw.data(), wts.get(), hw.size() * 4);
    route_off.assign(size_t(E) + 1, 0);
    for (int32_t e : hid) ++route_off[size_t(e) + 1];
    for (int e = 0; e < E; ++e) route_off[size_t(e) + 1] += route_off[size_t(e)];
    std::vector<int64_t> fill(route_off.begin(), route_off.end() - 1);
    std::vector<int32_t> rows_by(hid.size());
    std::vector<float> w_by(hid.size());
    for (int64_t r = 0; r < N; ++r)
      for (int k = 0; k < K; ++k) {
        const size_t at_ = size_t(fill[size_t(hid[size_t(r * K + k)])]++);
        rows_by[at_] = int32_t(r);
        w_by[at_] = hw[size_t(r * K + k)];
      }
    route_rows = DeviceBuffer<int32_t>(rows_by.size(), "MoE routing (rows by expert)");
    route_w = DeviceBuffer<float>(w_by.size(), "MoE routing (weights by expert)");
    copy_to_device(route_rows.get(), rows_by.data(), rows_by.size() * 4);
    copy_to_device(route_w.get(), w_by.data(), w_by.size() * 4);
  }
  // f(x, rows, i0) over expert e's input rows in chunks: all rows of moe_xn, or (routed) the rows
  // routed to e gathered into xn, i0 the chunk's first index among them.
  template <class F_>
  void expert_rows(int e, bool all, F_&& f) {
    const int64_t d = c.hidden_size;
    if (all) return by_chunks([&](int64_t r0, int64_t rows) { f(at(moe_xn, r0 * d), rows, r0); });
    const int64_t first = route_off[size_t(e)], n = route_off[size_t(e) + 1] - first;
    for (int64_t i0 = 0; i0 < n; i0 += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, n - i0);
      gather_rows16(moe_xn.get(), route_rows.get() + first + i0, rows, int(d), at(xn, 0));
      f(at(xn, 0), rows, i0);
    }
  }
  // act [rows, Fe] (16-bit) = silu(x Wg_e^T) * (x Wu_e^T)
  void expert_swiglu(int e, const void* x, int64_t rows, void* act) {
    float* g = y32.get();
    float* u = g + rows * Fe;
    expert_linear(e, 0, x, rows, g);
    expert_linear(e, 1, x, rows, u);
    silu_mul(g, u, act, rows * Fe, Fe);
  }
  // The pending experts' outputs for the rows routed to them, through their current (quantized)
  // weights, weighted into X in expert order.
  void finish_expert() {
    for (int e : pending) finish_expert(e);
    pending.clear();
  }
  void finish_expert(int e) {
    const int64_t first = route_off[size_t(e)], d = c.hidden_size;
    expert_rows(e, false, [&](const void* x, int64_t rows, int64_t i0) {
      expert_swiglu(e, x, rows, at(moe_act, 0));
      expert_linear(e, 2, at(moe_act, 0), rows, y32.get());
      scatter_add_rows(y32.get(), route_rows.get() + first + i0, route_w.get() + first + i0, rows, int(d), X.get());
    });
  }
};

size_t activation_bytes(const LlamaConfig& c, int samples, int seq_len) {
  const int64_t N = int64_t(samples) * seq_len;
  const size_t moe_xn = c.moe != MoeRouting::none ? size_t(N * c.hidden_size) * 2 : 0;   // rmsnorm2(X) for every expert
  return size_t(N * c.hidden_size) * 4 + size_t(N * std::max<int64_t>(c.q_dim(), c.intermediate_size)) * 2 + moe_xn;
}

LayerForwardCuda::LayerForwardCuda(const LlamaConfig& c, const Rope& rope, int samples, int seq_len, DType dtype, bool spill) : p_(new Impl) {
  Impl& m = *p_;
  std::string why;
  if (!forward_supported(c, seq_len, &why)) fail(Errc::usage, "", "device", "the GPU forward does not serve this model: " + why);
  m.c = c;
  m.S = samples;
  m.T = seq_len;
  m.N = int64_t(samples) * seq_len;
  m.dt = dtype == DType::F16 ? DType::F16 : DType::BF16;
  m.eps = float(c.rms_norm_eps);
  m.chunk_rows = std::max<int64_t>(1, kChunkTokens / seq_len) * seq_len;
  m.flash = flash_attention_supported(c.head_dim);
  const int64_t d = c.hidden_size, f = c.intermediate_size, qd = c.q_dim(), kv = c.kv_dim(), half = rope.cos.cols();
  for (Proj p : kAllProj) { m.outs[int(p)] = linear_shape(c, p).out; m.ins[int(p)] = linear_shape(c, p).in; }
  m.moe = c.moe != MoeRouting::none;
  m.F = std::max(qd, m.moe ? int64_t(0) : f);   // (MoE layers keep their activations in moe_xn and chunk buffers)
  m.spill = spill;
  if (m.moe && spill) fail(Errc::usage, "", "gpu_activations", "MoE layers need the calibration activations on the device (gpu_activations: device or auto)");
  m.keep_norm = !spill && m.F >= qd + d && (m.N * (m.F - d)) % 4 == 0;   // (the tail aligned for 8-byte stores)
  if (spill) {   // page-locked host memory for all rows, device memory for one chunk
    m.hX = PinnedBuffer(size_t(m.N * d) * 4);
    m.hStage = PinnedBuffer(size_t(m.N * m.F) * m.es);
    m.X = DeviceBuffer<float>(size_t(std::min(m.N, m.chunk_rows) * d), "calibration activations (one chunk of the residual stream)");
    m.stage = DeviceBuffer<uint8_t>(size_t(std::min(m.N, m.chunk_rows) * m.F) * m.es, "calibration activations (one chunk of the context / MLP activation)");
  } else {
    m.X = DeviceBuffer<float>(size_t(m.N * d), "calibration activations (fp32 residual stream; use fewer samples or a shorter seq_len, or gpu_activations: host)");
    m.stage = DeviceBuffer<uint8_t>(size_t(m.N * m.F) * m.es, "calibration activations (attention context / MLP activation; or gpu_activations: host)");
  }
  m.cs = DeviceBuffer<float>(size_t(seq_len * half), "rotary cos");
  m.sn = DeviceBuffer<float>(size_t(seq_len * half), "rotary sin");
  PTQ_CUDA(cudaMemcpy(m.cs.get(), rope.cos.data(), size_t(seq_len * half) * 4, cudaMemcpyHostToDevice));
  PTQ_CUDA(cudaMemcpy(m.sn.get(), rope.sin.data(), size_t(seq_len * half) * 4, cudaMemcpyHostToDevice));
  m.norm1 = DeviceBuffer<float>(size_t(d), "input_layernorm");
  m.norm2 = DeviceBuffer<float>(size_t(d), "post_attention_layernorm");
  if (c.qk_norm) {
    m.q_norm = DeviceBuffer<float>(size_t(c.head_dim), "q_norm");
    m.k_norm = DeviceBuffer<float>(size_t(c.head_dim), "k_norm");
  }
  for (int i = 0; i < (m.moe ? 4 : 7); ++i) m.W[i] = DeviceBuffer<uint8_t>(size_t(m.outs[i] * m.ins[i]) * m.es, "layer weights (16-bit)");
  if (m.moe) {
    m.E = c.num_experts;
    m.K = c.experts_per_token;
    m.Fe = c.moe_intermediate_size;
    m.router = DeviceBuffer<uint8_t>(size_t(m.E * d) * m.es, "MoE router (16-bit)");
    m.experts = DeviceBuffer<uint8_t>(size_t(m.E * 3 * m.Fe * d) * m.es, "MoE expert weights (16-bit)");
    m.moe_xn = DeviceBuffer<uint8_t>(size_t(m.N * d) * m.es, "calibration activations (rmsnorm2 of every row, read by every expert)");
  }
}
LayerForwardCuda::~LayerForwardCuda() = default;
double LayerForwardCuda::take_sink_seconds() {
  p_->collect_sink_times();
  const double s = p_->sink_seconds;
  p_->sink_seconds = 0;
  return s;
}
DType LayerForwardCuda::dtype() const { return p_->dt; }
bool LayerForwardCuda::spilled() const { return p_->spill; }

void LayerForwardCuda::set_input(const MatF& X) {
  Impl& m = *p_;
  if (X.rows() != m.N || X.cols() != m.c.hidden_size) fail(Errc::usage, "", "set_input", "shape mismatch");
  m.kept = 0;
  if (m.spill) {
    synchronize();
    parallel_memcpy(m.hX.get(), X.data(), size_t(X.size()) * 4);
    return;
  }
  // through page-locked memory (a pageable copy of 4 GiB runs at a third of PCIe's speed)
  copy_to_device_staged(m.X.get(), X.data(), size_t(X.size()) * 4);
}
MatF LayerForwardCuda::input() const {
  MatF X(p_->N, p_->c.hidden_size);
  if (p_->spill) {
    synchronize();
    parallel_memcpy(X.data(), p_->hX.get(), size_t(X.size()) * 4);
    return X;
  }
  PTQ_CUDA(cudaMemcpy(X.data(), p_->X.get(), size_t(X.size()) * 4, cudaMemcpyDeviceToHost));
  return X;
}

namespace {
// A fused Linear's parts (Phi-3): qkv_proj holds the q, k, v rows in that order, gate_up_proj the
// gate rows, then the up rows; the GPU forward keeps each part as its own 16-bit weight.
std::vector<Proj> parts_of(Proj p) {
  if (p == Proj::qkv) return {Proj::q, Proj::k, Proj::v};
  if (p == Proj::gate_up) return {Proj::gate, Proj::up};
  return {p};
}
// The layer's weights in kAllProj order as the checkpoint stores them (fused: the same rows).
std::vector<const MatF*> stored_weights(const LayerWeights& w, const LlamaConfig& c) {
  if (c.fused) return {&w[Proj::qkv].W, &w[Proj::o].W, &w[Proj::gate_up].W, &w[Proj::down].W};
  std::vector<const MatF*> v;
  if (!w.experts.empty()) {   // MoE: attention, the router, then each expert's gate, up, down
    for (Proj p : {Proj::q, Proj::k, Proj::v, Proj::o}) v.push_back(&w[p].W);
    v.push_back(&w.router.W);
    for (auto& e : w.experts)
      for (auto& l : e) v.push_back(&l.W);
    return v;
  }
  for (Proj p : kAllProj) v.push_back(&w[p].W);
  return v;
}
}  // namespace

void LayerForwardCuda::set_moe_calibration(bool all_experts) { p_->all_experts = all_experts; }
int64_t LayerForwardCuda::routed_tokens(int expert) const {
  const auto& o = p_->route_off;
  return size_t(expert) + 1 < o.size() ? o[size_t(expert) + 1] - o[size_t(expert)] : -1;
}

void LayerForwardCuda::set_weight(LinearId id, const MatF& W) {
  Impl& m = *p_;
  if (id.expert >= 0) {
    void* dst = m.expert_w(id);
    const LinearShape sh = linear_shape(m.c, id);
    if (W.rows() != sh.out || W.cols() != sh.in) fail(Errc::usage, "", proj_name(id.proj), "expert weight shape mismatch");
    const size_t bytes = size_t(W.size()) * 2;
    convert_from_f32(m.dt, W.data(), pinned_staging(bytes), size_t(W.size()));
    upload_from_staging(dst, bytes);
    return;
  }
  const Proj p = id.proj;
  if (parts_of(p).size() > 1) {
    int64_t r0 = 0;
    for (Proj q : parts_of(p)) {
      const int64_t rows = m.outs[int(q)];
      if (r0 + rows > W.rows()) fail(Errc::usage, "", proj_name(p), "weight shape mismatch");
      set_weight(q, W.middleRows(r0, rows));
      r0 += rows;
    }
    if (r0 != W.rows()) fail(Errc::usage, "", proj_name(p), "weight shape mismatch");
    return;
  }
  const int i = int(p);
  if (W.rows() != m.outs[i] || W.cols() != m.ins[i]) fail(Errc::usage, "", proj_name(p), "weight shape mismatch");
  m.model_w[i] = false;
  // Rounded to 16 bits on the host (every core) straight into page-locked memory: half the bytes
  // cross PCIe, at its full speed.
  const size_t bytes = size_t(W.size()) * 2;
  convert_from_f32(m.dt, W.data(), pinned_staging(bytes), size_t(W.size()));
  upload_from_staging(m.at(m.W[i], 0), bytes);
}

size_t LayerForwardCuda::weight_bytes() const {
  const Impl& m = *p_;
  size_t b = 0;
  for (int i = 0; i < (m.moe ? 4 : 7); ++i) b += size_t(m.outs[i] * m.ins[i]) * 2;
  if (m.moe) b += size_t(m.E * m.c.hidden_size) * 2 + size_t(m.E * 3 * m.Fe * m.c.hidden_size) * 2;
  return b;
}

void LayerForwardCuda::convert_weights(const LayerWeights& w, void* dst) const {
  uint8_t* d = static_cast<uint8_t*>(dst);
  const size_t total = weight_bytes();
  size_t done = 0;
  for (const MatF* W : stored_weights(w, p_->c)) {
    done += size_t(W->size()) * 2;
    if (done > total) fail(Errc::usage, "", "convert_weights", "weight shape mismatch");
    convert_from_f32(p_->dt, W->data(), d, size_t(W->size()));
    d += size_t(W->size()) * 2;
  }
  if (done != total) fail(Errc::usage, "", "convert_weights", "weight shape mismatch");
}

void LayerForwardCuda::load_layer(const LayerWeights& w, const void* converted) {
  Impl& m = *p_;
  m.kept = 0;
  for (ActQuant& a : m.act) a = ActQuant{};
  m.expert_act.clear();
  PTQ_CUDA(cudaMemcpy(m.norm1.get(), w.input_layernorm.data(), size_t(m.c.hidden_size) * 4, cudaMemcpyHostToDevice));
  PTQ_CUDA(cudaMemcpy(m.norm2.get(), w.post_attention_layernorm.data(), size_t(m.c.hidden_size) * 4, cudaMemcpyHostToDevice));
  if (m.c.qk_norm) set_head_norms(w.q_norm, w.k_norm);
  const uint8_t* src = static_cast<const uint8_t*>(converted);
  if (!src) {
    if (m.moe) {
      for (Proj p : {Proj::q, Proj::k, Proj::v, Proj::o}) set_weight(p, w[p].W);
      if (int64_t(w.experts.size()) != m.E) fail(Errc::usage, "", "load_layer", "MoE layer with another number of experts");
      set_router(w.router.W);
      for (int e = 0; e < m.E; ++e)
        for (Proj p : {Proj::gate, Proj::up, Proj::down}) set_weight(LinearId(p, e), w[LinearId(p, e)].W);
    } else {
      for (Proj p : m.c.fused ? std::vector<Proj>{Proj::qkv, Proj::o, Proj::gate_up, Proj::down} : std::vector<Proj>(kAllProj.begin(), kAllProj.end()))
        set_weight(p, w[p].W);
    }
  }
  for (Proj p : kAllProj) {
    const int i = int(p);
    if (m.moe && i >= 4) {   // the experts' weights follow the router in `converted`
      if (src && i == 4) {
        PTQ_CUDA(cudaMemcpy(m.router.get(), src, m.router.size(), cudaMemcpyHostToDevice));
        PTQ_CUDA(cudaMemcpy(m.experts.get(), src + m.router.size(), m.experts.size(), cudaMemcpyHostToDevice));
      }
      m.bias[i] = DeviceBuffer<float>();
      continue;
    }
    if (src) {   // already in 16 bits, in page-locked memory (fused Linears: their parts' rows in order)
      const size_t bytes = size_t(m.outs[i] * m.ins[i]) * 2;
      PTQ_CUDA(cudaMemcpy(m.at(m.W[i], 0), src, bytes, cudaMemcpyHostToDevice));
      src += bytes;
    }
    if (w[p].b.size()) {
      if (!m.bias[i].get()) m.bias[i] = DeviceBuffer<float>(size_t(m.outs[i]), "bias");
      PTQ_CUDA(cudaMemcpy(m.bias[i].get(), w[p].b.data(), size_t(m.outs[i]) * 4, cudaMemcpyHostToDevice));
    } else {
      m.bias[i] = DeviceBuffer<float>();
    }
  }
  for (bool& b : m.model_w) b = true;
}

void LayerForwardCuda::norm1(DeviceRowSink* h) { p_->norm_all(1, h); }

void LayerForwardCuda::renorm(Stage s, DeviceRowSink* h) {
  Impl& m = *p_;
  if (s == Stage::expert_in && m.moe && m.all_experts) {   // the experts' shared input: norm2 and the routing again, every row to h
    Impl::Scratch scratch(m);
    const int64_t d = m.c.hidden_size;
    m.by_chunks([&](int64_t r0, int64_t rows) { m.rmsnorm(m.norm2, m.x_rows(r0, rows, true), m.at(m.moe_xn, r0 * d), rows); });
    m.route_all();
    m.expert_rows(-1, true, [&](const void* x, int64_t rows, int64_t) { m.sink_add(h, x, rows); });
    return;
  }
  if (!(s == Stage::norm1 || (s == Stage::norm2 && !m.moe)))
    fail(Errc::usage, "", "LayerForwardCuda::renorm", std::string("no norm to recompute at stage ") + stage_name(s));
  m.norm_all(s == Stage::norm1 ? 1 : 2, h);
}

void LayerForwardCuda::set_act_quant(LinearId id, const ActQuant& a) {
  Impl& m = *p_;
  if (id.expert >= 0) {
    if (!m.moe || id.expert >= m.E) fail(Errc::usage, "", proj_name(id.proj), "no such expert");
    m.expert_act.resize(size_t(m.E) * 3);
    m.expert_act[size_t(id.expert * 3 + expert_slot(id.proj))] = a;
    return;
  }
  for (Proj q : parts_of(id.proj)) m.act[int(q)] = a;
}

void LayerForwardCuda::attention(DeviceRowSink* h) {
  Impl& m = *p_;
  Impl::Scratch scratch(m);
  const LlamaConfig& c = m.c;
  const int nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim, group = nh / nkv, T = m.T;
  const int64_t qd = c.q_dim(), kv = c.kv_dim();
  const float one = 1.0f, zero = 0.0f, scale = 1.0f / std::sqrt(float(hd));
  const cudaDataType ct = ctype(m.dt);
  m.by_chunks([&](int64_t r0, int64_t rows) {
    const void* xn = m.normed(1, m.kept == 1 ? nullptr : m.x_rows(r0, rows, true), r0, rows, false);
    float* yq = m.y32.get();
    float* yk = yq + rows * qd;
    float* yv = yk + rows * kv;
    if (!m.split_linear(Proj::qkv, xn, rows, {{yq, qd}, {yk, kv}, {yv, kv}})) {
      m.linear(0, xn, yq, rows, 0.0f);
      m.linear(1, xn, yk, rows, 0.0f);
      m.linear(2, xn, yv, rows, 0.0f);
    }
    m.bias_add(0, yq, rows);
    m.bias_add(1, yk, rows);
    m.bias_add(2, yv, rows);
    if (c.qk_norm) {
      m.head_norm(yq, m.q_norm, rows, nh);
      m.head_norm(yk, m.k_norm, rows, nkv);
    }
    m.rope_cast(yq, m.q16, rows, nh, r0, true);
    m.rope_cast(yk, m.k16, rows, nkv, r0, true);
    m.rope_cast(yv, m.v16, rows, nkv, r0, false);
    void* ctx = m.stage_rows(r0, rows, qd, false);
    if (m.flash) {
      flash_attention(m.dt, m.at(m.q16, 0), m.at(m.k16, 0), m.at(m.v16, 0), ctx, int(rows / T), T, nh, nkv, hd, scale, c.sliding_window);
    } else {
      for (int64_t s0 = 0; s0 < rows; s0 += T) {   // one window at a time (cuBLAS GEMMs and a softmax kernel)
        const void* Q = m.at(m.q16, s0 * qd);
        const void* K = m.at(m.k16, s0 * kv);
        const void* V = m.at(m.v16, s0 * kv);
        void* cw = static_cast<uint8_t*>(ctx) + size_t(s0 * qd) * m.es;
        for (int r = 0; r < group; ++r)   // query heads kvh * group + r, batched over kvh
          PTQ_CUBLAS(cublasGemmStridedBatchedEx(blas(), CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, &one, K, ct, int(kv), hd,
                                                static_cast<const uint8_t*>(Q) + size_t(r * hd) * m.es, ct, int(qd), int64_t(group) * hd, &zero,
                                                m.scores.get() + int64_t(r) * T * T, CUDA_R_32F, T, int64_t(group) * T * T, nkv,
                                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        if (m.dt == DType::F16) causal_softmax_kernel<__half><<<unsigned(nh * T), 256>>>(m.scores.get(), static_cast<__half*>(m.at(m.P, 0)), T, scale, c.sliding_window);
        else causal_softmax_kernel<__nv_bfloat16><<<unsigned(nh * T), 256>>>(m.scores.get(), static_cast<__nv_bfloat16*>(m.at(m.P, 0)), T, scale, c.sliding_window);
        PTQ_CUDA_LAUNCH("causal_softmax_kernel");
        for (int r = 0; r < group; ++r)
          PTQ_CUBLAS(cublasGemmStridedBatchedEx(blas(), CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, &one, V, ct, int(kv), hd, m.at(m.P, int64_t(r) * T * T), ct,
                                                T, int64_t(group) * T * T, &zero, static_cast<uint8_t*>(cw) + size_t(r * hd) * m.es, ct, int(qd),
                                                int64_t(group) * hd, nkv, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
    }
    m.sink_add(h, ctx, rows);
    m.stage_back(r0, rows, qd);
  });
  m.kept = 0;
}

void LayerForwardCuda::o_proj_norm2(DeviceRowSink* h) {
  Impl& m = *p_;
  Impl::Scratch scratch(m);
  const int64_t qd = m.c.q_dim();
  m.kept = 0;
  m.by_chunks([&](int64_t r0, int64_t rows) {
    const void* ctx = m.stage_rows(r0, rows, qd, true);
    float* x = m.x_rows(r0, rows, true);
    m.linear(3, ctx, x, rows, 1.0f);   // X += ctx Wo^T
    m.bias_add(3, x, rows);
    const void* xn = m.normed(2, x, r0, rows, true);
    m.sink_add(h, xn, rows);
    m.x_back(r0, rows);
  });
  if (m.keep_norm) m.kept = 2;
}

void LayerForwardCuda::mlp(DeviceRowSink* h) {
  Impl& m = *p_;
  Impl::Scratch scratch(m);
  const int64_t f = m.c.intermediate_size;
  m.by_chunks([&](int64_t r0, int64_t rows) {
    const void* xn = m.normed(2, m.kept == 2 ? nullptr : m.x_rows(r0, rows, true), r0, rows, false);
    float* g = m.y32.get();
    float* u = g + rows * f;
    if (!m.split_linear(Proj::gate_up, xn, rows, {{g, f}, {u, f}})) {
      m.linear(4, xn, g, rows, 0.0f);
      m.linear(5, xn, u, rows, 0.0f);
    }
    m.bias_add(4, g, rows);
    m.bias_add(5, u, rows);
    void* act = m.stage_rows(r0, rows, f, false);
    m.silu_mul(g, u, act, rows * f, f);
    m.sink_add(h, act, rows);
    m.stage_back(r0, rows, f);
  });
  m.kept = 0;
}

void LayerForwardCuda::expert_in(int e, DeviceRowSink* h) {
  Impl& m = *p_;
  if (!m.moe || e < -1 || e >= m.E || (e < 0 && !m.all_experts)) fail(Errc::usage, "", "expert_in", "no such expert (every expert: all-experts calibration only)");
  Impl::Scratch scratch(m);
  if (e <= 0) {   // the first expert group follows the attention: norm2 and the routing first
    m.moe_norm2();
    m.route_all();
  }
  m.finish_expert();
  m.expert_rows(e, m.all_experts, [&](const void* x, int64_t rows, int64_t) { m.sink_add(h, x, rows); });
}

void LayerForwardCuda::expert_act(int e, DeviceRowSink* h) {
  Impl& m = *p_;
  if (!m.moe || e < 0 || e >= m.E || m.route_off.empty()) fail(Errc::usage, "", "expert_act", "no such expert, or not routed yet");
  Impl::Scratch scratch(m);
  // (the previous experts' outputs wait for the end of the layer: their downs may still be solved
  // after this expert's activation Hessian, in one batch)
  m.expert_rows(e, m.all_experts, [&](const void* x, int64_t rows, int64_t) {
    m.expert_swiglu(e, x, rows, m.at(m.moe_act, 0));
    m.sink_add(h, m.at(m.moe_act, 0), rows);
  });
  if (std::find(m.pending.begin(), m.pending.end(), e) == m.pending.end()) m.pending.push_back(e);   // (AWQ samples it first)
}

void LayerForwardCuda::down_proj() {
  Impl& m = *p_;
  Impl::Scratch scratch(m);
  if (m.moe) {   // the last expert's output
    m.finish_expert();
    return;
  }
  const int64_t f = m.c.intermediate_size;
  m.kept = 0;
  m.by_chunks([&](int64_t r0, int64_t rows) {
    const void* act = m.stage_rows(r0, rows, f, true);
    float* x = m.x_rows(r0, rows, true);
    m.linear(6, act, x, rows, 1.0f);   // X += act Wd^T
    m.bias_add(6, x, rows);
    m.x_back(r0, rows);
  });
}

void LayerForwardCuda::stage(Stage s, int expert, DeviceRowSink* sink) {
  if (s == Stage::expert_in) return expert_in(expert, sink);
  if (s == Stage::expert_act) return expert_act(expert, sink);
  stage(s, sink);
}

void LayerForwardCuda::stage(Stage s, DeviceRowSink* sink) {
  switch (s) {
    case Stage::norm1: return norm1(sink);
    case Stage::attention: return attention(sink);
    case Stage::norm2: return o_proj_norm2(sink);
    case Stage::mlp_act: return mlp(sink);
    default: fail(Errc::usage, "", "LayerForwardCuda::stage", std::string("the GPU forward has no stage ") + stage_name(s));
  }
}

void LayerForwardCuda::layer() {
  Impl& m = *p_;
  m.kept = 0;
  if (m.moe) {
    attention(nullptr);
    Impl::Scratch scratch(m);
    m.moe_norm2();
    m.route_all();
    for (int e = 0; e < m.E; ++e) m.finish_expert(e);
    return;
  }
  attention(nullptr);
  o_proj_norm2(nullptr);
  mlp(nullptr);
  down_proj();
}

void LayerForwardCuda::set_weight_device(LinearId id, const float* W) {
  Impl& m = *p_;
  if (id.expert >= 0) {
    void* dst = m.expert_w(id);
    const int64_t n = m.Fe * m.c.hidden_size;
    narrow_kernel<<<blocks(n), 256>>>(W, n, m.dt == DType::F16 ? 1 : 2, dst);
    PTQ_CUDA_LAUNCH("narrow_kernel");
    return;
  }
  const Proj p = id.proj;
  if (parts_of(p).size() > 1) {
    for (Proj q : parts_of(p)) {
      set_weight_device(q, W);
      W += m.outs[int(q)] * m.ins[int(q)];
    }
    return;
  }
  const int i = int(p);
  const int64_t n = m.outs[i] * m.ins[i];
  m.model_w[i] = false;
  narrow_kernel<<<blocks(n), 256>>>(W, n, m.dt == DType::F16 ? 1 : 2, m.at(m.W[i], 0));
  PTQ_CUDA_LAUNCH("narrow_kernel");
}

void LayerForwardCuda::set_linear(Proj p, LinearFn f) { p_->override_[int(p)] = std::move(f); }

bool LayerForwardCuda::holds_model_weights(LinearId id) const {
  if (id.expert >= 0) return true;
  for (Proj q : parts_of(id.proj))
    if (!p_->model_w[int(q)]) return false;
  return true;
}

void LayerForwardCuda::set_expert_linear(LinearId id, LinearFn f) {
  Impl& m = *p_;
  if (!m.moe || id.expert < 0 || id.expert >= m.E) fail(Errc::usage, "", "set_expert_linear", "no such expert");
  if (m.expert_override.empty()) m.expert_override.resize(size_t(m.E) * 3);
  m.expert_override[size_t(id.expert * 3 + expert_slot(id.proj))] = std::move(f);
}

void LayerForwardCuda::set_router(const MatF& W) {
  Impl& m = *p_;
  if (!m.moe || W.rows() != m.E || W.cols() != m.c.hidden_size) fail(Errc::usage, "", "set_router", "router of the wrong shape, or a model without one");
  const size_t bytes = size_t(W.size()) * 2;
  convert_from_f32(m.dt, W.data(), pinned_staging(bytes), size_t(W.size()));
  upload_from_staging(m.router.get(), bytes);
}

void LayerForwardCuda::set_norms(const VecF& input_layernorm, const VecF& post_attention_layernorm) {
  Impl& m = *p_;
  if (input_layernorm.size() != m.c.hidden_size || post_attention_layernorm.size() != m.c.hidden_size)
    fail(Errc::usage, "", "set_norms", "norm weights of the wrong size");
  m.kept = 0;
  copy_to_device(m.norm1.get(), input_layernorm.data(), size_t(m.c.hidden_size) * 4);
  copy_to_device(m.norm2.get(), post_attention_layernorm.data(), size_t(m.c.hidden_size) * 4);
}

void LayerForwardCuda::set_head_norms(const VecF& q_norm, const VecF& k_norm) {
  Impl& m = *p_;
  if (!m.c.qk_norm || q_norm.size() != m.c.head_dim || k_norm.size() != m.c.head_dim)
    fail(Errc::usage, "", "set_head_norms", "q/k norm weights of the wrong size, or a model without them");
  copy_to_device(m.q_norm.get(), q_norm.data(), size_t(m.c.head_dim) * 4);
  copy_to_device(m.k_norm.get(), k_norm.data(), size_t(m.c.head_dim) * 4);
}

void LayerForwardCuda::set_bias(Proj p, const VecF& b) {
  Impl& m = *p_;
  const int i = int(p);
  if (b.size() == 0) { m.bias[i] = DeviceBuffer<float>(); return; }
  if (parts_of(p).size() > 1) fail(Errc::usage, "", proj_name(p), "biases of fused Linears are not served (no family has them)");
  if (b.size() != m.outs[i]) fail(Errc::usage, "", proj_name(p), "bias of the wrong size");
  if (!m.bias[i].get()) m.bias[i] = DeviceBuffer<float>(size_t(m.outs[i]), "bias");
  copy_to_device(m.bias[i].get(), b.data(), size_t(m.outs[i]) * 4);
}

void LayerForwardCuda::logits(const VecF& final_norm, const void* lm_head, int64_t vocab, float* out) {
  Impl& m = *p_;
  Impl::Scratch scratch(m);
  const int64_t d = m.c.hidden_size;
  DeviceBuffer<float> nw(size_t(d), "final norm");
  copy_to_device(nw.get(), final_norm.data(), size_t(d) * 4);
  m.by_chunks([&](int64_t r0, int64_t rows) {
    m.rmsnorm(nw, m.x_rows(r0, rows, true), m.at(m.xn, 0), rows);
    linear_gemm(m.at(m.xn, 0), lm_head, out + r0 * vocab, CUDA_R_32F, rows, d, vocab, m.dt, 0.0f);
  });
}

const void* LayerForwardCuda::weight(LinearId id) const {
  if (id.expert >= 0) return p_->expert_w(id);
  const Proj p = id.proj;
  if (parts_of(p).size() > 1) fail(Errc::usage, "", proj_name(p), "a fused Linear's parts are held apart on the device");
  return p_->at(p_->W[int(p)], 0);
}

// ---------------------------------------------------------------- StageStats

struct StageStats::Impl {
  int64_t cols, step = 1, count = 0, seen = 0;   // seen: the global index of the next row (first + rows so far)
  DType dt;
  DeviceRowSink* next;
  DeviceBuffer<int> amax;
  DeviceBuffer<float> sample;   // [count, cols]: every rank's sampled rows at their places
  // The first sampled row at or after global row r.
  int64_t sampled_from(int64_t r) const { return std::min(count, (r + step - 1) / step); }
};

StageStats::StageStats(int64_t cols, DType dtype, DeviceRowSink* next, int64_t total, int64_t sample, int64_t first)
    : p_(std::make_unique<Impl>()) {
  Impl& m = *p_;
  m.cols = cols;
  m.dt = dtype;
  m.next = next;
  m.seen = first;
  m.amax = DeviceBuffer<int>(size_t(cols), "stage statistics: column absmax");
  fill_bytes(m.amax.get(), 0, size_t(cols) * 4);
  if (sample > 0 && total > 0) {
    m.step = std::max<int64_t>(1, total / sample);
    m.count = total / m.step;
    m.sample = DeviceBuffer<float>(size_t(m.count * cols), "stage statistics: sampled rows");
    fill_bytes(m.sample.get(), 0, size_t(m.count * cols) * 4);   // other ranks' rows: zeros until across_ranks
  }
}
StageStats::~StageStats() = default;

void StageStats::add_device(const void* x, int64_t rows) {
  Impl& m = *p_;
  if (rows > 0) {
    const dim3 grid(unsigned((m.cols + 255) / 256), unsigned((rows + 63) / 64));
    if (m.dt == DType::F16) column_absmax_kernel<__half><<<grid, 256>>>(static_cast<const __half*>(x), rows, m.cols, m.amax.get());
    else column_absmax_kernel<__nv_bfloat16><<<grid, 256>>>(static_cast<const __nv_bfloat16*>(x), rows, m.cols, m.amax.get());
    PTQ_CUDA_LAUNCH("column_absmax_kernel");
    // the sampled rows k * step within [seen, seen + rows)
    const int64_t k0 = m.sampled_from(m.seen), k1 = m.sampled_from(m.seen + rows);
    if (k1 > k0) {
      float* out = m.sample.get() + k0 * m.cols;
      const int64_t first = k0 * m.step - m.seen;
      if (m.dt == DType::F16) sample_rows_kernel<__half><<<unsigned(k1 - k0), 256>>>(static_cast<const __half*>(x), m.cols, first, m.step, out);
      else sample_rows_kernel<__nv_bfloat16><<<unsigned(k1 - k0), 256>>>(static_cast<const __nv_bfloat16*>(x), m.cols, first, m.step, out);
      PTQ_CUDA_LAUNCH("sample_rows_kernel");
    }
    m.seen += rows;
  }
  if (m.next) m.next->add_device(x, rows);
}

void StageStats::across_ranks(const Comm& comm, const std::vector<int64_t>& firsts) {
  Impl& m = *p_;
  if (firsts.size() != size_t(comm.size()) + 1) fail(Errc::usage, "StageStats", "firsts", "one first row per rank and the total");
  comm.max(reinterpret_cast<float*>(m.amax.get()), size_t(m.cols));   // the bits of non-negative floats: their float maximum
  if (m.count == 0) return;
  std::vector<size_t> off;
  for (int64_t f : firsts) off.push_back(size_t(m.sampled_from(f) * m.cols) * sizeof(float));
  comm.share(m.sample.get(), off);
}

VecF StageStats::column_absmax() const {
  VecF a(p_->cols);
  copy_to_host(a.data(), p_->amax.get(), size_t(p_->cols) * 4);
  return a;
}

MatF StageStats::sampled_rows() const {
  MatF X(p_->count, p_->cols);
  if (X.size()) copy_to_host(X.data(), p_->sample.get(), size_t(X.size()) * 4);
  return X;
}

}  // namespace ptq::cuda
