// chain_probe.cu — a probe, not a ptqkit kernel: how fast can a batch-1 decode step's Linears
// stream when no kernel boundary stands between them?
//
// ptqkit's decode launches each Linear as its own kernel under programmatic dependent launch
// (PDL). Its one-row W4 kernels stream 2.7-2.9 TB/s back to back, a CUDA-core GEMV 10-17% faster
// alone, but in the step that gain shrank to 1.3% (docs/lab/2026-11-24-decode-h200.md, runs
// 358-368): at each boundary the next kernel's CTAs wait for room on the SMs, and a kernel's bytes
// in flight are bounded by its registers. This probe measures the other structure: one persistent
// kernel, one CTA an SM, in which a producer lane streams every Linear's weights through a ring in
// shared memory by the copy engine (bulk copies completing on mbarriers) without ever waiting for
// activations, so the next Linear's bytes are in flight while the consumers still finish this one
// and cross the grid barrier between them. What it measured (runs 372-381): 1.41-1.43 ms a step
// with the units spread evenly, 1.23 with whole row blocks a CTA, 1.205 with the RMS deferred to
// the rows' sums, against 1.26-1.27 ms for the same weights as one launch a Linear; see the lab.
// Runs 534-543 asked whether faster consumers would let the ring hide the boundaries: with no dot
// at all and at most two fills in flight the step takes 0.91-0.92 ms (88-89% of copy), but a dot
// on the tensor cores with half the instructions runs no faster than the CUDA cores' (1.19-1.21).
// Runs 547-558 (lab): its clock64 advances 1.68-1.79 cycles a globaltimer ns against 1.84-1.97 in
// the other forms (nvidia-smi reads 1,980 MHz throughout: not explained); with
// flagged sources (ll, below) and no dot the step takes 0.88-0.89 ms (92-93% of copy), while the
// real consumers gain 1-4% (rows, 8 warps) or lose (16 warps, the tensor-core form).
//
// Contract. A chain of stages (Llama-2-7B's per layer: q, k, v 12288 x 4096; o 4096 x 4096;
// gate, up 22016 x 4096 with gate and up rows interleaved 16 and 16 a row block; down 4096 x 11008;
// `layers` times), each y_s = W_s · x_s in the rows layout of bench/w4_rows.cuh. x_s is the first
// K_s values of stage s-1's output in f16 (stage 0: a fixed vector), normalized to unit RMS (the
// stand-in for the norms and the attention between them: this probe times the Linears and their
// dependencies only); after the gate, up stage the output is silu(gate) · up.
// Work. Stage s has U_s = N_s / 32 · K_s / 128 units (a row block's group: 2,048 bytes of codes and
// 128 of metadata, contiguous in unit order). CTA c takes units [c U / P, (c + 1) U / P) (units
// spread evenly), or whole row blocks [c RB / P, (c + 1) RB / P) (none split): a contiguous byte
// range. The producer (lane 0 of the last warp) copies up to T units at a time,
// stage after stage, into the ring's next slot once its T consumers released it. Consumer warp w
// of C takes the CTA's units q = w, w + C, ... (numbered across stages); lane l sums row l of the
// unit's row block over the group (w4_rows.cuh's word_dot, scaled by s) and keeps a running sum a
// row block in a register; or (kDot, below) the warp dots the unit on the tensor cores, or (a
// timing bound) not at all. With max_out the producer keeps at most that many fills in flight.
// After its units the CTA adds each row block's warp sums in warp order; a row block whole in
// this CTA is written as it is (f16, or silu(gate) · up); one split between CTAs goes through
// a slot a CTA in global memory, and the last of its CTAs to arrive (an acq_rel counter) adds
// the slots in CTA order and writes it. Then the CTA arrives on the stage's grid
// counter (release, after a CTA barrier: no fence); before a stage the consumers wait until every
// CTA arrived on the one before (acquire), then load x (every load issued before the first is
// used) and normalize it (or, defer_rms, use it as it is and scale each row's sum by the same
// 1 / RMS when it is written). With ll (whole row blocks, no attention) no grid counter: each
// stage's output is written as flagged words (ll_store, 4 values a 16-byte store) and the next
// stage's consumers poll x's words in rounds (every word not yet flagged loaded again, together)
// until all carry the stage's flag. Deterministic: every sum in a fixed order. Needs every CTA
// resident: a cooperative launch (a plain one in the graph).
// Numerics: w4_rows.cuh's; x's RMS in fp32; checked against fp64 sums of the device's own f16
// sources (norm-wise relative error <= 2e-3, ptqkit's A16 kernel tests' bound) on the first
// layer's stages and the last stage, with `check` set (CTA 0 then writes every stage's fp32 output;
// not in the timed steps). A traced step (globaltimer stamps, every CTA, every stage; each warp's
// cycles waiting for its fills and to its own last unit, converted at the rate clock64 advanced,
// cycles a ns, over the same phases) says where the time goes between stages.
// Compared with, on the same weights: each stage as its own launch of w4_rows.cuh's gemv_w4 under
// PDL (its x the previous stage's f16 output, not normalized: the same bytes, the timing only).
// With positions L > 0, each layer also holds an attention stage between q, k, v and o (the term a
// one-kernel decode step would add; lab run 518): Llama-2-7B's 32 heads of 128 at batch 1 over L
// cached positions (f16, random, head-major so that a split's keys are one contiguous run: the
// cache's layout measured no different in ptqkit's attention, lab run 170), q the q, k, v stage's
// first 4,096 outputs, in splits of 64 positions, one a CTA (attn_split: one pass of online
// softmax, the splits' records added by the last split of a head to arrive, in split order). In the
// persistent kernel the producer streams a split's keys and values as two fills of the ring right
// after the q, k, v stage's units (they do not depend on it), and the CTA computes its split once
// every CTA arrived on q, k, v; ctx is the o stage's source. In the arm of launches, a kernel of
// 8 warps a split loads its rows into registers before its PDL wait, as ptqkit's attend does.
// Checked against fp64 (the same bound).
// Usage: chain_probe [runs] [layers] [positions]   (default 10 runs, 32 layers, no attention)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/tma.cuh"

#include "bench_timing.cuh"
#include "w4_rows.cuh"

using namespace bench;
namespace tma = ptq::cuda::tma;

namespace {

constexpr int kUnitCodes = 2048, kUnitBytes = kUnitCodes + 128;   // a unit in the ring: codes, then metadata
constexpr int kMaxSlots = 4;                                        // CTAs a row block may span (checked on the host)

struct Stage {
  const uint4* codes;      // [U][128]
  const uint32_t* meta;    // [U][32]
  const __half* src;       // the source of x: the first K values
  __half* out16;           // y in f16, or silu(gate) · up for a gate, up stage
  float* y32;              // y in fp32 (N)
  float* slots;            // [N / 32][kMaxSlots][32]: a split row block's partials
  int* arrivals;           // [N / 32]: CTAs of a split row block arrived (zeroed before each step)
  ulonglong2* ll;          // with ll: the next stage's source as flagged words, [N / 4] (ll_store)
  int N, K, gate_up;
  int part;                // units a block of the partition: 1, or K / 128 (whole row blocks)
  int ns_off;              // into the CTA's copy of the table of CTAs a row block
  // An attention stage (attn = 1; N = K = 0, no codes): q = src [kHeads x kHd] (the q, k, v
  // stage's first 4096 outputs), the layer's cache kc, vc [kHeads][L][kHd] f16 (head-major), ctx
  // into out16 (and y32 in fp32 with check); recs [kHeads][S_a][2 + kHd] the splits' records,
  // arrivals [kHeads] the splits arrived a head.
  int attn;
  const __half* kc;
  const __half* vc;
  float* recs;
  int L, S_a;
};

// The attention stage: Llama-2-7B's 32 heads of 128 over L cached positions, batch 1, in splits of
// 64 positions, a split a CTA (ptqkit's attend at batch 1 splits a 384-long cache's positions 6
// ways: about 43 a CTA at position 256). A thread takes dims d0 .. d0 + 7 of one position (16
// lanes a position, 2 a warp step) and at most kAttnU of the split's positions.
constexpr int kHeads = 32, kHd = 128, kSplitPos = 64, kAttnRow = kHd * 2;
constexpr int kAttnU = 4;   // 64 positions / (2 a warp step x 8 warps): the fewest warps an arm runs

// The partition: CTA c takes blocks of A units [c (U / A) / P, (c + 1) (U / A) / P) (A = 1, or G:
// whole row blocks); unit_begin is its first unit, cta_of(t) the CTA that holds unit t (the
// largest c with floor(c B / P) <= t / A, B = U / A blocks).
__device__ __host__ __forceinline__ int unit_begin(int c, int U, int P, int A) { return int(int64_t(c) * (U / A) / P) * A; }
__device__ __host__ __forceinline__ int cta_of(int t, int U, int P, int A) { return ((t / A + 1) * P + U / A - 1) / (U / A) - 1; }

__device__ __forceinline__ void consumers_sync(int C) { asm volatile("bar.sync 1, %0;\n" ::"r"(C * 32) : "memory"); }
// A stage's grid counter: a CTA's arrival (release: after a CTA barrier, it covers every consumer's
// writes), and the wait until all P CTAs arrived (acquire), by one thread. (Relaxed polls with one
// acquire fence after the last, sparing each poll's L1 invalidation, ran 2-8% slower: lab run 558.)
__device__ __forceinline__ void arrive(int* counter) { asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory"); }
__device__ __forceinline__ void wait_arrived(const int* counter, int P) {
  int a = 0;
  do asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(a) : "l"(counter) : "memory");
  while (a < P);
}

// Row rb * 32 + lane of a stage's output: its CTAs' partials (slots) added in CTA order.
__device__ __forceinline__ float row_sum(const Stage& d, int G, int U, int P, int rb, int lane) {
  const int cf = cta_of(rb * G, U, P, d.part), ns = cta_of((rb + 1) * G - 1, U, P, d.part) - cf + 1;
  float z[kMaxSlots];
#pragma unroll
  for (int k = 0; k < kMaxSlots; ++k) z[k] = k < ns ? __ldcg(d.slots + (size_t(rb) * kMaxSlots + k) * 32 + lane) : 0.0f;
  float v = z[0];
#pragma unroll
  for (int k = 1; k < kMaxSlots; ++k) v += z[k];
  return v;
}
__device__ __forceinline__ float silu_mul(float gate, float up) { return gate / (1.0f + __expf(-gate)) * up; }

// Flagged outputs (ll; NCCL's LL protocol): 4 f16 values of a stage's output as two 8-byte words
// {2 values, flag}, each written and read as one access (aligned 8-byte accesses are single-copy
// atomic), so a reader that sees a word's flag sees its values: no grid counter, no fence, and the
// source arrives in the same load that says it is ready. flag = epoch · stages + s + 1 (stage_flag;
// epoch: the steps so far, from memory), never the same twice; a reader polls until both words
// carry it.
__device__ __forceinline__ void ll_store(ulonglong2* p, uint32_t h01, uint32_t h23, uint32_t flag) {
  const unsigned long long a = (static_cast<unsigned long long>(flag) << 32) | h01, b = (static_cast<unsigned long long>(flag) << 32) | h23;
  asm volatile("st.relaxed.gpu.global.v2.b64 [%0], {%1, %2};\n" ::"l"(p), "l"(a), "l"(b) : "memory");
}
__device__ __forceinline__ ulonglong2 ll_load(const ulonglong2* p) {
  ulonglong2 v;
  asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];\n" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ bool ll_ready(const ulonglong2& v, uint32_t flag) { return uint32_t(v.x >> 32) == flag && uint32_t(v.y >> 32) == flag; }
// The flag stage s's output words carry in step epoch (the writer's s; its reader asks for s - 1).
__device__ __forceinline__ uint32_t stage_flag(uint32_t epoch, int n_stages, int s) { return epoch * uint32_t(n_stages) + uint32_t(s) + 1u; }
__device__ __forceinline__ uint32_t pack_h2(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// Element k of the source of the stage after d: y_k in f16, or silu(gate_k) · up_k in f16 after a
// gate, up stage (row block k / 16: lanes 0-15 its gate rows, 16-31 the same rows of up).
__device__ __forceinline__ __half source_value(const Stage& d, int P, int k) {
  const int G = d.K / 128, U = d.N / 32 * G;
  if (!d.gate_up) return __float2half_rn(row_sum(d, G, U, P, k / 32, k % 32));
  const float gate = row_sum(d, G, U, P, k / 16, k % 16), up = row_sum(d, G, U, P, k / 16, 16 + k % 16);
  return __float2half_rn(silu_mul(gate, up));
}
// With check: CTA 0 writes the stage's whole output in fp32 (y32) and its source values in f16
// (out16), for the host's fp64 check. Not timed.
__device__ void write_check(const Stage& d, int P, int threads) {
  if (d.attn) return;   // its combining CTAs wrote y32 and out16
  const int G = d.K / 128, U = d.N / 32 * G;
  for (int r = threadIdx.x; r < d.N; r += threads) d.y32[r] = row_sum(d, G, U, P, r / 32, r % 32);
  for (int k = threadIdx.x; k < (d.gate_up ? d.N / 2 : d.N); k += threads) d.out16[k] = source_value(d, P, k);
}

constexpr int kMaxLocal = 8;   // row blocks a CTA's range of one stage may touch

// Split z of head h (n of its positions) from the thread's key and value rows kr, vr (dims d0 ..
// d0 + 7 of local positions 2 w + sub + 2 nw u, u < kAttnU, those < n; w the warp of nw): scores
// q·k / sqrt(kHd) (fp32, the 16 lanes of a position summed by shuffles), one pass of online softmax
// (the thread's max, exp-sum and P·V of its 8 dims), the two positions of a warp step merged by a
// shuffle, the warps in scratch ([nw][kHd] + 2 nw floats + a flag) after sync(); the split's record
// (max, exp-sum, P·V) into d.recs. The last of the head's splits to arrive (an acq_rel counter
// after sync(): its release covers the CTA's record) adds the S_a records in split order, as
// ptqkit's combine_splits: ctx = sum_z e^(m_z - M) o_z / sum_z e^(m_z - M) s_z, into out16 (and y32
// with check). Deterministic: every sum in a fixed order.
template <class Sync>
__device__ void attn_split(const Stage& d, int h, int z, int n, const uint4 (&kr)[kAttnU], const uint4 (&vr)[kAttnU], float* scratch, int nw, int check, Sync sync) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, sub = lane / 16, d0 = (lane % 16) * 8;
  float q[8];
  {
    const uint4 u = __ldcg(reinterpret_cast<const uint4*>(d.src + h * kHd + d0));   // written by the stage before
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h2(w[i]));
      q[2 * i] = f.x, q[2 * i + 1] = f.y;
    }
  }
  const float scale = rsqrtf(float(kHd));
  float e[kAttnU], m = -FLT_MAX;
  bool on[kAttnU];   // local position 2 w + sub + 2 nw u of the split is one of its n
#pragma unroll
  for (int u = 0; u < kAttnU; ++u) {
    on[u] = 2 * warp + sub + 2 * nw * u < n;
    const uint32_t w[4] = {kr[u].x, kr[u].y, kr[u].z, kr[u].w};
    float t = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h2(w[i]));
      t = fmaf(q[2 * i], f.x, fmaf(q[2 * i + 1], f.y, t));
    }
#pragma unroll
    for (int o = 8; o > 0; o /= 2) t += __shfl_xor_sync(0xffffffffu, t, o);
    e[u] = on[u] ? t * scale : -FLT_MAX;
    m = fmaxf(m, e[u]);
  }
  float l = 0.0f, acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
  for (int u = 0; u < kAttnU; ++u) {
    const float p = on[u] ? __expf(e[u] - m) : 0.0f;
    const uint32_t w[4] = {vr[u].x, vr[u].y, vr[u].z, vr[u].w};
    l += p;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h2(w[i]));
      acc[2 * i] = fmaf(p, f.x, acc[2 * i]), acc[2 * i + 1] = fmaf(p, f.y, acc[2 * i + 1]);
    }
  }
  {   // the warp's two positions a step: rescaled to the larger max (none: -FLT_MAX, 0, 0, weight 0)
    const float m2 = __shfl_xor_sync(0xffffffffu, m, 16), l2 = __shfl_xor_sync(0xffffffffu, l, 16), mm = fmaxf(m, m2);
    const float a = __expf(m - mm), b = __expf(m2 - mm);
    l = l * a + l2 * b;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = acc[i] * a + __shfl_xor_sync(0xffffffffu, acc[i], 16) * b;
    m = mm;
  }
  float* part = scratch;            // [nw][kHd]
  float* red = scratch + nw * kHd;  // [nw] maxima, [nw] exp-sums
  int* last = reinterpret_cast<int*>(red + 2 * nw);
  if (sub == 0)
#pragma unroll
    for (int i = 0; i < 8; ++i) part[warp * kHd + d0 + i] = acc[i];
  if (lane == 0) red[warp] = m, red[nw + warp] = l;
  sync();
  float M = -FLT_MAX, tot = 0.0f;
  for (int w = 0; w < nw; ++w) M = fmaxf(M, red[w]);
  for (int w = 0; w < nw; ++w) tot += red[nw + w] * __expf(red[w] - M);
  float* rec = d.recs + (size_t(h) * d.S_a + z) * (2 + kHd);
  for (int i = tid; i < kHd; i += 32 * nw) {
    float o = 0.0f;
    for (int w = 0; w < nw; ++w) o += part[w * kHd + i] * __expf(red[w] - M);
    rec[2 + i] = o;
  }
  if (tid == 0) rec[0] = M, rec[1] = tot;
  sync();
  if (tid == 0) {
    int before;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(before) : "l"(d.arrivals + h) : "memory");
    *last = before == d.S_a - 1;
    if (*last) d.arrivals[h] = 0;   // every split has arrived: ready for the next step
  }
  sync();
  if (!*last) return;
  const float* rh = d.recs + size_t(h) * d.S_a * (2 + kHd);
  for (int i = tid; i < kHd; i += 32 * nw) {
    float Mx = -FLT_MAX, sum = 0.0f, o = 0.0f;
    for (int zz = 0; zz < d.S_a; ++zz) {
      const float* r = rh + zz * (2 + kHd);
      const float mz = __ldcg(r), sz = __ldcg(r + 1), oz = __ldcg(r + 2 + i);
      if (sz > 0.0f) {
        const float Mn = fmaxf(Mx, mz), a = sum > 0.0f ? __expf(Mx - Mn) : 0.0f, b = __expf(mz - Mn);
        sum = sum * a + sz * b, o = o * a + oz * b, Mx = Mn;
      }
    }
    d.out16[h * kHd + i] = __float2half_rn(o / sum);
    if (check) d.y32[h * kHd + i] = o / sum;
  }
}

// The arm of launches: split blockIdx.x % S_a of head blockIdx.x / S_a, 8 warps; its key and value
// rows loaded before the PDL wait (they do not depend on the kernel before, as in attend), q after.
__global__ void __launch_bounds__(256) attn_launch(const Stage d, int check) {
  __shared__ float scratch[8 * kHd + 2 * 8 + 1];
  const int h = blockIdx.x / d.S_a, z = blockIdx.x % d.S_a, j0 = z * kSplitPos, n = min(kSplitPos, d.L - j0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane / 16, d0 = (lane % 16) * 8;
  uint4 kr[kAttnU], vr[kAttnU];
#pragma unroll
  for (int u = 0; u < kAttnU; ++u) {
    const int j = 2 * warp + sub + 16 * u;
    kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
    if (j < n) {
      const size_t at = (size_t(h) * d.L + j0 + j) * kHd + d0;
      kr[u] = __ldcs(reinterpret_cast<const uint4*>(d.kc + at));
      vr[u] = __ldcs(reinterpret_cast<const uint4*>(d.vc + at));
    }
  }
  ptq::cuda::pdl::wait_prior_grid();
  ptq::cuda::pdl::allow_dependents();
  attn_split(d, h, z, n, kr, vr, scratch, 8, check, [] { __syncthreads(); });
}

// How the consumers dot a unit (kDot): rows (0), each lane a row by w4_rows.cuh's group_dot on
// the CUDA cores; mma (1), the unit as two row tiles of mma.m16n8k16 A fragments (W4Layout::frag),
// x the B operand in each of its 8 columns; none (2, timing only: wrong outputs) no arithmetic.
// The mma form leaves q - z to the end: the A operand is the magic number's 1024 + q (rows g) or
// 1024 + 16 q (rows g + 8) as it comes out of one LOP3, so a row's fp32 sum over the group is
// T = 1024 X + m Σ q x (m = 1 or 16, X = Σ x over the group), and Σ (q - z) x = T / m + (-(1024 + z) +
// 1024 - 1024 / m) X: a shift, 4 LOP3 and an MMA a 16 x 16 tile, no f16 arithmetic. X is summed in
// fp32 from the f16 x the MMAs read (defer_rms only: x as loaded).
// (Two other schedules of the mma form lost, lab run 538: each tile's 8 steps in two chains of 4,
// and unit i + C read before unit i's MMAs.)
enum { kDotRows = 0, kDotMma = 1, kDotNone = 2 };

constexpr int kMaxK = 11008;   // the longest x (down's K): the x loads a thread holds
// A traced stage's entries a CTA: barrier passed, x ready, units done, row blocks written (ns); a
// warp's wait for its fills, and its units phase up to its own last unit (SM cycles, mean over warps);
// thread 0's cycles over the units phase (with its ns: the rate the cycles are converted at).
constexpr int kTraceN = 7;

template <int C, int T, int kDot = kDotRows, bool ll = false>
__global__ void __launch_bounds__((C + 1) * 32, 1)
    chain_w4(const Stage* stages, int n_stages, int K_max, const __half* x0, int* grid_arrivals, const uint8_t* tables, int table_bytes, int S,
             int check, int fence, int defer_rms, int max_out, unsigned long long* trace, unsigned* epoch_ptr, int* done) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kXPer = (kMaxK / 8 + C * 32 - 1) / (C * 32);
  constexpr int kXLL = (kMaxK / 4 + C * 32 - 1) / (C * 32);   // with ll: 4 values a load
  const int P = gridDim.x, c = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint8_t* ring = smem;   // S slots of T units: T x 2,048 bytes of codes, then T x 128 of metadata
  constexpr int slot_bytes = T * kUnitBytes;
  static_assert(C % T == 0, "a warp's next unit is C / T fills on");
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + size_t(S) * slot_bytes);
  uint64_t* empty = full + S;
  float* red = reinterpret_cast<float*>(empty + S);                     // [32]
  float* acc_rb = red + 32;                                              // [C][kMaxLocal][32]: each warp's row sums a row block
  __half* xs = reinterpret_cast<__half*>(acc_rb + C * kMaxLocal * 32);   // [max K]
  float* xsum = reinterpret_cast<float*>(xs + K_max);                    // [max K / 128]: X a group (kDotMma)
  uint8_t* ns_tbl = reinterpret_cast<uint8_t*>(xsum + K_max / 128);   // CTAs a row block, every stage kind's (uint8)
  for (int i = threadIdx.x; i < table_bytes; i += blockDim.x) ns_tbl[i] = tables[i];
  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) tma::mbar_init(&full[i], 1), tma::mbar_init(&empty[i], T);
    tma::mbar_init_fence();
  }
  __shared__ unsigned long long trace_sums[3];   // traced: the warps' fill waits, their units' ends, the units' start (cycles)
  if (threadIdx.x == 0) trace_sums[0] = trace_sums[1] = 0;
  __syncthreads();

  if (warp == C) {   // the producer: up to T units a bulk copy (a CTA's units are contiguous)
    if (lane != 0) return;
    int j = 0, slot = 0, phase = 0;   // fills so far; this fill's slot and its use's parity
    // With max_out > 0, at most max_out fills in flight: fill j waits until fill j - max_out has
    // landed (its slot's phase cannot move on before the producer refills it, S > max_out).
    auto throttle = [&] {
      if (max_out > 0 && j >= max_out) tma::mbar_wait(&full[(j - max_out) % S], ((j - max_out) / S) & 1);
    };
    for (int s = 0; s < n_stages; ++s) {
      const Stage d = stages[s];
      if (d.attn) {   // the CTA's split: its keys, then its values, a fill each (one bulk copy: contiguous)
        const int j0 = (c % d.S_a) * kSplitPos, h = c / d.S_a, n = min(kSplitPos, d.L - j0);
        if (c >= kHeads * d.S_a || n <= 0) continue;
        for (const __half* src : {d.kc, d.vc}) {
          if (j >= S) tma::mbar_wait(&empty[slot], phase ^ 1);
          throttle();
          tma::mbar_expect_tx(&full[slot], n * kAttnRow);
          tma::bulk_load(ring + size_t(slot) * slot_bytes, src + (size_t(h) * d.L + j0) * kHd, n * kAttnRow, &full[slot]);
          ++j;
          if (++slot == S) slot = 0, phase ^= 1;
        }
        continue;
      }
      const int U = d.N / 32 * (d.K / 128);
      const int u1 = unit_begin(c + 1, U, P, d.part);
      for (int u = unit_begin(c, U, P, d.part); u < u1; u += T, ++j) {
        const int m = min(T, u1 - u);
        if (j >= S) tma::mbar_wait(&empty[slot], phase ^ 1);
        throttle();
        uint8_t* dst = ring + size_t(slot) * slot_bytes;
        tma::mbar_expect_tx(&full[slot], m * kUnitBytes);
        tma::bulk_load(dst, d.codes + size_t(u) * 128, m * kUnitCodes, &full[slot]);
        tma::bulk_load(dst + T * kUnitCodes, d.meta + size_t(u) * 32, m * 128, &full[slot]);
        for (int k = m; k < T; ++k) tma::mbar_arrive(&empty[slot]);   // the units a short last fill lacks
        if (++slot == S) slot = 0, phase ^= 1;
      }
    }
    return;
  }

  // The consumers. With ll, stage s's output carries stage_flag(epoch, n_stages, s) and the grid
  // counters are kept for check's write_check only.
  const uint32_t epoch = ll ? *epoch_ptr : 0u;
  const bool grid = !ll || check;
  auto stamp = [&](int s, int k) {
    if (trace && threadIdx.x == 0) trace[(size_t(s) * P + c) * kTraceN + k] = global_ns();
  };
  int q_base = 0, j_base = 0;   // units and fills of the stages before
  for (int s = 0; s < n_stages; ++s) {
    const Stage d = stages[s];
    if (d.attn) {   // after every CTA arrived on the stage before (q): the CTA's split, from its two fills
      if (threadIdx.x == 0) wait_arrived(grid_arrivals + s - 1, P);
      stamp(s, 0);
      consumers_sync(C);
      if (check && c == 0) write_check(stages[s - 1], P, C * 32);
      const int z = c % d.S_a, h = c / d.S_a, j0 = z * kSplitPos, n = min(kSplitPos, d.L - j0);
      if (c < kHeads * d.S_a && n > 0) {
        const int sub = lane / 16, d0 = (lane % 16) * 8;
        uint4 kr[kAttnU], vr[kAttnU];
        for (int f = 0; f < 2; ++f) {
          const int slot = (j_base + f) % S, parity = ((j_base + f) / S) & 1;
          tma::mbar_wait(&full[slot], parity);
          const uint8_t* b = ring + size_t(slot) * slot_bytes;
#pragma unroll
          for (int u = 0; u < kAttnU; ++u) {
            const int jl = 2 * warp + sub + 2 * C * u;
            const uint4 v = jl < n ? *reinterpret_cast<const uint4*>(b + jl * kAttnRow + d0 * 2) : make_uint4(0, 0, 0, 0);
            if (f == 0) kr[u] = v;
            else vr[u] = v;
          }
        }
        consumers_sync(C);   // both fills read: release them (T arrivals each, as a fill of units)
        if (threadIdx.x == 0)
          for (int f = 0; f < 2; ++f)
            for (int k = 0; k < T; ++k) tma::mbar_arrive(&empty[(j_base + f) % S]);
        stamp(s, 1);
        attn_split(d, h, z, n, kr, vr, acc_rb, C, check, [=] { consumers_sync(C); });
        j_base += 2;
      } else {
        stamp(s, 1);
      }
      stamp(s, 2);
      consumers_sync(C);
      stamp(s, 3);
      if (threadIdx.x == 0) arrive(grid_arrivals + s);
      continue;
    }
    const int G = d.K / 128, U = d.N / 32 * G;
    const int u0 = unit_begin(c, U, P, d.part), u1 = unit_begin(c + 1, U, P, d.part), n = u1 - u0, rb0 = u0 / G;
    // x: once every CTA arrived on stage s - 1, its output's first K values (in f16) at unit RMS
    // (with ll: as each of its words carries the stage's flag).
    if (s > 0 && grid && threadIdx.x == 0) wait_arrived(grid_arrivals + s - 1, P);
    stamp(s, 0);
    consumers_sync(C);
    if (s > 0 && check && c == 0) write_check(stages[s - 1], P, C * 32);
    // x and its sum of squares in one pass; then either x scaled to unit RMS (one more pass), or
    // (defer_rms) x as it is and each row's sum scaled by the same 1 / RMS before it is written.
    const __half* src = s > 0 ? stages[s - 1].out16 : x0;
    float ss = 0.0f;
    // A load's W words of 2 f16 into ss (squares) and gs (values); the mma form's X of a group,
    // gs summed over the L lanes whose loads hold its 128 values (k: the load's index, of lim).
    auto add_x = [&](const uint32_t* w, int W, float& gs) {
#pragma unroll
      for (int j = 0; j < W; ++j) {
        const float2 f = __half22float2(h2(w[j]));
        ss = fmaf(f.x, f.x, fmaf(f.y, f.y, ss));
        gs += f.x + f.y;
      }
    };
    auto group_x = [&](float gs, int k, int L, int lim) {
      if constexpr (kDot == kDotMma) {
#pragma unroll
        for (int o = L / 2; o > 0; o /= 2) gs += __shfl_xor_sync(0xffffffffu, gs, o);
        if (lane % L == 0 && k < lim) xsum[k / L] = gs;
      }
    };
    if (ll && s > 0) {   // 4 values a load, every load issued before the first is checked
      const ulonglong2* lsrc = stages[s - 1].ll;
      const uint32_t flag = stage_flag(epoch, n_stages, s - 1);
      ulonglong2 lv[kXLL];
#pragma unroll
      for (int it = 0; it < kXLL; ++it) {
        const int k = warp * 32 + lane + it * C * 32;
        if (k < d.K / 4) lv[it] = ll_load(lsrc + k);
      }
      // Rounds: every word not yet flagged loaded again, together (one round trip a round).
      for (;;) {
        bool all = true;
#pragma unroll
        for (int it = 0; it < kXLL; ++it) {
          const int k = warp * 32 + lane + it * C * 32;
          if (k < d.K / 4 && !ll_ready(lv[it], flag)) all = false, lv[it] = ll_load(lsrc + k);
        }
        if (all) break;
      }
#pragma unroll
      for (int it = 0; it < kXLL; ++it) {   // warp-uniform: a group is a warp's 32 loads
        const int k = warp * 32 + lane + it * C * 32;
        float gs = 0.0f;
        if (k < d.K / 4) {
          const uint32_t w[2] = {uint32_t(lv[it].x), uint32_t(lv[it].y)};
          reinterpret_cast<uint2*>(xs)[k] = make_uint2(w[0], w[1]);
          add_x(w, 2, gs);
        }
        group_x(gs, k, 32, d.K / 4);
      }
    } else {
      uint4 xv[kXPer];   // every load issued before the first is used
#pragma unroll
      for (int it = 0; it < kXPer; ++it) {
        const int k = warp * 32 + lane + it * C * 32;
        if (k < d.K / 8) xv[it] = __ldcg(reinterpret_cast<const uint4*>(src) + k);
      }
#pragma unroll
      for (int it = 0; it < kXPer; ++it) {   // warp-uniform: a group is 16 lanes' uint4
        const int k = warp * 32 + lane + it * C * 32;
        float gs = 0.0f;
        if (k < d.K / 8) {
          const uint4 v = xv[it];
          reinterpret_cast<uint4*>(xs)[k] = v;
          const uint32_t w[4] = {v.x, v.y, v.z, v.w};
          add_x(w, 4, gs);
        }
        group_x(gs, k, 16, d.K / 8);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red[warp] = ss;
#pragma unroll
    for (int r = 0; r < kMaxLocal; ++r) acc_rb[(warp * kMaxLocal + r) * 32 + lane] = 0.0f;
    consumers_sync(C);
    float tot = 0.0f;
    for (int w = 0; w < C; ++w) tot += red[w];
    const float rinv = rsqrtf(tot / float(d.K)), row_scale = defer_rms ? rinv : 1.0f;
    if (!defer_rms) {
      for (int k = threadIdx.x; k < d.K / 2; k += C * 32) {
        __half2* p = reinterpret_cast<__half2*>(xs) + k;
        *p = __float22half2_rn(make_float2(__low2float(*p) * rinv, __high2float(*p) * rinv));
      }
      consumers_sync(C);
    }
    stamp(s, 1);
    // The units q_base + i for i = (w - q_base) mod C, + C, ...: fill j_base + i / T (slot, parity,
    // group and local row block kept by increments: C / T fills and C units a step). A warp sums
    // its units of a row block in registers, in unit order.
    const int i0 = ((warp - q_base) % C + C) % C;
    int slot = (j_base + i0 / T) % S, parity = ((j_base + i0 / T) / S) & 1, g = (u0 + i0) % G, lrb = (u0 + i0) / G - rb0;
    float acc = 0.0f;
    // The mma form: lane (gq, c) keeps row gq + 8 c of the row block (of its C fragment's rows gq,
    // gq + 8 of tiles 0, 1: c0 of tile c / 2 when c is even, c2 when odd), m = 1 or 16.
    const int c4 = lane % 4, my_row = kDot == kDotMma ? lane / 4 + 8 * c4 : lane;
    const float inv_m = c4 % 2 ? 1.0f / 16.0f : 1.0f, off_m = c4 % 2 ? 960.0f : 0.0f;
    // A unit's codes and metadata: wait for its fill, read them, release the warp's share of it.
    // Traced: every warp's cycles in its fills' waits this stage (lane 0's), and in its units phase
    // up to its own last unit, summed over the warps in shared memory (zeroed at kernel start and
    // after each read; a register held across the loop made the 16-warp rows form spill: run 544).
    if (trace && threadIdx.x == 0) trace_sums[2] = clock64();   // the units phase's start (after the barrier)
    auto fetch = [&](uint4 (&q)[4], uint32_t& mq, int i, int sl, int par) {
      if (trace && lane == 0) {
        const long long t0 = clock64();
        tma::mbar_wait(&full[sl], par);
        atomicAdd(&trace_sums[0], (unsigned long long)(clock64() - t0));
      } else {
        tma::mbar_wait(&full[sl], par);
      }
      const uint8_t* b = ring + size_t(sl) * slot_bytes;
#pragma unroll
      for (int k = 0; k < 4; ++k) q[k] = reinterpret_cast<const uint4*>(b + (i % T) * kUnitCodes)[k * 32 + lane];
      mq = reinterpret_cast<const uint32_t*>(b + T * kUnitCodes + (i % T) * 128)[my_row];
      __syncwarp();
      if (lane == 0) tma::mbar_arrive(&empty[sl]);
    };
    uint4 cq[4];
    uint32_t m = 0;
    for (int i = i0; i < n; i += C) {
      fetch(cq, m, i, slot, parity);
      if constexpr (kDot == kDotRows) {
        acc = group_dot(cq, m, reinterpret_cast<const uint4*>(xs + g * 128), acc);
      } else if constexpr (kDot == kDotMma) {
        // The two row tiles' 8 k16 steps, the tiles' MMAs interleaved (two chains of 8).
        const uint32_t* xg = reinterpret_cast<const uint32_t*>(xs + g * 128);
        float t[2][4] = {};
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int kk = 4 * (k % 2) + j;
            const uint32_t wv = j == 0 ? cq[k].x : j == 1 ? cq[k].y : j == 2 ? cq[k].z : cq[k].w, w8 = wv >> 8;
            const uint32_t a[4] = {lop(wv, 0x000F000Fu), lop(wv, 0x00F000F0u), lop(w8, 0x000F000Fu), lop(w8, 0x00F000F0u)};
            ptq::cuda::ptx::mma_m16n8k16_f16(t[k / 2], a, xg[8 * kk + c4], xg[8 * kk + c4 + 4]);
          }
        // Tile c / 2's row gq (c0) or gq + 8 (c2), by selects (an index would put t in local memory).
        const float tr = c4 == 0 ? t[0][0] : c4 == 1 ? t[0][2] : c4 == 2 ? t[1][0] : t[1][2];
        const __half2 mh = h2(m);
        acc = fmaf(__low2float(mh), fmaf(tr, inv_m, (__high2float(mh) + off_m) * xsum[g]), acc);
      } else {
        acc += float((cq[0].x ^ cq[1].y ^ cq[2].z ^ cq[3].w ^ m) & 0xffu) * 1e-30f;   // keep the loads
      }
      slot += C / T;
      if (slot >= S) slot -= S, parity ^= 1;
      g += C;
      if (g >= G) {   // C <= G: at most one row block on
        g -= G;
        acc_rb[(warp * kMaxLocal + lrb) * 32 + my_row] = acc;
        acc = 0.0f;
        ++lrb;
      }
    }
    if (lrb < kMaxLocal) acc_rb[(warp * kMaxLocal + lrb) * 32 + my_row] = acc;   // past the range: lrb's entry is never read
    if (trace && lane == 0) atomicAdd(&trace_sums[1], (unsigned long long)clock64());
    consumers_sync(C);
    stamp(s, 2);
    if (trace && threadIdx.x == 0) {
      trace[(size_t(s) * P + c) * kTraceN + 6] = clock64() - trace_sums[2];
      trace[(size_t(s) * P + c) * kTraceN + 4] = trace_sums[0] / C, trace[(size_t(s) * P + c) * kTraceN + 5] = max(0ll, (long long)(trace_sums[1] / C - trace_sums[2]));
      trace_sums[0] = trace_sums[1] = 0;
    }
    // Each row block of the range: the warps' sums in warp order, into this CTA's slot (the next
    // stage's readers add a row block's slots in CTA order).
    if (n > 0)
      for (int rb = rb0 + warp; rb <= (u1 - 1) / G; rb += C) {
        float v = 0.0f;
        for (int w = 0; w < C; ++w) v += acc_rb[(w * kMaxLocal + rb - rb0) * 32 + lane];
        v *= row_scale;
        const int ns = ns_tbl[d.ns_off + rb];
        if (ns > 1 || check) d.slots[(size_t(rb) * kMaxSlots + (c - cta_of(rb * G, U, P, d.part))) * 32 + lane] = v;
        if (ns > 1) {   // the last of the row block's CTAs to arrive adds the slots in CTA order
          if (fence) __threadfence();
          __syncwarp();   // the lanes' slot writes before lane 0's release (cumulative: no fence needed)
          int before = 0;
          if (lane == 0) asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(before) : "l"(d.arrivals + rb) : "memory");
          if (__shfl_sync(0xffffffffu, before, 0) != ns - 1) continue;
          v = 0.0f;
          for (int z = 0; z < ns; ++z) v += __ldcg(d.slots + (size_t(rb) * kMaxSlots + z) * 32 + lane);
        }
        const int n_out = d.gate_up ? 16 : 32;   // lanes 0-15 gate rows, 16-31 the same rows of up
        if (d.gate_up) v = silu_mul(v, __shfl_down_sync(0xffffffffu, v, 16));
        if (ll) {   // lanes 4i: outputs 4i .. 4i + 3 of the row block as one flagged store
          const float v1 = __shfl_down_sync(0xffffffffu, v, 1), v2 = __shfl_down_sync(0xffffffffu, v, 2), v3 = __shfl_down_sync(0xffffffffu, v, 3);
          if (lane % 4 == 0 && lane < n_out) ll_store(d.ll + (rb * n_out + lane) / 4, pack_h2(v, v1), pack_h2(v2, v3), stage_flag(epoch, n_stages, s));
        } else if (lane < n_out) {
          d.out16[rb * n_out + lane] = __float2half_rn(v);
        }
      }
    consumers_sync(C);
    stamp(s, 3);
    if (grid && threadIdx.x == 0) {   // after the barrier: the release covers every consumer's writes
      if (fence) __threadfence();
      arrive(grid_arrivals + s);
    }
    q_base += n;
    j_base += (n + T - 1) / T;
  }
  if (ll && threadIdx.x == 0) {   // the last CTA to finish moves the epoch on (done is zeroed before each step)
    int before;
    asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(before) : "l"(done) : "memory");
    if (before == P - 1) *epoch_ptr = epoch + 1u;
  }
  if (check && c == 0) {   // the last stage's output
    if (threadIdx.x == 0) wait_arrived(grid_arrivals + n_stages - 1, P);
    consumers_sync(C);
    write_check(stages[n_stages - 1], P, C * 32);
  }
}

// The attention stages' caches: f16 in [-1, 1) from the same hash.
__global__ void fill_cache(__half* kc, __half* vc, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    kc[i] = __float2half_rn(float(mix((seed + 11) * 0x9e3779b97f4a7c15ull + uint64_t(i)) >> 8) / 8388608.0f - 1.0f);
    vc[i] = __float2half_rn(float(mix((seed + 13) * 0xbf58476d1ce4e5b9ull + uint64_t(i)) >> 8) / 8388608.0f - 1.0f);
  }
}

// fp64 ctx of an attention stage from its device q (src), cache and the kernel's fp32 ctx (y32):
// norm-wise relative error over the heads.
double check_attn(const Stage& d) {
  const size_t n = size_t(kHeads) * d.L * kHd;
  std::vector<__half> q(size_t(kHeads) * kHd), kc(n), vc(n);
  std::vector<float> y(size_t(kHeads) * kHd);
  CK(cudaMemcpy(q.data(), d.src, q.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(kc.data(), d.kc, n * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(vc.data(), d.vc, n * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(y.data(), d.y32, y.size() * 4, cudaMemcpyDeviceToHost));
  auto f = [](__half v) { return double(__half2float(v)); };
  std::vector<double> ref(y.size());
  for (int h = 0; h < kHeads; ++h) {
    std::vector<double> sc(size_t(d.L));
    double mx = -1e300;
    for (int j = 0; j < d.L; ++j) {
      double t = 0;
      for (int i = 0; i < kHd; ++i) t += f(q[size_t(h * kHd + i)]) * f(kc[(size_t(h) * d.L + size_t(j)) * kHd + size_t(i)]);
      sc[size_t(j)] = t / std::sqrt(double(kHd));
      mx = std::max(mx, sc[size_t(j)]);
    }
    double sum = 0;
    for (double& v : sc) sum += (v = std::exp(v - mx));
    for (int i = 0; i < kHd; ++i) {
      double o = 0;
      for (int j = 0; j < d.L; ++j) o += sc[size_t(j)] * f(vc[(size_t(h) * d.L + size_t(j)) * kHd + size_t(i)]);
      ref[size_t(h * kHd + i)] = o / sum;
    }
  }
  return rel_error(y, ref);
}

// fp64 y of one stage from its device codes, metadata and source (x normalized to unit RMS, as the
// persistent kernel does): norm-wise relative error of the kernel's fp32 y.
double check_stage(const Stage& d, const __half* src, W4Layout layout) {
  std::vector<__half> xh(size_t(d.K));
  std::vector<float> y(size_t(d.N));
  CK(cudaMemcpy(xh.data(), src, size_t(d.K) * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(y.data(), d.y32, size_t(d.N) * 4, cudaMemcpyDeviceToHost));
  std::vector<double> x(size_t(d.K));
  double ss = 0;
  for (int k = 0; k < d.K; ++k) ss += double(__half2float(xh[size_t(k)])) * double(__half2float(xh[size_t(k)]));
  const double rms = std::sqrt(ss / d.K);
  for (int k = 0; k < d.K; ++k) x[size_t(k)] = double(__half2float(xh[size_t(k)])) / rms;
  return rel_error(y, rows_gemv_ref(d.codes, d.meta, d.N, d.K, x, layout));
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 10;
  const int layers = argc > 2 ? std::max(1, std::atoi(argv[2])) : 32;
  const int L = argc > 3 ? std::max(0, std::atoi(argv[3])) : 0;   // cached positions of an attention stage a layer (0: none)
  int dev = 0, major = 0, sms = 0, smem_optin = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (major < 9) {
    std::fprintf(stderr, "chain_probe: needs an sm_90 GPU (bulk copies, PDL)\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));

  struct Shape {
    int N, K, gate_up, attn;
    const char* name;
  };
  // A layer's stages: q, k, v; (with L) the attention over L positions; o; gate, up; down.
  std::vector<Shape> layer = {{12288, 4096, 0, 0, "q, k, v"}, {4096, 4096, 0, 0, "o"}, {22016, 4096, 1, 0, "gate, up"}, {4096, 11008, 0, 0, "down"}};
  if (L > 0) layer.insert(layer.begin() + 1, Shape{0, 0, 0, 1, "attention"});
  const int kinds = int(layer.size()), S_a = (L + kSplitPos - 1) / kSplitPos;
  if (L > 0 && kHeads * S_a > sms) {
    std::fprintf(stderr, "chain_probe: %d positions make %d attention splits, more than the %d CTAs\n", L, kHeads * S_a, sms);
    return 2;
  }
  int K_max = 0;   // the longest x: shared memory, and x0
  for (const Shape& sh : layer) K_max = std::max(K_max, sh.K);
  if (K_max > kMaxK) {
    std::fprintf(stderr, "chain_probe: K %d past the kernel's %d\n", K_max, kMaxK);
    return 2;
  }
  const int n_stages = kinds * layers;
  std::vector<Stage> hs(static_cast<size_t>(n_stages));
  size_t bytes = 0, kv_bytes = 0, counters = size_t(n_stages);
  for (int s = 0; s < n_stages; ++s) counters += layer[size_t(s % kinds)].attn ? size_t(kHeads) : size_t(layer[size_t(s % kinds)].N / 32);
  ++counters;   // the CTAs done (ll's epoch)
  int* d_counters = nullptr;   // the grid counters [n_stages], then each stage's row-block counters
  CK(cudaMalloc(&d_counters, counters * 4));
  __half* x0 = nullptr;
  CK(cudaMalloc(&x0, size_t(K_max) * 2));
  {
    std::vector<__half> hx(static_cast<size_t>(K_max));
    for (size_t i = 0; i < hx.size(); ++i) hx[i] = __float2half_rn(std::sin(0.37f * float(i) + 0.1f));
    CK(cudaMemcpy(x0, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  }
  size_t off = size_t(n_stages);
  for (int s = 0; s < n_stages; ++s) {
    const Shape sh = layer[size_t(s % kinds)];
    Stage& d = hs[size_t(s)];
    if (sh.attn) {   // the layer's cache, random f16 in [-1, 1); ctx; the splits' records
      const size_t n = size_t(kHeads) * L * kHd;
      __half *kc = nullptr, *vc = nullptr;
      CK(cudaMalloc(&kc, n * 2));
      CK(cudaMalloc(&vc, n * 2));
      fill_cache<<<1024, 256, 0, g_stream>>>(kc, vc, int64_t(n), uint64_t(s) + 1);
      CK(cudaGetLastError());
      d.attn = 1, d.kc = kc, d.vc = vc, d.L = L, d.S_a = S_a;
      CK(cudaMalloc(&d.recs, size_t(kHeads) * S_a * (2 + kHd) * 4));
      CK(cudaMalloc(&d.out16, size_t(kHeads) * kHd * 2));
      CK(cudaMalloc(&d.y32, size_t(kHeads) * kHd * 4));
      d.src = hs[size_t(s) - 1].out16;   // q: the q, k, v stage's first kHeads x kHd outputs
      d.arrivals = d_counters + off;
      off += size_t(kHeads);
      kv_bytes += 2 * n * 2;
      continue;
    }
    const int G = sh.K / 128;
    const size_t U = size_t(sh.N / 32) * G;
    uint4* codes = nullptr;
    uint32_t* meta = nullptr;
    CK(cudaMalloc(&codes, U * kUnitCodes));
    CK(cudaMalloc(&meta, U * 128));
    fill_rows<<<1024, 256, 0, g_stream>>>(reinterpret_cast<uint32_t*>(codes), meta, int64_t(U) * 512, int64_t(U) * 32, uint64_t(s) + 1,
                                          float(1.0 / std::sqrt(21.0 * sh.K)));
    CK(cudaGetLastError());
    d.codes = codes, d.meta = meta, d.N = sh.N, d.K = sh.K, d.gate_up = sh.gate_up;
    CK(cudaMalloc(&d.out16, size_t(sh.N) * 2));
    CK(cudaMalloc(&d.y32, size_t(sh.N) * 4));
    CK(cudaMalloc(&d.slots, size_t(sh.N / 32) * kMaxSlots * 32 * 4));
    if (L == 0) {   // the ll arms run without the attention stage only
      CK(cudaMalloc(&d.ll, size_t(sh.N) / 4 * 16));
      CK(cudaMemset(d.ll, 0, size_t(sh.N) / 4 * 16));   // flag 0: never a stage's
    }
    d.src = s > 0 ? hs[size_t(s) - 1].out16 : x0;
    d.arrivals = d_counters + off;
    off += size_t(sh.N / 32);
    bytes += U * kUnitBytes;
  }
  bytes += kv_bytes;
  // The partition (whole_rows: whole row blocks a CTA, so that none is split, at the cost of
  // balance) and the table the kernel keeps in shared memory, one a stage kind (every layer's
  // partition is the same): CTAs a row block (uint8).
  std::vector<uint8_t> tables;
  uint8_t* d_tables = nullptr;
  Stage* d_stages = nullptr;
  CK(cudaMalloc(&d_stages, hs.size() * sizeof(Stage)));
  auto partition = [&](bool whole_rows) {
    tables.clear();
    int ns_off[5] = {};
    std::printf("%s: row blocks split between CTAs:", whole_rows ? "whole row blocks a CTA" : "units spread evenly");
    for (int kind = 0; kind < kinds; ++kind) {
      if (layer[size_t(kind)].attn) continue;
      const int G = layer[kind].K / 128, RB = layer[kind].N / 32, U = RB * G, A = whole_rows ? G : 1;
      ns_off[kind] = int(tables.size());
      int n_split = 0;
      for (int rb = 0; rb < RB; ++rb) {
        const int ns = cta_of((rb + 1) * G - 1, U, sms, A) - cta_of(rb * G, U, sms, A) + 1;
        if (ns > kMaxSlots) {
          std::fprintf(stderr, "chain_probe: row block %d of %dx%d spans %d CTAs (at most %d)\n", rb, layer[kind].N, layer[kind].K, ns, kMaxSlots);
          std::exit(1);
        }
        tables.push_back(uint8_t(ns));
        n_split += ns > 1;
      }
      for (int c = 0; c < sms; ++c) {   // the row blocks of a CTA's range: the kernel's kMaxLocal
        const int u0 = unit_begin(c, U, sms, A), u1 = unit_begin(c + 1, U, sms, A);
        if (u1 > u0 && (u1 - 1) / G - u0 / G + 1 > kMaxLocal) {
          std::fprintf(stderr, "chain_probe: CTA %d's range of %dx%d spans more than %d row blocks\n", c, layer[kind].N, layer[kind].K, kMaxLocal);
          std::exit(1);
        }
      }
      std::printf("%s %s %d", kind > 0 ? "," : "", layer[size_t(kind)].name, n_split);
    }
    std::printf("\n");
    for (int s = 0; s < n_stages; ++s)
      if (!layer[size_t(s % kinds)].attn) hs[size_t(s)].ns_off = ns_off[s % kinds], hs[size_t(s)].part = whole_rows ? layer[size_t(s % kinds)].K / 128 : 1;
    if (!d_tables) CK(cudaMalloc(&d_tables, tables.size()));
    CK(cudaMemcpy(d_tables, tables.data(), tables.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_stages, hs.data(), hs.size() * sizeof(Stage), cudaMemcpyHostToDevice));
  };
  partition(false);
  CK(cudaStreamSynchronize(g_stream));

  const double copy = copy_gbs();
  std::printf("chain_probe on %s, %d SMs: copy %.0f GB/s (read + write); %d layers of Llama-2-7B's Linears (%d stages), %.3f GB of W4 g128 codes and "
              "metadata a step; median of %d\n",
              prop.name, sms, copy, layers, n_stages, (bytes - kv_bytes) / 1e9, runs);
  if (L > 0)
    std::printf("  and an attention stage a layer after q, k, v: 32 heads of 128 over %d positions in %d splits of %d (%d CTAs), %.3f GB of f16 cache a step\n", L, S_a,
                kSplitPos, kHeads * S_a, kv_bytes / 1e9);
  const double floor_ms = double(bytes) / (copy * 1e9) * 1e3;
  std::printf("  the bytes at the copy rate: %.3f ms a step\n", floor_ms);
  auto report = [&](const char* name, double us) {
    std::printf("  %-44s %8.3f ms a step, %6.0f GB/s, %5.1f%% of copy\n", name, us / 1e3, bytes / (us * 1e-6) / 1e9, 100.0 * floor_ms / (us / 1e3));
  };

  // The persistent chain at C consumer warps and T units a fill.
  unsigned long long* d_trace = nullptr;   // [stage][CTA][kTraceN]
  CK(cudaMalloc(&d_trace, size_t(n_stages) * sms * kTraceN * 8));
  int fence_mode = 0;   // 1: a __threadfence before each release (the first form measured)
  int defer_mode = 0;   // 1: x as it is, each row's sum scaled by 1 / RMS (defer_rms)
  int max_out = 0;      // > 0: the producer keeps at most this many fills in flight
  int ll_mode = 0;      // 1: each stage's source read as flagged words (ll_store), no grid counters
  unsigned* d_epoch = nullptr;
  CK(cudaMalloc(&d_epoch, 4));
  CK(cudaMemset(d_epoch, 0, 4));
  auto run_chain = [&](auto kern, int C, int T, int dot = kDotRows) {
    if (dot == kDotMma && !defer_mode) {
      std::printf("chain_w4<%d, %d> on the tensor cores: skipped (its group sums X are of x as loaded: defer_rms only)\n", C, T);
      return;
    }
    if (ll_mode && L > 0) {
      std::printf("chain_w4<%d, %d>, flagged sources: skipped (the attention stage reads plain ones)\n", C, T);
      return;
    }
    if (L > 0 && (2 * C * kAttnU < kSplitPos || size_t(T) * kUnitBytes < size_t(kSplitPos) * kAttnRow)) {
      std::printf("chain_w4<%d>, %d units a fill: skipped (an attention split needs 8 warps or more and a fill of %d bytes)\n", C, T, kSplitPos * kAttnRow);
      return;
    }
    const int table_bytes = int(tables.size());   // the same for either partition
    const size_t fixed = 32 * 4 + size_t(C) * kMaxLocal * 32 * 4 + size_t(K_max) * 2 + size_t(K_max / 128) * 4 + size_t(table_bytes + 15) / 16 * 16;
    const int S = int((size_t(smem_optin) - 1024 - fixed) / (size_t(T) * kUnitBytes + 16));
    const size_t smem = size_t(S) * (size_t(T) * kUnitBytes + 16) + fixed;
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    cudaFuncAttributes fa{};
    CK(cudaFuncGetAttributes(&fa, kern));
    const char* dot_name = dot == kDotMma ? " on the tensor cores" : dot == kDotNone ? " without arithmetic (timing only)" : "";
    std::printf("%schain_w4<%d>%s, %d units a fill: %d threads, %d registers, %zu bytes local, a ring of %d fills (%zu bytes of shared memory)", fence_mode ? "fenced " : "", C,
                dot_name, T, (C + 1) * 32, fa.numRegs, size_t(fa.localSizeBytes), S, smem);
    if (max_out > 0) std::printf(", at most %d in flight (%d KB)", max_out, max_out * T * kUnitBytes / 1024);
    std::printf("\n");
    // cooperative: the stream timings (the launch checks that every CTA is resident); a graph
    // takes the plain launch (one CTA an SM, nothing else running: resident too).
    auto launch_step = [=](bool cooperative, int check = 0, unsigned long long* trace = nullptr) {
      const int fence = fence_mode, defer = defer_mode, out = max_out;
      CK(cudaMemsetAsync(d_counters, 0, counters * 4, g_stream));
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeCooperative;
      attr[0].val.cooperative = 1;
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(unsigned(sms));
      cfg.blockDim = dim3(unsigned((C + 1) * 32));
      cfg.dynamicSmemBytes = smem;
      cfg.attrs = attr;
      cfg.numAttrs = cooperative ? 1 : 0;
      cfg.stream = g_stream;
      CK(cudaLaunchKernelEx(&cfg, kern, (const Stage*)d_stages, n_stages, K_max, (const __half*)x0, d_counters, (const uint8_t*)d_tables, table_bytes, S, check,
                                fence, defer, out, trace, d_epoch, d_counters + counters - 1));
    };
    launch_step(true, 1);
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaGetLastError());
    double worst = 0;
    std::vector<int> checked;
    if (dot != kDotNone) {
      for (int s = 0; s < kinds; ++s) checked.push_back(s);
      checked.push_back(n_stages - 1);
    }
    for (int s : checked) {
      const Stage& d = hs[size_t(s)];
      const double rel = d.attn ? check_attn(d) : check_stage(d, s > 0 ? hs[size_t(s) - 1].out16 : x0, dot == kDotMma ? W4Layout::frag : W4Layout::rows);
      worst = std::max(worst, rel);
      if (d.attn) std::printf("  stage %d (attention): relative error %.2e\n", s, rel);
      if (!(rel <= 2e-3)) std::printf("  stage %d (%dx%d): WRONG, relative error %.3g\n", s, d.N, d.K, rel);
    }
    if (dot == kDotNone) std::printf("  not checked (timing only)\n");
    else std::printf("  checked stages 0-%d and %d against fp64: worst relative error %.2e%s\n", kinds - 1, n_stages - 1, worst, worst <= 2e-3 ? "" : " (WRONG)");
    // Same bytes out on a second step (deterministic); not for the timing-only form, whose sums
    // of nothing normalize to non-finite values.
    if (dot != kDotNone) {
      std::vector<float> a(size_t(hs.back().N)), b(a.size());
      CK(cudaMemcpy(a.data(), hs.back().y32, a.size() * 4, cudaMemcpyDeviceToHost));
      launch_step(true, 1);
      CK(cudaStreamSynchronize(g_stream));
      CK(cudaMemcpy(b.data(), hs.back().y32, b.size() * 4, cudaMemcpyDeviceToHost));
      std::printf("  a second step's last output: %s\n", std::equal(a.begin(), a.end(), b.begin()) ? "the same bytes" : "DIFFERENT bytes");
    }
    char name[128];
    const char* rows = hs[0].part > 1 ? (defer_mode ? "whole rows, RMS at the end, " : "whole rows, ") : "";
    const char* how = dot == kDotMma ? "mma, " : dot == kDotNone ? "no dot, " : "";
    const char* src = ll_mode ? "LL, " : "";
    char outs[32] = "";
    if (max_out > 0) std::snprintf(outs, sizeof outs, ", %d out", max_out);
    std::snprintf(name, sizeof name, "persistent, %s%s%sC %d, T %d%s, stream", how, src, rows, C, T, outs);
    report(name, stream_us(runs, 1, [&](int) { launch_step(true); }));
    std::snprintf(name, sizeof name, "persistent, %s%s%sC %d, T %d%s, graph", how, src, rows, C, T, outs);
    report(name, graph_us(runs, 1, [&](int) { launch_step(false); }));
    // Where a step's time goes: one traced step, its stages averaged by kind.
    CK(cudaMemsetAsync(d_trace, 0, size_t(n_stages) * sms * kTraceN * 8, g_stream));
    launch_step(true, 0, d_trace);
    CK(cudaStreamSynchronize(g_stream));
    std::vector<unsigned long long> tr(size_t(n_stages) * sms * kTraceN);
    CK(cudaMemcpy(tr.data(), d_trace, tr.size() * 8, cudaMemcpyDeviceToHost));
    auto at = [&](int s, int cta, int k) { return double(tr[(size_t(s) * sms + cta) * kTraceN + k]); };
    for (int kind = 0; kind < kinds; ++kind) {
      double gap = 0, xload = 0, units = 0, rows = 0, spread_units = 0, spread_pass = 0, waits = 0, own = 0, cyc = 0;
      int cnt = 0;
      for (int s = kind; s < n_stages; s += kinds) {
        if (s == 0) continue;
        double last_end = 0, first_pass = 1e30, last_pass = 0, first_units = 1e30, last_units = 0;
        for (int cta = 0; cta < sms; ++cta) {
          last_end = std::max(last_end, at(s - 1, cta, 3));
          first_pass = std::min(first_pass, at(s, cta, 0)), last_pass = std::max(last_pass, at(s, cta, 0));
          first_units = std::min(first_units, at(s, cta, 2)), last_units = std::max(last_units, at(s, cta, 2));
          xload += at(s, cta, 1) - at(s, cta, 0), units += at(s, cta, 2) - at(s, cta, 1), rows += at(s, cta, 3) - at(s, cta, 2);
          waits += at(s, cta, 4);   // cycles (to ns at the measured clock, below)
          own += at(s, cta, 5), cyc += at(s, cta, 6);
        }
        gap += first_pass - last_end, spread_pass += last_pass - first_pass, spread_units += last_units - first_units;
        ++cnt;
      }
      const double per = double(cnt) * sms;
      const double ghz = cyc / units;   // clock64's cycles a globaltimer ns over the units phases
      own /= ghz, waits /= ghz;
      std::printf("    %-9s a stage, us: last arrival -> first CTA passes %.2f, passes spread %.2f; x %.2f, units %.2f (a warp's own %.2f, waiting for fills %.2f; CTAs' "
                  "ends spread %.2f), row blocks %.2f; clock64 %.2f cycles a ns\n",
                  layer[size_t(kind)].name, gap / cnt / 1e3, spread_pass / cnt / 1e3, xload / per / 1e3, units / per / 1e3, own / per / 1e3, waits / per / 1e3,
                  spread_units / cnt / 1e3,
                  rows / per / 1e3, ghz);
    }
  };
  run_chain(chain_w4<8, 8>, 8, 8);
  run_chain(chain_w4<16, 8>, 16, 8);
  run_chain(chain_w4<16, 16>, 16, 16);
  fence_mode = 1;
  run_chain(chain_w4<8, 8>, 8, 8);
  fence_mode = 0;
  partition(true);
  run_chain(chain_w4<8, 8>, 8, 8);
  run_chain(chain_w4<16, 16>, 16, 16);
  defer_mode = 1;
  run_chain(chain_w4<8, 8>, 8, 8);
  run_chain(chain_w4<16, 16>, 16, 16);
  // The consumers' dot on the tensor cores, and (a bound) with no dot at all; each with fewer bytes
  // in flight too (the producer's copies queue ahead of the barrier's and x's loads: lab runs 535-539).
  for (int o : {0, 2}) {
    max_out = o;
    run_chain(chain_w4<8, 8, kDotMma>, 8, 8, kDotMma);
    run_chain(chain_w4<16, 8, kDotMma>, 16, 8, kDotMma);
    run_chain(chain_w4<16, 16>, 16, 16);
    run_chain(chain_w4<8, 8, kDotNone>, 8, 8, kDotNone);
  }
  for (int o : {0, 1, 2, 4}) {
    max_out = o;
    run_chain(chain_w4<16, 16, kDotNone>, 16, 16, kDotNone);
  }
  max_out = 0;
  // Flagged sources: each stage's x polled in rounds, no grid counter (positions 0 only).
  ll_mode = 1;
  run_chain(chain_w4<8, 8, kDotMma, true>, 8, 8, kDotMma);
  run_chain(chain_w4<8, 8, kDotRows, true>, 8, 8);
  run_chain(chain_w4<16, 16, kDotRows, true>, 16, 16);
  max_out = 2;
  run_chain(chain_w4<8, 8, kDotNone, true>, 8, 8, kDotNone);
  max_out = 0;
  ll_mode = 0;

  // The same stages as one gemv_w4 launch each under PDL: the kernel-a-Linear structure.
  {
    float* part = nullptr;
    int* arrivals = nullptr;
    CK(cudaMalloc(&part, size_t(4) * 22016 * 4));
    CK(cudaMalloc(&arrivals, size_t(22016 / 32) * 4));
    CK(cudaMemset(arrivals, 0, size_t(22016 / 32) * 4));
    auto kern = gemv_w4<512, 3, false>;
    auto launch_all = [&](int) {
      for (int s = 0; s < n_stages; ++s) {
        const Stage& d = hs[size_t(s)];
        if (d.attn) {
          launch(attn_launch, true, dim3(unsigned(kHeads * d.S_a)), dim3(256), 0, d, 0);
          continue;
        }
        const int G = d.K / 128, RB = d.N / 32, S = RB >= 256 ? 1 : 4;
        launch(kern, true, dim3(unsigned(S), unsigned(RB)), dim3(512), 0, d.codes, d.meta, d.src, part, arrivals, d.out16, d.N, G, S, (G + S - 1) / S);
      }
    };
    report("a gemv_w4 launch a stage (PDL), stream", stream_us(runs, 1, launch_all));
    report("a gemv_w4 launch a stage (PDL), graph", graph_us(runs, 1, launch_all));
  }
  return 0;
}
