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
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "model/attention_cuda.h"
#include "cuda/half.cuh"
#include "cuda/pdl.cuh"
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

// ---------------------------------------------------------------------------------------------
// Decode attention: one new query row per sequence against its KV cache, on tensor cores.
//
// Contract. q [batch, heads * hd], ctx [batch, heads * hd], caches [batch, max_len, kv_heads * hd],
// all 16-bit (T), row-major; *pos (device) the position of every sequence's new row, already in the
// cache; keys first .. *pos with first = max(0, *pos - window + 1) when window > 0, else 0.
// hd 64, 96 or 128; group = heads / kv_heads <= 8. Reference: attention_reference (fp64) on the
// same rows; lib/eval/decode_cuda.cu's attend (fp32 P) is the kernel it replaces from 2 rows.
// Mapping. A CTA (kDecWarps warps) owns one sequence's KV head and its `group` query heads, over
// split z of gridDim.z equal runs of the keys; its warps take chunks of 16 keys in turn. A chunk is
// two MMAs deep with the keys as the 16-row operand, so the group's query heads (1..8) are the n8
// columns and nothing is padded to 16 query rows:
//   S^T (16 keys x 8 heads) = K (16 x hd) · Q^T         k16 steps over hd
//   O^T (hd x 8 heads)     += V^T (hd x 16 keys) · P^T  m16 tiles over hd, one k16 step
// Every operand is loaded from global memory (L2) straight into fragment registers: each lane reads
// 16-byte pieces of K and V rows, and the contraction index of each product is permuted so that a
// piece is a fragment (the sum over hd, or over the 16 keys, does not depend on the order). K: lane
// (g, c) reads rows g and g + 8, dims 32i + 8c .. 32i + 8c + 7, which are the A fragments of k16
// steps 2i and 2i + 1 when Q^T's B fragments are read at the same dims. V: lane (g, c) reads keys
// 2c, 2c + 1, 2c + 8, 2c + 9 at dims (hd/8) g .. (hd/8) g + hd/8 - 1; m16 tile t's rows g and g + 8
// are dims (hd/8) g + t and (hd/8) g + hd/16 + t, whose key pairs one PRMT packs. P leaves the S
// accumulators as an 8x8 matrix a lane-row per key; movmatrix.trans gives it a lane-row per head,
// which is P^T's B fragment. Online softmax in fp32 (log2 domain) per head column: the chunk's max
// over its 16 keys by three shuffles, the sum a lane-partial until the end.
// Loads: a chunk's K and V (hd 128: 4 KB each) in 64 registers a lane, two sets: the next chunk's
// K and V are issued before this one's MMAs (220 registers at hd 128: 2 CTAs an SM, one wave for
// the grids measured, 192-256 CTAs at batch 8 and 32).
// (A ring of 2 or 3 chunks a warp in shared memory, filled by cp.async, ran 10-25% slower: lab run 248.)
// Before the PDL wait a warp loads the rows of its first chunk that earlier steps wrote
// (positions < *pos). The warps' (max, sum, O) merge in shared memory; with splits (a cluster of
// gridDim.z CTAs, sm_90) each CTA pushes its heads' records into the last CTA's shared memory,
// which merges them in split order.
// Precision: Q, K, V as stored (16-bit), S and O accumulated in fp32, softmax fp32, P rounded to
// 16 bits for the P·V product (as flash_attention), ctx rounded to 16 bits.
constexpr int kDecWarps = 4, kDecMaxGroup = 8, kDecMaxSplits = 8, kDecChunk = 16;
constexpr int kDecMaxRecords = 32;   // group x splits: the records the last CTA of a cluster merges
constexpr int kDecPad = 4;   // floats padding each head's row of a warp's O in shared memory (bank spread)

// The 8x8 16-bit matrix whose row lane / 4 holds, at columns 2 (lane % 4) and 2 (lane % 4) + 1,
// the two halves of x (the MMA fragment layout), transposed: the same layout of its transpose.
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// A warp's (max, sum, O) record of each head of the group, in floats.
template <int HD> constexpr int dec_warp_floats() { return kDecMaxGroup * (2 + HD + kDecPad); }

template <class T, int HD>
__global__ void __launch_bounds__(kDecWarps * 32, 2)
decode_attention_kernel(const T* qh, const T* kc, const T* vc, const int* pos, int nh, int nkv, int max_len, int window, float scale_log2, T* ctx) {
  constexpr int KQ = HD / 32;   // 16-byte pieces of a K row a lane reads (two k16 steps each)
  constexpr int DG = HD / 8;    // dims of a V row a lane reads
  constexpr int MT = HD / 16;   // m16 tiles of O^T
  constexpr int VR = DG / 2;    // 32-bit registers they fill
  extern __shared__ float sh[];
  const int G = nh / nkv, S = int(gridDim.z), z = int(blockIdx.z);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (S > 1) asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");   // this CTA runs (waited for before the pushes)
#endif
  const int kvh = int(blockIdx.x), b = int(blockIdx.y);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, c = lane % 4;
  const int p0 = *pos, first = window > 0 ? max(0, p0 - window + 1) : 0;
  const int chunk = (p0 - first + S) / S;   // keys a split (the last may hold fewer, or none)
  const int j0 = first + z * chunk, last = min(p0, j0 + chunk - 1);
  const size_t kvw = size_t(nkv) * HD;
  const T* K = kc + size_t(b) * max_len * kvw + size_t(kvh) * HD;
  const T* V = vc + size_t(b) * max_len * kvw + size_t(kvh) * HD;

  using I0 = std::integral_constant<int, 0>;
  using I1 = std::integral_constant<int, 1>;
  uint4 ka[2][KQ], kb[2][KQ];   // K rows cb + g, cb + g + 8 (two sets: this chunk's, the next one's)
  uint32_t va[2][4][VR];        // V rows cb + 2c, 2c + 1, 2c + 8, 2c + 9 (dims DG g ..)
  // The rows of the chunk at cb (clamped to `last`; a clamped key scores -inf, a clamped value
  // weighs 0) whose position is before p0 (when = 1), at or after it (when = 2), or all (0),
  // straight from global memory (L2) into the fragment registers.
  auto load_k = [&](auto buf, int cb, int when) {
    constexpr int B = decltype(buf)::value;
    const int ja = min(cb + g, last), jb = min(cb + g + 8, last);
    const bool la = when == 0 || (when == 1) == (ja < p0), lb = when == 0 || (when == 1) == (jb < p0);
#pragma unroll
    for (int i = 0; i < KQ; ++i) {
      if (la) ka[B][i] = __ldcg(reinterpret_cast<const uint4*>(K + size_t(ja) * kvw + 32 * i + 8 * c));
      if (lb) kb[B][i] = __ldcg(reinterpret_cast<const uint4*>(K + size_t(jb) * kvw + 32 * i + 8 * c));
    }
  };
  auto load_v = [&](auto buf, int cb, int when) {
    constexpr int B = decltype(buf)::value;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int j = min(cb + 2 * c + (r & 1) + (r >> 1) * 8, last);
      if (!(when == 0 || (when == 1) == (j < p0))) continue;
      const T* src = V + size_t(j) * kvw + DG * g;
      if constexpr (DG % 8 == 0) {
#pragma unroll
        for (int i = 0; i < DG / 8; ++i) *reinterpret_cast<uint4*>(&va[B][r][4 * i]) = __ldcg(reinterpret_cast<const uint4*>(src) + i);
      } else {   // hd 96: 12 dims, 24 bytes
#pragma unroll
        for (int i = 0; i < DG / 4; ++i) *reinterpret_cast<uint2*>(&va[B][r][2 * i]) = __ldcg(reinterpret_cast<const uint2*>(src) + i);
      }
    }
  };
  constexpr int kStride = kDecWarps * kDecChunk;
  int cb = j0 + warp * kDecChunk;
  const bool busy = j0 <= last && cb <= last;   // this warp has a chunk (uniform over the warp)
  if (busy) load_k(I0{}, cb, 1), load_v(I0{}, cb, 1);
  pdl::wait_prior_grid();
  pdl::allow_dependents();
  if (busy) load_k(I0{}, cb, 2), load_v(I0{}, cb, 2);
  uint4 qf[KQ];   // Q^T's B fragments: head g of the group, dims 32i + 8c ..
  {
    const T* q = qh + (size_t(b) * nh + size_t(kvh) * G + g) * HD;
#pragma unroll
    for (int i = 0; i < KQ; ++i) qf[i] = g < G ? __ldcg(reinterpret_cast<const uint4*>(q + 32 * i + 8 * c)) : make_uint4(0, 0, 0, 0);
  }
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};   // heads 2c, 2c + 1: running max (log2 units), lane-partial sum
  float o[MT][4];
#pragma unroll
  for (int t = 0; t < MT; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
  // One chunk from register set B; whether another follows. The next chunk's K and V are issued
  // into the other set first, so their loads run under this whole chunk (lab run 251: +0.2-1.4% in
  // the step against issuing K once S is formed and V once P·V is, into the same set).
  auto step = [&](auto buf) {
    constexpr int B = decltype(buf)::value;
    const int next = cb + kStride;
    const bool more = next <= last;
    if (more) load_k(std::integral_constant<int, 1 - B>{}, next, 0), load_v(std::integral_constant<int, 1 - B>{}, next, 0);
    // keys g, g + 8 x heads 2c, 2c + 1; two accumulator sets (even and odd k16 steps) halve the
    // chain of dependent MMAs
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < KQ; ++i) {
      const uint32_t a0[4] = {ka[B][i].x, kb[B][i].x, ka[B][i].y, kb[B][i].y}, a1[4] = {ka[B][i].z, kb[B][i].z, ka[B][i].w, kb[B][i].w};
      Mma<T>::run(s, a0, qf[i].x, qf[i].y);
      Mma<T>::run(s2, a1, qf[i].z, qf[i].w);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) s[e] += s2[e];
    const bool lo = cb + g <= last, hi = cb + g + 8 <= last;
    const float x0 = lo ? s[0] * scale_log2 : -INFINITY, x1 = lo ? s[1] * scale_log2 : -INFINITY;
    const float x2 = hi ? s[2] * scale_log2 : -INFINITY, x3 = hi ? s[3] * scale_log2 : -INFINITY;
    float mx0 = fmaxf(x0, x2), mx1 = fmaxf(x1, x3);
#pragma unroll
    for (int d = 4; d < 32; d <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(~0u, mx0, d));
      mx1 = fmaxf(mx1, __shfl_xor_sync(~0u, mx1, d));
    }
    const float mn0 = fmaxf(m[0], mx0), mn1 = fmaxf(m[1], mx1);   // finite: key cb is in the chunk
    const float a0 = exp2f(m[0] - mn0), a1 = exp2f(m[1] - mn1);
    const float p0v = exp2f(x0 - mn0), p1v = exp2f(x1 - mn1), p2v = exp2f(x2 - mn0), p3v = exp2f(x3 - mn1);
    l[0] = l[0] * a0 + p0v + p2v;
    l[1] = l[1] * a1 + p1v + p3v;
    m[0] = mn0, m[1] = mn1;
    const uint32_t b0 = transpose8x8(Mma<T>::pack(p0v, p1v)), b1 = transpose8x8(Mma<T>::pack(p2v, p3v));
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      o[t][0] *= a0, o[t][2] *= a0, o[t][1] *= a1, o[t][3] *= a1;
      // dims DG g + t (rows g) and DG g + MT + t (rows g + 8) of keys (2c, 2c + 1) and (2c + 8, 2c + 9)
      auto pair = [&](int r, int e) { return __byte_perm(va[B][r][e / 2], va[B][r + 1][e / 2], (e & 1) ? 0x7632 : 0x5410); };
      const uint32_t a[4] = {pair(0, t), pair(0, MT + t), pair(2, t), pair(2, MT + t)};
      Mma<T>::run(o[t], a, b0, b1);
    }
    cb = next;
    return more;
  };
  if (busy)
    for (;;) {
      if (!step(I0{})) break;
      if (!step(I1{})) break;
    }
  // The warp's sums over its lanes of a head (lanes with the same c), then its record.
#pragma unroll
  for (int d = 4; d < 32; d <<= 1) l[0] += __shfl_xor_sync(~0u, l[0], d), l[1] += __shfl_xor_sync(~0u, l[1], d);
  constexpr int row = 2 + HD + kDecPad;   // a head's (max, sum, O) of a warp
  constexpr int wfloats = dec_warp_floats<HD>();
  float* wrec = sh + warp * wfloats;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int h = 2 * c + e;
    if (h >= G) continue;
    float* r = wrec + h * row;
    if (g == 0) r[0] = m[e], r[1] = l[e];
#pragma unroll
    for (int t = 0; t < MT; ++t) r[2 + DG * g + t] = o[t][e], r[2 + DG * g + MT + t] = o[t][2 + e];
  }
  __syncthreads();
  // The CTA's heads: the warps merged by rescaling to the largest max. A split with no key: max
  // -inf, sum 0 (weight 0 in the merge across splits).
  float* recs = sh + kDecWarps * wfloats;   // [G][S][2 + HD] in the last CTA (S > 1)
  T* ctx_kv = ctx + (size_t(b) * nh + size_t(kvh) * G) * HD;
  for (int i = int(threadIdx.x); i < G * (HD + 2); i += kDecWarps * 32) {
    const int h = i / (HD + 2), d = i % (HD + 2);
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) M = fmaxf(M, sh[w * wfloats + h * row]);
    float sum = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) {
      const float* r = sh + w * wfloats + h * row;
      const float a = r[0] == -INFINITY ? 0.0f : exp2f(r[0] - M);
      sum += r[1] * a;
      if (d >= 2) acc += r[d] * a;
    }
    if (S == 1) {
      if (d >= 2) ctx_kv[size_t(h) * HD + (d - 2)] = from_f<T>(acc / sum);
    } else {
      // This split's record, pushed below: max (log2 units), sum, unnormalized O.
      const float v = d == 0 ? M : d == 1 ? sum : acc;
      recs[G * S * (HD + 2) + i] = v;   // staged after the cluster's records
    }
  }
  if (S == 1) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  __syncthreads();
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");   // every CTA of the cluster runs: its shared memory may be written
  const float* mine = recs + G * S * (HD + 2);
  float* dst = cluster.map_shared_rank(recs, S - 1);
  for (int i = int(threadIdx.x); i < G * (HD + 2); i += kDecWarps * 32) {
    const int h = i / (HD + 2), d = i % (HD + 2);
    dst[(h * S + z) * (HD + 2) + d] = mine[i];
  }
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  if (z != S - 1) return;
  for (int i = int(threadIdx.x); i < G * HD; i += kDecWarps * 32) {
    const int h = i / HD, d = i % HD;
    const float* r = recs + size_t(h) * S * (HD + 2);
    float M = -INFINITY;
    for (int y = 0; y < S; ++y) M = fmaxf(M, r[y * (HD + 2)]);
    float sum = 0.0f, acc = 0.0f;
    for (int y = 0; y < S; ++y) {
      const float* q = r + y * (HD + 2);
      const float a = q[0] == -INFINITY ? 0.0f : exp2f(q[0] - M);
      sum += q[1] * a;
      acc += q[2 + d] * a;
    }
    ctx_kv[size_t(h) * HD + d] = from_f<T>(acc / sum);
  }
#endif
}

// Shared memory of decode_attention_kernel: the warps' records, and with splits the cluster's
// records [group][splits][2 + hd] in the last CTA plus this CTA's own before its push (at most
// 41 KB: group x splits <= 32, within the 48 KB default).
template <int HD>
constexpr size_t decode_smem(int group, int splits) {
  return (size_t(kDecWarps) * dec_warp_floats<HD>() + (splits > 1 ? size_t(group) * (splits + 1) * (2 + HD) : 0)) * 4;
}
static_assert(decode_smem<128>(kDecMaxGroup, kDecMaxRecords / kDecMaxGroup) <= 48 * 1024, "decode attention within the default shared memory");

template <class T, int HD>
void launch_decode(const void* q, const void* k, const void* v, const int* pos, void* ctx, int batch, int heads, int kv_heads, int max_len,
                   int window, float scale, int splits, bool pdl) {
  // A sequence's KV heads side by side in the grid (x): CTAs that run together read whole cache
  // rows (measured equal to sequences first, lab run 247).
  launch_ex("decode_attention_kernel", pdl, -1, splits > 1 ? dim3(1, 1, unsigned(splits)) : dim3(0), decode_attention_kernel<T, HD>,
            dim3(unsigned(kv_heads), unsigned(batch), unsigned(splits)), dim3(kDecWarps * 32), decode_smem<HD>(heads / kv_heads, splits),
            static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), pos, heads, kv_heads, max_len, window,
            scale * 1.4426950408889634f, static_cast<T*>(ctx));
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

bool decode_attention_supported(int head_dim, int heads, int kv_heads) {
  return flash_attention_supported(head_dim) && kv_heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= kDecMaxGroup &&
         compute_capability() >= 80;
}

int decode_attention_splits(int batch, int heads, int kv_heads, int max_len) {
  static const int forced = env_int("PTQKIT_DECODE_ATTN_SPLITS", 0);
  if (compute_capability() < 90) return 1;   // the splits merge in a cluster
  const int group = heads / kv_heads, ctas = std::max(1, batch * kv_heads);
  // Enough CTAs for one an SM, each split at least 4 chunks (one a warp); at most the cluster's
  // records the shared memory holds.
  const int s = forced > 0 ? forced : std::min((sm_count() + ctas - 1) / ctas, max_len / (kDecWarps * kDecChunk));
  return std::clamp(std::min(s, kDecMaxRecords / std::max(1, group)), 1, kDecMaxSplits);
}

void decode_attention(DType dt, const void* q, const void* k_cache, const void* v_cache, const int* pos, void* ctx, int batch, int heads,
                      int kv_heads, int head_dim, int max_len, int window, float scale, int splits, bool pdl) {
  if (!decode_attention_supported(head_dim, heads, kv_heads))
    fail(Errc::usage, "", "head_dim", "decode attention takes head_dim 64, 96 or 128 and at most 8 query heads a KV head on sm_80+, got head_dim " +
                                          std::to_string(head_dim) + ", " + std::to_string(heads) + "/" + std::to_string(kv_heads) + " heads");
  if (dt != DType::F16 && dt != DType::BF16) fail(Errc::usage, "", "dtype", "decode attention takes f16 or bf16");
  if (splits < 1 || splits > kDecMaxSplits || (splits > 1 && compute_capability() < 90) || (heads / kv_heads) * splits > kDecMaxRecords)
    fail(Errc::usage, "", "splits", "decode attention takes 1..8 splits (more than 1 on sm_90 only; group x splits <= 32), got " + std::to_string(splits));
  if (batch <= 0) return;
  const bool h16 = dt == DType::F16;
  auto run = head_dim == 128 ? (h16 ? launch_decode<__half, 128> : launch_decode<__nv_bfloat16, 128>)
           : head_dim == 96  ? (h16 ? launch_decode<__half, 96> : launch_decode<__nv_bfloat16, 96>)
                             : (h16 ? launch_decode<__half, 64> : launch_decode<__nv_bfloat16, 64>);
  run(q, k_cache, v_cache, pos, ctx, batch, heads, kv_heads, max_len, window, scale, splits, pdl);
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
