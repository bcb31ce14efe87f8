// a16_dispatch.cuh — the A16 dispatcher (W4A16, W8A16, NF4): which kernel serves a call
// (a16_path.h's choice, checked), and for the L2-fed kernel of a16_mma.cuh the work split: a wave
// model over the occupancy calculator that picks the row tiles per warp, the K slices per CTA, the
// plain or the overlapped batch loop, and spreads the CTAs over the SMs. Plans are made once per
// kernel and shape. The kernels themselves: a16_mma.cuh (x through L1/L2), a16_shared_x.cuh (x in
// shared memory), a16_wgmma.cu (Hopper); their weight layout: relayout.h.
#pragma once
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "kernels/a16_mma.cuh"
#include "kernels/a16_shared_x.cuh"

namespace ptq::cuda::a16 {

// The kernel that serves a call (automatic: a16_auto_path), or Errc::usage when a forced one cannot take M.
inline A16Path resolve(A16Path path, int64_t M, int64_t N, int64_t K, int bits, const char* kernel) {
  if (path == A16Path::automatic) {
    if (M >= 17 && M <= 32 && a16_wgmma_supported() && a16_streamed_swept(N, K, bits)) return A16Path::wgmma;
    // PTQKIT_A16_NF4_STREAMED=0 (a sweep switch): NF4 at 17..32 rows on the L2-fed kernel, as before
    // its streamed cells (a16_wgmma_streamed), for A/Bs in one process.
    static const bool nf4_streamed = env_switch("PTQKIT_A16_NF4_STREAMED", true);
    if (bits == 0 && !nf4_streamed && M >= 17 && M <= 32) return A16Path::mma;
    return a16_auto_path(M, N, K, bits, a16_wgmma_supported());
  }
  if (path == A16Path::wgmma && !a16_wgmma_supported())
    fail(Errc::usage, "", "device", std::string("the ") + kernel + " wgmma kernel is built for sm_90 (H100/H200) only: " + describe());
  const int64_t most = path == A16Path::mma ? kA16MmaMaxM : path == A16Path::shared_x ? kA16SharedXMaxM : path == A16Path::wgmma ? kA16WgmmaMaxM : INT64_MAX;
  if (M > most)
    fail(Errc::usage, "", "M",
         std::string("the ") + kernel + " " + a16_path_name(path) + " kernel takes M <= " + std::to_string(most) + " rows, got M = " + std::to_string(M));
  return path;
}

constexpr int n8_tiles(int64_t M) { return M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : 8; }
inline size_t red_bytes(int S, int nt, int rt) { return size_t(S) * 32 * 4 * size_t(nt * rt) * sizeof(float); }

struct Plan {
  int rt, S, ctas, sps;
  bool overlap = false;   // the kernel with overlapped batches (overlap_variants)
  bool stage_x = false;   // the kernel that stages x in shared memory (mma_kernel's kStageX)
  size_t smem = 0;     // dynamic shared memory per CTA at launch
  int carveout = -1;   // shared-memory carveout at launch (percent), -1: the driver's choice
};

// Lets kern take dynamic shared memory up to the opt-in limit (the attribute is per kernel), so that
// the occupancy calculator answers the planner the same whatever an earlier plan of the kernel set:
// NF4's kernel of two row tiles at 17..32 rows needs 64 KB a CTA for 8 K slices (its 32 KB pair
// table and the slice sums), and before this its plans depended on the order of the shapes planned
// (llama2-7b's o projection took 4 slices, llama3-8b's 8, where a qkv plan had set the limit
// first; lab runs 204-205: llama2-7b NF4 at batch 32 +4.2% with 8 there, phi3-mini +4.6% with 8 on
// its 3072 x 3072).
inline void allow_opt_in_smem(const void* kern) {
  PTQ_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, max_dynamic_smem(kern)));
}

// Spreads the plan's CTAs: no SM takes more than cap = ceil(ctas / SMs) of them. A grid smaller
// than the GPU holds, launched while the previous kernel's CTAs still occupy SMs (PDL), otherwise
// piles up on the SMs that freed first. The launch asks for the smallest shared-memory carveout
// that holds cap CTAs (the rest of the 256 KB stays L1, which caches x) and pads each CTA to 1/cap
// of it (each CTA also takes 1 KB reserved by the system, and the padding may pass 48 KB: the
// caller has allowed kern the opt-in limit, allow_opt_in_smem); the occupancy calculator confirms.
inline void spread(const void* kern, Plan& p) {
  const int per_sm = resident_ctas(kern, p.S, p.smem), cap = (p.ctas + sm_count() - 1) / sm_count();
  if (cap >= per_sm) return;
  int dev = 0, sm_bytes = 0;
  PTQ_CUDA(cudaGetDevice(&dev));
  PTQ_CUDA(cudaDeviceGetAttribute(&sm_bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  const size_t fixed = size_t(static_smem(kern)) + 1024;   // static shared memory and the system's 1 KB
  int carve = sm_bytes;
  for (int kb : {64, 100, 132, 164, 196})   // the sm_90 carveouts below the largest
    if (kb * 1024 < sm_bytes && size_t(cap) * (p.smem + fixed) <= size_t(kb) * 1024) { carve = kb * 1024; break; }
  if (size_t(carve / cap) < p.smem + fixed) return;
  const size_t padded = std::max<size_t>(p.smem, (size_t(carve / cap) - fixed) / 256 * 256);   // whole 256-byte units: the allocation rounds up
  const int most = max_dynamic_smem(kern);
  if (padded > size_t(most)) return;
  const int percent = int(int64_t(carve) * 100 / sm_bytes);
  PTQ_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, percent));   // for the calculator only
  const int now = resident_ctas(kern, p.S, padded);
  PTQ_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, -1));
  if (now != cap) return;
  p.smem = padded;
  p.carveout = percent;
}
// The split with the least time by a wave model: waves of resident CTAs (the occupancy calculator)
// times the k-steps each warp walks; ties go to fewer waves (a partial wave costs a whole warp's
// latency again), then to more (row tile, K slice) pairs, then to more warps; at M <= 16 no more
// than two waves. Against forced splits on the Llama shapes (docs/lab/kernels.md): within 4% (W4) and
// 8% (NF4) of the best at M <= 16; up to 14% off in three M = 32/64 cells, where fewer warps per SM
// also slow each k-step (not modelled). kern(rt, overlap) gives the kernel of each RT and loop
// (variants(rt): overlap_variants); where both loops exist the overlapped one is tried first, so it
// wins ties: it is faster at the same plan, and its extra registers count through the occupancy
// calculator (W4 M = 1 14336 x 4096: 80 registers, 3 CTAs per SM, two waves, so the plain loop's one
// wave wins). RT = 2 up to M = 32; rt_only: the RT the caller measured best (where the layer has that
// many tiles), 0: the model's. batch_of(rt): the kernel's batch_steps.
template <class KernOf, class VariantsOf, class BatchOf>
Plan plan(int64_t N, int64_t K, int64_t M, KernOf kern, VariantsOf variants, BatchOf batch_of, int rt_only = 0, int pair = 1, int slices = 0) {
  // pair = 2: the split silu kernel, whose CTA pairs the tiles b and b + tiles / 2 in 2 S warps
  // (ctas: tiles / 2; residency with 2 S warps); S stays the K slices.
  const int tiles = int((N + 15) / 16), KS = int((K + 63) / 64), nt = n8_tiles(M), sms = sm_count();
  Plan best{1, 1, tiles / pair, KS, variants(1) == Overlap::overlap_only};
  int64_t best_cost = INT64_MAX, best_waves = 0, best_pairs = 0, best_warps = 0;
  for (int rt : {1, 2})
  for (bool overlap : {true, false}) {
    if (rt == 2 && (nt > 4 || tiles < 2)) continue;
    if ((g_split.rt && rt != g_split.rt) || (!g_split.rt && rt_only && tiles >= rt_only && rt != rt_only)) continue;
    if (overlap ? variants(rt) == Overlap::plain_only : variants(rt) == Overlap::overlap_only) continue;
    if (g_split.loop && variants(rt) == Overlap::both && overlap != (g_split.loop == 2)) continue;
    const int ctas = (tiles / pair + rt - 1) / rt;
    allow_opt_in_smem(kern(rt, overlap));
    for (int S = 1; S * pair <= max_slices(nt) && S <= KS; S *= 2) {
      const int per_sm = resident_ctas(kern(rt, overlap), S * pair, red_bytes(S * pair, nt, rt));
      if (per_sm == 0) break;
      const int64_t waves = (ctas + int64_t(per_sm) * sms - 1) / (int64_t(per_sm) * sms), sps = (KS + S - 1) / S;
      if (nt <= 2 && S > 1 && waves > 2) break;   // M <= 16: a third wave of latency-bound warps costs more than it saves (NF4 11008 rows: 1.62x vs 1.95x)
      const int64_t cost = waves * sps, pairs = int64_t(tiles) * S, warps = int64_t(ctas) * S * pair;
      const bool better = cost != best_cost     ? cost < best_cost
                          : waves != best_waves ? waves < best_waves
                          : pairs != best_pairs ? pairs > best_pairs
                                                : warps > best_warps;
      if (better) {
        best = {rt, S, ctas, 0, overlap};
        best_cost = cost, best_waves = waves, best_pairs = pairs, best_warps = warps;
      }
    }
  }
  // K slices forced: a sweep's (g_split), else a measured cell's (slices: a16_mma_slices).
  if (const int forced = g_split.slices ? g_split.slices : slices) best.S = std::max(1, std::min({forced, max_slices(nt) / pair, KS}));
  best.sps = (KS + best.S - 1) / best.S;
  // One row: each slice rounded up to whole batches (the last slice shorter) where that saves round
  // trips to memory: a warp walks sps / B batches and sps % B single k-steps, and a round trip costs
  // about two k-steps of streaming (W4 4096 x 11008: 12 k-steps in batches of 4 walk 3 round trips
  // where 11 walk 5). Batches of 2 (W8, NF4 with two row tiles) save no trip. Not at 2..8 rows, which
  // run the same kernel: there the longer slices cost more than the trips save.
  const int batch = batch_of(best.rt);
  auto trips = [batch](int sps) { return sps / batch + sps % batch; };
  if (const int whole = (best.sps + batch - 1) / batch * batch; M == 1 && 2 * (trips(best.sps) - trips(whole)) > whole - best.sps)
    best.sps = whole;
  return best;
}

template <class Format>
using MmaKernel = void (*)(Format, const uint4*, const __half*, __half*, float*, float, int, int, int, int, A16RowNorm);

// Whether the x-staged kernel (one row) loads each slot of the next batch as soon as its k-step
// is done (mma_kernel's kRoll): the format's kRollM1, or PTQKIT_A16_ROLL (a sweep switch, read
// once): 0 never, 1 always.
template <class Format>
bool roll_at_one_row() {
  static const int mode = env_int("PTQKIT_A16_ROLL", -1);
  return mode < 0 ? Format::kRollM1 : mode == 1;
}

// kSplit: a split norm's reader or writer (one n8 tile, M = 1; not with kFold), as its own
// instantiation; at four n8 tiles (17..32 rows) the writer of the quantized formats.
template <int NT, int RT, bool kStepScale, class Format, bool kFold, bool kSilu, SplitNorm kSplit>
MmaKernel<Format> mma_kernel_pick_in(bool overlap, bool stage_x) {
  constexpr Overlap v = overlap_variants<Format>(NT, RT);
  if constexpr (NT == 1 && Format::kOverlapM8 && v != Overlap::plain_only)
    if (stage_x && overlap)
      return roll_at_one_row<Format>() ? mma_kernel<NT, RT, kStepScale, Format, true, true, kFold, kSilu, true, kSplit>
                                         : mma_kernel<NT, RT, kStepScale, Format, true, true, kFold, kSilu, false, kSplit>;
  if constexpr (v == Overlap::both)
    return overlap ? mma_kernel<NT, RT, kStepScale, Format, true, false, kFold, kSilu, false, kSplit>
                   : mma_kernel<NT, RT, kStepScale, Format, false, false, kFold, kSilu, false, kSplit>;
  else return mma_kernel<NT, RT, kStepScale, Format, v == Overlap::overlap_only, false, kFold, kSilu, false, kSplit>;
}
template <int NT, int RT, bool kStepScale, class Format, bool kFold, bool kSilu>
MmaKernel<Format> mma_kernel_pick(bool overlap, bool stage_x, SplitNorm split = SplitNorm::none) {
  if constexpr (NT == 1 && !kFold) {
    if (split == SplitNorm::reader) return mma_kernel_pick_in<NT, RT, kStepScale, Format, kFold, kSilu, SplitNorm::reader>(overlap, stage_x);
    if constexpr (!kSilu)
      if (split == SplitNorm::writer) return mma_kernel_pick_in<NT, RT, kStepScale, Format, kFold, kSilu, SplitNorm::writer>(overlap, stage_x);
  }
  if constexpr (NT == 4 && !kFold && !kSilu && !Format::kRowMajor)
    if (split == SplitNorm::writer) return mma_kernel_pick_in<NT, RT, kStepScale, Format, kFold, kSilu, SplitNorm::writer>(overlap, stage_x);
  return mma_kernel_pick_in<NT, RT, kStepScale, Format, kFold, kSilu, SplitNorm::none>(overlap, stage_x);
}
// fold: the kernel with the folded norm (one n8 tile, the formats run_mma folds for); silu: the
// one that writes silu(gate) · up (one n8 tile, two row tiles).
template <int NT, int RT, bool kStepScale, class Format>
MmaKernel<Format> mma_kernel_of(bool overlap, bool stage_x, bool fold, bool silu, SplitNorm split) {
  if constexpr (NT == 1 && Format::kPairTable)
    if (fold) return mma_kernel_pick<NT, RT, kStepScale, Format, true, false>(overlap, stage_x);
  if constexpr (NT == 1 && (RT == 2 || !Format::kRowMajor))   // one row tile: the split fold, quantized formats only (run_mma)
    if (silu) return mma_kernel_pick<NT, RT, kStepScale, Format, false, true>(overlap, stage_x, split);
  return mma_kernel_pick<NT, RT, kStepScale, Format, false, false>(overlap, stage_x, split);
}
template <int NT, class Format>
MmaKernel<Format> mma_kernel_of(int rt, bool k_step_scale, bool overlap, bool stage_x, bool fold, bool silu, SplitNorm split) {
  if constexpr (Format::kMin) {   // a grid with mins is scaled in f16 (GptqFormat): its k-step-scaled forms are not instantiated
    if constexpr (NT <= 4)
      if (rt == 2) return mma_kernel_of<NT, 2, false, Format>(overlap, stage_x, fold, silu, split);
    return mma_kernel_of<NT, 1, false, Format>(overlap, stage_x, fold, silu, split);
  } else {
    if constexpr (NT <= 4)
      if (rt == 2)
        return k_step_scale ? mma_kernel_of<NT, 2, true, Format>(overlap, stage_x, fold, silu, split)
                            : mma_kernel_of<NT, 2, false, Format>(overlap, stage_x, fold, silu, split);
    return k_step_scale ? mma_kernel_of<NT, 1, true, Format>(overlap, stage_x, fold, silu, split)
                        : mma_kernel_of<NT, 1, false, Format>(overlap, stage_x, fold, silu, split);
  }
}
template <class Format>
MmaKernel<Format> mma_kernel_of(int nt, int rt, bool k_step_scale, bool overlap, bool stage_x = false, bool fold = false, bool silu = false,
                                SplitNorm split = SplitNorm::none) {
  switch (nt) {
    case 1: return mma_kernel_of<1, Format>(rt, k_step_scale, overlap, stage_x, fold, silu, split);
    case 2: return mma_kernel_of<2, Format>(rt, k_step_scale, overlap, false, false, false, SplitNorm::none);
    case 4: return mma_kernel_of<4, Format>(rt, k_step_scale, overlap, false, false, false, split);
    default: return mma_kernel_of<8, Format>(rt, k_step_scale, overlap, false, false, false, SplitNorm::none);
  }
}

// Runs mma_kernel for M rows on the default stream (kStepScale: the groups hold whole k-steps).
template <class Format>
void run_mma(const Format& fmt, bool k_step_scale, const uint4* W, const __half* x, __half* yh, float* yf, float beta, int64_t M, int64_t N,
             int64_t K) {
  const int nt = n8_tiles(M);
  // A folded norm (a16_path.h: a16_fold_norm) at M = 1 with fp32 y, for NF4 only: in the decode
  // step at batch 1 (llama2-7b, o and down folding the next norm; docs/lab/2026-11-24-decode-h200.md
  // run 66) NF4 ran 468.7 tok/s against 455.9 with the norm kernel, while W4A16 ran 565.7 against
  // 572.4, W8A16 436.9 against 440.3 and f16 264.2 against 264.4: every CTA's arrival (a barrier
  // and an atomic round trip) costs the GPTQ kernels about what the norm kernel's boundary does;
  // NF4's next kernel, launched earlier, fills its pair table under the o / down tail.
  const bool fold = Format::kPairTable && g_fold.norm && M == 1 && yf && N % 4 == 0;
  A16RowNorm norm{};
  if (fold) norm = *g_fold.norm, norm.row_ss = nullptr, g_fold.taken = A16Fold::whole;
  // A split norm's reader side: any one-row kernel with K % 64 == 0 (the sums copied as float4s).
  const bool norm_in = g_norm_in.norm && M == 1 && nt == 1 && K % 64 == 0;
  // silu(gate) · up written by a stacked gate, up Linear (a16_fold_silu) at M <= 8: each CTA takes
  // a gate row tile and the up row tile of the same rows (no forced one-tile split).
  const bool silu = !fold && g_fold.silu && !g_fold.silu_perm && nt == 1 && N % 32 == 0 && g_split.rt != 1;
  // At one row of the quantized formats the gate and the up tile go to two halves of one CTA's
  // warps (kSilu with one row tile, planned with the pair's 2S warps: plan()'s pair) instead of one
  // warp holding both: the decode step at batch 1 (docs/lab/2026-11-24-decode-h200.md runs 98-102)
  // NF4 496.5 tok/s against 480.8 on llama2-7b and 445.5 against 411.3 on llama3-8b, W4A16 518.5
  // against 493.8 on llama3-8b, the rest within 0.5%; f16 lost 2% and batch 8 lost 2-12% for every
  // format (run 98), so they keep one warp per gate, up pair.
  const bool silu_split = silu && M == 1 && !Format::kRowMajor;
  if (silu) yh = static_cast<__half*>(g_fold.silu), yf = nullptr, g_fold.taken = A16Fold::whole;
  // A split norm's writer side (A16RowNorm row_ss): a one-row kernel writing fp32 y itself (not a
  // reader too: the decode's Linears are one or the other; a writer that declines leaves the norm
  // to its kernel).
  // At 17..32 rows (four n8 tiles) the quantized formats' kernel writes it too (row_ss per token).
  const bool norm_out = !fold && !silu && !norm_in && g_fold.norm && g_fold.norm->row_ss && (M == 1 || (nt == 4 && !Format::kRowMajor)) && yf;
  if (norm_out) norm = *g_fold.norm, g_fold.taken = A16Fold::split;
  const SplitNorm split = norm_in ? SplitNorm::reader : norm_out ? SplitNorm::writer : SplitNorm::none;
  // At M = 1 the planner weighs the overlapped kernels in their x-staged form (kStageX),
  // the one it launches where their warps walk more than one batch; with two row tiles that form
  // also takes fewer registers (75 against 82 unstaged: 3 CTAs of 256 threads per SM, not 2).
  auto kern = [&](int rt, bool overlap) {
    return reinterpret_cast<const void*>(
        mma_kernel_of<Format>(nt, rt, k_step_scale, overlap, M == 1 && overlap, fold, silu && rt == (silu_split ? 1 : 2), split));
  };
  // Plans depend on the kernel (format, n8 tiles, scales), N, K, a forced split, M = 1, a fold (norm or silu) and a split norm's side: made once.
  static std::mutex mu;
  static std::map<std::tuple<const void*, int64_t, int64_t, int, int, int, bool, bool, bool, SplitNorm>, Plan> plans;
  Plan p;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto key = std::make_tuple(kern(1, false), N, K, g_split.rt, g_split.slices, g_split.loop, M == 1, fold, silu, split);   // kern(1, ...): the split silu kernel where it runs
    auto it = plans.find(key);
    if (it == plans.end()) {
      // GPTQ codes at 9..16 rows: two row tiles per warp. The wave model would pick one on the 4096-row
      // layers (more CTAs in flight), which measured slower: 8-bit codes as a single launch, 4-bit
      // codes both ways (two tiles overlap their batches). NF4 is mixed and keeps the model's choice.
      // 8-bit codes at one row: one row tile (run 43, docs/lab/2026-11-24-decode-h200.md: its
      // overlapped x-staged kernel as fast as the model's pick or faster on every Llama shape, 5% on
      // 14336 x 4096, where the model picks two plain tiles).
      // NF4 at 17..32 rows: two row tiles (the model picks one on the layers longer in K, which halves
      // each warp's reuse of the x it reads through L2: 4096 x 11008 at 32 rows 45.0 us against 26.2,
      // 6144 x 4096 31.4 against 19.7; docs/lab/2026-11-24-decode-h200.md run 86).
      // 8-bit codes writing a split norm at 17..32 rows (the decode's o on llama2-7b, 4096 x 4096): two
      // row tiles, the writer's shared-memory form, though the kernel without the writer runs 1.6 µs
      // slower so (14.1 against 12.5 µs stream at 32 rows): decode W8A16 at batch 32 +0.7-1.0%
      // against one tile and the writer's shuffle form (docs/lab/2026-11-24-decode-h200.md, runs
      // 333-334; W4A16 -1.1 to -2.6% and llama3-8b's unsplit W8A16 -1.9% at two tiles everywhere).
      // PTQKIT_A16_RT32 (a sweep switch, read once): 1 or 2 the row tiles of every GPTQ call at
      // 17..32 rows, 0 the model's everywhere.
      static const int rt32 = env_int("PTQKIT_A16_RT32", -1);
      const int rt32_here = rt32 >= 0 ? rt32 : Format::kU4 == 2 && split == SplitNorm::writer ? 2 : 0;
      // PTQKIT_A16_MMA_CELLS="NxK:bits:rt:slices,..." (a sweep switch): the row tiles a warp and K
      // slices of single layers at 17..32 rows and at one row (0: the planner's; a stacked gate, up
      // with its silu at one row: slices of each half, rt left to the silu form), for per-layer A/Bs
      // in the decode.
      static const std::vector<A16SweepCell> cells = a16_sweep_cells("PTQKIT_A16_MMA_CELLS");
      const A16SweepCell* cell = (nt == 4 && !silu) || M == 1 ? a16_sweep_cell(cells, N, K, code_bits<Format>()) : nullptr;
      const int rt_only = [&] {
        if (cell && cell->a && !silu) return cell->a;
        if (silu) return silu_split ? 1 : 2;
        if (nt == 2 && !Format::kPairTable) return 2;
        if (nt == 4 && Format::kPairTable) return 2;
        if (nt == 4 && rt32_here) return rt32_here;
        return Format::kU4 == 2 && M == 1 ? 1 : 0;
      }();
      // With the measured slice counts at 17..32 rows (a16_path.h, a16_mma_slices; lab run 199:
      // phi3-mini NF4 decode batch 32 +4.1%).
      auto plan_rt = [&](int rt_of) {
        return plan(N, K, M, kern, [nt](int rt) { return overlap_variants<Format>(nt, rt); }, [nt](int rt) { return batch_steps<Format>(nt, rt); }, rt_of,
                    silu_split ? 2 : 1, cell && cell->b ? cell->b : a16_mma_slices(M, N, K, code_bits<Format>()));
      };
      Plan q = plan_rt(rt_only);
      // Shared memory at launch: at least 512 bytes (a fold's 32 sums and flag fit); kNormIn's sums after them.
      auto smem_of = [&](int S, int rt) { return red_bytes(S, nt, rt) + (norm_in ? size_t(K / 16) * 4 : 0); };
      // NF4 at one row: one row tile where its CTAs fit in one wave. The model counts a warp's k-steps,
      // not its tiles, so it picks two plain tiles for 12288 x 4096 (the stacked q, k, v), where one
      // tile's overlapped x-staged kernel ran 15.36 against 16.16 µs and the llama2-7b and phi3-mini
      // decode at batch 1 +2.3% (lab runs 506-508). Where one tile takes more than a wave the
      // model's choice stays: 28672 x 4096 ran 32.7 µs on two tiles, 70.9 on one (three waves).
      if (Format::kPairTable && M == 1 && !silu && !g_split.rt && !(cell && cell->a) && q.rt == 2) {
        const Plan q1 = plan_rt(1);   // rt_only 1: plan() weighs one tile only
        if (q1.ctas <= int64_t(resident_ctas(kern(1, q1.overlap), q1.S, smem_of(q1.S, 1))) * sm_count()) q = q1;
      }
      if (silu_split) q.S *= 2;   // gate tile b and up tile b + F / 16 in one CTA: S K slices of each
      q.smem = smem_of(q.S, q.rt);
      // One row, overlapped batches: x staged per batch (kStageX). One row tile: where a warp walks
      // more than one batch (staging takes the x loads off each batch's critical path; with one
      // batch a warp it only adds a copy), the unstaged kernel otherwise (the same launch bound, 64
      // registers). Two row tiles: always, as planned (the staged form takes fewer registers: one
      // wave where the unstaged overlapped loop needs two).
      q.stage_x = M == 1 && nt == 1 && q.overlap && Format::kOverlapM8 && (q.rt == 2 || q.sps > batch_steps<Format>(1, 1));
      const auto k = reinterpret_cast<const void*>(mma_kernel_of<Format>(nt, q.rt, k_step_scale, q.overlap, q.stage_x, fold, silu, split));   // the kernel launched
      allow_opt_in_smem(k);   // the kernel launched (x-staged, folded or silu forms): a CTA past 48 KB
      spread(k, q);
      it = plans.emplace(key, q).first;
      if (env_switch("PTQKIT_A16_PLAN_LOG", false)) {   // the planner's choice, once per kernel and shape (bench sweeps)
        cudaFuncAttributes a{};
        PTQ_CUDA(cudaFuncGetAttributes(&a, k));
        std::fprintf(stderr, "a16 mma plan: M %lld N %lld K %lld nt %d rt %d S %d ctas %d sps %d smem %zu+%zu carveout %d regs %d resident %d%s%s\n",
                     (long long)M, (long long)N, (long long)K, nt, q.rt, q.S, q.ctas, q.sps, a.sharedSizeBytes, q.smem, q.carveout, a.numRegs,
                     resident_ctas(k, q.S, q.smem), q.overlap ? " overlap" : "", q.stage_x ? " x-staged" : "");
      }
    }
    p = it->second;
  }
  if (norm_in) norm.in_ss = g_norm_in.norm->in_ss, norm.in_eps = g_norm_in.norm->in_eps, g_norm_in.taken = true;
  launch_pdl("a16 mma_kernel", true, p.carveout, mma_kernel_of<Format>(nt, p.rt, k_step_scale, p.overlap, p.stage_x, fold, silu, split), dim3(unsigned(p.ctas)), dim3(unsigned(32 * p.S)), p.smem, fmt,
             W, x, yh, yf, beta, int(M), int(N), int(K), p.sps, norm);
}

template <class Format>
void run_dequant(const Format& fmt, const uint4* W, __half* out, int64_t N, int64_t K) {
  const int64_t units = (N + 15) / 16 * ((K + 63) / 64);   // a warp each, 8 per block
  dequant_kernel<<<unsigned((units + 7) / 8), 256, 0, static_cast<cudaStream_t>(current_stream())>>>(fmt, W, out, int(N), int(K));
  PTQ_CUDA_LAUNCH("a16 dequant_kernel");
}

// The tensor-core kernel the path names: a16_mma.cuh's (x through L1/L2), this one (x in shared
// memory) or a16_wgmma.cu's (Hopper).
template <class Format>
void run_tensor_cores(A16Path path, const Format& fmt, bool k_step_scale, const uint4* W, const __half* x, __half* yh, float* yf, float beta,
                      int64_t M, int64_t N, int64_t K) {
  if (path == A16Path::wgmma) run_wgmma(fmt, W, x, yh, yf, beta, M, N, K);
  else if (path == A16Path::shared_x) run_shared_x(fmt, W, x, yh, yf, beta, M, N, K);
  else run_mma(mma_format(fmt), k_step_scale, W, x, yh, yf, beta, M, N, K);
}

}  // namespace ptq::cuda::a16
