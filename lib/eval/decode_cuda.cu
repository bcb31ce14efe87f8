// decode_cuda.cu — the decode step's kernels and the engine (contract in decode_cuda.h).
//
// Kernels (one launch each, all reading the position from device memory):
//   embed_rows      X [rows, d] fp32 = table[tokens] (16-bit)
//   rmsnorm_rows    xn [rows, d] 16-bit = X / rms(X) * w, one CTA per row, fp32 statistics
//                   (rmsnorm_rows_vec: the same with the row in registers)
//   rope_append     per (row, head): bias, Qwen3 head norm, rotary at pos + t; q -> 16-bit q,
//                   k, v -> the cache at [b, pos + t] (at batch 1 the attention does this itself;
//                   at 17..32 rows the q, k, v Linear where its kernel does: a16_fold_rope)
//   attend          per (row, head[, split]): scores over the cached positions <= its own
//                   (sliding window too), softmax, weighted sum of V -> ctx 16-bit (splits: one
//                   cluster a head combining in shared memory, or the last split to finish);
//                   a prompt fed from position 0 takes flash_attention (model/attention_cuda.h),
//                   a decode step of 2+ sequences decode_attention (the same header) where the
//                   engine's rule below picks it
//   silu_mul        act = silu(g) * u -> 16-bit
//   rmsnorm_quant_rows_vec, silu_mul_quant_rows (silu_mul_quant_cluster: a cluster of CTAs a row)
//                   the same two with their output quantized to int8 for W8A8 Linears
//                   (DecodeLayer::lin8; the reference is quantize_activations)
//   argmax_rows     next token per sequence, written to the token buffer and the history
// The CPU reference of each is the same stage in lib/model/llama.cpp (attention_cached,
// rmsnorm, head_rmsnorm, apply_rope, silu_mul).
// Folded into the Linears' kernels where measured faster (kernels/a16_path.h): up to 32 rows the
// stacked gate, up Linear writes act itself (a16_fold_silu: no silu_mul launch); at one row NF4's
// o and down Linears write the next RMSNorm's xn (a16_fold_norm: no rmsnorm launch), the other
// formats' split it with the Linear after the norm; at 2+ rows the stacked q, k, v Linear writes q
// and the cache rows rotated (a16_fold_rope: no rope_append launch).
// From 17 rows the norm and silu·mul kernels, and attend without splits, also write their output in
// the wgmma A16 kernel's k-step order (a16_wgmma_x_col), which the Linear after them takes where it
// runs that kernel (a16_offer_wgmma_x: no permute launch of its own).
// The per-layer kernels are launched with programmatic dependent launch (see pdl_begin below).
#include "eval/decode_cuda.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "core/rng.h"
#include "cuda/blas.h"
#include "cuda/half.cuh"
#include "cuda/pdl.cuh"
#include "cuda/random.h"
#include "cuda/runtime.h"
#include "cuda/act8.cuh"
#include "kernels/act_quant.h"
#include "kernels/bench_kernels.h"
#include "kernels/f16_gemv.h"
#include "kernels/nf4.h"
#include "kernels/rotary.cuh"
#include "kernels/w4a16.h"
#include "kernels/w8a8.h"
#include "model/attention_cuda.h"

namespace ptq::cuda {

namespace {

// Four values rounded to T and written with one 8-byte store (p 8-byte aligned).
template <class T>
__device__ __forceinline__ void store4(T* p, float a, float b, float c, float d) {
  union {
    T h[4];
    uint2 u;
  } o;
  o.h[0] = from_f<T>(a), o.h[1] = from_f<T>(b), o.h[2] = from_f<T>(c), o.h[3] = from_f<T>(d);
  *reinterpret_cast<uint2*>(p) = o.u;
}
// The same four values (columns col .. col + 3 of a row, col % 4 == 0, the row's length a multiple
// of 64) at their places in the wgmma A16 kernel's order: two 4-byte stores.
template <class T>
__device__ __forceinline__ void store4_wgmma_order(T* row, int64_t col, float a, float b, float c, float d) {
  union {
    T h[2];
    uint32_t u;
  } lo, hi;
  lo.h[0] = from_f<T>(a), lo.h[1] = from_f<T>(b), hi.h[0] = from_f<T>(c), hi.h[1] = from_f<T>(d);
  *reinterpret_cast<uint32_t*>(row + a16_wgmma_x_col(col)) = lo.u;
  *reinterpret_cast<uint32_t*>(row + a16_wgmma_x_col(col + 2)) = hi.u;
}
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

// Sum over the CTA (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ float block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int w = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, nw = int(blockDim.x) / 32;
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  float s = 0;
  for (int i = 0; i < nw; ++i) s += red[i];
  return s;
}

// The per-layer kernels below are launched with programmatic dependent launch (cuda/pdl.cuh):
// pdl_begin, first, waits for the kernel before, then lets the next kernel launch, so its CTAs
// (an A16 kernel's weight loads) start while this grid runs. That is safe because every kernel
// that follows reads what this one writes only after its own wait, and through L2: the A16 and
// W8A8 kernels read x by __ldcg or cp.async.cg, not the non-coherent path (__ldg), whose stale
// reads under this early trigger failed 7 of 30 decode test runs (W8A16 and NF4, then reading x
// by __ldg; 0 of 20 with __ldcg: docs/lab/2026-11-24-decode-h200.md, runs 16-19 and 27).
// PTQKIT_DECODE_PDL=0 launches them plainly (decode_on below).
__device__ __forceinline__ void pdl_begin() {
  pdl::wait_prior_grid();
  pdl::allow_dependents();
}
bool switch_on(const char* name) { return env_switch(name, true); }
// The decode's switches (benchmarks compare), each on unless its variable is 0 (1 on; anything
// else refused, naming the variable: cuda/runtime.h env_switch):
//   PTQKIT_DECODE_PDL           the small kernels under PDL (else launched plainly)
//   PTQKIT_DECODE_INT8_FUSE     W8A8 Linears' inputs quantized by the norm / silu·mul kernels
//                               before them (else each Linear quantizes its own)
//   PTQKIT_DECODE_NORM_FOLD     at one row the o and down Linears write the next RMSNorm's input
//                               where their kernel does (a16_fold_norm)
//   PTQKIT_DECODE_SILU_FOLD     up to 32 rows the stacked gate, up Linear writes silu·mul where its
//                               kernel does (a16_fold_silu)
//   PTQKIT_DECODE_SILU_CLUSTER  the W8A8 down's silu·mul quantized by a cluster of CTAs a row
//                               (else one CTA a row)
//   PTQKIT_DECODE_ATTN_CLUSTER  the attention's splits of a head combined in a cluster (else by
//                               the last CTA to arrive, through global memory)
//   PTQKIT_DECODE_ROPE_FOLD     a batch-1 decode step's rotary and KV append done by the
//                               attention, 2+ rows' by the q, k, v Linear where its kernel does
//                               (a16_fold_rope; else by rope_append before the attention)
//   PTQKIT_DECODE_XPERM         from 17 rows the norm and silu·mul write x in the wgmma kernel's
//                               order too (DecodeCuda::set_permuted_x)
//   PTQKIT_DECODE_FLASH_PREFILL a prompt fed from position 0 attends by flash attention
//                               (model/attention_cuda.h; else by attend, a CTA a row and head)
//   PTQKIT_DECODE_ATTN_MMA      a decode step of 2+ sequences attends by decode_attention (tensor
//                               cores, a CTA a KV head; else by attend, a CTA a query head) where
//                               the rule below picks it; 2: wherever it can serve (read by
//                               attn_mma_mode, not decode_on: it has three values)
//   PTQKIT_DECODE_NORM_SPLIT    at one row and at 17..32 rows, where the Linear before a norm does
//                               not fold it whole, the norm is split between the Linears around it
//                               (else its kernel)
//   PTQKIT_DECODE_NORM_SPLIT_PAIRS  at 17..32 rows a layer's two norms split both or neither (else
//                               either alone)
enum class Switch { pdl, int8_fuse, norm_fold, silu_fold, silu_cluster, attn_cluster, rope_fold, xperm, flash_prefill, norm_split, norm_split_pairs };
bool decode_on(Switch w) {
  static const bool on[] = {switch_on("PTQKIT_DECODE_PDL"), switch_on("PTQKIT_DECODE_INT8_FUSE"), switch_on("PTQKIT_DECODE_NORM_FOLD"),
                            switch_on("PTQKIT_DECODE_SILU_FOLD"), switch_on("PTQKIT_DECODE_SILU_CLUSTER"), switch_on("PTQKIT_DECODE_ATTN_CLUSTER"),
                            switch_on("PTQKIT_DECODE_ROPE_FOLD"), switch_on("PTQKIT_DECODE_XPERM"), switch_on("PTQKIT_DECODE_FLASH_PREFILL"),
                            switch_on("PTQKIT_DECODE_NORM_SPLIT"), switch_on("PTQKIT_DECODE_NORM_SPLIT_PAIRS")};
  return on[int(w)];
}

template <class T>
__global__ void embed_rows(const T* table, const int* tokens, int d, float* X) {
  const int r = blockIdx.x;
  const T* src = table + size_t(tokens[r]) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) X[size_t(r) * d + i] = to_f(src[i]);
}

constexpr int kNormThreads = 1024;   // a row of 4096 in 4 unrolled loads per thread: latency, not bandwidth, bounds it

// Row i of out normalizes row i * stride + offset of X (the head: each sequence's last token).
template <class T>
__global__ void rmsnorm_rows(const float* X, const float* w, int d, float eps, T* out, int stride = 1, int offset = 0) {
  __shared__ float red[32];
  pdl_begin();
  const float* x = X + (size_t(blockIdx.x) * stride + offset) * d;
  float ss = 0;
#pragma unroll 4
  for (int i = threadIdx.x; i < d; i += blockDim.x) ss += x[i] * x[i];   // unrolled: the loads overlap
  const float inv = rsqrtf(block_sum(ss, red) / float(d) + eps);
#pragma unroll 4
  for (int i = threadIdx.x; i < d; i += blockDim.x) out[size_t(blockIdx.x) * d + i] = from_f<T>(x[i] * inv * w[i]);
}

// The same with 256 threads and the row held in registers (float4 loads, one pass over X): for
// d % 4 == 0 and d <= 4 * 256 * kNormVecMax (run 21: 2.6% faster decode steps at batch 1 than
// rmsnorm_rows' 1024 threads and two passes, which serves the rest and the final norm).
constexpr int kNormVecThreads = 256, kNormVecMax = 8;
// The CTA's row of X normed in fp32: v[k] = float4 (threadIdx.x + 256 k) of X[row] / rms * w, zeros
// past d. Runs the kernel's pdl_begin: the norm's weights (never written by a kernel) are loaded
// before the wait.
__device__ __forceinline__ void normed_row_vec(const float* X, const float* w, int d, float eps, float4 (&v)[kNormVecMax]) {
  __shared__ float red[32];
  const int n4 = d / 4;
  const float4* w4 = reinterpret_cast<const float4*>(w);
  float4 g[kNormVecMax];
#pragma unroll
  for (int k = 0; k < kNormVecMax; ++k) {
    const int i = int(threadIdx.x) + k * kNormVecThreads;
    g[k] = i < n4 ? w4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  pdl_begin();
  const float4* x = reinterpret_cast<const float4*>(X + size_t(blockIdx.x) * d);
  float ss = 0;
#pragma unroll
  for (int k = 0; k < kNormVecMax; ++k) {
    const int i = int(threadIdx.x) + k * kNormVecThreads;
    v[k] = i < n4 ? x[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  }
  const float inv = rsqrtf(block_sum(ss, red) / float(d) + eps);
#pragma unroll
  for (int k = 0; k < kNormVecMax; ++k) v[k] = make_float4(v[k].x * inv * g[k].x, v[k].y * inv * g[k].y, v[k].z * inv * g[k].z, v[k].w * inv * g[k].w);
}
// outp (d % 64 == 0, or null): the row again in the wgmma A16 kernel's order (store4_wgmma_order).
template <class T>
__global__ void rmsnorm_rows_vec(const float* X, const float* w, int d, float eps, T* out, T* outp = nullptr) {
  float4 v[kNormVecMax];
  normed_row_vec(X, w, d, eps, v);
#pragma unroll
  for (int k = 0; k < kNormVecMax; ++k) {
    const int i = int(threadIdx.x) + k * kNormVecThreads;
    if (i >= d / 4) break;
    store4(out + size_t(blockIdx.x) * d + 4 * i, v[k].x, v[k].y, v[k].z, v[k].w);
    if (outp) store4_wgmma_order(outp + size_t(blockIdx.x) * d, 4 * i, v[k].x, v[k].y, v[k].z, v[k].w);
  }
}

struct RopeArgs {
  const float *q, *k, *v;                 // Linear outputs fp32, rows q_stride (q) and kv_stride (k, v) apart
  int q_stride, kv_stride;                // q_dim, kv_dim (apart) or q_dim + 2 kv_dim (one stacked Linear)
  const float *bq, *bk, *bv;              // biases or null
  const float *q_norm, *k_norm;           // [hd] or null
  const float *cos, *sin;                 // [max_len, half]
  const int* pos;                         // the first new token's position
  int T, nh, nkv, hd, half, max_len;
  float eps;
};

// Thread i's cos and sin of position p for rotary (i < 2 half: index i mod half; else 1, 0):
// constant tables, so the attention reads them before its PDL wait.
__device__ __forceinline__ void rope_cos_sin(const RopeArgs& a, int p, float& cs, float& sn) {
  const int i = threadIdx.x, j = i < a.half ? i : i - a.half;
  cs = 1.0f, sn = 0.0f;
  if (i < a.hd && i < 2 * a.half) cs = a.cos[size_t(p) * a.half + j], sn = a.sin[size_t(p) * a.half + j];
}
// Element i = threadIdx.x (< hd) of row r's head h of q (is_q) or k as the Linear wrote it, plus
// its bias; 0 past hd. Plain loads: the Linear before wrote it (PDL).
__device__ __forceinline__ float rope_input(const RopeArgs& a, int r, int h, bool is_q) {
  const int i = threadIdx.x;
  const float* src = is_q ? a.q : a.k;
  const float* bias = is_q ? a.bq : a.bk;
  return i < a.hd ? src[size_t(r) * (is_q ? a.q_stride : a.kv_stride) + h * a.hd + i] + (bias ? bias[h * a.hd + i] : 0.0f) : 0.0f;
}
// That element as the cache and the attention take it: the head's RMSNorm where the model has one
// (nw: Qwen3), then rotated with thread i's (cs, sn) (rope_cos_sin). Every thread of the CTA calls
// it (a reduction and barriers); sh holds hd floats, red 32.
__device__ float rope_rotate(const RopeArgs& a, float x, const float* nw, float cs, float sn, float* sh, float* red) {
  const int i = threadIdx.x;
  if (nw) {
    const float ss = block_sum(i < a.hd ? x * x : 0.0f, red);
    if (i < a.hd) x = x * rsqrtf(ss / float(a.hd) + a.eps) * nw[i];
  }
  __syncthreads();   // an earlier call's reads of sh are done
  if (i < a.hd) sh[i] = x;
  __syncthreads();
  if (i < a.hd && i < 2 * a.half) x = i < a.half ? rotary_lo(sh[i], sh[i + a.half], cs, sn) : rotary_hi(sh[i - a.half], sh[i], cs, sn);
  return x;
}
// Element i of row r's value head h: the Linear's output plus its bias.
__device__ __forceinline__ float value_element(const RopeArgs& a, int r, int h, int i) {
  return a.v[size_t(r) * a.kv_stride + h * a.hd + i] + (a.bv ? a.bv[h * a.hd + i] : 0.0f);
}

// grid (rows, nh + nkv), block hd threads (rounded up to 32). Head h < nh: a query head; else
// the key/value head h - nh. A batch-1 decode step folds this into the attention (attend with
// kRope); the prompt's rows, whose attention reads each other's keys, and batches run it first.
template <class T>
__global__ void rope_append(RopeArgs a, T* qh, T* kc, T* vc) {
  extern __shared__ float sh[];           // hd values + 32 for the reduction
  pdl_begin();
  const int r = blockIdx.x, b = r / a.T, t = r % a.T, p = *a.pos + t;
  const bool is_q = int(blockIdx.y) < a.nh;
  const int h = is_q ? int(blockIdx.y) : int(blockIdx.y) - a.nh, i = threadIdx.x;
  float cs, sn;
  rope_cos_sin(a, p, cs, sn);
  const float x = rope_rotate(a, rope_input(a, r, h, is_q), is_q ? a.q_norm : a.k_norm, cs, sn, sh, sh + a.hd);
  if (i < a.hd && is_q) {
    qh[size_t(r) * a.nh * a.hd + h * a.hd + i] = from_f<T>(x);
  } else if (i < a.hd) {
    const size_t at = (size_t(b) * a.max_len + p) * size_t(a.nkv * a.hd) + size_t(h * a.hd + i);
    kc[at] = from_f<T>(x);
    vc[at] = from_f<T>(value_element(a, r, h, i));
  }
}

// grid (rows, nh, splits), 256 threads; shared: 32 + warps x hd floats, the records (below).
// 16-byte loads: a position's key and value rows are read by L lanes, 8 dims each (hd % 8 == 0,
// L the power of two >= hd / 8), so a warp takes 32 / L positions at a time (warp w the positions
// j0 + (w + warps i) 32 / L + lane / L). One pass over the positions (online softmax): each group
// of L lanes keeps a running max m, its exp-sum l and the unnormalized P·V of its 8 dims over its
// positions, rescaled by e^(m_old - m_new) once a batch of U steps (its keys and values loaded
// together); the warp's position groups are merged by shuffles, the warps in shared memory after
// the kernel's one barrier. (Run 28: 2-byte loads, a warp per position, ran the batch-32 attention
// at 2.85 ms a step against 1.51 ms in the 16-byte form. Runs 165-166: the one pass against the
// two passes it replaced (scores into shared memory, a softmax, then P·V, four barriers): batch 8
// +1.6-3.3%, batch 32 +0.7-0.9%, prefill +5%; 4 steps a batch (80 registers, or 64 with spills),
// and a warp's own cp.async ring of 2-4 stages in shared memory, were slower than 2 steps in
// registers.) With no scores in shared memory the cache's length is not bounded by it. q, K, V and
// the partials through L2 (__ldcg): q is written by the kernel before under PDL, the partials by
// other CTAs of this one. Out: ctx [rows, nh hd]; where ctx_perm is set (one split a head), the same
// values again at their columns in the wgmma A16 kernel's order (a16_wgmma_x_col), the o
// projection's x without its permute pass.
constexpr int kAttnMaxWarps = 8, kMaxHd = 256, kMaxSplits = 16, kSplitBelow = 512, kSplitCtas = 768, kSplitMinPositions = 64;   // a CTA of 8 warps (32 at batch 1 was 0.55 ms a step; splits instead)
constexpr int kAttnThreads = 32 * kAttnMaxWarps;
constexpr int kClusterSplits = 8;   // the most splits combined in a cluster (the portable cluster size)
// Shared memory of attend: the reduction (32), the warps' P·V sums (warps x hd), the CTA's record
// (2 + hd) and, clustered, every split's record (kClusterSplits x (2 + hd)).
constexpr size_t attend_smem(int warps, int hd, bool clustered) {
  return size_t(32 + warps * hd + (2 + hd) * (clustered ? 1 + kClusterSplits : 1)) * 4;
}
// ctx_row [hd] = the S records [S][2 + hd] (max, exp-sum, unnormalized P·V) combined: one pass
// over the splits in split order, rescaling the running sums at each new max (unrolled by 4: the
// loads of 4 splits issue together; all 16 at once took 164 registers). Records in global memory
// (written by other CTAs) are read through L2 (__ldcg), those in shared memory plainly.
template <bool kGlobal, class T>
__device__ __forceinline__ void combine_splits(int S, int hd, const float* recs, T* ctx_row) {
  auto ld = [](const float* p) {
    if constexpr (kGlobal) return __ldcg(p);
    else return *p;
  };
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float M = -FLT_MAX, tot = 0, o = 0;
#pragma unroll 4
    for (int z = 0; z < S; ++z) {
      const float* q = recs + z * (2 + hd);
      const float mz = ld(q), sz = ld(q + 1), oz = ld(q + 2 + i);
      if (sz > 0.0f) {
        const float Mn = fmaxf(M, mz), a = tot > 0.0f ? __expf(M - Mn) : 0.0f, b = __expf(mz - Mn);
        tot = tot * a + sz * b;
        o = o * a + oz * b;
        M = Mn;
      }
    }
    ctx_row[i] = from_f<T>(o / tot);
  }
}
// With gridDim.z = S > 1 (flash-decoding, where CTAs are few: batch 1), CTA z takes the z-th of
// S equal runs of the positions and forms its record: its max, its exp-sum and its unnormalized
// P·V. One CTA then rescales and adds the S records in split order:
// ctx = Σ_z e^(m_z - M) o_z / Σ_z e^(m_z - M) sum_z. Where the launch makes the S CTAs of a head one
// cluster (partial null; S <= kClusterSplits, sm_90) each CTA writes its record into the shared
// memory of the cluster's last CTA, which combines after one cluster barrier. Otherwise the records
// go to partial [rows, nh, S, 2 + hd] and the last of the head's S CTAs to arrive (arrivals
// [rows, nh], reset by it) combines them from there: a global write, an atomic and a read, each an
// L2 round trip on the step's critical path (lab run 104: the cluster form 1.3-3.4% faster batch-1 steps).
// With kRope (a batch-1 decode step) the CTA forms q, and the CTA whose split holds the
// new position its key and value, from the q, k, v Linear's output itself (rope_rotate:
// rope_append's arithmetic, rounded to T as the cache holds them; cos and sin read before the
// wait, the three inputs together after it); the CTA of the first query head of a key/value group
// appends them to the cache. No CTA reads that position from the cache in this launch, so the
// append needs no ordering here (lab runs 105, 108: a kernel less a layer, batch 1 W4A16 +2.7%,
// NF4 +2.2%). Its own instantiation: in the one kernel the fold's code took the attention from 64
// to 86 registers, 2 CTAs an SM instead of 3, and prefill and batch 8 lost 4-8% (run 110).
// Registers: 64 (4 CTAs an SM) without kRope; 105 with it (2 CTAs an SM: batch 1 has few CTAs).
// Steps a batch of loads (U): 2 at 64 registers (4, or 64 with spills, were slower: runs 165-166);
// with kRope 4, so that a split's positions in a batch-1 step (64 at head size 128: 6 splits of a
// 384-long cache) are all in flight before the wait: decode batch 1 +0.3-0.7% (lab run 190).
template <class T, int L, bool kRope>
__global__ void __launch_bounds__(kAttnThreads, kRope ? 1 : 4) attend(const T* qh, T* kc, T* vc, const int* pos, int T_, int nh, int nkv, int hd, int max_len, int window,
                       float scale, T* ctx, T* ctx_perm, float* partial, int* arrivals, RopeArgs rope) {
  constexpr int P = 32 / L, U = kRope ? 4 : 2;   // positions per warp step; steps per batch of loads in flight
  extern __shared__ float sh[];
  float* red = sh;
  float* part = red + 32;   // [warps][hd]
  float* rec = part + blockDim.x / 32 * hd;   // [2 + hd]: this CTA's record (S > 1)
  float* recs = rec + 2 + hd;                 // [S][2 + hd]: every split's record, in the combining CTA (clustered)
  const bool clustered = gridDim.z > 1 && !partial;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (clustered) asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");   // this CTA runs (waited for before the pushes)
#endif
  const int r = blockIdx.x, b = r / T_, t = r % T_, h = blockIdx.y, kvh = h / (nh / nkv);
  // Before the wait: the position and the first batch of key and value rows that earlier steps
  // wrote (positions < *pos). Every kernel before the one this waits for has completed (each waits
  // for its own predecessor before it lets the next one launch), so those are final.
  const int p0 = *pos, end = p0 + t, first = window > 0 ? max(0, end - window + 1) : 0;
  const int S = gridDim.z, chunk = (end - first + S) / S;   // positions per split (the last may hold fewer)
  const int j0 = first + int(blockIdx.z) * chunk, last = min(end, j0 + chunk - 1);
  float* head_part = partial ? partial + (size_t(r) * nh + h) * S * size_t(2 + hd) : nullptr;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32, stride = nwarps * P;
  const int sub = lane / L, d0 = (lane % L) * 8;
  const bool on = d0 < hd;
  const int kvw = nkv * hd;
  const T* K = kc + size_t(b) * max_len * kvw + kvh * hd + (on ? d0 : 0);   // lanes past hd read dims 0..7, unused
  const T* V = vc + size_t(b) * max_len * kvw + kvh * hd + (on ? d0 : 0);
  auto row = [&](const T* base, int j) { return __ldcg(reinterpret_cast<const uint4*>(base + size_t(j) * kvw)); };
  const int jw = j0 + warp * P + sub;   // the lane's first position; the batch's are jw + u stride, clamped to last
  uint4 kr[U], vr[U];
  bool early[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int j = min(jw + u * stride, last);
    early[u] = j0 <= last && j < p0;
    if (early[u]) kr[u] = row(K, j), vr[u] = row(V, j);
  }
  float cs = 1.0f, sn = 0.0f;   // the new position's rotary (kRope)
  if constexpr (kRope) rope_cos_sin(rope, end, cs, sn);
  pdl_begin();
  if (j0 > last) {   // an empty split (uniform over the CTA; S > 1)
    for (int i = threadIdx.x; i < hd + 2; i += blockDim.x) rec[i] = i == 0 ? -FLT_MAX : 0.0f;
  } else {
    float q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const bool fresh = kRope && last == end;   // this split holds the new position, formed here (uniform)
    uint4 kn = make_uint4(0, 0, 0, 0), vn = kn;   // its key and value rows (dims d0 .. d0 + 7), as the cache holds them
    if constexpr (kRope) {
      // part (written only after P·V) holds q, the new key and value, and rope_rotate's scratch.
      // The q, k and v inputs are read together: one L2 round trip.
      const int i = threadIdx.x;
      const float xq = rope_input(rope, r, h, true), xk = fresh ? rope_input(rope, r, kvh, false) : 0.0f;
      const float xv = fresh && i < hd ? value_element(rope, r, kvh, i) : 0.0f;
      const float x = rope_rotate(rope, xq, rope.q_norm, cs, sn, part + 3 * hd, red);
      if (i < hd) part[i] = to_f(from_f<T>(x));
      if (fresh) {
        const float k = rope_rotate(rope, xk, rope.k_norm, cs, sn, part + 3 * hd, red);
        if (i < hd) part[hd + i] = k, part[2 * hd + i] = xv;
      }
      __syncthreads();
      if (on) {
        T ke[8], ve[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) q[e] = part[d0 + e], ke[e] = from_f<T>(part[hd + d0 + e]), ve[e] = from_f<T>(part[2 * hd + d0 + e]);
        if (fresh) kn = *reinterpret_cast<const uint4*>(ke), vn = *reinterpret_cast<const uint4*>(ve);
      }
      if (fresh && h % (nh / nkv) == 0 && i < hd) {
        const size_t at = (size_t(b) * max_len + end) * size_t(kvw) + size_t(kvh * hd + i);
        kc[at] = from_f<T>(part[hd + i]);
        vc[at] = from_f<T>(part[2 * hd + i]);
      }
    } else if (on) {
      const uint4 u = __ldcg(reinterpret_cast<const uint4*>(qh + size_t(r) * nh * hd + h * hd + d0));
      const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int i = 0; i < 8; ++i) q[i] = to_f(e[i]);
    }
    // A row of the cache, or the new position's where this CTA formed it.
    auto key = [&](int j) { return fresh && j == end ? kn : row(K, j); };
    auto value = [&](int j) { return fresh && j == end ? vn : row(V, j); };
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (!early[u]) {
        const int j = min(jw + u * stride, last);
        kr[u] = key(j), vr[u] = value(j);
      }
    // A batch of U rows of K and of V per lane loaded, then used (loads inside the per-position
    // branch ran one at a time). jb - sub, the warp's first position of the batch, is uniform over
    // the warp. Positions past last score -FLT_MAX and weigh 0.
    float m = -FLT_MAX, l = 0, acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int jb = jw; jb - sub <= last; jb += U * stride) {
      if (jb != jw)
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int j = min(jb + u * stride, last);
          kr[u] = key(j), vr[u] = value(j);
        }
      float d[U], mb = m;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const T* k = reinterpret_cast<const T*>(&kr[u]);
        float e = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) e = fmaf(q[i], to_f(k[i]), e);
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1) e += __shfl_xor_sync(0xffffffffu, e, o);
        d[u] = jb + u * stride <= last ? e * scale : -FLT_MAX;
        mb = fmaxf(mb, d[u]);
      }
      const float a = __expf(m - mb);   // 1 where the max held; 0 from -FLT_MAX
      l *= a;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] *= a;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const float pj = jb + u * stride <= last ? __expf(d[u] - mb) : 0.0f;
        const T* v = reinterpret_cast<const T*>(&vr[u]);
        l += pj;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = fmaf(pj, to_f(v[i]), acc[i]);
      }
      m = mb;
    }
    // The warp's P position groups by shuffles, then the warps in shared memory: (m, l, acc)
    // merged by rescaling to the larger max (a group with no position: -FLT_MAX, 0, 0, weight 0).
#pragma unroll
    for (int o = L; o < 32; o <<= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o), mm = fmaxf(m, m2);
      const float a = __expf(m - mm), c = __expf(m2 - mm);
      l = l * a + l2 * c;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = acc[i] * a + __shfl_xor_sync(0xffffffffu, acc[i], o) * c;
      m = mm;
    }
    if (sub == 0 && on)
#pragma unroll
      for (int i = 0; i < 8; ++i) part[warp * hd + d0 + i] = acc[i];
    if (lane == 0) red[warp] = m, red[16 + warp] = l;
    __syncthreads();
    float M = -FLT_MAX, tot = 0;
    for (int w = 0; w < nwarps; ++w) M = fmaxf(M, red[w]);
    for (int w = 0; w < nwarps; ++w) tot += red[16 + w] * __expf(red[w] - M);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
      float o = 0;
      for (int w = 0; w < nwarps; ++w) o += part[w * hd + i] * __expf(red[w] - M);
      if (S > 1) {
        rec[2 + i] = o;
      } else {
        const T e = from_f<T>(o / tot);
        ctx[size_t(r) * nh * hd + h * hd + i] = e;
        if (ctx_perm) ctx_perm[size_t(r) * nh * hd + size_t(a16_wgmma_x_col(h * hd + i))] = e;   // the o projection's x (S = 1 only)
      }
    }
    if (S > 1 && threadIdx.x == 0) rec[0] = M, rec[1] = tot;
  }
  if (S == 1) return;
  T* ctx_row = ctx + size_t(r) * nh * hd + h * hd;
  __syncthreads();
  if (clustered) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // The push: every CTA has started (the arrival at its start), so the last CTA's shared memory
    // may be written; the release-acquire barrier then orders the writes before its reads.
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
    float* dst = cluster.map_shared_rank(recs, S - 1) + blockIdx.z * (2 + hd);
    for (int i = threadIdx.x; i < hd + 2; i += blockDim.x) dst[i] = rec[i];
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    if (int(blockIdx.z) == S - 1) combine_splits<false>(S, hd, recs, ctx_row);
#endif
    return;
  }
  float* out = head_part + blockIdx.z * size_t(2 + hd);
  for (int i = threadIdx.x; i < hd + 2; i += blockDim.x) out[i] = rec[i];
  __shared__ int is_last;
  int* arrived = arrivals + size_t(r) * nh + h;
  // The combine: thread 0 counts the arrival with an acquire-release atomic after a barrier (its
  // release covers the CTA's partial, ordered before it by the barrier: no fence); the last CTA
  // walks the splits once.
  __syncthreads();
  if (threadIdx.x == 0) {
    int before;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(before) : "l"(arrived) : "memory");
    is_last = before == S - 1;
    if (is_last) *arrived = 0;   // ready for the next step (every split has arrived)
  }
  __syncthreads();
  if (is_last) combine_splits<true>(S, hd, head_part, ctx_row);
}

template <class T>
using AttendKernel = void (*)(const T*, T*, T*, const int*, int, int, int, int, int, int, float, T*, T*, float*, int*, RopeArgs);
// The kernel for head size hd (decode_supported: hd % 8 == 0, hd <= 256), with the rotary folded in or not.
template <class T, bool kRope>
AttendKernel<T> attend_kernel_of(int hd) {
  const int lanes = hd / 8;
  return lanes <= 1 ? attend<T, 1, kRope> : lanes <= 2 ? attend<T, 2, kRope> : lanes <= 4 ? attend<T, 4, kRope> : lanes <= 8 ? attend<T, 8, kRope>
       : lanes <= 16 ? attend<T, 16, kRope> : attend<T, 32, kRope>;
}
template <class T>
AttendKernel<T> attend_kernel(int hd, bool rope) { return rope ? attend_kernel_of<T, true>(hd) : attend_kernel_of<T, false>(hd); }

// act [rows, f] = silu(g) * u; g and u rows `stride` apart (f apart, or 2f: one stacked gate_up Linear).
template <class T>
__global__ void silu_mul(const float* g, const float* u, int64_t f, int64_t stride, int64_t n, T* out) {
  pdl_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const int64_t at = i / f * stride + i % f;
    out[i] = from_f<T>(silu_times(g[at], u[at]));
  }
}

// The same, 4 values a thread (f and stride multiples of 4): 16-byte loads, one 8-byte store; outp
// (f % 64 == 0, or null): act again in the wgmma A16 kernel's order (store4_wgmma_order).
template <class T>
__global__ void silu_mul4(const float* g, const float* u, int64_t f, int64_t stride, int64_t n, T* out, T* outp = nullptr) {
  pdl_begin();
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i < n) {
    const int64_t at = i / f * stride + i % f;
    const float4 x = __ldcg(reinterpret_cast<const float4*>(g + at)), y = __ldcg(reinterpret_cast<const float4*>(u + at));
    const float a = silu_times(x.x, y.x), b = silu_times(x.y, y.y), c = silu_times(x.z, y.z), d = silu_times(x.w, y.w);
    store4(out + i, a, b, c, d);
    if (outp) store4_wgmma_order(outp + i / f * f, i % f, a, b, c, d);
  }
}

// W8A8 Linears after the norm or the silu·mul (DecodeLayer::lin8): the producer quantizes its own
// output, one CTA per row. Each value is rounded to T exactly as rmsnorm_rows_vec / silu_mul4 store
// it, then quantized as quantize_rows_vec_kernel quantizes what it reads (act8::row_scale, code_of):
// the codes and scales of the two kernels, in one launch.
template <class T>
__device__ __forceinline__ float rounded(float x) {
  return to_f(from_f<T>(x));
}
template <class T>
__global__ void rmsnorm_quant_rows_vec(const float* X, const float* w, int d, float eps, bool per_token, float static_scale, int8_t* q, float* s) {
  float4 v[kNormVecMax];
  normed_row_vec(X, w, d, eps, v);
  float m = 0;
#pragma unroll
  for (int k = 0; k < kNormVecMax; ++k) {   // past the row: zeros
    v[k] = make_float4(rounded<T>(v[k].x), rounded<T>(v[k].y), rounded<T>(v[k].z), rounded<T>(v[k].w));
    m = fmaxf(m, fmaxf(fmaxf(fabsf(v[k].x), fabsf(v[k].y)), fmaxf(fabsf(v[k].z), fabsf(v[k].w))));
  }
  const float scale = act8::row_scale(m, per_token, static_scale, s);
#pragma unroll
  for (int k = 0; k < kNormVecMax; ++k) {
    const int i = int(threadIdx.x) + k * kNormVecThreads;
    if (i >= d / 4) break;
    act8::store_codes4(q + size_t(blockIdx.x) * d + 4 * i, v[k].x, v[k].y, v[k].z, v[k].w, scale);
  }
}

// f % 4 == 0 and f <= 4 x 1024 x kSiluQuantMax (14336 on Llama 3 8B: 4 values a thread 4 times).
constexpr int kSiluQuantThreads = 1024, kSiluQuantMax = 4;
template <class T>
__global__ void __launch_bounds__(kSiluQuantThreads) silu_mul_quant_rows(const float* g, const float* u, int f, int64_t stride, bool per_token,
                                                                          float static_scale, int8_t* q, float* s) {
  pdl_begin();
  const float4* g4 = reinterpret_cast<const float4*>(g + size_t(blockIdx.x) * stride);
  const float4* u4 = reinterpret_cast<const float4*>(u + size_t(blockIdx.x) * stride);
  const int n4 = f / 4;
  float4 a[kSiluQuantMax];
  float m = 0;
#pragma unroll
  for (int k = 0; k < kSiluQuantMax; ++k) {
    const int i = int(threadIdx.x) + k * kSiluQuantThreads;
    a[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < n4) {
      const float4 x = __ldcg(g4 + i), y = __ldcg(u4 + i);
      a[k] = make_float4(rounded<T>(silu_times(x.x, y.x)), rounded<T>(silu_times(x.y, y.y)), rounded<T>(silu_times(x.z, y.z)), rounded<T>(silu_times(x.w, y.w)));
    }
    m = fmaxf(m, fmaxf(fmaxf(fabsf(a[k].x), fabsf(a[k].y)), fmaxf(fabsf(a[k].z), fabsf(a[k].w))));
  }
  const float scale = act8::row_scale(m, per_token, static_scale, s);
#pragma unroll
  for (int k = 0; k < kSiluQuantMax; ++k) {
    const int i = int(threadIdx.x) + k * kSiluQuantThreads;
    if (i >= n4) break;
    act8::store_codes4(q + size_t(blockIdx.x) * f + 4 * i, a[k].x, a[k].y, a[k].z, a[k].w, scale);
  }
}

// The same spread over a cluster of kSiluClusterCtas CTAs a row (sm_90: grid (C, rows), cluster
// (C, 1, 1)): each CTA forms its run of the row in registers and its max |a|, which it writes into
// every CTA of the cluster (distributed shared memory); then each CTA quantizes its own run. One
// CTA a row (silu_mul_quant_rows) pulls the row's 2 f fp32 values through one SM, whose loads in
// flight bound it (~5 us a layer at f = 11008, lab run 73). C = 8: 4 measured 0.9% slower, 16
// (a non-portable cluster size) 0.5% faster at batch 1 and 8 but 5% slower at prefill (lab runs
// 79-80). f % 4 == 0 and f <= 4 x C x 256 x kSiluClusterMax.
constexpr int kSiluClusterCtas = 8, kSiluClusterThreads = 256, kSiluClusterMax = 4;
template <class T>
__global__ void __launch_bounds__(kSiluClusterThreads) silu_mul_quant_cluster(const float* g, const float* u, int f, int64_t stride, bool per_token,
                                                                               float static_scale, int8_t* q, float* s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  __shared__ float warp_max[kSiluClusterThreads / 32];
  __shared__ float maxes[kSiluClusterCtas];   // every CTA's max, written by that CTA
  if (per_token) asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");   // this CTA runs (waited for before the pushes)
  pdl_begin();
  cg::cluster_group cluster = cg::this_cluster();
  const int r = int(blockIdx.y), c = int(cluster.block_rank()), C = int(cluster.num_blocks());
  const int n4 = f / 4, per = (n4 + C - 1) / C, i0 = c * per, i1 = min(n4, i0 + per);
  const float4* g4 = reinterpret_cast<const float4*>(g + size_t(r) * stride);
  const float4* u4 = reinterpret_cast<const float4*>(u + size_t(r) * stride);
  float4 x[kSiluClusterMax], y[kSiluClusterMax], a[kSiluClusterMax];
#pragma unroll
  for (int k = 0; k < kSiluClusterMax; ++k) {   // every load first: they are the kernel's latency
    const int i = i0 + int(threadIdx.x) + k * kSiluClusterThreads;
    if (i < i1) x[k] = __ldcg(g4 + i), y[k] = __ldcg(u4 + i);
  }
  float m = 0;
#pragma unroll
  for (int k = 0; k < kSiluClusterMax; ++k) {
    const int i = i0 + int(threadIdx.x) + k * kSiluClusterThreads;
    a[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < i1)
      a[k] = make_float4(rounded<T>(silu_times(x[k].x, y[k].x)), rounded<T>(silu_times(x[k].y, y[k].y)), rounded<T>(silu_times(x[k].z, y[k].z)),
                         rounded<T>(silu_times(x[k].w, y[k].w)));
    m = fmaxf(m, fmaxf(fmaxf(fabsf(a[k].x), fabsf(a[k].y)), fmaxf(fabsf(a[k].z), fabsf(a[k].w))));
  }
  float scale = static_scale;
  if (per_token) {
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
    __syncthreads();
    // Each CTA writes its max into every CTA's maxes[c] (distributed shared memory), between a
    // barrier that every CTA has started (arrived at its start: hidden behind the loads) and one
    // that every write has landed; then the row's max is read locally. One exposed cluster barrier,
    // and no CTA reads another's shared memory, so none waits for readers before it leaves (lab
    // run 78: +0.5% W8A8 against cluster.sync, remote reads, cluster.sync).
    float v = 0;
    for (int w = 0; w < kSiluClusterThreads / 32; ++w) v = fmaxf(v, warp_max[w]);
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
    if (int(threadIdx.x) < C) *cluster.map_shared_rank(&maxes[c], int(threadIdx.x)) = v;
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    m = 0;
    for (int j = 0; j < C; ++j) m = fmaxf(m, maxes[j]);
    scale = m / 127.0f;
  }
  if (!(scale > 0)) scale = 1.0f;
  if (c == 0 && threadIdx.x == 0) s[r] = scale;
#pragma unroll
  for (int k = 0; k < kSiluClusterMax; ++k) {
    const int i = i0 + int(threadIdx.x) + k * kSiluClusterThreads;
    if (i < i1) act8::store_codes4(q + size_t(r) * f + 4 * i, a[k].x, a[k].y, a[k].z, a[k].w, scale);
  }
#endif
}

// One CTA per sequence: the argmax of its logits row (lowest id on ties) -> tokens[b] and
// history[*step * batch + b]; the last CTA's thread 0 advances *step.
__global__ void argmax_rows(const float* logits, int vocab, int* tokens, int* history, int* step, int batch) {
  __shared__ float bv[1024];
  __shared__ int bi[1024];
  const float* l = logits + size_t(blockIdx.x) * vocab;
  float best = -FLT_MAX;
  int arg = 0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    if (l[i] > best) best = l[i], arg = i;
  bv[threadIdx.x] = best;
  bi[threadIdx.x] = arg;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (int(threadIdx.x) < o) {
      const float v2 = bv[threadIdx.x + o];
      const int i2 = bi[threadIdx.x + o];
      if (v2 > bv[threadIdx.x] || (v2 == bv[threadIdx.x] && i2 < bi[threadIdx.x])) bv[threadIdx.x] = v2, bi[threadIdx.x] = i2;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    tokens[blockIdx.x] = bi[0];
    if (history) history[size_t(*step) * batch + blockIdx.x] = bi[0];
  }
}

__global__ void advance(int* pos, int by, int* step) {
  *pos += by;
  if (step) *step += 1;
}

cudaStream_t stream() { return static_cast<cudaStream_t>(current_stream()); }

// `one_step` captured into *exec on stream s (made the current stream meanwhile: every kernel and
// cuBLAS call of this thread goes to it). False, with the error state cleared, where the driver
// refuses the capture or a call in it throws: the caller launches plainly.
bool capture_step(cudaStream_t s, const std::function<void()>& one_step, cudaGraphExec_t* exec) {
  cudaGraph_t graph = nullptr;
  set_current_stream(s);
  bool ok = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess;
  if (ok) {
    try {
      one_step();
    } catch (const Error&) {
      ok = false;
    }
    ok = cudaStreamEndCapture(s, &graph) == cudaSuccess && ok;
    ok = ok && cudaGraphInstantiate(exec, graph, 0) == cudaSuccess;
  }
  set_current_stream(nullptr);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
  return ok;
}

DeviceBuffer<float> upload_f32(const VecF& v, const char* what) {
  DeviceBuffer<float> d(size_t(std::max<Eigen::Index>(v.size(), 1)), what);
  if (v.size()) copy_to_device(d.get(), v.data(), size_t(v.size()) * 4);
  return d;
}

}  // namespace

bool decode_supported(const LlamaConfig& c, std::string* why) {
  std::string w;
  if (c.head_dim > kMaxHd) w = "head_dim above 256";
  else if (c.head_dim % 8 != 0) w = "head_dim not a multiple of 8";
  if (why) *why = w;
  return w.empty();
}

struct DecodeCuda::Impl {
  DecodeWeights w;
  int B = 1, max_len = 0, pos = 0;
  bool graphs = true, graph_used = false;
  bool xperm = decode_on(Switch::xperm), xperm_used = false;   // set_permuted_x; whether a Linear took the permuted x
  bool rope_in_linear = decode_on(Switch::rope_fold), rope_in_linear_used = false;   // set_rope_in_linear; whether a Linear took it
  bool norm_split_rows_used = false;   // whether a Linear at 17..32 rows read a split norm
  // By rows: whether the Linears after the input norm, the post-attention norm, the silu·mul and
  // the attention took x in the wgmma order (-1: not yet seen; the first step of a row count writes
  // and offers it, later ones only where it was taken: f16's and NF4's Linears never take it, nor
  // W8's o projection).
  std::map<int64_t, std::array<int8_t, 4>> xperm_taken;
  bool moe_layers = false;   // routing on the host each step: no graphs
  // feed() and next_greedy() at one token a sequence (generate's loop) as a CUDA graph (run_fed):
  // the step from tokens_d and the position's advance, captured once a plain one-token step has
  // run (the first step of a row count decides what later ones take), replayed on the legacy
  // stream (ordered with the copies before and after it) while the buffers it was captured with
  // stand.
  struct StepGraph {
    cudaGraphExec_t exec = nullptr;
    int64_t rows_cap = 0;   // the per-row buffers it was captured with (grow() replaces them)
    PoolHold workspaces;    // the pool blocks its kernels were given, kept from other users while it lives
    ~StepGraph() {
      cudaStreamSynchronize(nullptr);   // a replay in flight ends before its workspaces go back to the pool
      if (exec) cudaGraphExecDestroy(exec);
    }
  };
  std::unique_ptr<StepGraph> feed_graph;
  bool one_token_plain = false, feed_capture_refused = false;
  struct LayerDev {
    DeviceBuffer<float> in_norm, post_norm, q_norm, k_norm, bq, bk, bv;
    DeviceBuffer<uint16_t> K, V;   // [B, max_len, kv_dim] in dt
  };
  std::vector<LayerDev> L;
  DeviceBuffer<float> final_norm, cos, sin;
  DeviceBuffer<int> pos_d, step_d, tokens_d, history_d;
  // Per-row buffers, grown to the largest step seen.
  int64_t rows_cap = 0;
  DeviceBuffer<float> X, qkv, gu, logits, partial;   // qkv: q, k, v outputs; gu: gate, up outputs
  DeviceBuffer<int> arrivals;   // [split rows, nh]: attention splits arrived, zero between launches
  DeviceBuffer<int> norm_arrivals;   // [1]: the folded norm's CTAs arrived (a16_fold_norm), zero between launches
  DeviceBuffer<float> row_ss;        // [2][rows][ceil(d / 16)]: a split norm's sums of squares (A16RowNorm row_ss), after o and after down
  // A split norm's sums in row_ss: slot 0 after the o projection (the post-attention norm), 1 after down (the next input norm).
  float* row_ss_at(int slot) { return row_ss.get() + size_t(slot) * size_t(rows_cap) * size_t((w.c.hidden_size + 15) / 16); }
  // Per row count and layer, the Linears after its norms (0: post-attention, 1: input) that did
  // not take a split norm: their norm runs whole from then on (set by the first step of that row
  // count, before a capture).
  std::map<int64_t, std::vector<std::array<bool, 2>>> split_declined_at;
  DeviceBuffer<uint16_t> xn, qh, ctx, act;
  DeviceBuffer<uint16_t> xn_perm, act_perm, ctx_perm;   // xn, act and ctx in the wgmma A16 kernel's order (d, f, q_dim multiples of 64)
  DeviceBuffer<int8_t> xq8;   // a W8A8 Linear's input quantized by its producer (DecodeLayer::lin8) [rows, max(d, f)]
  DeviceBuffer<float> sx8;    // its per-row scales

  void grow(int64_t rows) {
    if (rows <= rows_cap) return;
    const LlamaConfig& c = w.c;
    const int64_t d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), f = c.intermediate_size;
    X = DeviceBuffer<float>(size_t(rows * d), "decode residual");
    qkv = DeviceBuffer<float>(size_t(rows * (qd + 2 * kvd)), "decode q, k, v");
    gu = DeviceBuffer<float>(size_t(rows * 2 * f), "decode gate, up");
    xn = DeviceBuffer<uint16_t>(size_t(rows * d), "decode normed x");
    qh = DeviceBuffer<uint16_t>(size_t(rows * qd), "decode rotated q");
    ctx = DeviceBuffer<uint16_t>(size_t(rows * qd), "decode attention context");
    act = DeviceBuffer<uint16_t>(size_t(rows * std::max<int64_t>(f, c.moe_intermediate_size)), "decode MLP activation");
    if (d % 64 == 0) xn_perm = DeviceBuffer<uint16_t>(size_t(rows * d), "decode normed x, wgmma order");
    if (f % 64 == 0) act_perm = DeviceBuffer<uint16_t>(size_t(rows * f), "decode MLP activation, wgmma order");
    if (qd % 64 == 0) ctx_perm = DeviceBuffer<uint16_t>(size_t(rows * qd), "decode attention context, wgmma order");
    xq8 = DeviceBuffer<int8_t>(size_t(rows * std::max(d, f)), "decode int8 activations");
    sx8 = DeviceBuffer<float>(size_t(rows), "decode int8 activation scales");
    // Split attention runs where rows x heads < kSplitBelow: only those rows need partials.
    const int64_t split_rows = std::min<int64_t>(rows, std::max(1, (kSplitBelow - 1) / c.num_attention_heads));
    partial = DeviceBuffer<float>(size_t(split_rows * c.num_attention_heads * kMaxSplits * (c.head_dim + 2)), "decode attention partials");
    arrivals = DeviceBuffer<int>(size_t(split_rows * c.num_attention_heads), "decode attention arrivals");
    fill_bytes(arrivals.get(), 0, size_t(split_rows * c.num_attention_heads) * 4);
    if (!norm_arrivals.get()) {
      norm_arrivals = DeviceBuffer<int>(1, "decode folded-norm arrivals");
      fill_bytes(norm_arrivals.get(), 0, 4);
    }
    row_ss = DeviceBuffer<float>(size_t(2 * rows * ((d + 15) / 16)), "decode split-norm sums");   // row_ss_at's two slots
    if (check)   // PTQKIT_DECODE_CHECK: no stale bytes read as a stage's output
      for (auto [p, n] : {std::pair<void*, size_t>{X.get(), size_t(rows * d) * 4}, {qkv.get(), size_t(rows * (qd + 2 * kvd)) * 4},
                          {gu.get(), size_t(rows * 2 * f) * 4}, {xn.get(), size_t(rows * d) * 2}, {ctx.get(), size_t(rows * qd) * 2},
                          {act.get(), size_t(rows * f) * 2}})
        fill_bytes(p, 0, n);
    rows_cap = rows;
  }

  // PTQKIT_DECODE_PROFILE=1: each stage's GPU time summed over the layers (plain launches only),
  // printed by decode_greedy: where a step's time goes.
  bool profile = env_switch("PTQKIT_DECODE_PROFILE", false);
  std::vector<cudaEvent_t> ev;
  static constexpr int kStages = 10;   // 9 per layer (norm1 ... down), then the head
  std::vector<double> stage_ms = std::vector<double>(kStages, 0.0);
  int ev_n = 0;
  // PTQKIT_DECODE_CHECK=1: after each stage (plain launches only) the step's buffers are read back
  // and the first stage that leaves a non-finite value in one of them is named on stderr, once per
  // buffer: where a NaN or an infinity comes from.
  bool check = env_switch("PTQKIT_DECODE_CHECK", false);
  int64_t check_rows = 0;
  int check_n = 0;
  std::map<std::string, bool> check_seen;
  void check_stage() {
    // mark() k of a layer ends the stage before it: the layer's first ends the previous layer's down (or the embedding).
    static const char* names[kStages - 1] = {"down (or the embedding)", "norm1", "qkv", "rope+append", "attention", "o", "norm2", "gate_up", "silu"};
    PTQ_CUDA(cudaDeviceSynchronize());
    const LlamaConfig& c = w.c;
    const int64_t r = check_rows, d = c.hidden_size, f = c.intermediate_size;
    auto scan = [&](const char* what, const void* p, int64_t n, bool f32) {
      if (!p || n <= 0 || check_seen[what]) return;
      std::vector<uint32_t> h(size_t(f32 ? n : (n + 1) / 2));
      copy_to_host(h.data(), p, size_t(f32 ? n * 4 : n * 2));
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t v = f32 ? h[size_t(i)] : (h[size_t(i / 2)] >> (16 * (i % 2))) & 0xffffu;
        bad += f32 ? (v & 0x7f800000u) == 0x7f800000u : (v & 0x7c00u) == 0x7c00u;
      }
      if (!bad) return;
      check_seen[what] = true;
      std::fprintf(stderr, "decode check: %lld non-finite values in %s after stage %s of layer %d (%lld rows)\n", (long long)bad, what,
                   names[check_n % (kStages - 1)], check_n / (kStages - 1), (long long)r);
    };
    scan("X", X.get(), r * d, true);
    scan("q, k, v", qkv.get(), r * (c.q_dim() + 2 * c.kv_dim()), true);
    scan("gate, up", gu.get(), r * 2 * f, true);
    scan("xn", xn.get(), r * d, false);
    scan("ctx", ctx.get(), r * c.q_dim(), false);
    scan("act", act.get(), r * f, false);
    ++check_n;
  }
  void mark() {
    if (check && !current_stream() && check_rows) check_stage();
    if (!profile || current_stream()) return;
    if (ev_n == int(ev.size())) {
      cudaEvent_t e;
      PTQ_CUDA(cudaEventCreate(&e));
      ev.push_back(e);
    }
    PTQ_CUDA(cudaEventRecord(ev[size_t(ev_n++)], 0));
  }
  // After a step: the events' gaps, by stage (9 per layer, then the head).
  void collect(int per_layer, int layers_n) {
    if (!profile || ev_n == 0) return;
    PTQ_CUDA(cudaEventSynchronize(ev[size_t(ev_n - 1)]));
    for (int i = 1; i < ev_n; ++i) {
      float ms = 0;
      PTQ_CUDA(cudaEventElapsedTime(&ms, ev[size_t(i - 1)], ev[size_t(i)]));
      const int k = i - 1 < per_layer * layers_n ? (i - 1) % per_layer : kStages - 1;
      stage_ms[size_t(k)] += ms;
    }
    ev_n = 0;
  }

  // An MoE layer's MLP for the rows of xn (normed by the caller): the routing on the host from the
  // residual rows X (model/llama.cpp: rmsnorm, the fp32 router, route), then per expert in order
  // its rows gathered, gate and up, silu, down, and X[row] += weight * out.
  DeviceBuffer<int32_t> moe_rows;
  DeviceBuffer<float> moe_w, moe_y;
  DeviceBuffer<uint16_t> moe_x;
  template <class T>
  void moe(const DecodeLayer& W, int64_t rows) {
    const LlamaConfig& c = w.c;
    const int64_t d = c.hidden_size, fe = c.moe_intermediate_size > 0 ? c.moe_intermediate_size : c.intermediate_size;
    MatF x(rows, d), xn_h;
    synchronize();
    copy_to_host(x.data(), X.get(), size_t(x.size()) * 4);
    rmsnorm(x, W.post_norm, float(c.rms_norm_eps), xn_h);
    const Routing rt = route(c, W.router, xn_h);
    if (int64_t(moe_y.size()) < rows * std::max(d, 2 * fe)) {
      moe_y = DeviceBuffer<float>(size_t(rows * std::max(d, 2 * fe)), "decode expert outputs");
      moe_x = DeviceBuffer<uint16_t>(size_t(rows * std::max(d, fe)), "decode expert inputs");
      moe_rows = DeviceBuffer<int32_t>(size_t(rows), "decode expert rows");
      moe_w = DeviceBuffer<float>(size_t(rows), "decode expert weights");
    }
    for (size_t e = 0; e < W.experts.size(); ++e) {
      const int64_t n = int64_t(rt.rows[e].size());
      if (n == 0) continue;
      copy_to_device(moe_rows.get(), rt.rows[e].data(), size_t(n) * 4);
      copy_to_device(moe_w.get(), rt.weights[e].data(), size_t(n) * 4);
      gather_rows16(xn.get(), moe_rows.get(), n, int(d), moe_x.get());
      float* g = moe_y.get();
      float* u = g + n * fe;
      W.experts[e][0](moe_x.get(), n, g, 0.0f);
      W.experts[e][1](moe_x.get(), n, u, 0.0f);
      silu_mul<T><<<unsigned((n * fe + 255) / 256), 256, 0, stream()>>>(g, u, fe, fe, n * fe, reinterpret_cast<T*>(act.get()));
      PTQ_CUDA_LAUNCH("silu_mul");
      W.experts[e][2](act.get(), n, moe_y.get(), 0.0f);
      scatter_add_rows(moe_y.get(), moe_rows.get(), moe_w.get(), n, int(d), X.get());
    }
  }

  template <class T>
  void layers(int T_) {
    const LlamaConfig& c = w.c;
    const int64_t rows = int64_t(B) * T_, d = c.hidden_size, f = c.intermediate_size;
    check_rows = rows, check_n = 0;
    const float eps = float(c.rms_norm_eps);
    const int hd = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
    const int half = int(cos.size() / size_t(max_len));
    const int threads_hd = (hd + 31) / 32 * 32;
    const bool pdl = decode_on(Switch::pdl);
    const bool norm_vec = d % 4 == 0 && d <= 4 * kNormVecThreads * kNormVecMax;
    // 17..256 rows of f16 activations (where the wgmma A16 kernel may serve a Linear): the norm and
    // silu·mul also write their output in that kernel's order, offered to the Linear after them
    // (a16_offer_wgmma_x); lab runs 148-150: batch 32 W4A16 +3.4%, W8A16 +2.6% with the permute
    // launches gone. Where the Linears after a producer did not take it at a row count (f16's
    // cuBLAS, NF4's kernels), later steps of that count skip the second write (xperm_taken).
    // Which producer writes it (0: the input norm, 1: the post-attention norm, 2: silu·mul, 3: the
    // attention, for the o projection; lab runs 389-390).
    const bool xperm_rows = xperm && std::is_same_v<T, __half> && rows >= 17 && rows <= kA16WgmmaMaxM;
    std::array<int8_t, 4>& known = xperm_taken.try_emplace(rows, std::array<int8_t, 4>{-1, -1, -1, -1}).first->second;
    std::array<bool, 4> took{false, false, false, false};
    auto perm_of = [&](int producer, const DeviceBuffer<uint16_t>& buf, bool ok) {
      return xperm_rows && ok && buf.get() && known[size_t(producer)] != 0 ? reinterpret_cast<T*>(buf.get()) : nullptr;
    };
    T* const xnp[2] = {perm_of(0, xn_perm, norm_vec), perm_of(1, xn_perm, norm_vec)};
    T* const actp = perm_of(2, act_perm, f % 4 == 0);
    // A call with a request to its A16 kernel made before it (a16_path.h: a fold, an offered x):
    // what the kernel did with it, as `taken` answers, which also clears the request (on a throw too).
    auto answered = [](auto&& call, auto taken) {
      try {
        call();
      } catch (...) {
        taken();
        throw;
      }
      return taken();
    };
    // fn(x, ...) with x's copy xp in the wgmma order offered (null: a plain call).
    auto offered = [&](int producer, const void* x, const void* xp, auto&& call) {
      if (!xp) return call();
      a16_offer_wgmma_x(x, xp);
      if (answered(call, a16_took_wgmma_x)) took[size_t(producer)] = true, xperm_used = true;
    };
    auto norm = [&](const DeviceBuffer<float>& nw, T* outp) {
      if (norm_vec)
        launch_pdl("rmsnorm_rows_vec", pdl, -1, rmsnorm_rows_vec<T>, dim3(unsigned(rows)), dim3(kNormVecThreads), 0, static_cast<const float*>(X.get()),
                   static_cast<const float*>(nw.get()), int(d), eps, reinterpret_cast<T*>(xn.get()), outp);
      else
        launch_pdl("rmsnorm_rows", pdl, -1, rmsnorm_rows<T>, dim3(unsigned(rows)), dim3(kNormThreads), 0, static_cast<const float*>(X.get()),
                   static_cast<const float*>(nw.get()), int(d), eps, reinterpret_cast<T*>(xn.get()), 1, 0);
    };
    // The one activation spec of the Linears that read a norm's output where all are W8A8 with
    // it (then the norm quantizes), else null.
    auto int8_input = [&](std::initializer_list<const Int8Linear*> readers) -> const ActQuant* {
      if (!norm_vec || !decode_on(Switch::int8_fuse)) return nullptr;
      const ActQuant* a = nullptr;
      for (const Int8Linear* r : readers) {
        if (!*r || (a && (r->act.mode != a->mode || r->act.static_scale != a->static_scale))) return nullptr;
        a = &r->act;
      }
      return a;
    };
    auto norm_quant = [&](const DeviceBuffer<float>& nw, const ActQuant& a) {
      launch_pdl("rmsnorm_quant_rows_vec", pdl, -1, rmsnorm_quant_rows_vec<T>, dim3(unsigned(rows)), dim3(kNormVecThreads), 0, static_cast<const float*>(X.get()),
                 static_cast<const float*>(nw.get()), int(d), eps, a.mode == ActQuant::per_token, a.static_scale, xq8.get(), sx8.get());
    };
    // Few (row, head) pairs (batch 1 to 8 on 7B shapes): each head's positions split over up to 16
    // CTAs, about 768 CTAs in all and at least 64 positions of the cache each (run 35, with the
    // attention's batched loads: batch 1 at 6 splits 2.5% faster than at 12, batch 8 at 3 splits
    // 15% faster than at 8).
    const int splits = rows * nh >= kSplitBelow ? 1 : std::clamp(std::min(int(kSplitCtas / (rows * nh)), max_len / kSplitMinPositions), 1, kMaxSplits);
    // The splits of a head combined in a cluster where they fit one (sm_90).
    const bool attn_cluster = splits > 1 && splits <= kClusterSplits && compute_capability() >= 90 && decode_on(Switch::attn_cluster);
    const size_t attn_smem = attend_smem(kAttnMaxWarps, hd, attn_cluster);
    // One sequence's decode step: the attention forms q and the new key and value itself (lab runs
    // 105, 108: batch 1 W4A16 +2.7%, NF4 +2.2%; at batch 8 and 32, where every split and query
    // head forms them again, 0.5-1.6% slower in run 105's form).
    const bool rope_fold = rows == 1 && decode_on(Switch::rope_fold);
    // 2+ rows: the stacked q, k, v Linear writes q and the cache rows rotated itself where its kernel
    // does (a16_fold_rope: the wgmma kernel's streamed form at 17..32 rows, GPTQ and NF4 codes;
    // heads of 128 rotated whole, no bias, no head norm), and rope_append does not run.
    const bool rope_linear = rows > 1 && std::is_same_v<T, __half> && hd == kA16RopeHead && 2 * half == int(hd) && rope_in_linear;
    // A prompt fed from position 0 (the cache holds only its own keys): flash attention over each
    // sequence's T rows, which reads each key and value tile once for a block of queries, where
    // attend reads a row's whole prefix for every (row, head): T^2 / 2 rows of the cache a head
    // (lab run 172: a 2,048-token prompt's prefill 3.0-3.2x faster on llama2-7b and llama3-8b). Head sizes 64, 96, 128.
    const bool flash_prefill = T_ > 1 && pos == 0 && flash_attention_supported(int(hd)) && decode_on(Switch::flash_prefill);
    // A decode step of 2 or more sequences: decode_attention on tensor cores, a CTA per sequence
    // and KV head (its group of query heads together: each key and value row read once a group),
    // keys in chunks of 16 loaded straight into MMA fragments (model/attention_cuda.h). Lab runs
    // 246-252: llama3-8b (4 query heads a KV head) at batch 32 +6-9% in every format, batch 8
    // +4-8%; llama2-7b and phi3-mini (1 a KV head) at batch 8 +3-10% (NF4 on llama2-7b -1.7%).
    // Not where attend has a CTA for each of 512+ query heads and no group to share rows
    // (llama2-7b at batch 32: the kernels equal alone, 25.6 against 25.0 us, but the Linear after
    // the new one slower, the step W4A16 -8%, W8A8 -10%: run 253). One sequence keeps attend with
    // the rotary folded in (tuned for batch 1's few CTAs).
    // PTQKIT_DECODE_ATTN_MMA: 0 never, 2 wherever it can serve (a sweep switch for the A/Bs of that
    // rule), else by the rule.
    static const int attn_mma_mode = env_int("PTQKIT_DECODE_ATTN_MMA", 1);
    const bool attn_mma = T_ == 1 && !rope_fold && attn_mma_mode != 0 && (nh > nkv || rows * nh < kSplitBelow || attn_mma_mode == 2) &&
                          decode_attention_supported(hd, nh, nkv);
    const int attn_mma_splits = attn_mma ? decode_attention_splits(B, nh, nkv, int(max_len)) : 1;
    // ctx's copy in the wgmma order, where the attention writes it: attend without splits (a split
    // head's ctx is written by its combine). decode_attention does not: written there too, it ran
    // llama3-8b's W4A16 at batch 24 3.5% slower than the o projection's own permute pass (at 17
    // and 32 rows within 0.7%; lab run 391).
    const bool attn_perm = !flash_prefill && !attn_mma && splits == 1;
    T* const ctxp = perm_of(3, ctx_perm, attn_perm);
    auto attn8_of = [&](const DecodeLayer& W) { return W.qkv ? int8_input({&W.qkv8}) : int8_input({&W.lin8[0], &W.lin8[1], &W.lin8[2]}); };
    // A call with a fold asked of its kernel (a16_path.h): what the kernel did with it (A16Fold:
    // where it did not, the step runs the kernel it would have saved).
    auto folded = [&](auto&& call) { return answered(call, a16_folded); };
    // At one row (f16 activations, the norm's vector form) the Linear that writes X (o, down)
    // normalizes it into xn where its kernel does (a16_fold_norm: NF4 at M = 1); residual_linear
    // says whether it did, else the norm kernel runs as before.
    const bool fold = rows == 1 && std::is_same_v<T, __half> && norm_vec && decode_on(Switch::norm_fold);
    // Where the kernel does not fold it whole (the GPTQ and f16 kernels), the norm is split between
    // the two Linears around it (PTQKIT_DECODE_NORM_SPLIT; a16_path.h, A16RowNorm): the writer
    // leaves the sums of squares of each 16 rows of X in row_ss and xn = f16(X * w / 16), the
    // reader scales its fp32 sums by 16 / rms(X). No norm kernel: batch 1 on llama2-7b W4A16
    // +3.2%, W8A16 +2.7%, f16 +1.5% against the norm kernel (lab run 278; leaving the norms out
    // entirely, run 266: +7.2%, +5.0%, +3.0%). residual_linear answers how the next norm was done:
    // its call's A16Fold (none: the norm still to run; whole: done into xn; split: row_ss and xn
    // written).
    // At 17..32 rows the norm is split only (no kernel folds it whole there): the L2-fed kernel
    // writes it (the o projection, and NF4's down on the Llama shapes), also into xn's copy in the
    // wgmma order, and so does the wgmma kernel's k-step loop in its split-K sum (W8's down on the
    // Llama shapes); the wgmma kernel's streamed form reads it (the q, k, v and gate, up Linears
    // on their cells). Where either side declines, the norm kernel runs as before. Against the norm
    // kernels (lab runs 320-322 and 326, batch 32, --decode 128, twice): NF4 llama2-7b +3.9%,
    // llama3-8b +7.3%, W8A16 llama2-7b +0.7%; W4A16 (o and down on the streamed form, which writes
    // it on a16_wgmma_tma_writes_norm's cells) llama2-7b +1.4-1.6%, llama3-8b +1.1% (runs 396-406);
    // W8A16 on llama3-8b, whose gate, up runs the loop (no reader), splits neither (below).
    // (xnp[0] == xnp[1]: one copy in the wgmma order, or none, serves both norms' readers.)
    const bool split_rows = rows >= 17 && rows <= 32 && std::is_same_v<T, __half> && norm_vec && d % 64 == 0 && xnp[0] == xnp[1];
    const bool norm_split = (fold || split_rows) && decode_on(Switch::norm_split);
    std::vector<std::array<bool, 2>>& split_declined = split_declined_at[rows];
    if (split_declined.size() != w.layers.size()) split_declined.assign(w.layers.size(), {false, false});
    auto residual_linear = [&](const LinearFn& fn, const void* x, const DeviceBuffer<float>* next_norm, int slot, bool split_ok = true) {
      if (!(fold || (norm_split && split_ok)) || !next_norm) {
        fn(x, rows, X.get(), 1.0f);
        return A16Fold::none;
      }
      A16RowNorm rn{next_norm->get(), xn.get(), norm_arrivals.get(), eps};
      if (norm_split && split_ok) rn.row_ss = row_ss_at(slot), rn.out_perm = fold ? nullptr : xnp[0];
      a16_fold_norm(&rn);
      return folded([&] { fn(x, rows, X.get(), 1.0f); });
    };
    // A Linear on the norm's output where the writer left row_ss (slot): asked to be the split's
    // reader; where its kernel was not, the norm runs (xn normed: the rest of its readers read it
    // plainly, slot set to -1) and the Linear again, and from the next step the norm runs whole.
    auto split_normed = [&](size_t layer, int& slot, const DeviceBuffer<float>& nw, T* outp, auto&& call) {
      A16RowNorm rn{};
      rn.in_ss = row_ss_at(slot), rn.in_eps = eps;
      a16_norm_in(&rn);
      if (answered(call, a16_took_norm_in)) {
        norm_split_rows_used |= rows > 1;
        return;
      }
      split_declined[layer][size_t(slot)] = true;
      slot = -1;
      norm(nw, outp);
      call();
    };
    // Up to 32 rows a stacked gate, up Linear writes silu(gate) · up itself where its kernel does
    // (a16_fold_silu: the A16 and f16 kernels up to 8 rows, the wgmma kernel's streamed form at 9..32
    // on its layers, with act's copy in its order for the down's), not with a W8A8 down (its
    // silu·mul quantizes). Where the kernel declines, the silu·mul kernel runs.
    const bool silu_fold = rows <= 32 && std::is_same_v<T, __half> && f % 16 == 0 && decode_on(Switch::silu_fold);
    // W8A8 down: silu·mul quantized by a cluster of CTAs a row where the GPU has clusters (sm_90).
    const bool silu_cluster = compute_capability() >= 90 && f % 4 == 0 && f <= 4 * kSiluClusterCtas * kSiluClusterThreads * kSiluClusterMax &&
                              decode_on(Switch::silu_cluster);
    A16Fold in_normed = A16Fold::none;   // the layer's input norm as the previous layer's down Linear left it
    for (size_t l = 0; l < w.layers.size(); ++l) {
      const DecodeLayer& W = w.layers[l];
      LayerDev& D = L[l];
      mark();
      const ActQuant* attn8 = attn8_of(W);
      const void* xn_p = nullptr;   // xn in the wgmma order, where the norm before the Linear wrote it
      int split = -1;               // the row_ss slot the Linears on xn form it from (the norm split), else -1
      const DeviceBuffer<float>* split_w = nullptr;
      if (attn8) norm_quant(D.in_norm, *attn8);
      else if (in_normed == A16Fold::split) split = 1, split_w = &D.in_norm;
      else if (in_normed == A16Fold::none) norm(D.in_norm, xnp[0]), xn_p = xnp[0];
      in_normed = A16Fold::none;
      mark();
      // A Linear on the norm's output: its int8 form on the quantized rows, else on xn (formed by
      // the Linear itself where the norm is split).
      // producer: the norm before it (0 or 1).
      auto linear = [&](const LinearFn& fn, const Int8Linear& fn8, bool int8, float* y, float beta, int producer) {
        if (int8) fn8.fn(xq8.get(), sx8.get(), rows, y, beta);
        else if (split >= 0) split_normed(l, split, *split_w, xnp[producer], [&] { offered(producer, xn.get(), split_rows ? xnp[producer] : nullptr, [&] { fn(xn.get(), rows, y, beta); }); });
        else offered(producer, xn.get(), xn_p, [&] { fn(xn.get(), rows, y, beta); });
      };
      const int64_t qd = c.q_dim(), kvd = c.kv_dim();
      float *yq = qkv.get(), *yk, *yv;
      int q_stride, kv_stride;
      bool roped = false;   // q and the cache rows written by the q, k, v Linear (a16_fold_rope)
      if (W.qkv) {   // one Linear: row r holds q, k, v side by side
        if (rope_linear && !attn8 && W.qkv_bias[0].size() + W.qkv_bias[1].size() + W.qkv_bias[2].size() + W.q_norm.size() + W.k_norm.size() == 0) {
          const A16Rope ar{cos.get(), sin.get(), pos_d.get(), qh.get(), D.K.get(), D.V.get(), T_, nh, nkv, int(max_len)};
          a16_fold_rope(&ar);
          roped = folded([&] { linear(W.qkv, W.qkv8, false, yq, 0.0f, 0); }) == A16Fold::whole;
          rope_in_linear_used |= roped;
        } else {
          linear(W.qkv, W.qkv8, attn8, yq, 0.0f, 0);
        }
        yk = yq + qd, yv = yk + kvd;
        q_stride = kv_stride = int(qd + 2 * kvd);
      } else {
        yk = yq + rows * qd, yv = yk + rows * kvd;
        q_stride = int(qd), kv_stride = int(kvd);
        linear(W.lin[0], W.lin8[0], attn8, yq, 0.0f, 0);
        linear(W.lin[1], W.lin8[1], attn8, yk, 0.0f, 0);
        linear(W.lin[2], W.lin8[2], attn8, yv, 0.0f, 0);
      }
      mark();
      RopeArgs a{yq, yk, yv, q_stride, kv_stride,
                 W.qkv_bias[0].size() ? D.bq.get() : nullptr, W.qkv_bias[1].size() ? D.bk.get() : nullptr, W.qkv_bias[2].size() ? D.bv.get() : nullptr,
                 W.q_norm.size() ? D.q_norm.get() : nullptr, W.k_norm.size() ? D.k_norm.get() : nullptr,
                 cos.get(), sin.get(), pos_d.get(), T_, nh, nkv, hd, half, max_len, eps};
      // A decode step's rotary (2+ sequences) is launched plainly, after the q, k, v Linear has
      // completed, not under PDL beside its tail (lab run 292, against PDL in the same call):
      // llama2-7b batch 8 +0.6% (NF4 +5.8%), batch 32 W8A16 +1.9%, W8A8 +0.8%; llama3-8b within
      // 0.6% (W8A8 at batch 32 +1.8%); phi3-mini batch 8 -0.3 to -1.4%, W8A8 at batch 32 +3.1%.
      // Why is not established. PTQKIT_DECODE_ROPE_PDL=1 launches it under PDL again (a sweep
      // switch). A prompt's keeps PDL.
      static const bool rope_pdl = env_switch("PTQKIT_DECODE_ROPE_PDL", false);
      if (!rope_fold && !roped)
        launch_pdl("rope_append", pdl && (T_ > 1 || rope_pdl), -1, rope_append<T>, dim3(unsigned(rows), unsigned(nh + nkv)), dim3(unsigned(threads_hd)), size_t(hd + 32) * 4, a,
                   reinterpret_cast<T*>(qh.get()), reinterpret_cast<T*>(D.K.get()), reinterpret_cast<T*>(D.V.get()));
      mark();
      if (flash_prefill) {
        const size_t qrows = size_t(T_) * size_t(qd), kvrows = size_t(max_len) * size_t(kvd);   // a sequence's q (ctx), cache
        for (int s = 0; s < B; ++s)
          flash_attention(w.dt, qh.get() + s * qrows, D.K.get() + s * kvrows, D.V.get() + s * kvrows, ctx.get() + s * qrows, 1, T_, nh, nkv, int(hd),
                          1.0f / std::sqrt(float(hd)), c.sliding_window);
      } else if (attn_mma)
        decode_attention(w.dt, qh.get(), D.K.get(), D.V.get(), pos_d.get(), ctx.get(), B, nh, nkv, hd, int(max_len), c.sliding_window,
                         1.0f / std::sqrt(float(hd)), attn_mma_splits, pdl);
      else
      launch_ex("attend", pdl, -1, attn_cluster ? dim3(1, 1, unsigned(splits)) : dim3(0), attend_kernel<T>(hd, rope_fold), dim3(unsigned(rows), unsigned(nh), unsigned(splits)), dim3(unsigned(kAttnThreads)), attn_smem,
                 reinterpret_cast<const T*>(qh.get()), reinterpret_cast<T*>(D.K.get()), reinterpret_cast<T*>(D.V.get()),
                 static_cast<const int*>(pos_d.get()), T_, nh, nkv, hd, max_len, c.sliding_window, 1.0f / std::sqrt(float(hd)),
                 reinterpret_cast<T*>(ctx.get()), ctxp, splits > 1 && !attn_cluster ? partial.get() : nullptr, arrivals.get(), a);
      mark();
      const ActQuant* mlp8 = !W.experts.empty() ? nullptr   // MoE: xn is gathered per expert
                             : W.gate_up        ? int8_input({&W.gate_up8})
                                                : int8_input({&W.lin8[4], &W.lin8[5]});
      A16Fold post_normed = A16Fold::none;   // X += o(ctx); MoE gathers xn
      offered(3, ctx.get(), ctxp, [&] { post_normed = residual_linear(W.lin[3], ctx.get(), mlp8 ? nullptr : &D.post_norm, 0, W.experts.empty() && !split_declined[l][0]); });
      mark();
      xn_p = nullptr;
      split = -1;
      if (mlp8) norm_quant(D.post_norm, *mlp8);
      else if (post_normed == A16Fold::split) split = 0, split_w = &D.post_norm, xn_p = split_rows ? xnp[1] : nullptr;
      else if (post_normed == A16Fold::none) norm(D.post_norm, xnp[1]), xn_p = xnp[1];
      mark();
      if (!W.experts.empty()) {
        moe<T>(W, rows);
        mark();   // the profile's silu and down stages: empty
        mark();
        continue;
      }
      const float *yg = gu.get(), *yu;
      int64_t gu_stride;
      bool post_split = false;   // the post-attention norm split (its writer and its reader took it)
      bool act_done = false;   // act written by the gate, up Linear
      if (W.gate_up) {   // one Linear: row r holds gate, up side by side
        if (silu_fold && !mlp8 && !W.lin8[6]) {
          auto gate_up = [&] {
            a16_fold_silu(act.get(), actp);
            act_done = folded([&] { offered(1, xn.get(), xn_p, [&] { W.gate_up(xn.get(), rows, gu.get(), 0.0f); }); }) == A16Fold::whole;
          };
          if (split >= 0) split_normed(l, split, *split_w, xnp[1], gate_up);
          else gate_up();
        } else {
          linear(W.gate_up, W.gate_up8, mlp8, gu.get(), 0.0f, 1);
        }
        yu = yg + f, gu_stride = 2 * f;
        post_split = split >= 0;
      } else {
        yu = yg + rows * f, gu_stride = f;
        linear(W.lin[4], W.lin8[4], mlp8, gu.get(), 0.0f, 1);
        linear(W.lin[5], W.lin8[5], mlp8, gu.get() + rows * f, 0.0f, 1);
      }
      mark();
      if (W.lin8[6] && decode_on(Switch::int8_fuse) && f % 4 == 0 && f <= 4 * kSiluQuantThreads * kSiluQuantMax) {   // W8A8 down: silu·mul quantizes its output
        const ActQuant& a = W.lin8[6].act;
        if (silu_cluster)
          launch_ex("silu_mul_quant_cluster", pdl, -1, kSiluClusterCtas, silu_mul_quant_cluster<T>, dim3(unsigned(kSiluClusterCtas), unsigned(rows)),
                    dim3(kSiluClusterThreads), 0, yg, yu, int(f), gu_stride, a.mode == ActQuant::per_token, a.static_scale, xq8.get(), sx8.get());
        else
          launch_pdl("silu_mul_quant_rows", pdl, -1, silu_mul_quant_rows<T>, dim3(unsigned(rows)), dim3(kSiluQuantThreads), 0, yg, yu, int(f), gu_stride,
                     a.mode == ActQuant::per_token, a.static_scale, xq8.get(), sx8.get());
        mark();
        W.lin8[6].fn(xq8.get(), sx8.get(), rows, X.get(), 1.0f);   // X += down(act)
        continue;
      }
      if (!act_done) {
        if (f % 4 == 0)
          launch_pdl("silu_mul4", pdl, -1, silu_mul4<T>, dim3(unsigned((rows * f / 4 + 255) / 256)), dim3(256), 0, yg, yu, f, gu_stride, rows * f,
                     reinterpret_cast<T*>(act.get()), actp);
        else
          launch_pdl("silu_mul", pdl, -1, silu_mul<T>, dim3(unsigned((rows * f + 255) / 256)), dim3(256), 0, yg, yu, f, gu_stride, rows * f,
                     reinterpret_cast<T*>(act.get()));
      }
      mark();
      const bool next = l + 1 < w.layers.size() && !attn8_of(w.layers[l + 1]);   // the next layer's input norm, unless it quantizes
      // X += down(act)
      offered(2, act.get(), actp, [&] { in_normed = residual_linear(W.lin[6], act.get(), next ? &L[l + 1].in_norm : nullptr, 1, next && !split_declined[l + 1][1]); });
      // At 17..32 rows a layer's norms split both or neither: where one of them is not split (its
      // writer's kernel or its reader's declined), the other alone measured no gain, so from the
      // next step both norm kernels run whole at this row count. Post-attention alone against
      // neither (lab run 324, batch 32, twice): llama2-7b W8A16 +1.0%, W4A16 +0.2%; llama3-8b
      // -0.4%, 0.0%; phi3-mini -0.4%, -1.0% (the reader's and writer's costs about what the norm
      // kernel cost). The input norm alone (llama3-8b W8A16, whose gate, up runs the k-step loop,
      // no reader; lab run 326): -1.1%. PTQKIT_DECODE_NORM_SPLIT_PAIRS=0 (a sweep switch) lets
      // either split alone.
      if (decode_on(Switch::norm_split_pairs) && split_rows && next && (in_normed != A16Fold::split || !post_split))
        for (auto& d : split_declined) d = {true, true};
    }
    if (xperm_rows)
      for (size_t i = 0; i < known.size(); ++i)
        if (known[i] < 0 && (i != 3 || attn_perm)) known[i] = took[i] ? 1 : 0;   // the attention's copy: known where it was written
    mark();
  }

  // The last position of each sequence: normed, then lm_head -> logits [B, vocab] fp32.
  template <class T>
  void head(int T_) {
    const LlamaConfig& c = w.c;
    const int64_t d = c.hidden_size, V = c.vocab_size;
    // Rows b*T + T-1, normalized into xn rows 0..B-1.
    rmsnorm_rows<T><<<unsigned(B), kNormThreads, 0, stream()>>>(X.get(), final_norm.get(), int(d), float(c.rms_norm_eps), reinterpret_cast<T*>(xn.get()), T_, T_ - 1);
    PTQ_CUDA_LAUNCH("rmsnorm_rows (final)");
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType ct = w.dt == DType::F16 ? CUDA_R_16F : CUDA_R_16BF;
    PTQ_CUBLAS(cublasGemmEx(blas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(V), B, int(d), &one, w.lm_head, ct, int(d), xn.get(), ct, int(d), &zero,
                            logits.get(), CUDA_R_32F, int(V), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  void step(int T_) {
    grow(int64_t(B) * T_);
    const LlamaConfig& c = w.c;
    if (w.dt == DType::F16) {
      embed_rows<__half><<<unsigned(B * T_), 256, 0, stream()>>>(static_cast<const __half*>(w.embed), tokens_d.get(), c.hidden_size, X.get());
      layers<__half>(T_);
      head<__half>(T_);
      mark();
      collect(kStages - 1, int(w.layers.size()));
    } else {
      embed_rows<__nv_bfloat16><<<unsigned(B * T_), 256, 0, stream()>>>(static_cast<const __nv_bfloat16*>(w.embed), tokens_d.get(), c.hidden_size, X.get());
      layers<__nv_bfloat16>(T_);
      head<__nv_bfloat16>(T_);
    }
    PTQ_CUDA_LAUNCH("embed_rows");
  }

  // The step from tokens_d ([B, T], on the device already) and the position's advance. One token a
  // sequence after a plain one-token step: as a CUDA graph (a 32-layer llama2-7b W4A16 from
  // generate: 591 tok/s with plain launches, 630 with the graph; docs/lab/2026-12-03-gpu-formats-h200.md,
  // runs 11-12), captured once and replayed on the legacy stream, ordered with the copies before and
  // after it.
  void run_fed(int T) {
    auto one_step = [&] {
      step(T);
      advance<<<1, 1, 0, stream()>>>(pos_d.get(), T, nullptr);
      PTQ_CUDA_LAUNCH("advance");
    };
    if (T == 1 && one_token_plain && graphs && !moe_layers && !profile && !check && !feed_capture_refused) {
      if (!feed_graph || feed_graph->rows_cap != rows_cap) {
        feed_graph.reset();
        auto g = std::make_unique<StepGraph>();
        cudaStream_t s = nullptr;
        PTQ_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        synchronize();   // as decode_greedy: nothing in flight on the legacy stream while the capture is made
        g->workspaces.open();
        const bool ok = capture_step(s, one_step, &g->exec);
        g->workspaces.close();
        cudaStreamDestroy(s);
        g->rows_cap = rows_cap;
        if (ok) feed_graph = std::move(g);
        else feed_capture_refused = true;   // plain launches from now on
      }
      if (feed_graph) {
        PTQ_CUDA(cudaGraphLaunch(feed_graph->exec, nullptr));
        pos += T;
        graph_used = true;
        return;
      }
    }
    one_step();
    pos += T;
    graph_used = false;
    if (T == 1) one_token_plain = true;
  }
};

DecodeCuda::DecodeCuda(DecodeWeights w, int batch, int max_len) : p_(std::make_unique<Impl>()) {
  Impl& m = *p_;
  const LlamaConfig& c = w.c;
  std::string why;
  if (!decode_supported(c, &why)) fail(Errc::usage, "", "--device", "cuda decode of this model: " + why + " (use --device cpu)");
  if (max_len > c.max_position_embeddings)
    fail(Errc::input, "", "max_position_embeddings", std::to_string(max_len) + " positions asked, the model's context is " + std::to_string(c.max_position_embeddings));
  static_assert(attend_smem(kAttnMaxWarps, kMaxHd, true) <= 48 * 1024, "attend's shared memory within the 48 KB default (no opt-in)");
  m.B = batch;
  m.max_len = max_len;
  for (const DecodeLayer& W : w.layers) {
    Impl::LayerDev D;
    D.in_norm = upload_f32(W.in_norm, "decode norms");
    D.post_norm = upload_f32(W.post_norm, "decode norms");
    D.q_norm = upload_f32(W.q_norm, "decode head norms");
    D.k_norm = upload_f32(W.k_norm, "decode head norms");
    D.bq = upload_f32(W.qkv_bias[0], "decode biases");
    D.bk = upload_f32(W.qkv_bias[1], "decode biases");
    D.bv = upload_f32(W.qkv_bias[2], "decode biases");
    const size_t kv = size_t(batch) * size_t(max_len) * size_t(c.kv_dim());
    D.K = DeviceBuffer<uint16_t>(kv, "KV cache (keys; fewer sequences or tokens need less)");
    D.V = DeviceBuffer<uint16_t>(kv, "KV cache (values)");
    m.L.push_back(std::move(D));
  }
  m.final_norm = upload_f32(w.final_norm, "decode final norm");
  const Rope r = make_rope(c, max_len);
  m.cos = upload_f32(Eigen::Map<const VecF>(r.cos.data(), r.cos.size()), "rotary cos");
  m.sin = upload_f32(Eigen::Map<const VecF>(r.sin.data(), r.sin.size()), "rotary sin");
  m.pos_d = DeviceBuffer<int>(1, "decode position");
  m.step_d = DeviceBuffer<int>(1, "decode step");
  m.tokens_d = DeviceBuffer<int>(size_t(batch) * size_t(max_len), "decode tokens");
  m.logits = DeviceBuffer<float>(size_t(batch) * size_t(c.vocab_size), "decode logits");
  for (const DecodeLayer& L : w.layers) m.moe_layers = m.moe_layers || !L.experts.empty();
  m.w = std::move(w);
  reset();
}

DecodeCuda::~DecodeCuda() { p_->feed_graph.reset(); }   // first: a replay in flight ends before the buffers it uses go
int DecodeCuda::batch() const { return p_->B; }
int DecodeCuda::position() const { return p_->pos; }
const DecodeWeights& DecodeCuda::weights() const { return p_->w; }

void DecodeCuda::reset() {
  p_->pos = 0;
  fill_bytes(p_->pos_d.get(), 0, 4);
  fill_bytes(p_->step_d.get(), 0, 4);
}

void DecodeCuda::feed(const std::vector<int32_t>& tokens, int T) {
  Impl& m = *p_;
  if (T < 1 || tokens.size() != size_t(m.B) * size_t(T)) fail(Errc::input, "", "tokens", "expected batch x T tokens");
  if (m.pos + T > m.max_len) fail(Errc::input, "", "tokens", "the KV cache holds " + std::to_string(m.max_len) + " positions");
  for (int32_t t : tokens)
    if (t < 0 || t >= m.w.c.vocab_size) fail(Errc::input, "", "tokens", "id " + std::to_string(t) + " outside the vocabulary");
  copy_to_device(m.tokens_d.get(), tokens.data(), tokens.size() * 4);
  m.run_fed(T);
}

MatF DecodeCuda::logits() const {
  const Impl& m = *p_;
  MatF out(m.B, m.w.c.vocab_size);   // row-major: [B, vocab]
  copy_to_host(out.data(), m.logits.get(), size_t(out.size()) * 4);
  return out;
}

std::vector<int32_t> DecodeCuda::next_greedy(bool then_feed) {
  Impl& m = *p_;
  if (then_feed && m.pos + 1 > m.max_len) fail(Errc::input, "", "tokens", "the KV cache holds " + std::to_string(m.max_len) + " positions");
  argmax_rows<<<unsigned(m.B), 1024, 0, stream()>>>(m.logits.get(), m.w.c.vocab_size, m.tokens_d.get(), nullptr, nullptr, m.B);
  PTQ_CUDA_LAUNCH("argmax_rows");
  std::vector<int32_t> out(size_t(m.B));
  copy_to_host(out.data(), m.tokens_d.get(), out.size() * 4);   // waits for the step before and the argmax only
  if (then_feed) m.run_fed(1);   // launched, not waited for: it runs while the caller prints the tokens
  return out;
}

std::vector<int32_t> DecodeCuda::decode_greedy(int n) {
  Impl& m = *p_;
  if (m.pos + n > m.max_len) fail(Errc::input, "", "tokens", "the KV cache holds " + std::to_string(m.max_len) + " positions");
  DeviceBuffer<int> hist(size_t(std::max(n, 1)) * size_t(m.B), "decode history");
  fill_bytes(m.step_d.get(), 0, 4);
  const int V = m.w.c.vocab_size;
  m.grow(m.B);
  // One step: the argmax of the last logits becomes the next token, which is fed at once.
  auto one_step = [&] {
    argmax_rows<<<unsigned(m.B), 1024, 0, stream()>>>(m.logits.get(), V, m.tokens_d.get(), hist.get(), m.step_d.get(), m.B);
    PTQ_CUDA_LAUNCH("argmax_rows");
    m.step(1);
    advance<<<1, 1, 0, stream()>>>(m.pos_d.get(), 1, m.step_d.get());
    PTQ_CUDA_LAUNCH("advance");
  };
  int done = 0;
  m.graph_used = false;
  if (m.graphs && !m.moe_layers && !m.profile && n > 1) {
    // The step as a CUDA graph: captured once on a stream of its own (every kernel and cuBLAS
    // call of this thread goes to the current stream), then replayed; a capture the driver
    // refuses falls back to plain launches.
    one_step();   // a plain first step: cuBLAS's and the kernels' scratch exist before the capture
    ++m.pos, ++done;
    synchronize();
    cudaStream_t s = nullptr;
    cudaGraphExec_t exec = nullptr;
    PTQ_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (capture_step(s, one_step, &exec)) {
      for (; done < n; ++done, ++m.pos) PTQ_CUDA(cudaGraphLaunch(exec, s));
      PTQ_CUDA(cudaStreamSynchronize(s));
      m.graph_used = true;
    }
    if (exec) cudaGraphExecDestroy(exec);
    cudaStreamDestroy(s);
  }
  for (; done < n; ++done, ++m.pos) one_step();
  if (n) m.one_token_plain = true;   // its first step ran plainly (at one token a sequence)
  if (m.profile) {
    static const char* names[Impl::kStages] = {"norm1", "qkv", "rope+append", "attention", "o", "norm2", "gate_up", "silu", "down", "head"};
    std::fprintf(stderr, "decode profile (B = %d, %d plain steps, ms per step):", m.B, n);
    for (int i = 0; i < Impl::kStages; ++i) std::fprintf(stderr, " %s %.3f", names[i], m.stage_ms[size_t(i)] / std::max(n, 1));
    std::fprintf(stderr, "\n");
    std::fill(m.stage_ms.begin(), m.stage_ms.end(), 0.0);
  }
  std::vector<int32_t> out(size_t(n) * size_t(m.B));
  if (n) copy_to_host(out.data(), hist.get(), out.size() * 4);
  return out;
}

void DecodeCuda::set_graphs(bool on) { p_->graphs = on; }
// Each changes what a step launches: feed's graph is captured again.
void DecodeCuda::set_permuted_x(bool on) { p_->xperm = on, p_->feed_graph.reset(); }
bool DecodeCuda::permuted_x_used() const { return p_->xperm_used; }
void DecodeCuda::set_rope_in_linear(bool on) { p_->rope_in_linear = on, p_->feed_graph.reset(); }
bool DecodeCuda::rope_in_linear_used() const { return p_->rope_in_linear_used; }
bool DecodeCuda::norm_split_rows_used() const { return p_->norm_split_rows_used; }
bool DecodeCuda::graph_used() const { return p_->graph_used; }
size_t DecodeCuda::graph_held_bytes() const { return p_->feed_graph ? p_->feed_graph->workspaces.bytes() : 0; }

// ---- synthetic weights for `bench decode` ----

DecodeWeights synthetic_decode_weights(const LlamaConfig& c, const std::string& format, bool stacked) {
  if (format != "f16" && format != "w8a16" && format != "w4a16" && format != "nf4" && format != "w8a8" && format != "q4_k" && format != "q6_k")
    fail(Errc::usage, "", "--formats", "unknown format '" + format + "' (f16, w8a16, w4a16, nf4, w8a8, q4_k, q6_k)");
  DecodeWeights w;
  w.c = c;
  w.dt = DType::F16;
  const int64_t d = c.hidden_size, V = c.vocab_size;
  auto f16_buffer = [&](int64_t n, uint64_t seed, float sd) {
    auto b = std::make_shared<DeviceBuffer<uint16_t>>(size_t(n), "synthetic weights (f16)");
    fill_random_normal(b->get(), DType::F16, n, seed, sd);
    w.owners.push_back(b);
    return static_cast<const void*>(b->get());
  };
  w.embed = f16_buffer(V * d, 1, 1.0f);
  w.lm_head = f16_buffer(V * d, 2, 0.02f);
  w.final_norm = VecF::Ones(d);
  w.step_weight_bytes = double(V * d) * 2 + double(d) * 4;
  const std::vector<Proj> projs = stacked ? std::vector<Proj>{Proj::qkv, Proj::o, Proj::gate_up, Proj::down} : std::vector<Proj>(kAllProj.begin(), kAllProj.end());
  const size_t n = projs.size();
  // One layer's packed Linears built on the host from random codes, cloned on the device into each layer.
  std::vector<std::shared_ptr<W4A16Linear>> w4(n);
  std::vector<std::shared_ptr<Nf4Linear>> nf(n);
  Rng r(7);
  for (size_t j = 0; j < n; ++j) {
    const LinearShape sh = linear_shape(c, projs[j]);
    if (format == "w4a16" || format == "w8a16") w4[j] = random_gptq_linear(sh.out, sh.in, format == "w4a16" ? 4 : 8, 0.002f, r);
    else if (format == "nf4") nf[j] = random_nf4_linear(sh.out, sh.in, 0.02f, r);
    else if (format == "q4_k" || format == "q6_k") w4[j] = random_gguf_linear(sh.out, sh.in, format, 0.002f, r);
  }
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    DecodeLayer L;
    double before = w.step_weight_bytes;
    L.in_norm = VecF::Ones(d);
    L.post_norm = VecF::Ones(d);
    if (c.qk_norm) L.q_norm = L.k_norm = VecF::Ones(c.head_dim);
    for (size_t j = 0; j < n; ++j) {
      const Proj p = projs[j];
      const size_t slot = size_t(std::find(kAllProj.begin(), kAllProj.end(), p) - kAllProj.begin());
      LinearFn& fn = p == Proj::qkv ? L.qkv : p == Proj::gate_up ? L.gate_up : L.lin[slot];
      Int8Linear& fn8 = p == Proj::qkv ? L.qkv8 : p == Proj::gate_up ? L.gate_up8 : L.lin8[slot];
      const int64_t N = linear_shape(c, p).out, K = linear_shape(c, p).in;
      const uint64_t seed = uint64_t(100 + l * 9 + int(p));
      if (format == "f16") {
        const void* W = f16_buffer(N * K, seed, 0.02f);
        fn = [W, N, K](const void* x, int64_t rows, float* y, float beta) { f16_linear_f32(W, x, rows, N, K, y, beta); };
        w.step_weight_bytes += double(N * K) * 2;
      } else if (format == "w8a8") {
        auto wb = std::make_shared<DeviceBuffer<int8_t>>(size_t(N * K), "synthetic weights (int8)");
        auto sb = std::make_shared<DeviceBuffer<float>>(size_t(N), "synthetic weight scales");
        fill_random_normal(wb->get(), DType::F16, N * K / 2, seed, 30.0f);   // any bytes: random int8 codes
        std::vector<float> sw(size_t(N), 0.001f);
        copy_to_device(sb->get(), sw.data(), sw.size() * 4);
        w.owners.push_back(wb);
        w.owners.push_back(sb);
        const int8_t* Wp = wb->get();
        const float* Sp = sb->get();
        fn = [Wp, Sp, N, K](const void* x, int64_t rows, float* y, float beta) {
          w8a8_linear_f32(x, DType::F16, ActQuant{ActQuant::per_token, 0.0f}, Wp, Sp, rows, N, K, y, beta);
        };
        fn8.act = ActQuant{ActQuant::per_token, 0.0f};
        fn8.fn = [Wp, Sp, N, K](const int8_t* xq, const float* sx, int64_t rows, float* y, float beta) {
          w8a8_linear_int8_f32(xq, sx, Wp, Sp, rows, N, K, y, beta);
        };
        w.step_weight_bytes += double(N * K) + double(N) * 4;
      } else if (format == "nf4") {
        std::shared_ptr<Nf4Linear> q = l == 0 ? nf[j] : std::shared_ptr<Nf4Linear>(nf[j]->clone());
        w.owners.push_back(q);
        const Nf4Linear* qp = q.get();
        fn = [qp](const void* x, int64_t rows, float* y, float beta) { qp->gemm_f32(x, rows, y, beta); };
        w.step_weight_bytes += double(qp->weight_bytes());
      } else {
        std::shared_ptr<W4A16Linear> q = l == 0 ? w4[j] : std::shared_ptr<W4A16Linear>(w4[j]->clone());
        w.owners.push_back(q);
        const W4A16Linear* qp = q.get();
        fn = [qp](const void* x, int64_t rows, float* y, float beta) { qp->gemm_f32(x, rows, y, beta); };
        w.step_weight_bytes += double(qp->weight_bytes());
      }
      if (l == 0) {
        const int stage = p == Proj::o ? 1 : p == Proj::gate_up || p == Proj::gate || p == Proj::up ? 2 : p == Proj::down ? 3 : 0;
        w.layer_linear_bytes[size_t(stage)].push_back(w.step_weight_bytes - before);
      }
      before = w.step_weight_bytes;
    }
    w.step_weight_bytes += double(d) * 8;
    w.layers.push_back(std::move(L));
  }
  w.what = format + " synthetic weights" + (stacked ? " (q, k, v and gate, up stacked)" : "");
  return w;
}

}  // namespace ptq::cuda
