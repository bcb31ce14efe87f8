// a16_path.h — which kernel serves a 16-bit-activation call (W4A16, W8A16, NF4).
#pragma once
#include <cstdint>
#include <vector>

namespace ptq::cuda {

// automatic picks by shape and codes (a16_auto_path): the tensor-core kernel with x read through
// L1/L2 (kernels/a16_mma.cuh, `mma`) for small M, the one with x staged in shared memory
// (kernels/a16_shared_x.cuh, `shared_x`) for 33..64 rows of a layer larger than 4096 x 4096 without
// sm_90, the Hopper wgmma kernel (kernels/a16_wgmma.cu, `wgmma`) on an sm_90 GPU from 33 rows (17
// for the GPTQ codes of large layers), dequantize to f16 + cuBLAS above. The others force one
// (benchmarks, tests); mma refuses M > 64, shared_x M > 128, wgmma M > 256 or a GPU other than
// sm_90 (Errc::usage).
enum class A16Path { automatic, mma, shared_x, dequant, wgmma };

// Crossovers measured on the H100 (docs/lab/kernels.md): the wgmma kernel beats every other path at 33..128 rows (W4 M = 64:
// 1.04-1.57x cuBLAS f16 against shared_x's 0.93-1.13x; M = 128: 0.79-1.22x against dequantize +
// cuBLAS's 0.52-0.68x) and at 129..256 rows on layers larger than 4096 x 4096 (its K slices then fill
// the GPU without a second wave); elsewhere (or without sm_90): x staged in shared memory for
// 33..64 rows of a layer larger than 4096 x 4096, the L2-fed kernel below, dequantize + cuBLAS
// above 64 rows. At 17..32 rows (the H200, nine Llama and stacked decode shapes at 17 and 32 rows,
// docs/lab/2026-11-24-decode-h200.md run 86): wgmma for GPTQ 4-bit codes on layers of 4096 x 11008
// elements or more (11008 x 4096 at 32 rows: 24.2 us against the L2-fed kernel's 29.0; 6144 x 4096
// stayed, 18.2 against 19.1, until the streamed form at 4 K slices took it: a16_wgmma_tma_slices), for GPTQ 8-bit codes on those larger than 12288 x 4096 or longer in K
// than in N (22016 x 4096: 45.4 against 55.3, 4096 x 11008: 25.9 against 30.5; 11008 and 12288 x
// 4096 stayed: 28.4 against 29.8; 11008 x 4096 moved with 3 K slices, 12288 x 4096 and 3072 x
// 8192 with the streamed form, below), for NF4 only on the streamed form's cells (below; its k-step
// loop lost: the L2-fed kernel with two row tiles a warp ran 11008 x 4096 24.1 against 31.0, 4096
// x 11008 26.2 against 31.1). bits: the codes, 4 or 8 (GPTQ), 0 (NF4).
constexpr int64_t kA16MmaMaxM = 64, kA16SharedXMaxM = 128, kA16WgmmaMaxM = 256;   // what a forced mma / shared_x / wgmma takes
// The wgmma kernel's K slices at 17..32 rows (32 staged x rows) where a count other than its
// planner's power of two measured faster (the H200, stream µs at 32 rows with the slices forced
// 1..16; lab runs 188 and 196): 3 slices on 9216 x 3072 (Phi-3-mini's q, k, v; W4 18.8 against 21.7
// at 4 slices, W8 20.1 against 24.2), 22016 x 4096 (llama2-7b's gate, up; W8 42.3 against 45.6 at
// 1, W4 36.7 against 37.9 at 2) and 11008 x 4096 (W4 22.3 against 24.3 at 4, W8 24.4 against 29.8).
// 0: the planner's (28672, 14336 and 6144 x 4096 and the layers longer in K: within 2% of the best
// count, or it). No model of the split picked these without losing elsewhere (run 189: 16 slices on
// 22016 rows), so they are cells, like the path table. bits: 4 or 8 (GPTQ), 0 (NF4: the planner's,
// its streamed cells take the cluster's count, a16_wgmma.cu).
constexpr int a16_wgmma_slices(int64_t M, int64_t N, int64_t K, int bits) {
  if (M < 17 || M > 32 || (bits != 4 && bits != 8)) return 0;
  return (N == 9216 && K == 3072) || (N == 22016 && K == 4096) || (N == 11008 && K == 4096) ? 3 : 0;
}
// Where the wgmma kernel runs its streamed form at 17..32 rows (a16_wgmma.cu: a producer warp's
// copies, the K slices of a row group one cluster) instead of its k-step loop, and for GPTQ 8-bit
// codes also takes the layer from the L2-fed kernel or shared_x (a16_auto_path): the cells where the decode step at
// batch 32 ran faster with it (the H200, lab runs 231-234). GPTQ 4-bit with K >= 4096; GPTQ 8-bit
// on 12288 x 4096 (stream µs at 32 rows: 21.8 against the L2-fed kernel's 29.5) and Phi-3-mini's
// 9216 x 3072, 16384 x 3072 and 3072 x 8192 (15.9, 23.0, 16.6 against the loop's 18.9 and 25.6 and
// shared_x's 20.2). Decode at batch 32 with these cells against without (run 234, each arm its own
// process, twice): W4A16 llama2-7b +1.4%, llama3-8b +4.1%, phi3-mini -0.4%; W8A16 +3.8%, 0.0%,
// +4.1%. Then one cell at a time (run 240, PTQKIT_A16_TMA_CELLS): W8 22016 x 4096 (llama2-7b's
// gate, up; 32.8 µs against the loop's 39.8) +2.8% on llama2-7b's W8A16. Left out: Phi-3-mini's
// 4-bit layers (K = 3072; -11% in the step at equal kernel figures), the other 8-bit layers on
// wgmma (28672 x 4096 -0.6%, 4096 x 11008 and 14336 slower alone), and the layers the L2-fed kernel
// serves (run 240: 4096 x 4096 W4 +1.4% on llama2-7b but -8.8% on llama3-8b, W8 -1.0% / -1.7%;
// 6144 x 4096 W4 -2.5%, W8 -1.8%; Phi-3-mini's 3072 x 3072 W4 -0.4%). W8 6144 x 4096 (llama3-8b's
// q, k, v) joined with a ring of 3 stages and the rotary folded into it (a16_fold_rope; lab runs 296-297, twice each): llama3-8b W8A16 at batch 32
// 8,200 -> 8,726 tok/s (+6.4%; +3.6% without the fold, -1.3% at 2 stages with it, +0.3% at 4);
// its 4-bit codes stayed on the L2-fed kernel (-1.1% at 2 stages, -1.3% at 3, at the planner's 8 K
// slices) until runs 338-340 ran them at 4 (+2.9%: a16_wgmma_tma_slices). W4 16384 x 3072
// (Phi-3-mini's gate, up, with the silu fold since run 293) joined with 3 stages (run 300, twice):
// phi3-mini W4A16 at batch 32 9,006 -> 9,369 tok/s (+4.0%; -4.4% at 2 stages; its q, k, v 9216 x
// 3072 stayed off: -3.7% at 2 stages, -4.8% at 3, -0.7% beside the gate, up at 3, at the planner's
// K slices; at 3 slices it joined, run 340: +3.3%).
// NF4 (bits 0) joined when the streamed form took its pair table in shared memory (a16_wgmma.cu,
// run(); lab runs 305-306): the q, k, v and gate, up of every preset, where the L2-fed
// kernel had served it. Stream µs at 32 rows, streamed / L2-fed: 12288 x 4096 22.6 / 24.5, 22016 x
// 4096 37.2 / 45.6, 28672 x 4096 38.2 / 62.1, 6144 x 4096 (3 stages) 16.3 / 17.7, 9216 x 3072 15.4 /
// 18.7, 16384 x 3072 21.6 / 24.2, 3072 x 8192 16.4 / 18.9; the 4096-row layers and 3072 x 3072 stay
// (4096 x 4096 18.2 / 11.6, 4096 x 11008 29.6 / 24.7, 4096 x 14336 36.0 / 32.7, 3072 x 3072 10.4 /
// 9.2). Decode NF4 at batch 32, the new cells (the rotary folded into the q, k, v with them)
// against the L2-fed kernel in one call, twice: llama2-7b 6,683 -> 7,358 tok/s (+10.1%; +7.3% of it
// without the rotary fold), llama3-8b 6,530 -> 7,722 (+18.3%; 6144 x 4096 at 3 stages, +2.2% of
// it: at 2 it lost 3.3%), phi3-mini 9,123 -> 10,155 (+11.3%, 16384 x 3072 at 3 stages), and 3072 x
// 8192 (its down) 10,122 -> 10,508 (+3.8%, run 307; at 3 stages -10%).
constexpr bool a16_wgmma_streamed(int64_t N, int64_t K, int bits) {
  if (bits == 0) return (K == 4096 && (N == 12288 || N == 22016 || N == 28672 || N == 6144)) || (K == 3072 && (N == 9216 || N == 16384)) || (N == 3072 && K == 8192);
  if (bits == 4) return K >= 4096 || (K == 3072 && (N == 16384 || N == 9216));
  if (bits == 8)
    return (N == 12288 && K == 4096) || (N == 22016 && K == 4096) || (N == 6144 && K == 4096) || (N == 9216 && K == 3072) || (N == 16384 && K == 3072) ||
           (N == 3072 && K == 8192);
  return false;
}
// The streamed form's ring depth (stages of 4 k-steps) per cell: 2, or 3 where the decode step at
// batch 32 measured faster with 3 (the H200, lab run 243, one cell at a time, each arm its own
// process, twice): 12288 x 4096 (llama2-7b's q, k, v; W4 24.3 -> 22.5 µs at 32 rows) W4A16 +3.3%,
// W8A16 +1.1%; W8 9216 x 3072 (Phi-3-mini's q, k, v; equal alone, 15.9 µs) phi3-mini W8A16 +4.5%;
// W8 16384 x 3072 (its gate, up; run 245) +2.7%. Slower with 3: the layers long in K (W4 4096 x
// 11008 23.6 -> 28.7 µs, decode -5.3%; 4096 x 14336 -6.8% on llama3-8b; W8 3072 x 8192 -6.0% on
// phi3-mini), 22016 x 4096 (30.8 -> 36.9 µs) and 28672 x 4096 (W4 -0.4%, W8 -1.3%). W8 6144 x 4096
// and W4 16384 x 3072: 3 (runs 296-297 and 300, above); NF4 6144 x 4096 and 16384 x 3072: 3 (run
// 306: llama3-8b NF4 at batch 32 +2.2%, phi3-mini +0.8%; NF4 12288 x 4096 at 3 stages -1.3%); W4
// 3072 x 8192 (Phi-3-mini's down, a16_auto_path): 3 (run 308). W4 28672 x 4096 and 6144 x 4096
// (llama3-8b's and Mistral-7B's gate, up and q, k, v): 3, for the split norm's readers' placement
// (lab runs 401-406, 2026-11-30). Without a norm kernel between them (a16_wgmma_tma_writes_norm), a
// reader is launched by PDL while the writer before it still runs (the writers trigger at their
// start; the norm kernel only after its wait), so its CTAs back-fill the writer's slots as they free
// and pack up to three an SM, where a launch onto an idle GPU spreads them evenly (the L2-fed
// kernel's spread() answers the same effect by padding shared memory): the gate, up's 224 CTAs and
// the q, k, v's 192 at 2 stages (three an SM possible) ran llama3-8b's W4A16 at batch 32 13.5%
// slower split than whole. At 3 stages (102 KB a CTA, two an SM) the split runs +1.1% at
// 32 rows, -0.2% at 24, equal at 17 (run 406, twice; 3 stages alone, whole: -0.2 to -0.3%, runs
// 338, 404). Capping every streamed grid at its even share of CTAs an SM by its shared-memory
// request instead lost 4-8% (the 4096-row writers' clusters of 8; run 405); the readers alone so
// capped, 0.5-1% below these cells (run 406).
constexpr int a16_wgmma_stages(int64_t N, int64_t K, int bits) {
  const bool three = (N == 12288 && K == 4096 && (bits == 4 || bits == 8)) || (K == 3072 && (N == 9216 || N == 16384) && bits == 8) ||
                     (N == 6144 && K == 4096) || (N == 16384 && K == 3072 && (bits == 4 || bits == 0)) ||
                     (N == 3072 && K == 8192 && bits == 4) || (N == 28672 && K == 4096 && bits == 4);
  return three ? 3 : 2;
}
// The streamed form's k-steps a stage per cell: 4, or 2 on NF4 22016 x 4096 (llama2-7b's gate, up),
// where 2 stages of 2 k-steps and NF4's 32 KB pair table fit three CTAs an SM (two at 4 k-steps),
// so the layer runs two K slices: 37.1 -> 34.8 µs at 32 rows (lab run 312; every other NF4 cell
// slower that way: 12288 x 4096 22.6 -> 29.5, 28672 x 4096 38.2 -> 57.3). Decode llama2-7b NF4 at
// batch 32 with this cell against without, in one call, twice: 7,384 -> 7,517 tok/s (+1.8%, run 313).
constexpr int a16_wgmma_nk(int64_t N, int64_t K, int bits) { return bits == 0 && N == 22016 && K == 4096 ? 2 : 4; }
// The streamed form's K slices per cell: 0 (its planner: the most, up to 8, that keep the grid
// resident), or a count measured faster in the decode step at batch 32 (the H200, one process an
// arm, twice; lab runs 338-340):
// - 4 on W4 6144 x 4096 (llama3-8b's and Mistral-7B's q, k, v), which the planner ran at 8 slices
//   of 8 k-steps (two stages a CTA): stream µs at 32 rows 18.6 at 8, 17.3 at 4, 15.4 at 6 (slices
//   of 10-11 k-steps); the L2-fed kernel that served it 18.2. llama3-8b W4A16: the L2-fed kernel
//   8,432 / 8,429 tok/s, the streamed form at 8 slices 8,319 / 8,299, at 4 8,672 / 8,678 (+2.9%,
//   the rotary folded into it), at 6 8,570 / 8,577, at 3 8,558 / 8,547, at 4 with 3 stages 8,633
//   / 8,663.
// - 3 on W4 9216 x 3072 (Phi-3-mini's q, k, v; the k-step loop at 3 slices served it, and the
//   streamed form at the planner's count lost 3.7%, run 297): phi3-mini W4A16 10,631 / 10,606 ->
//   10,948 / 11,010 (+3.3%); at 2 slices +1.2%, at 4 +2.0%, at 3 with 3 stages +2.5%.
// Every other streamed cell of the three presets (W4, W8, NF4) swept at 1-8 slices read best at
// its planner's count.
constexpr int a16_wgmma_tma_slices(int64_t N, int64_t K, int bits) {
  return bits != 4 ? 0 : N == 6144 && K == 4096 ? 4 : N == 9216 && K == 3072 ? 3 : 0;
}
// The cells where the streamed form writes a split norm (a16_wgmma.cu, kRowSs: the decode's o and
// down at 32 staged rows, GPTQ 4-bit), measured in the decode step at batch 32 with a layer's norms
// split against not (lab run 396, 2026-11-30, `PTQKIT_DECODE_NORM_SPLIT` 1 / 0, --decode 128,
// twice): llama2-7b W4A16 (o 4096 x 4096, down 4096 x 11008) 8,606, 8,606 against 8,478, 8,467
// tok/s (+1.6%). llama3-8b W4A16 (o 4096 x 4096, down 4096 x 14336) lost 13.7% with both split
// (7,521, 7,515 against 8,695, 8,723), until its readers ran 3-stage rings (a16_wgmma_stages: their
// CTAs had packed three an SM, lab runs 401-404): then 8,738, 8,759 against 8,656, 8,649 tok/s
// (+1.1%) at batch 32, 6,720, 6,724 against 6,732, 6,736 at 24, equal at 17 (run 406), so its down
// writes too.
constexpr bool a16_wgmma_tma_writes_norm(int64_t N, int64_t K, int bits) { return bits == 4 && N == 4096 && (K == 4096 || K == 11008 || K == 14336); }
// The L2-fed kernel's K slices (warps of a CTA) at 17..32 rows where a count other than its
// planner's measured faster in the decode step (the H200, batch 32, one cell at a time and then
// together: cells that pay alone can lose beside the others, as the kernels overlap under PDL):
// NF4 16384 x 3072 (Phi-3-mini's gate, up) 3 slices (stream µs at 32 rows 28.4 -> 24.0; phi3-mini
// NF4 +4.2%, lab runs 199, 206) and NF4 6144 x 4096 (llama3-8b's q, k, v) 6 slices (19.2 -> 17.8;
// llama3-8b NF4 +1.0%, runs 204-206). Measured and not taken (runs 204-206): 3 slices on 9216 x
// 3072 and 12288 x 4096 (+2.1% and +1.5% alone, -2.3% and -2.7% beside the other cells), 28672 x
// 4096 (+0.2%), and every GPTQ layer this kernel serves there (3 and 6 slices 1-12% slower than the
// planner's, 8 equal). 0: the planner's. bits: 4 or 8 (GPTQ), 0 (NF4). On an sm_90 GPU NF4 runs
// both layers on the wgmma kernel's streamed form since run 306 (a16_wgmma_streamed); these cells
// serve the L2-fed kernel where it does not (other GPUs, PTQKIT_A16_NF4_STREAMED=0).
constexpr int a16_mma_slices(int64_t M, int64_t N, int64_t K, int bits) {
  if (M < 17 || M > 32 || bits != 0) return 0;
  return N == 16384 && K == 3072 ? 3 : N == 6144 && K == 4096 ? 6 : 0;
}
// Phi-3-mini's layers (K = 3072; the H200, 2026-11-29, lab run 182, stream µs at 32 rows) moved
// three cells that the Llama shapes had left open: W4 9216 x 3072 (q, k, v) to wgmma (21.7 against
// the L2-fed kernel's 23.2), W8 16384 x 3072 (gate, up: a tall layer) to wgmma (25.6 against 28.7),
// and the mid-sized layers longer in K than in N (3072 x 8192, down) to x staged in shared memory
// (W4 18.2 against 21.4 from 17 rows; W8 20.0 against 22.0 at 32 rows, 19.7 against 19.2 at 17, so
// from 25; decode batch 32 W8A16 +4.7%, W4A16 +3.3%, run 184). The Llama cells are unchanged (run 183:
// shared_x never beat their choice there). With 3 K slices (a16_wgmma_slices) the wgmma kernel
// also takes W8 9216 x 3072 (run 196: 19.7 against the L2-fed kernel's 23.2 µs at 32 rows, 19.1
// against 22.0 at 24) and W8 11008 x 4096 (run 197: 24.4 against 28.8 at 32 rows, 23.7 against
// 27.5 at 24); W8 12288 x 4096 stayed (29.3 against 30.2) until the streamed form (a16_wgmma_streamed)
// took it and W8 3072 x 8192. W4 3072 x 8192 moved from shared_x to the streamed form with 3 stages
// (run 308, `PTQKIT_A16_TMA_CELLS` in one call, twice: phi3-mini W4A16 at batch 32 9,940 -> 10,666
// tok/s, +7.3%; +3.9% at 2 stages; 18.1 µs alone at 2 stages, shared_x's 18.2).
// W4 4096 x 4096 (the o projection of llama2-7b, llama3-8b and Mistral-7B) moved from the L2-fed
// kernel to the streamed form at 17..32 rows for the decode step (lab runs 389-391, 2026-11-30,
// --decode 128, twice; the form is slower alone: 12.4 µs is the L2-fed kernel's at 32 rows, run
// 387): with its own permute pass llama2-7b W4A16 at batch 32 +1.5-1.8%, llama3-8b within ±0.6% at
// 17, 24 and 32 rows; with attend writing ctx in its order (a16_offer_wgmma_x: no permute launch)
// llama2-7b at 17 / 24 / 32 rows 4,809 -> 4,891, 6,482 -> 6,693, 8,201 -> 8,445 tok/s (+1.7%,
// +3.3%, +3.0%). W8's o stays: it writes the split norm there, and on the streamed form lost 5.7%
// (llama2-7b) and 6.5% (llama3-8b) at batch 32 (run 389).
constexpr A16Path a16_auto_path(int64_t M, int64_t N, int64_t K, int bits, bool wgmma) {
  const int64_t size = N * K;
  const bool big = size > int64_t(4096) * 4096, large = size >= int64_t(4096) * 11008, mid = size >= int64_t(6144) * 4096;
  const bool wgmma_from_17 = bits == 4   ? large || (N > K && size > int64_t(6144) * 4096) || (N == 3072 && K == 8192) || (N == 6144 && K == 4096) || (N == 4096 && K == 4096)
                             : bits == 8 ? (large && (K > N || size > int64_t(12288) * 4096 || N >= 4 * K)) || a16_wgmma_slices(M, N, K, 8) != 0 || a16_wgmma_streamed(N, K, 8)
                                         : a16_wgmma_streamed(N, K, 0);
  if (wgmma && (M >= 33 || (M >= 17 && wgmma_from_17)) && (M <= 128 || (M <= kA16WgmmaMaxM && big))) return A16Path::wgmma;
  const bool shared_x_from_17 = wgmma && K > N && mid && !large && (bits == 4 ? M >= 17 : bits == 8 ? M >= 25 : false);
  return M > kA16MmaMaxM ? A16Path::dequant : (M >= 33 && big) || (M <= 32 && shared_x_from_17) ? A16Path::shared_x : A16Path::mma;
}
constexpr const char* a16_path_name(A16Path p) {
  return p == A16Path::mma ? "mma" : p == A16Path::shared_x ? "shared_x" : p == A16Path::dequant ? "dequant" : p == A16Path::wgmma ? "wgmma" : "automatic";
}
// Whether the wgmma kernel runs here (an sm_90 GPU: H100, H200); defined in kernels/a16_wgmma.cu.
bool a16_wgmma_supported();
// Whether a sweep names this layer at 17..32 rows, which then runs the wgmma kernel (also where
// a16_auto_path picked another): PTQKIT_A16_TMA_CELLS="NxK:bits[:stages[:slices]],..." (bits as
// above; stages: that cell's ring depth on the streamed form, else PTQKIT_A16_TMA_STAGES's or
// a16_wgmma_stages, -1 the k-step loop instead of the streamed form; slices: its K slices, else
// a16_wgmma_tma_slices or the planner's), read once; for per-cell A/Bs in the decode step. Defined
// in kernels/a16_wgmma.cu.
bool a16_streamed_swept(int64_t N, int64_t K, int bits);
// A sweep switch's cells: the list "NxK:bits[:a[:b]],..." in the environment variable var
// (PTQKIT_A16_TMA_CELLS, PTQKIT_A16_MMA_CELLS), a and b 0 where left out; a malformed entry is
// refused (Errc::usage naming the variable: cuda/runtime.h's env_int_list); each caller reads its
// variable once (a static). Defined in kernels/a16_wgmma.cu. a16_sweep_cell: the cell of a layer
// and codes (bits as above), or nullptr.
struct A16SweepCell {
  int64_t N, K;
  int bits, a, b;
};
std::vector<A16SweepCell> a16_sweep_cells(const char* var);
inline const A16SweepCell* a16_sweep_cell(const std::vector<A16SweepCell>& cells, int64_t N, int64_t K, int bits) {
  for (const A16SweepCell& c : cells)
    if (c.N == N && c.K == K && c.bits == bits) return &c;
  return nullptr;
}

// The tensor-core kernels' work split: rt row tiles of 16 per warp (mma only: 1 or 2, 2 up to
// M = 32), slices K slices (mma: warps of one CTA; shared_x: CTAs summed by the last to arrive),
// warps row warps per CTA (shared_x only: 4, 8, or 16 up to M = 64), loop (mma only, where both
// exist: 1 the plain loop, 2 the overlapped batches), form (wgmma at 8..32 staged rows: 1 its
// k-step loop, 2 its streamed form), sum (the wgmma k-step loop's K slices at 64..256 staged rows:
// 1 summed through the global workspace, 2 over a cluster where its clusters are all resident).
// 0 = the planner's choice. Forcing it is for sweeps (`bench kernels`, PTQKIT_A16_SWEEP) and tests;
// process-wide, not thread-safe.
struct A16Split {
  int rt = 0, slices = 0, warps = 0, loop = 0, form = 0, sum = 0;
};
void set_a16_split(A16Split split);
// Whether the last call of the wgmma k-step loop summed its K slices over a cluster (tests).
bool a16_wgmma_last_clustered();

// The RMSNorm of the row a Linear writes, folded into that Linear's kernel (decode at batch 1: the
// o and down projections write the residual row X, which the next norm reads). The CTA that
// finishes last (an arrival counter, reset by it for the next launch) reads the whole row y (fp32,
// after its beta y) and w, and writes out [N] f16 = y / rms(y) * w, rms = sqrt(mean(y²) + eps) in
// fp32: the norm kernel's output, one kernel boundary fewer. arrivals: one int, zero before the
// first launch. Only NF4's L2-fed kernel (a16_mma.cuh) at M = 1 with fp32 y and N % 4 == 0 folds
// (measured: a16_dispatch.cuh's run_mma).
struct A16RowNorm {
  const float* w = nullptr;   // [N]
  void* out = nullptr;        // [N] f16
  int* arrivals = nullptr;
  float eps = 0.0f;
  // The norm split between the two Linears around it (decode at batch 1, the formats whose kernel
  // does not fold it whole): the Linear that writes the row (o, down: fp32 y) also writes
  // row_ss [ceil(N / 16)] = the sum of squares of each 16 rows of y, and out [N] = f16(y * w / 16);
  // the Linear that reads the norm's output (q, k, v; gate, up) takes that out as its x and scales
  // its fp32 sums by 16 * inv, inv = rsqrt(sum(in_ss) / K + in_eps) (in_ss: the writer's row_ss).
  // Each side is its own request (a16_fold_norm with row_ss set; a16_norm_in), taken by the L2-fed
  // kernel at M = 1: the writer where it writes fp32 y itself (not a silu fold, not a reader), the
  // reader where K % 64 == 0. The 1/16
  // keeps f16(y * w) finite up to |y * w| < 2^20 (docs/numerics.md).
  // At 17..32 rows (decode at batch 17..32) each row of y is one token: row_ss [M][ceil(N / 16)]
  // (token n's sums at n ceil(N / 16)), out [M, N], and out_perm (when set) out again at
  // a16_wgmma_x_col's columns, the wgmma kernel's x; the reader's in_ss [M][K / 16]. Taken by the
  // L2-fed kernel as the writer (GPTQ and NF4 codes, fp32 y), by the wgmma kernel's k-step loop as
  // the writer too (GPTQ codes, 32 staged rows, K split over CTAs: its split-K sum writes it), and
  // by the wgmma kernel's streamed form as the reader (K % 64 == 0, 32 staged rows).
  float* row_ss = nullptr;
  const float* in_ss = nullptr;
  float in_eps = 0.0f;
  void* out_perm = nullptr;
};
// The writer's scale of a split norm's x (A16RowNorm): a power of two, exact in fp32.
constexpr float kSplitNormScale = 1.0f / 16.0f;
// Asks the next A16 call on this thread to fold `norm` (nullptr: nothing).
void a16_fold_norm(const A16RowNorm* norm);
// Asks the next A16 call on this thread, a stacked gate, up Linear (N = 2F, gate rows first, F a
// multiple of 16), to write act [M, F] f16 = silu(gate) * up (fp32, then rounded) instead of its
// y: the decode's MLP without its silu·mul kernel. Taken by the L2-fed kernel at M <= 8 (a CTA
// holds the gate's and the up's row tile: in each warp, or at one row of the quantized formats in
// two halves of its warps), not by a forced one-tile split, and where act_perm is null; and by the
// wgmma kernel's streamed form (8..32 staged rows, F % 64 == 0: a CTA holds 64 gate and the
// matching 64 up rows), which also writes act_perm [M, F] (when set): act in that kernel's
// k-step order (a16_wgmma_x_col), the next wgmma Linear's x.
void a16_fold_silu(void* act, void* act_perm = nullptr);
// The rotary embedding and KV-cache append folded into a stacked q, k, v Linear (decode of 2+
// rows): instead of its y [M, (nh + 2 nkv) 128] the Linear writes, for token n (sequence n / T,
// position *pos + n % T), q [n, nh 128] f16 = rot(q_n), and at row (n / T, *pos + n % T) of the
// caches [M / T, max_len, nkv 128] f16 the key rot(k_n) and the value v_n, rot rotating each head's
// dims (j, j + 64) by (cos, sin)[position][j] (kernels/rotary.cuh: the decode's rope_append
// arithmetic, so the same bytes). For heads of 128 dims rotated whole, no bias, no head norm (the
// caller checks those). Taken by the wgmma kernel's streamed form (its CTA holds one head's 128
// output rows) for GPTQ and NF4 codes at 17..32 rows (32 staged), N == (nh + 2 nkv) 128, M a
// multiple of T; every other kernel and call declines.
struct A16Rope {
  const float* cos = nullptr;   // [max_len, 64]
  const float* sin = nullptr;
  const int* pos = nullptr;     // the first new token's position (device)
  void* q = nullptr;            // [M, nh 128] f16
  void* k_cache = nullptr;      // [M / T, max_len, nkv 128] f16
  void* v_cache = nullptr;
  int T = 1, nh = 0, nkv = 0, max_len = 0;
};
constexpr int kA16RopeHead = 128;   // the head size the fold takes
// Asks the next A16 call on this thread to fold `rope` (A16Rope).
void a16_fold_rope(const A16Rope* rope);
// What the call after a fold request (a16_fold_norm, a16_fold_silu, a16_fold_rope) did with it:
//   none   not taken: the caller runs the kernel the fold would have saved;
//   whole  taken: the norm's output (or silu(gate) · up, or q and the cache rows) written;
//   split  a split norm's writer side (a16_fold_norm with row_ss): row_ss and out written, the
//          norm to be finished by its reader (a16_norm_in).
enum class A16Fold { none, whole, split };
// Answers for the last call and clears the request either way, so that it never reaches a later call.
A16Fold a16_folded();
// Asks the next A16 call on this thread to be the reader of a split norm (A16RowNorm: its x the
// writer's out, in_ss, in_eps); a16_took_norm_in says whether it did (and clears the request). A
// call that did not took x as a plain input: the caller runs the norm and calls again.
void a16_norm_in(const A16RowNorm* norm);
bool a16_took_norm_in();

// The column of x's row at which the wgmma kernel (kernels/a16_wgmma.cu) reads column col, for K
// a multiple of 64: inside each 64-column k-step the column pairs are permuted as the weights'
// fragment order needs (pair w = 8c + 4p + k goes to 16p + 4k + c: a 4 x 4 transpose of 4-byte
// words); col and col + 1 (col even) stay side by side. The kernel's own permute pass writes this
// order; a producer may write it instead (a16_offer_wgmma_x).
constexpr int64_t a16_wgmma_x_col(int64_t col) {
  const int64_t w = col % 64 / 2;
  return col / 64 * 64 + 2 * (((w & 7) << 2) | (w >> 3)) + col % 2;
}
// Offers the next A16 call on this thread x_perm [M, K] f16, x in that order (K % 64 == 0): a call
// whose x is x_of and whose kernel is the wgmma one reads x_perm and skips its permute pass (one
// launch and an L2 round trip fewer a Linear: the decode step at 17..32 rows, lab runs 148-150); any
// other call ignores it. a16_took_wgmma_x says whether the call took it and clears the offer.
void a16_offer_wgmma_x(const void* x_of, const void* x_perm);
bool a16_took_wgmma_x();

}  // namespace ptq::cuda
