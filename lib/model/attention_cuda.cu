// attention_cuda.cu — flash attention for the calibration forward (attention_cuda.h).
//
// Contract. Q, K, V, ctx 16-bit (f16 or bf16) row-major, rows = tokens, head h at columns
// h*hd .. h*hd+hd-1 (hd = 64, 96 or 128; row strides heads*hd and kv_heads*hd, so 16-byte aligned);
// causal within each window of T tokens (any T >= 1), optional sliding window; GQA by h / group.
// Reference: attention_reference (fp64, below) and lib/model/llama.cpp's attention_core (fp32);
// tests/test_forward_cuda.cpp compares against both.
// Mapping (FlashAttention-2). A CTA (4 warps) owns 64 query rows of one head of one window, a
// warp 16 of them; it walks the key tiles of 64 the rows may see (causal: up to the diagonal),
// K and V tiles double-buffered in shared memory by cp.async (XOR-swizzled 16-byte chunks, so
// ldmatrix is conflict-free). S = Q K^T by mma.sync m16n8k16 (fp32), online softmax in fp32
// (exp2 with the scale folded in, running max and sum per row), P rounded to 16 bits straight
// from the accumulator registers into A fragments, O += P V (fp32), O / sum written as 16 bits.
// Query blocks are launched heaviest (last) first, so the causal triangle's long blocks start early.
// Roofline (7B shapes, T = 2048, 128 windows): 4 T^2 hd heads / 2 = 4.4 TFLOP per layer on tensor
// cores, ~6 ms at 750 TFLOP/s; no T x T traffic (the unfused path moved 1.5 GiB per window).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "model/attention_cuda.h"
#include "cuda/ptx.cuh"
#include "cuda/runtime.h"

namespace ptq::cuda {

namespace {
constexpr int kBr = 64, kBc = 64, kThreads = 128;

template <class T> struct Mma;
template <> struct Mma<__half> {
  static __device__ __forceinline__ void run(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) { ptx::mma_m16n8k16_f16(c, a, b0, b1); }
  static __device__ __forceinline__ uint32_t pack(float x, float y) {
    const __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float x, float y) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};

using ptx::cp_async16;   // bytes = 0 fills zeros (rows past the window)
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::smem_addr;
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// A tile row in shared memory: HD 16-bit values padded to a power-of-two count of 16-byte chunks
// (hd 96: 12 chunks in a row of 16), so the XOR swizzle below stays inside the row.
template <int HD> constexpr int pitch() { return HD <= 64 ? 64 : 128; }
// Byte offset of 16-byte chunk c of row r in a tile (HD / 8 chunks used), XOR-swizzled over 8
// rows: the 8 rows an ldmatrix reads at one chunk hit 8 different banks.
template <int HD> __device__ __forceinline__ uint32_t swz(int r, int c) { return uint32_t(r * pitch<HD>() * 2 + ((c ^ (r & 7)) << 4)); }

// rows [row0, row0 + 64) of a [*, ld] matrix (columns col0 ..) into a swizzled tile; rows at or past
// `valid` are zero-filled.
template <int HD>
__device__ __forceinline__ void load_tile(uint32_t tile, const uint8_t* base, int64_t ld, int row0, int valid) {
  constexpr int kChunks = HD / 8;
  for (int idx = threadIdx.x; idx < kBr * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const bool ok = row0 + r < valid;
    const uint8_t* src = base + (int64_t(ok ? row0 + r : 0) * ld + c * 8) * 2;
    cp_async16(tile + swz<HD>(r, c), src, ok ? 16 : 0);
  }
}

template <class T, int HD>
__global__ void __launch_bounds__(kThreads, 2)
flash_attention_kernel(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, T* __restrict__ O, int Tlen, int heads,
                       int group, float scale_log2, int window) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kKS = HD / 16, kNO = HD / 8;   // k16 steps over hd, n8 tiles of O
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int nqb = (Tlen + kBr - 1) / kBr, qb = nqb - 1 - int(blockIdx.x), h = blockIdx.y, s = blockIdx.z, hk = h / group;
  const int q0 = qb * kBr;
  const int64_t ldq = int64_t(heads) * HD, ldk = int64_t(heads / group) * HD;
  const uint8_t* Qb = reinterpret_cast<const uint8_t*>(Q + int64_t(s) * Tlen * ldq + int64_t(h) * HD);
  const uint8_t* Kb = reinterpret_cast<const uint8_t*>(K + int64_t(s) * Tlen * ldk + int64_t(hk) * HD);
  const uint8_t* Vb = reinterpret_cast<const uint8_t*>(V + int64_t(s) * Tlen * ldk + int64_t(hk) * HD);
  const uint32_t sQ = smem_addr(smem), sK = sQ + kBr * pitch<HD>() * 2, sV = sK + 2 * kBc * pitch<HD>() * 2;

  // Key tiles [kt0, kt1]: up to the last query row's diagonal, from the first row's window start.
  const int last = min(q0 + kBr, Tlen) - 1;
  const int kt0 = window > 0 ? max(0, q0 - window + 1) / kBc : 0, kt1 = last / kBc;
  load_tile<HD>(sQ, Qb, ldq, q0, Tlen);
  load_tile<HD>(sK, Kb, ldk, kt0 * kBc, Tlen);
  load_tile<HD>(sV, Vb, ldk, kt0 * kBc, Tlen);
  cp_async_commit();

  uint32_t qf[kKS][4];
  float o[kNO][4];
  for (int j = 0; j < kNO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};   // rows g and g + 8 of the warp
  const int r_lo = q0 + warp * 16 + g, r_hi = r_lo + 8;         // query positions

  for (int kt = kt0; kt <= kt1; ++kt) {
    const int buf = (kt - kt0) & 1;
    if (kt < kt1) {   // prefetch the next tile into the other buffer
      load_tile<HD>(sK + (buf ^ 1) * kBc * pitch<HD>() * 2, Kb, ldk, (kt + 1) * kBc, Tlen);
      load_tile<HD>(sV + (buf ^ 1) * kBc * pitch<HD>() * 2, Vb, ldk, (kt + 1) * kBc, Tlen);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (kt == kt0)
      for (int ks = 0; ks < kKS; ++ks) ldmatrix_x4(qf[ks], sQ + swz<HD>(warp * 16 + (lane & 15), ks * 2 + (lane >> 4)));
    const uint32_t tK = sK + buf * kBc * pitch<HD>() * 2, tV = sV + buf * kBc * pitch<HD>() * 2;

    // S = Q K^T for this warp's 16 rows and the tile's 64 keys: 8 n8 tiles.
    float sc[kBc / 8][4];
    for (int j = 0; j < kBc / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
#pragma unroll
      for (int jp = 0; jp < kBc / 16; ++jp) {   // two n8 tiles (16 keys) per ldmatrix.x4
        uint32_t b[4];
        const int mi = lane >> 3;
        ldmatrix_x4(b, tK + swz<HD>(jp * 16 + (mi >> 1) * 8 + (lane & 7), ks * 2 + (mi & 1)));
        Mma<T>::run(sc[2 * jp], qf[ks], b[0], b[1]);
        Mma<T>::run(sc[2 * jp + 1], qf[ks], b[2], b[3]);
      }
    }
    // Mask: keys past the diagonal, before the sliding window, or past the window's end.
    const int k0 = kt * kBc;
    const bool edge = k0 + kBc - 1 > q0 || k0 + kBc > Tlen || (window > 0 && last - k0 >= window);
    if (edge) {
#pragma unroll
      for (int j = 0; j < kBc / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + j * 8 + 2 * t + (e & 1), row = e < 2 ? r_lo : r_hi;
          if (key > row || key >= Tlen || (window > 0 && row - key >= window)) sc[j][e] = -INFINITY;
        }
    }
    // Online softmax (log2 domain): new running max, rescale of the old sum and O.
    float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kBc / 8; ++j) {
      mt[0] = fmaxf(mt[0], fmaxf(sc[j][0], sc[j][1]));
      mt[1] = fmaxf(mt[1], fmaxf(sc[j][2], sc[j][3]));
    }
    float alpha[2], mu[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mt[i] = fmaxf(mt[i], __shfl_xor_sync(~0u, mt[i], 1));
      mt[i] = fmaxf(mt[i], __shfl_xor_sync(~0u, mt[i], 2));
      const float mn = fmaxf(m[i], mt[i] * scale_log2);
      alpha[i] = m[i] == -INFINITY ? 0.0f : exp2f(m[i] - mn);
      m[i] = mn;
      mu[i] = mn == -INFINITY ? 0.0f : mn;   // a row with no key yet: its p are all 0
      l[i] *= alpha[i];
    }
#pragma unroll
    for (int j = 0; j < kNO; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }
    uint32_t pf[kBc / 16][4];   // P as A fragments, one per k16 step over the tile's keys
#pragma unroll
    for (int j = 0; j < kBc / 8; ++j) {
      const float p0 = exp2f(sc[j][0] * scale_log2 - mu[0]), p1 = exp2f(sc[j][1] * scale_log2 - mu[0]);
      const float p2 = exp2f(sc[j][2] * scale_log2 - mu[1]), p3 = exp2f(sc[j][3] * scale_log2 - mu[1]);
      l[0] += p0 + p1;
      l[1] += p2 + p3;
      pf[j / 2][(j & 1) * 2 + 0] = Mma<T>::pack(p0, p1);
      pf[j / 2][(j & 1) * 2 + 1] = Mma<T>::pack(p2, p3);
    }
    // O += P V: k16 steps over the keys, n8 tiles over hd (two per ldmatrix.x4.trans).
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
#pragma unroll
      for (int jp = 0; jp < kNO / 2; ++jp) {
        uint32_t b[4];
        const int mi = lane >> 3;
        ldmatrix_x4_trans(b, tV + swz<HD>(kk * 16 + (mi & 1) * 8 + (lane & 7), jp * 2 + (mi >> 1)));
        Mma<T>::run(o[2 * jp], pf[kk], b[0], b[1]);
        Mma<T>::run(o[2 * jp + 1], pf[kk], b[2], b[3]);
      }
    }
    __syncthreads();   // the buffer is refilled by the next iteration's prefetch
  }
  // O / sum, as 16 bits.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(~0u, l[i], 1);
    l[i] += __shfl_xor_sync(~0u, l[i], 2);
    l[i] = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
  }
  T* Ob = O + int64_t(s) * Tlen * ldq + int64_t(h) * HD;
#pragma unroll
  for (int j = 0; j < kNO; ++j) {
    const int d = j * 8 + 2 * t;
    if (r_lo < Tlen) *reinterpret_cast<uint32_t*>(Ob + int64_t(r_lo) * ldq + d) = Mma<T>::pack(o[j][0] * l[0], o[j][1] * l[0]);
    if (r_hi < Tlen) *reinterpret_cast<uint32_t*>(Ob + int64_t(r_hi) * ldq + d) = Mma<T>::pack(o[j][2] * l[1], o[j][3] * l[1]);
  }
}

template <class E, int HD>
void launch(const void* q, const void* k, const void* v, void* ctx, int windows, int T, int heads, int kv_heads, float scale, int window) {
  constexpr int smem = (kBr + 4 * kBc) * pitch<HD>() * 2;
  static bool configured = false;
  if (!configured) {
    PTQ_CUDA(cudaFuncSetAttribute(flash_attention_kernel<E, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = true;
  }
  const dim3 grid(unsigned((T + kBr - 1) / kBr), unsigned(heads), unsigned(windows));
  flash_attention_kernel<E, HD><<<grid, kThreads, smem, static_cast<cudaStream_t>(current_stream())>>>(static_cast<const E*>(q), static_cast<const E*>(k), static_cast<const E*>(v),
                                                         static_cast<E*>(ctx), T, heads, heads / kv_heads, scale * 1.4426950408889634f, window);
  PTQ_CUDA_LAUNCH("flash_attention_kernel");
}
}  // namespace

bool flash_attention_supported(int head_dim) { return head_dim == 64 || head_dim == 96 || head_dim == 128; }

void flash_attention(DType dt, const void* q, const void* k, const void* v, void* ctx, int windows, int T, int heads, int kv_heads,
                     int head_dim, float scale, int window) {
  if (!flash_attention_supported(head_dim)) fail(Errc::usage, "", "head_dim", "flash attention takes head_dim 64, 96 or 128, got " + std::to_string(head_dim));
  if (dt != DType::F16 && dt != DType::BF16) fail(Errc::usage, "", "dtype", "flash attention takes f16 or bf16");
  if (kv_heads <= 0 || heads % kv_heads) fail(Errc::usage, "", "num_key_value_heads", "heads not a multiple of KV heads");
  if (windows <= 0 || T <= 0) return;
  const bool h16 = dt == DType::F16;
  if (head_dim == 128) (h16 ? launch<__half, 128> : launch<__nv_bfloat16, 128>)(q, k, v, ctx, windows, T, heads, kv_heads, scale, window);
  else if (head_dim == 96) (h16 ? launch<__half, 96> : launch<__nv_bfloat16, 96>)(q, k, v, ctx, windows, T, heads, kv_heads, scale, window);
  else (h16 ? launch<__half, 64> : launch<__nv_bfloat16, 64>)(q, k, v, ctx, windows, T, heads, kv_heads, scale, window);
}

void attention_reference(const float* q, const float* k, const float* v, double* ctx, int windows, int T, int heads, int kv_heads,
                         int hd, double scale, int window) {
  const int group = heads / kv_heads;
  const int64_t ldq = int64_t(heads) * hd, ldk = int64_t(kv_heads) * hd;
  std::vector<double> p(static_cast<size_t>(T));
  for (int s = 0; s < windows; ++s)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < T; ++i) {
        const float* qi = q + (int64_t(s) * T + i) * ldq + int64_t(h) * hd;
        const int j0 = window > 0 ? std::max(0, i - window + 1) : 0;
        double mx = -INFINITY;
        for (int j = j0; j <= i; ++j) {
          const float* kj = k + (int64_t(s) * T + j) * ldk + int64_t(h / group) * hd;
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += double(qi[d]) * double(kj[d]);
          p[size_t(j)] = dot * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        double sum = 0;
        for (int j = j0; j <= i; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
        double* out = ctx + (int64_t(s) * T + i) * ldq + int64_t(h) * hd;
        for (int d = 0; d < hd; ++d) out[d] = 0;
        for (int j = j0; j <= i; ++j) {
          const float* vj = v + (int64_t(s) * T + j) * ldk + int64_t(h / group) * hd;
          for (int d = 0; d < hd; ++d) out[d] += p[size_t(j)] / sum * double(vj[d]);
        }
      }
}

}  // namespace ptq::cuda
