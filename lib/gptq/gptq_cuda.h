// gptq_cuda.h — the GPTQ solve on the GPU (cuSOLVER, cuBLAS, one fused kernel per block of 128
// columns) and the output errors of its result. Same math as lib/gptq/gptq.cpp, its reference
// (tests/test_gptq_cuda.cpp compares the two).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "cuda/runtime.h"
#include "gptq/gptq.h"
#include "gptq/hessian_cuda.h"

namespace ptq::cuda {

// Whether the fused kernel serves this spec: groups must start at block boundaries (group_size
// divides 128), or be static, or be one per row.
bool gptq_supported(const QuantSpec& s, std::string* why);

// Rows of W: from the host (fp32), or already on the device (F16, BF16 or F32; the 16-bit forms
// are widened exactly, so they must hold the model's weights exactly).
struct WeightRows {
  int64_t rows = 0;
  const MatF* host = nullptr;
  const void* device = nullptr;
  DType dtype = DType::F32;
};
// GPTQ's output error from its own column loop. With H_d = H + lambda I the damped Hessian the
// solve factors (H_d^-1 = U^T U) and err_j = (w_j - q_j) / U_jj the errors it propagates, the
// weights' error is e = err U, so e H_d e^T = err U (U^T U)^-1 U^T err^T = |err|^2 for each row,
// and the output error is e H e^T / 2 = (|err|^2 - lambda |e|^2) / 2 (dead columns: e = 0).
// err2[r] = |err_r|^2 and e2[r] = |e_r|^2 (live columns), fp64 sums of fp32 terms; lambda[e] the
// damping of problem e (rows [e * rows_per, (e + 1) * rows_per) of a batched solve).
struct DampedLoss {
  std::vector<double> err2, e2, lambda;
  int64_t rows_per = 0;
  // (sum err2 - lambda sum e2) / 2 over rows [r0, r1) of one problem; NaN when the damping term
  // cancels more than 90% of the sum (then the fp32 rounding of err is amplified past 1e-4: use
  // the exact form).
  double loss(int64_t r0, int64_t r1) const;
};
// What a solve leaves on the device for what follows it.
enum class SolveKeep {
  codes,             // nothing: codes (one byte each) and grids on the host
  weights,           // W and GPTQ's Wq, codes packed on the device, DampedLoss
  weights_and_rtn,   // the same and RTN's Wr (the report's baseline)
};
struct ResidentSolve {
  // Per part: codes and grids, natural column order (SolveKeep::codes: codes; else packed as the
  // layer store's words, QuantizedLinear::packed).
  std::vector<QuantizedLinear> parts;
  DeviceBuffer<float> W, Wq, Wr; // [rows, cols] fp32: W as given, GPTQ's dequantized weights, RTN's (as kept)
  DampedLoss damped;             // GPTQ's output error by rows, from the column loop
};
// The GPU solve: one GPTQ solve of the parts stacked by rows (q/k/v, or gate/up: the same Hessian
// and spec give each row the same result as solving the parts apart — GPTQ treats rows
// independently). H = H.scale * H.sum, read only. limits [groups, rows of every part] (static
// groups only; gptq_quantize's): AWQ's clipping limits, which fix the static grids (and the RTN
// baseline's) before the solve.
ResidentSolve gptq_solve_cuda(const std::vector<WeightRows>& parts, int64_t cols, HessianRef H, const QuantSpec& s, SolveKeep keep,
                              SolveStats* stats = nullptr, const std::vector<float>* limits = nullptr);
// A batch of such solves of the same spec, input width and rows (an MoE layer's expert downs, each
// with its own Hessian): the problems' rows stacked in order in W, Wq, Wr and `parts`; each
// problem factored apart (batched cuSOLVER/cuBLAS calls), the column loop's kernels run once for
// all. Each problem's result is what its own gptq_solve_cuda gives up to the batched
// factorization's rounding. stats: one per problem.
// The fp64 Hessians (cols^2 x 8 bytes each) one batch takes: all 128 expert downs of a
// Qwen3-30B-A3B layer (768 columns) at once; Mixtral's (14,336 columns, 1.6 GB each) one at a
// time, where a single factorization already fills the GPU.
constexpr int64_t kBatchHessianBytes = int64_t(1) << 30;
struct SolveProblem {
  std::vector<WeightRows> parts;
  HessianRef H;
};
ResidentSolve gptq_solve_cuda(const std::vector<SolveProblem>& problems, int64_t cols, const QuantSpec& s, SolveKeep keep,
                              std::vector<SolveStats>* stats = nullptr, const std::vector<float>* limits = nullptr);

// words [rows, packed_words(n, bits)] = each row of codes [rows, n] packed as core/bits.h's
// pack_rows does on the host (device pointers; asynchronous).
void pack_rows_device(const uint8_t* codes, int64_t rows, int64_t n, int bits, uint32_t* words);

// Round-to-nearest on the GPU: rtn_quantize (lib/quant) to the bit (the same grids, quant/grid.cuh,
// and codes) of W [rows, cols] fp32 on the device; limits [groups, rows] (AWQ's clipping) or null.
// The codes are packed on the device; Wq (their weights, dequantized, [rows, cols] fp32) stays
// there for what follows (the output error, the next stage's forward). rtn_supported: bits 2..8,
// groups of at most 128 columns or one a row (no clipping then); GPTQ's integer grid or llama.cpp's
// (their grids formed on the device, or by the host's static_grids with the MSE search).
bool rtn_supported(const QuantSpec& s, std::string* why = nullptr);
struct ResidentRtn {
  QuantizedLinear q;
  DeviceBuffer<float> Wq;
};
ResidentRtn rtn_quantize_cuda(const float* W, int64_t rows, int64_t cols, const QuantSpec& s, const std::vector<float>* limits = nullptr);

// Timings of the last gptq_solve_cuda call's phases, for benchmarks (seconds).
// pack: the codes bit-packed on the device and downloaded (kept solves); download: the rest of
// the results (natural order, grids, Wq, RTN).
struct GptqPhaseTimes { double prepare = 0, factorization = 0, potrf = 0, trtri = 0, column_loop = 0, pack = 0, download = 0; };
GptqPhaseTimes last_phase_times();

// The CPU's output_error (lib/gptq) for GPTQ's Wq and, when given, RTN's Wr (else the second is
// the first): sum(E H E^T) / 2 with E = W - Wq (fp32, as on the CPU), H = H.scale * H.sum (fp64,
// device, symmetric); fp64 DGEMMs on the device. W, Wq, Wr: fp32 [rows, cols] on the device.
std::pair<double, double> output_errors(const float* W, const float* Wq, const float* Wr, int64_t rows, int64_t cols, HessianRef H);
// sum(E H E^T) / 2 with the products on TF32 tensor cores (E and H rounded to 10-bit mantissas,
// fp32 accumulation, fp64 row sums): ~1e-4 relative, an order of magnitude faster than fp64; for
// the report's RTN baseline, whose errors are not fitted to H (GPTQ's are, and cancel: not for them).
double output_error_tf32(const float* W, const float* Wq, int64_t rows, int64_t cols, HessianRef H);
// The same from host matrices (uploaded).
std::pair<double, double> output_errors(const MatF& W, const MatF& Wq, const MatF* Wr, HessianRef H);

}  // namespace ptq::cuda
