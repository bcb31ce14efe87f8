// gptq_cuda.cu — contract (reference: lib/gptq/gptq.cpp, the same steps in the same precisions):
//   gptq_solve_cuda: W [rows, cols] fp32 (host or device), H = hscale * sum, the sum fp64 [cols, cols] (device).
//     Factorization: J H J = L L^T (cusolverDnDpotrf, fp64), L^-1 in place (recursive, by cublasDtrmm, fp64),
//     U = J L^-1 J (upper), narrowed to fp32 one block of 128 rows at a time as the loop reaches
//     it (no fp32 copy of the whole U). fp64 because the factorization is where conditioning bites
//     and it is O(cols^3 / 3), small next to the Hessians; the column loop is fp32 like the CPU path.
//     Memory at the peak: H (fp64) + its factor, in place (fp64) + W twice (fp32).
//     The loop also sums err^2 per row: GPTQ's output error without a GEMM (DampedLoss).
//     Column loop: gptq_block_kernel, one launch per block of B = 128 columns: a warp per row,
//     lane l holding columns l, l+32, l+64, l+96 of the block in registers, the block's U
//     (128 x 128 fp32, 64 KiB) in shared memory; then one SGEMM W[:, i2:] -= Err1 U[i1:i2, i2:].
//     Accepts: groups that start at block boundaries (group_size | 128), static groups, one group
//     per row; bits 2..8; GPTQ's integer-zero grid, and llama.cpp's f16-min and K-quant grids with
//     static groups (static_grids' on the device: grid.cuh's form_grid_kernel, a warp a group and
//     row, then super_block_kernel, a thread a super-block and row; with the MSE search the host's
//     static_grids; the loop then quantizes with quant_form). Anything else is refused by
//     gptq_supported and solved on the CPU.
//   rtn_quantize_cuda: RTN (rtn_quantize) of W on the device, its grids by grid.cuh's kernels.
// Size (~740 lines): one algorithm, the solve's numbered steps and the kernel each step launches,
// kept together so that each step reads beside its kernel (the Hessians and the losses, which
// stand alone, are hessian_cuda.cu and loss_cuda.cu).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "core/bits.h"
#include "core/error.h"
#include "gptq/gptq_cuda.h"
#include "cuda/runtime.h"
#include "quant/grid.cuh"

namespace ptq::cuda {

namespace {
constexpr int kB = 128;          // columns per block
constexpr int kWarps = 16;       // rows per CTA of the column kernel

struct Handles {
  cublasHandle_t blas = nullptr;
  cusolverDnHandle_t solver = nullptr;
  Handles() {
    PTQ_CUBLAS(cublasCreate(&blas));
    PTQ_CUSOLVER(cusolverDnCreate(&solver));
  }
};
Handles& handles() {
  static Handles h;
  return h;
}
GptqPhaseTimes g_times;
double secs(std::chrono::steady_clock::time_point a) { return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count(); }
int blocks_for(int64_t n, int t = 256) { return int((n + t - 1) / t); }

}  // namespace

// ---------------------------------------------------------------- the solve
namespace {

// A batch of E problems: problem e is rows [e * rows_per, (e + 1) * rows_per) of the stacked W,
// its Hessian H[e], and its n entries of each per-column array (perm, g_idx, diag) at e * n.
// Dead columns (diag H = 0): W[:, i] = 0 (their diagonal is set by reversed_damped_kernel; the caller's H is read only).
__global__ void zero_dead_kernel(const double* const* H, float* W, int64_t n, int E, int64_t rows_per) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (k >= E * n) return;
  const int64_t e = k / n, i = k % n;
  if (H[e][i * n + i] != 0.0) return;
  for (int64_t r = e * rows_per; r < (e + 1) * rows_per; ++r) W[r * n + i] = 0.0f;
}
__global__ void diag_kernel(const double* const* H, int64_t n, int E, double* d) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (k < E * n) d[k] = H[k / n][(k % n) * n + k % n];
}
__global__ void permute_w_kernel(const float* W, const int* perm, int64_t rows, int64_t n, int64_t rows_per, float* Wp) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (k >= rows * n) return;
  const int64_t r = k / n;
  Wp[k] = W[r * n + perm[(r / rows_per) * n + k % n]];
}
// A = J P (H + damp I) P^T J (symmetric: the same in row- and column-major), scaled by `scale`;
// a dead column's zero diagonal counts as `one` (1 after the scaling, as on the CPU).
__global__ void reversed_damped_kernel(const double* H, const int* perm, int64_t n, double scale, double one, double damp, double* A) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (k >= n * n) return;
  const int64_t i = k / n, j = k % n;
  double v = H[int64_t(perm[n - 1 - i]) * n + perm[n - 1 - j]];
  if (i == j && v == 0.0) v = one;
  A[k] = scale * v + (i == j ? damp : 0.0);
}
__global__ void identity_kernel(double* a, int64_t n) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (k < n * n) a[k] = (k / n == k % n) ? 1.0 : 0.0;
}
// B (column-major, ldb) := the lower triangle of the n x n column-major block a (ld n).
__global__ void copy_lower_kernel(const double* a, int64_t n, double* B, int64_t ldb) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (k >= n * n) return;
  const int64_t i = k % n, j = k / n;
  if (i >= j) B[i + j * ldb] = a[k];
}
// U = J Linv J (upper; Linv column-major lower): U(i, j) = Linv(n-1-i, n-1-j) for j >= i. The
// column loop reads U one block of rows at a time, so U is never stored whole in fp32.
// bad = 1 when Linv has a non-finite entry or a diagonal that is not positive.
// (Problem e = blockIdx.y, its flag bad[e].)
__global__ void check_linv_kernel(const double* const* Linvs, int64_t n, int* bad) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (k >= n * n) return;
  const int64_t row = k % n, col = k / n;
  if (row < col) return;
  const double v = Linvs[blockIdx.y][k];
  if (!isfinite(v) || (row == col && !(v > 0))) bad[blockIdx.y] = 1;
}
// Ub [count, n] fp32 (row-major) = rows i1 .. i1+count-1 of U, columns j >= i1 (0 left of the
// diagonal; columns < i1 are not written). A 32 x 32 tile through shared memory: Linv's row index
// runs with a (coalesced reads), Ub's column with j (coalesced writes). Block (32, 8); problem e =
// blockIdx.z reads Linvs[e] and writes its kB rows at Ub + e * kB * n.
__global__ void u_rows_kernel(const double* const* Linvs, int64_t n, int64_t i1, int count, float* Ub) {
  __shared__ float t[32][33];
  const double* Linv = Linvs[blockIdx.z];
  Ub += int64_t(blockIdx.z) * kB * n;
  const int64_t j0 = i1 + blockIdx.x * 32, a0 = blockIdx.y * 32;
  for (int y = threadIdx.y; y < 32; y += 8) {
    const int64_t j = j0 + y, a = a0 + threadIdx.x;
    float v = 0.0f;
    if (j < n && a < count && j >= i1 + a) v = float(Linv[(n - 1 - j) * n + (n - 1 - i1 - a)]);
    t[y][threadIdx.x] = v;
  }
  __syncthreads();
  for (int y = threadIdx.y; y < 32; y += 8) {
    const int64_t a = a0 + y, j = j0 + threadIdx.x;
    if (a < count && j < n) Ub[a * n + j] = t[threadIdx.x][y];
  }
}

// Codes back to the natural column order, and the weights they stand for:
// codes_nat[r, perm[c]] = codes[r, c]; Wq[r, j] = scale[g(j), r] * (code - zero[g(j), r]), g = g_idx (natural);
// form: llama.cpp's grids (the host's), with their mins where given (dequant_form).
__global__ void unpermute_dequantize_kernel(const uint8_t* codes, const int* perm, const int* g_idx, const float* scale, const int* zero,
                                            const float* mins, bool form, int64_t rows, int64_t n, int64_t rows_per, uint8_t* codes_nat, float* Wq) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (k >= rows * n) return;
  const int64_t r = k / n, e = r / rows_per, j = perm[e * n + k % n], g = g_idx[e * n + j];
  const uint8_t q = codes[k];
  codes_nat[r * n + j] = q;
  if (!Wq) return;
  if (form) Wq[r * n + j] = dequant_form(q, {scale[g * rows + r], zero[g * rows + r], mins ? mins[g * rows + r] : 0.0f}, mins != nullptr);
  else Wq[r * n + j] = scale[g * rows + r] * float(int(q) - zero[g * rows + r]);
}
// Round-to-nearest with the given grids (groups of gs natural columns): the weights the codes stand
// for (the report's baseline, or RTN's result) and, where asked, the codes (one byte each).
// form, mins: as unpermute_dequantize_kernel's.
__global__ void rtn_dequantize_kernel(const float* W, int64_t rows, int64_t n, int64_t gs, const float* scale, const int* zero, const float* mins,
                                      bool form, int maxq, float* Wr, uint8_t* codes = nullptr) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (k >= rows * n) return;
  const int64_t r = k / n, g = (k % n) / gs;
  const Grid gr{scale[g * rows + r], zero[g * rows + r], mins ? mins[g * rows + r] : 0.0f};
  int q;
  if (form) {
    q = quant_form(W[k], gr, maxq, mins != nullptr);
    Wr[k] = dequant_form(q, gr, mins != nullptr);
  } else {
    q = quant(W[k], gr, maxq);
    Wr[k] = gr.scale * float(q - gr.zero);
  }
  if (codes) codes[k] = uint8_t(q);
}
// RTN's grids of W [rows, n] (natural column order; scale, zero [groups, rows]): static_grids' on
// the host (lib/quant), one group a row where group_size <= 0; lim [groups, rows] or null (AWQ's
// clipping: groups only).
void rtn_grids(const float* W, int64_t rows, int64_t n, const QuantSpec& s, const float* lim, float* scale, int* zero) {
  const int64_t gs = s.group_size > 0 ? s.group_size : n, groups = (n + gs - 1) / gs;
  const int maxq = s.maxq(), dt = dtype_code(s.scale_dtype);
  if (s.group_size <= 0)
    row_grid_kernel<<<blocks_for(rows * 32, 256), 256>>>(W, rows, n, maxq, s.sym, s.mse, dt, scale, zero);
  else
    static_grid_kernel<<<blocks_for(groups * rows * 32, 256), 256>>>(W, rows, n, gs, groups, maxq, s.sym, s.mse, dt, lim, scale, zero);
  PTQ_CUDA_LAUNCH("RTN grids");
}
// llama.cpp's grids (GridForm other than integer_zero) of W [rows, n] (device, fp32), static_grids'
// (lib/quant) on the device: each (group, row)'s grid, then each super-block's groups rounded
// together. scale, zero, min [groups, rows]; super_d, super_dmin [groups / groups_per_super, rows]
// (null where the form has none); lim: AWQ's clipping limits [groups, rows] or null. With the MSE
// search (find_grid's, evaluated in fp64 with pow) the host forms them: host_form_grids.
void form_grids(const float* W, int64_t rows, int64_t n, const QuantSpec& s, const float* lim, float* scale, int* zero, float* min, float* super_d,
                float* super_dmin) {
  const int64_t gs = s.group_size, groups = (n + gs - 1) / gs;
  form_grid_kernel<<<blocks_for(groups * rows * 32, 256), 256>>>(W, rows, n, gs, groups, int(s.form), s.maxq(), lim, scale, zero, min);
  PTQ_CUDA_LAUNCH("form_grid_kernel");
  if (const int per = groups_per_super(s.form)) {
    super_block_kernel<<<blocks_for(groups / per * rows), 256>>>(rows, groups / per, per, int(s.form), scale, min, super_d, super_dmin);
    PTQ_CUDA_LAUNCH("super_block_kernel");
  }
}
// The same by the host's static_grids, for grids with the MSE search: W downloaded, its grids
// formed, and their scales, zeros and (forms with a min) mins uploaded; g's grids take them all.
void host_form_grids(const float* W, int64_t rows, int64_t n, const QuantSpec& s, const std::vector<float>* limits, QuantizedLinear& g, float* scale,
                     int* zero, float* min) {
  MatF Wh(rows, n);
  copy_to_host_staged(Wh.data(), W, size_t(rows * n) * 4);
  QuantizedLinear h = QuantizedLinear::empty(rows, n, s);
  static_grids(Wh, h, limits);
  copy_to_device(scale, h.scales.data(), h.scales.size() * 4);
  copy_to_device(zero, h.zeros.data(), h.zeros.size() * 4);
  if (min) copy_to_device(min, h.mins.data(), h.mins.size() * 4);
  g.scales = std::move(h.scales);
  g.zeros = std::move(h.zeros);
  g.mins = std::move(h.mins);
  g.super_d = std::move(h.super_d);
  g.super_dmin = std::move(h.super_dmin);
}
// A form's grids of W into the solve's or RTN's buffers, and their mins and super-block parameters
// into g's (rows x groups on the host; the scales and zeros are read from the device later).
void form_grids_into(const float* W, int64_t rows, int64_t n, const QuantSpec& s, const std::vector<float>* limits, const float* lim,
                     QuantizedLinear& g, float* scale, int* zero, float* min) {
  if (s.mse) {
    host_form_grids(W, rows, n, s, limits, g, scale, zero, min);
    return;
  }
  const int64_t groups = (n + s.group_size - 1) / s.group_size, per = groups_per_super(s.form), supers = per ? groups / per : 0;
  DeviceBuffer<float> d(size_t(std::max<int64_t>(supers * rows, 1)), "super-block d"), dmin(size_t(std::max<int64_t>(supers * rows, 1)), "super-block dmin");
  const bool k_min = s.form == GridForm::k_min;
  form_grids(W, rows, n, s, lim, scale, zero, min, d.get(), k_min ? dmin.get() : nullptr);
  g.mins.resize(min ? size_t(groups * rows) : 0);
  g.super_d.resize(size_t(supers * rows));
  g.super_dmin.resize(k_min ? size_t(supers * rows) : 0);
  if (min) copy_to_host(g.mins.data(), min, g.mins.size() * 4);
  if (supers) copy_to_host(g.super_d.data(), d.get(), g.super_d.size() * 4);
  if (k_min) copy_to_host(g.super_dmin.data(), dmin.get(), g.super_dmin.size() * 4);
}
__global__ void widen_to_f32_kernel(const void* x, int dtype, int64_t n, float* y) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  y[i] = dtype == 1 ? __half2float(static_cast<const __half*>(x)[i])
         : dtype == 2 ? __bfloat162float(static_cast<const __nv_bfloat16*>(x)[i]) : static_cast<const float*>(x)[i];
}

// The column loop of one block. mode 0: per-row grids; 1: static groups (form: llama.cpp's grids,
// st_min their mins or null); 2: a grid per group, computed from the block's current values when
// the group starts. Grid (rows_per / kWarps, E): the
// CTAs of problem e = blockIdx.y read its U block (u_rows_kernel) and its columns' groups.
__global__ void __launch_bounds__(kWarps * 32) gptq_block_kernel(const float* __restrict__ W, const float* __restrict__ U, int64_t rows,
                                                                  int64_t rows_per, int64_t n, int64_t i1, int count, int mode, int gs, int maxq, bool sym,
                                                                  bool mse, int dt, const float* row_scale, const int* row_zero,
                                                                  const float* st_scale, const int* st_zero, const float* st_min, bool form,
                                                                  const int* gidx_perm,
                                                                  float* grp_scale, int* grp_zero, uint8_t* codes, float* err_out,
                                                                  double* err2) {
  extern __shared__ float Us[];   // [count][kB]
  U += int64_t(blockIdx.y) * kB * n;
  gidx_perm += int64_t(blockIdx.y) * n;
  for (int k = threadIdx.x; k < count * kB; k += blockDim.x) {
    const int a = k / kB, b = k % kB;
    Us[k] = b < count ? U[a * n + i1 + b] : 0.0f;   // U: the block's rows (u_rows_kernel)
  }
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int64_t local = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32, r = blockIdx.y * rows_per + local;
  if (local >= rows_per) return;
  float reg[4];
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const int j = t * 32 + lane;
    reg[t] = j < count ? W[r * n + i1 + j] : 0.0f;
  }
  Grid g{mode == 0 ? row_scale[r] : 1.0f, mode == 0 ? row_zero[r] : 0};
  double e2 = 0;   // this lane's columns' err^2 (the row's damped loss, see solve)
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    for (int l = 0; l < 32; ++l) {
      const int i = s * 32 + l;
      if (i >= count) break;
      const int64_t col = i1 + i;
      if (mode == 2 && col % gs == 0) {
        bool have[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) { const int j = t * 32 + lane; have[t] = j >= i && j < min(i + gs, count); }
        g = warp_grid(reg, have, maxq, sym, mse, dt);
        if (lane == 0) { grp_scale[(col / gs) * rows + r] = g.scale; grp_zero[(col / gs) * rows + r] = g.zero; }
      } else if (mode == 1) {
        const int gi = gidx_perm[col];
        g = {st_scale[int64_t(gi) * rows + r], st_zero[int64_t(gi) * rows + r], st_min ? st_min[int64_t(gi) * rows + r] : 0.0f};
      }
      const float w = __shfl_sync(~0u, reg[s], l);
      int q;
      float err;
      if (form) {   // llama.cpp's grids (static, the host's)
        q = quant_form(w, g, maxq, st_min != nullptr);
        err = (w - dequant_form(q, g, st_min != nullptr)) / Us[i * kB + i];
      } else {
        q = quant(w, g, maxq);
        err = (w - g.scale * float(q - g.zero)) / Us[i * kB + i];
      }
      if (lane == l) {
        codes[r * n + col] = uint8_t(q);
        err_out[r * kB + i] = err;
        e2 += double(err) * double(err);
      }
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int j = t * 32 + lane;
        if (j > i && j < count) reg[t] -= err * Us[i * kB + j];
      }
    }
  }
  e2 = warp_sum(e2);
  if (lane == 0) err2[r] += e2;   // blocks run in order: deterministic
}
// e2[r] = sum over live columns j (H_jj != 0) of (W[r, j] - Wq[r, j])^2, fp64; a warp per row.
__global__ void live_sq_error_kernel(const float* W, const float* Wq, const double* diag, int64_t rows, int64_t n, int64_t rows_per, double* e2) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  diag += (r / rows_per) * n;
  double s = 0;
  for (int64_t j = threadIdx.x % 32; j < n; j += 32)
    if (diag[j] != 0.0) {
      const double d = double(W[r * n + j] - Wq[r * n + j]);
      s += d * d;
    }
  s = warp_sum(s);
  if (threadIdx.x % 32 == 0) e2[r] = s;
}
}  // namespace

bool gptq_supported(const QuantSpec& s, std::string* why) {
  if (s.form != GridForm::integer_zero && !(s.static_groups && s.group_size > 0)) {
    if (why) *why = std::string("the ") + grid_form_name(s.form) + " grids of llama.cpp's blocks solve on the GPU with static groups only (on the CPU otherwise)";
    return false;
  }
  if (s.bits < 2 || s.bits > 8) { if (why) *why = "bits must be 2..8"; return false; }
  if (s.group_size > kB && s.static_groups) {
    if (why) *why = "static groups on the GPU take at most 128 columns";
    return false;
  }
  if (s.group_size > 0 && !s.static_groups && kB % s.group_size != 0) {
    if (why) *why = "group_size " + std::to_string(s.group_size) + " does not divide the 128-column block (dynamic groups must start at block boundaries)";
    return false;
  }
  return true;
}

GptqPhaseTimes last_phase_times() { return g_times; }

double DampedLoss::loss(int64_t r0, int64_t r1) const {
  double a = 0, b = 0;
  for (int64_t r = r0; r < r1 && r < int64_t(err2.size()); ++r) { a += err2[size_t(r)]; b += e2[size_t(r)]; }
  if (err2.empty() || rows_per <= 0 || (r1 - 1) / rows_per != r0 / rows_per) return std::nan("");
  return damped_output_error(a, b, lambda[size_t(r0 / rows_per)]);
}

namespace {

// words [rows, nw] = each row of codes [rows, n] as one core/bits.h stream of `bits`-bit values
// (pack_rows on the host): a thread per word, ORing the values that overlap it.
__global__ void pack_rows_kernel(const uint8_t* codes, int64_t rows, int64_t n, int bits, int64_t nw, uint32_t* words) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * nw) return;
  const int64_t r = i / nw, b0 = (i - r * nw) * 32;
  const uint8_t* c = codes + r * n;
  const int64_t k1 = min(n, (b0 + 32 + bits - 1) / bits);
  uint32_t x = 0;
  for (int64_t k = b0 / bits; k < k1; ++k) {   // value k's bits start at k * bits - b0 in [-bits, 32)
    const int64_t sh = k * bits - b0;
    const uint32_t v = c[k];
    x |= sh >= 0 ? v << sh : v >> -sh;
  }
  words[i] = x;
}

// A (column-major, lower, n x n, leading dimension lda) := A^-1 in place, as LAPACK's dtrtri:
// with A = [A11 0; A21 A22], A^-1 = [A11^-1 0; -A22^-1 A21 A11^-1  A22^-1]. The diagonal blocks
// are inverted first (recursively), then A21 by two in-place triangular products (cublasDtrmm:
// measured 0.113 s against 0.148 s for the same recursion by two triangular solves before the
// blocks are inverted, 7 factorizations of a 7B layer); diagonal blocks of at most kTri columns
// are inverted by a solve against the identity in a small buffer.
constexpr int64_t kTri = 256;   // the largest diagonal block inverted against the identity
void invert_lower_in_place(double* A, int64_t n, int64_t lda, double* work /* kTri x kTri */) {
  auto& h = handles();
  const double one = 1.0, minus_one = -1.0;
  if (n <= kTri) {
    identity_kernel<<<blocks_for(n * n), 256>>>(work, n);
    PTQ_CUDA_LAUNCH("identity_kernel");
    PTQ_CUBLAS(cublasDtrsm(h.blas, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, CUBLAS_DIAG_NON_UNIT, int(n), int(n), &one, A, int(lda),
                           work, int(n)));
    copy_lower_kernel<<<blocks_for(n * n), 256>>>(work, n, A, lda);
    PTQ_CUDA_LAUNCH("copy_lower_kernel");
    return;
  }
  const int64_t n1 = (n / 2 + kTri - 1) / kTri * kTri, n2 = n - n1;   // A11: whole kTri blocks
  double *A11 = A, *A21 = A + n1, *A22 = A + n1 + n1 * lda;
  invert_lower_in_place(A11, n1, lda, work);
  invert_lower_in_place(A22, n2, lda, work);
  // A21 := A21 A11^-1, then A21 := -A22^-1 A21 (cuBLAS's trmm writes C; C = B is its in-place form)
  PTQ_CUBLAS(cublasDtrmm(h.blas, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, CUBLAS_DIAG_NON_UNIT, int(n2), int(n1), &one, A11,
                         int(lda), A21, int(lda), A21, int(lda)));
  PTQ_CUBLAS(cublasDtrmm(h.blas, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, CUBLAS_DIAG_NON_UNIT, int(n2), int(n1), &minus_one, A22,
                         int(lda), A21, int(lda), A21, int(lda)));
}

// L^-1 of each problem in its own n x n fp64 buffer: cusolverDnDpotrfBatched, then
// cublasDtrsmBatched against the identity. For batches of small solves (an MoE layer's expert
// downs), where one factorization after another is bound by launches and host round trips.
// A[e] holds the damped reversed Hessian on entry and its Cholesky factor after; Inv[e] gets L^-1
// (lower; its upper triangle stays 0). info[e] != 0: A[e] was not positive definite.
void invert_batched(std::vector<double*>& A, std::vector<double*>& Inv, int64_t n, std::vector<int>& info) {
  auto& h = handles();
  const int E = int(A.size());
  DeviceBuffer<double*> dA(size_t(E), "batched factorization (pointers)"), dInv(size_t(E), "batched inverse (pointers)");
  DeviceBuffer<int> dInfo(size_t(E), "cuSOLVER info (batched)");
  PTQ_CUDA(cudaMemcpy(dA.get(), A.data(), size_t(E) * sizeof(double*), cudaMemcpyHostToDevice));
  PTQ_CUDA(cudaMemcpy(dInv.get(), Inv.data(), size_t(E) * sizeof(double*), cudaMemcpyHostToDevice));
  PTQ_CUSOLVER(cusolverDnDpotrfBatched(h.solver, CUBLAS_FILL_MODE_LOWER, int(n), dA.get(), int(n), dInfo.get(), E));
  for (double* I : Inv) {
    identity_kernel<<<blocks_for(n * n), 256>>>(I, n);
    PTQ_CUDA_LAUNCH("identity_kernel");
  }
  const double one = 1.0;
  PTQ_CUBLAS(cublasDtrsmBatched(h.blas, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, CUBLAS_DIAG_NON_UNIT, int(n), int(n), &one,
                                dA.get(), int(n), dInv.get(), int(n), E));
  info.assign(size_t(E), 0);
  PTQ_CUDA(cudaMemcpy(info.data(), dInfo.get(), size_t(E) * 4, cudaMemcpyDeviceToHost));
}

// The solve of E problems of the same shape and spec at once: W (device, fp32, [E * rows_per, n],
// problem e's rows stacked after problem e-1's; read only), problem e against Hs[e] (an unscaled
// fp64 sum, read only). One problem is the stacked Linears of a group (q/k/v); several are an MoE
// layer's expert downs, each with its own Hessian. Each problem is factored apart (E = 1: potrf
// and the in-place inverse; E > 1: invert_batched), then every kernel of the column loop runs once
// for all problems. Leaves GPTQ's dequantized weights in Wq_out and RTN's in Wr_out when given
// (natural column order); parts: the results by part_rows (each part within one problem).
void solve(const float* dW0, int E, int64_t rows_per, int64_t n, const std::vector<HessianRef>& Hs, const QuantSpec& s,
           std::vector<SolveStats>& S, DeviceBuffer<float>* Wq_out, DeviceBuffer<float>* Wr_out, DampedLoss* dl,
           const std::vector<int64_t>& part_rows, std::vector<QuantizedLinear>& parts, const std::vector<float>* limits) {
  using clk = std::chrono::steady_clock;
  const auto t_start = clk::now();
  std::string why;
  if (!gptq_supported(s, &why)) fail(Errc::usage, "", "quantization", "the CUDA GPTQ kernel does not serve this spec: " + why);
  g_times = {};
  auto& h = handles();
  const int64_t rows = E * rows_per;   // every problem's rows
  const int64_t gs = s.group_size > 0 ? s.group_size : n;
  const int maxq = s.maxq(), dt = dtype_code(s.scale_dtype);
  QuantizedLinear q = QuantizedLinear::empty(0, n, s);   // the grids of every row: [groups, rows]
  q.rows = rows;
  q.scales.assign(size_t(q.groups * rows), 0.0f);
  q.zeros.assign(size_t(q.groups * rows), 0);
  std::vector<const double*> hH;
  for (const HessianRef& H : Hs) hH.push_back(H.sum);
  DeviceBuffer<const double*> dHs(size_t(E), "Hessians (pointers)");
  PTQ_CUDA(cudaMemcpy(dHs.get(), hH.data(), size_t(E) * sizeof(double*), cudaMemcpyHostToDevice));

  // 1. dead columns
  DeviceBuffer<float> dW(size_t(rows * n), "GPTQ weights (dead columns zeroed)"), dWp(size_t(rows * n), "GPTQ weights (permuted)");
  copy_device(dW.get(), dW0, size_t(rows * n) * 4);
  DeviceBuffer<double> dDiag(size_t(E * n), "Hessian diagonal");
  diag_kernel<<<blocks_for(E * n), 256>>>(dHs.get(), n, E, dDiag.get());
  PTQ_CUDA_LAUNCH("diag_kernel");
  std::vector<double> diag(static_cast<size_t>(E * n));
  PTQ_CUDA(cudaMemcpy(diag.data(), dDiag.get(), size_t(E * n) * 8, cudaMemcpyDeviceToHost));
  zero_dead_kernel<<<blocks_for(E * n), 256>>>(dHs.get(), dW.get(), n, E, rows_per);
  PTQ_CUDA_LAUNCH("zero_dead_kernel");
  for (int e = 0; e < E; ++e)
    for (int64_t c = 0; c < n; ++c)
      if (double& d = diag[size_t(e * n + c)]; d == 0) { d = 1.0 / Hs[size_t(e)].scale; ++S[size_t(e)].dead_columns; }
  // 2. static groups, from the unpermuted weights (dead columns zeroed, as on the device)
  const bool static_groups = s.static_groups && s.group_size > 0;
  if (limits && !static_groups)
    fail(Errc::usage, "", "quantization.static_groups", "clipped grids (quantization.awq.clip) are fixed before the solve: they need static groups");
  if (limits && limits->size() != size_t(q.groups * rows)) fail(Errc::usage, "", "gptq_solve_cuda", "clipping limits: one a group and row");
  DeviceBuffer<float> dLimits(limits ? limits->size() : 1, "clipping limits");
  if (limits) copy_to_device(dLimits.get(), limits->data(), limits->size() * 4);
  const float* lim = limits ? dLimits.get() : nullptr;
  // llama.cpp's grids (form): static_grids' of the same weights, on the device
  const bool form = s.form != GridForm::integer_zero, with_min = has_min(s.form);
  DeviceBuffer<float> dStScale(static_groups ? size_t(q.groups * rows) : 1, "static scales");
  DeviceBuffer<int> dStZero(static_groups ? size_t(q.groups * rows) : 1, "static zeros");
  DeviceBuffer<float> dStMin(with_min ? size_t(q.groups * rows) : 1, "static mins");
  if (form) {
    form_grids_into(dW.get(), rows, n, s, limits, lim, q, dStScale.get(), dStZero.get(), with_min ? dStMin.get() : nullptr);
  } else if (static_groups) {
    if (gs > kB) fail(Errc::usage, "", "quantization.group_size", "static groups on the GPU take at most 128 columns per group");
    static_grid_kernel<<<blocks_for(q.groups * rows * 32, 256), 256>>>(dW.get(), rows, n, gs, q.groups, maxq, s.sym, s.mse, dt, lim, dStScale.get(),
                                                                       dStZero.get());
    PTQ_CUDA_LAUNCH("static_grid_kernel");
  }
  // 3. act-order: a stable sort of each problem's diagonal on the host, the gathers on the device
  std::vector<int> perm(static_cast<size_t>(E * n));
  for (int e = 0; e < E; ++e) {
    const auto p0 = perm.begin() + e * n;
    const double* d = diag.data() + e * n;
    std::iota(p0, p0 + n, 0);
    if (s.act_order) std::stable_sort(p0, p0 + n, [&](int a, int b) { return d[a] > d[b]; });
  }
  DeviceBuffer<int> dPerm(size_t(E * n), "act-order permutation");
  PTQ_CUDA(cudaMemcpy(dPerm.get(), perm.data(), size_t(E * n) * 4, cudaMemcpyHostToDevice));
  permute_w_kernel<<<blocks_for(rows * n), 256>>>(dW.get(), dPerm.get(), rows, n, rows_per, dWp.get());
  PTQ_CUDA_LAUNCH("permute_w_kernel");
  dW = DeviceBuffer<float>();
  // per-row grids (one group per row)
  DeviceBuffer<float> dRowScale(size_t(rows), "row scales");
  DeviceBuffer<int> dRowZero(size_t(rows), "row zeros");
  if (s.group_size <= 0) {
    row_grid_kernel<<<blocks_for(rows * 32, 256), 256>>>(dWp.get(), rows, n, maxq, s.sym, s.mse, dt, dRowScale.get(), dRowZero.get());
    PTQ_CUDA_LAUNCH("row_grid_kernel");
  }
  PTQ_CUDA(cudaDeviceSynchronize());
  g_times.prepare = secs(t_start);

  // 4-5. damping (retried with 10x more while a factorization fails), U = J L^-1 J, problem by
  // problem: each has its own damping and retries
  const auto t_fact = clk::now();
  std::vector<double> mean_diag(size_t(E), 0.0), damp(size_t(E), s.damp_percent);
  for (int e = 0; e < E; ++e) {
    for (int64_t c = 0; c < n; ++c) mean_diag[size_t(e)] += diag[size_t(e * n + c)];
    mean_diag[size_t(e)] = mean_diag[size_t(e)] / double(n) * Hs[size_t(e)].scale;
  }
  DeviceBuffer<int> dInfo(size_t(std::max(E, 2)), "cuSOLVER info");
  DeviceBuffer<double> dA(size_t(E * n * n), "Hessian (factorization)");
  DeviceBuffer<double> dInv(E > 1 ? size_t(E * n * n) : 0, "Hessian (batched inverse)");
  std::vector<const double*> linv(static_cast<size_t>(E));   // where each problem's L^-1 (lower, column-major) is
  auto damped = [&](int e) {   // the caller's H (shared by q/k/v) is read, never written
    double* A = dA.get() + e * n * n;
    const double hs = Hs[size_t(e)].scale;
    reversed_damped_kernel<<<blocks_for(n * n), 256>>>(hH[size_t(e)], dPerm.get() + e * n, n, hs, 1.0 / hs,
                                                       damp[size_t(e)] * mean_diag[size_t(e)], A);
    PTQ_CUDA_LAUNCH("reversed_damped_kernel");
    return A;
  };
  auto retry = [&](int e) {
    SolveStats& st = S[size_t(e)];
    st.log.push_back("Cholesky failed with damp_percent " + std::to_string(damp[size_t(e)]) + "; retrying with " + std::to_string(damp[size_t(e)] * 10));
    ++st.retries;
    damp[size_t(e)] *= 10;
    if (damp[size_t(e)] > 1e4) fail(Errc::numeric, "", "H", "Hessian is not positive definite even with damping 1e4 x mean(diag)");
  };
  DeviceBuffer<const double*> dLinv(size_t(E), "inverse Cholesky factors (pointers)");
  if (E == 1) {
    int lwork = 0;
    PTQ_CUSOLVER(cusolverDnDpotrf_bufferSize(h.solver, CUBLAS_FILL_MODE_LOWER, int(n), dA.get(), int(n), &lwork));
    DeviceBuffer<double> dWork(size_t(std::max(lwork, 1)), "cuSOLVER workspace");
    linv[0] = dA.get();
    PTQ_CUDA(cudaMemcpy(dLinv.get(), linv.data(), sizeof(double*), cudaMemcpyHostToDevice));
    for (;;) {
      damped(0);
      int info[2] = {0, 0};
      PTQ_CUDA(cudaMemset(dInfo.get(), 0, 8));
      auto tp = clk::now();
      PTQ_CUSOLVER(cusolverDnDpotrf(h.solver, CUBLAS_FILL_MODE_LOWER, int(n), dA.get(), int(n), dWork.get(), lwork, dInfo.get()));
      PTQ_CUDA(cudaMemcpy(info, dInfo.get(), 4, cudaMemcpyDeviceToHost));
      g_times.potrf += secs(tp);
      if (info[0] == 0) {
        tp = clk::now();
        // L^-1 in place (n^3 / 3 flops, no second n x n buffer)
        DeviceBuffer<double> work(size_t(kTri * kTri), "triangular inverse (diagonal block)");
        invert_lower_in_place(dA.get(), n, n, work.get());
        PTQ_CUDA(cudaDeviceSynchronize());
        g_times.trtri += secs(tp);
        check_linv_kernel<<<blocks_for(n * n), 256>>>(dLinv.get(), n, dInfo.get() + 1);
        PTQ_CUDA_LAUNCH("check_linv_kernel");
        PTQ_CUDA(cudaMemcpy(info, dInfo.get(), 8, cudaMemcpyDeviceToHost));
        if (info[0] == 0 && info[1] == 0) break;
      }
      retry(0);
    }
  } else {
    for (int e = 0; e < E; ++e) linv[size_t(e)] = dInv.get() + e * n * n;
    PTQ_CUDA(cudaMemcpy(dLinv.get(), linv.data(), size_t(E) * sizeof(double*), cudaMemcpyHostToDevice));
    std::vector<int> todo(static_cast<size_t>(E));
    std::iota(todo.begin(), todo.end(), 0);
    while (!todo.empty()) {
      std::vector<double*> A, Inv;
      for (int e : todo) { A.push_back(damped(e)); Inv.push_back(dInv.get() + e * n * n); }
      std::vector<int> info;
      invert_batched(A, Inv, n, info);
      PTQ_CUDA(cudaMemset(dInfo.get(), 0, size_t(E) * 4));
      check_linv_kernel<<<dim3(unsigned(blocks_for(n * n)), unsigned(E)), 256>>>(dLinv.get(), n, dInfo.get());
      PTQ_CUDA_LAUNCH("check_linv_kernel");
      std::vector<int> bad(static_cast<size_t>(E));
      PTQ_CUDA(cudaMemcpy(bad.data(), dInfo.get(), size_t(E) * 4, cudaMemcpyDeviceToHost));
      std::vector<int> again;
      for (size_t k = 0; k < todo.size(); ++k)
        if (info[k] != 0 || bad[size_t(todo[k])] != 0) { retry(todo[k]); again.push_back(todo[k]); }
      todo = std::move(again);
    }
    g_times.potrf = secs(t_fact);
  }
  for (int e = 0; e < E; ++e) S[size_t(e)].damp_percent = damp[size_t(e)];
  PTQ_CUDA(cudaDeviceSynchronize());
  g_times.factorization = secs(t_fact);

  // 6. blocks of 128 columns: the fused kernel, then the trailing update as one SGEMM (per problem)
  const auto t_loop = clk::now();
  const int mode = s.group_size <= 0 ? 0 : s.static_groups ? 1 : 2;
  std::vector<int> gidx_perm(static_cast<size_t>(E * n));
  for (int64_t c = 0; c < E * n; ++c) gidx_perm[size_t(c)] = int(perm[size_t(c)] / gs);
  DeviceBuffer<int> dGidx(size_t(E * n), "group of each permuted column");
  PTQ_CUDA(cudaMemcpy(dGidx.get(), gidx_perm.data(), size_t(E * n) * 4, cudaMemcpyHostToDevice));
  DeviceBuffer<float> dGrpScale(size_t(q.groups * rows), "group scales");
  DeviceBuffer<int> dGrpZero(size_t(q.groups * rows), "group zeros");
  DeviceBuffer<uint8_t> dCodes(size_t(rows * n), "codes");
  DeviceBuffer<float> dErr(size_t(rows * kB), "block errors");
  DeviceBuffer<double> dErr2(size_t(rows), "sum of err^2 per row");
  PTQ_CUDA(cudaMemset(dErr2.get(), 0, size_t(rows) * 8));
  const int smem = kB * kB * 4;
  PTQ_CUDA(cudaFuncSetAttribute(gptq_block_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const float minus_one = -1.0f, one = 1.0f;
  DeviceBuffer<float> dUb(size_t(E * kB * n), "inverse Cholesky factor U (one block of rows, fp32)");
  for (int64_t i1 = 0; i1 < n; i1 += kB) {
    const int count = int(std::min<int64_t>(kB, n - i1));
    u_rows_kernel<<<dim3(unsigned((n - i1 + 31) / 32), unsigned((count + 31) / 32), unsigned(E)), dim3(32, 8)>>>(dLinv.get(), n, i1, count, dUb.get());
    PTQ_CUDA_LAUNCH("u_rows_kernel");
    gptq_block_kernel<<<dim3(unsigned((rows_per + kWarps - 1) / kWarps), unsigned(E)), kWarps * 32, smem>>>(
        dWp.get(), dUb.get(), rows, rows_per, n, i1, count, mode, int(gs), maxq, s.sym, s.mse, dt, dRowScale.get(), dRowZero.get(),
        dStScale.get(), dStZero.get(), with_min ? dStMin.get() : nullptr, form, dGidx.get(), dGrpScale.get(), dGrpZero.get(), dCodes.get(), dErr.get(), dErr2.get());
    PTQ_CUDA_LAUNCH("gptq_block_kernel");
    const int64_t i2 = i1 + count;
    if (i2 >= n) continue;
    // W[:, i2:] -= Err1 U[i1:i2, i2:], in column-major terms on the row-major buffers
    if (E == 1)
      PTQ_CUBLAS(cublasSgemm(h.blas, CUBLAS_OP_N, CUBLAS_OP_N, int(n - i2), int(rows), count, &minus_one, dUb.get() + i2, int(n),
                             dErr.get(), kB, &one, dWp.get() + i2, int(n)));
    else
      PTQ_CUBLAS(cublasSgemmStridedBatched(h.blas, CUBLAS_OP_N, CUBLAS_OP_N, int(n - i2), int(rows_per), count, &minus_one, dUb.get() + i2,
                                           int(n), kB * n, dErr.get(), kB, rows_per * kB, &one, dWp.get() + i2, int(n), rows_per * n, E));
  }
  PTQ_CUDA(cudaDeviceSynchronize());
  g_times.column_loop = secs(t_loop);
  dA = DeviceBuffer<double>();   // before Wq and Wr: the peak holds the factor or them, not both
  dInv = DeviceBuffer<double>();
  dUb = DeviceBuffer<float>();

  // 7. back to the natural column order (codes, and Wq when asked), then to the host
  const auto t_dl = clk::now();
  std::vector<int32_t> g_idx(size_t(E * n));   // each problem's, natural order
  for (int64_t c = 0; c < E * n; ++c) g_idx[size_t(c)] = int32_t((c % n) / gs);
  if (mode == 2)
    for (int64_t c = 0; c < E * n; ++c) g_idx[size_t((c / n) * n + perm[size_t(c)])] = int32_t((c % n) / gs);
  const float* dScale = mode == 0 ? dRowScale.get() : mode == 1 ? dStScale.get() : dGrpScale.get();
  const int* dZero = mode == 0 ? dRowZero.get() : mode == 1 ? dStZero.get() : dGrpZero.get();
  DeviceBuffer<int> dGidxNat(size_t(E * n), "group of each column");
  PTQ_CUDA(cudaMemcpy(dGidxNat.get(), g_idx.data(), size_t(E * n) * 4, cudaMemcpyHostToDevice));
  DeviceBuffer<uint8_t> dCodesNat(size_t(rows * n), "codes (natural order)");
  float* dWq = nullptr;
  if (Wq_out) {
    *Wq_out = DeviceBuffer<float>(size_t(rows * n), "GPTQ dequantized weights");
    dWq = Wq_out->get();
  }
  unpermute_dequantize_kernel<<<blocks_for(rows * n), 256>>>(dCodes.get(), dPerm.get(), dGidxNat.get(), dScale, dZero,
                                                             with_min ? dStMin.get() : nullptr, form, rows, n, rows_per, dCodesNat.get(), dWq);
  PTQ_CUDA_LAUNCH("unpermute_dequantize_kernel");
  if (dl && dWq) {   // the damped loss per row, and what the damping added (see DampedLoss)
    DeviceBuffer<double> dE2(size_t(rows), "sum of e^2 per row");
    live_sq_error_kernel<<<blocks_for(rows * 32, 256), 256>>>(dW0, dWq, dDiag.get(), rows, n, rows_per, dE2.get());
    PTQ_CUDA_LAUNCH("live_sq_error_kernel");
    dl->err2.resize(size_t(rows));
    dl->e2.resize(size_t(rows));
    PTQ_CUDA(cudaMemcpy(dl->err2.data(), dErr2.get(), size_t(rows) * 8, cudaMemcpyDeviceToHost));
    PTQ_CUDA(cudaMemcpy(dl->e2.data(), dE2.get(), size_t(rows) * 8, cudaMemcpyDeviceToHost));
    dl->rows_per = rows_per;
    dl->lambda.clear();
    for (int e = 0; e < E; ++e) dl->lambda.push_back(damp[size_t(e)] * mean_diag[size_t(e)]);
  }
  PTQ_CUDA(cudaMemcpy(q.scales.data(), dScale, q.scales.size() * 4, cudaMemcpyDeviceToHost));
  PTQ_CUDA(cudaMemcpy(q.zeros.data(), dZero, q.zeros.size() * 4, cudaMemcpyDeviceToHost));
  // The codes packed on the device (QuantizedLinear's one representation), then each part's rows
  // straight into its own QuantizedLinear on the host.
  const auto t_pack = clk::now();
  const int64_t nw = packed_words(n, s.bits);
  DeviceBuffer<uint32_t> dWords(size_t(rows * nw), "packed codes");
  pack_rows_kernel<<<blocks_for(rows * nw), 256>>>(dCodesNat.get(), rows, n, s.bits, nw, dWords.get());
  PTQ_CUDA_LAUNCH("pack_rows_kernel");
  int64_t r0 = 0;
  for (int64_t pr : part_rows) {
    const int64_t e = r0 / rows_per;
    if (r0 + pr > (e + 1) * rows_per) fail(Errc::usage, "", "gptq_solve_cuda", "a part crosses two problems");
    QuantizedLinear pq = QuantizedLinear::empty(0, n, s);
    pq.rows = pr;
    pq.g_idx.assign(g_idx.begin() + e * n, g_idx.begin() + (e + 1) * n);
    auto part_rows_of = [&](const auto& v) {   // rows [r0, r0 + pr) of a grid vector [k, rows]
      std::decay_t<decltype(v)> out;
      for (int64_t k = 0; k < int64_t(v.size()) / rows; ++k) out.insert(out.end(), v.begin() + k * rows + r0, v.begin() + k * rows + r0 + pr);
      return out;
    };
    pq.scales = part_rows_of(q.scales);
    pq.zeros = part_rows_of(q.zeros);
    pq.mins = part_rows_of(q.mins);
    pq.super_d = part_rows_of(q.super_d);
    pq.super_dmin = part_rows_of(q.super_dmin);
    pq.packed.resize(size_t(pr * nw));
    copy_to_host_staged(pq.packed.data(), dWords.get() + r0 * nw, size_t(pr * nw) * 4);
    parts.push_back(std::move(pq));
    r0 += pr;
  }
  g_times.pack = secs(t_pack);
  // RTN, the report's baseline, from the weights as given (the CPU's rtn_quantize); allocated
  // last, so that the factorization's peak does not hold it
  if (Wr_out) {
    *Wr_out = DeviceBuffer<float>(size_t(rows * n), "RTN dequantized weights");
    float* dWr = Wr_out->get();
    DeviceBuffer<float> sc(size_t(q.groups * rows), "RTN scales"), mn(with_min ? size_t(q.groups * rows) : 1, "RTN mins");
    DeviceBuffer<int> ze(size_t(q.groups * rows), "RTN zeros");
    int64_t dead = 0;
    for (const SolveStats& st : S) dead += st.dead_columns;
    if (form && dead == 0) {   // the weights the static grids came from: the same grids
      copy_device(sc.get(), dStScale.get(), size_t(q.groups * rows) * 4);
      copy_device(ze.get(), dStZero.get(), size_t(q.groups * rows) * 4);
      if (with_min) copy_device(mn.get(), dStMin.get(), size_t(q.groups * rows) * 4);
    } else if (form) {
      QuantizedLinear rg;
      form_grids_into(dW0, rows, n, s, limits, lim, rg, sc.get(), ze.get(), with_min ? mn.get() : nullptr);
    } else {
      rtn_grids(dW0, rows, n, s, lim, sc.get(), ze.get());
    }
    rtn_dequantize_kernel<<<blocks_for(rows * n), 256>>>(dW0, rows, n, gs, sc.get(), ze.get(), with_min ? mn.get() : nullptr, form, maxq, dWr);
    PTQ_CUDA_LAUNCH("rtn_dequantize_kernel");
  }
  g_times.download = secs(t_dl) - g_times.pack;
  const double total = secs(t_start);
  for (SolveStats& st : S) st.seconds = total / double(E);
}

}  // namespace

void pack_rows_device(const uint8_t* codes, int64_t rows, int64_t n, int bits, uint32_t* words) {
  const int64_t nw = packed_words(n, bits);
  pack_rows_kernel<<<blocks_for(rows * nw), 256>>>(codes, rows, n, bits, nw, words);
  PTQ_CUDA_LAUNCH("pack_rows_kernel");
}

bool rtn_supported(const QuantSpec& s, std::string* why) {
  if (s.bits < 2 || s.bits > 8) { if (why) *why = "bits must be 2..8"; return false; }
  if (s.group_size > kB) { if (why) *why = "groups on the GPU take at most 128 columns"; return false; }
  if (s.group_size <= 0 && s.output_clip) { if (why) *why = "AWQ's clipping limits are per group"; return false; }
  return true;
}

ResidentRtn rtn_quantize_cuda(const float* W, int64_t rows, int64_t cols, const QuantSpec& s, const std::vector<float>* limits) {
  std::string why;
  if (!rtn_supported(s, &why)) fail(Errc::usage, "", "quantization", "RTN on the GPU does not serve this spec: " + why);
  ResidentRtn out;
  out.q = QuantizedLinear::empty(rows, cols, s);
  QuantizedLinear& q = out.q;
  if (limits && (s.group_size <= 0 || limits->size() != size_t(q.groups * rows)))
    fail(Errc::usage, "", "rtn_quantize_cuda", "clipping limits: one a group and row");
  if (rows == 0 || cols == 0) return out;
  const bool form = s.form != GridForm::integer_zero, with_min = has_min(s.form);
  DeviceBuffer<float> dLim(limits ? limits->size() : 1, "clipping limits"), sc(size_t(q.groups * rows), "RTN scales");
  DeviceBuffer<float> mn(with_min ? size_t(q.groups * rows) : 1, "RTN mins");
  DeviceBuffer<int> ze(size_t(q.groups * rows), "RTN zeros");
  if (limits) copy_to_device(dLim.get(), limits->data(), limits->size() * 4);
  if (form)   // llama.cpp's grids: the mins and super-block parameters go to q here
    form_grids_into(W, rows, cols, s, limits, limits ? dLim.get() : nullptr, q, sc.get(), ze.get(), with_min ? mn.get() : nullptr);
  else
    rtn_grids(W, rows, cols, s, limits ? dLim.get() : nullptr, sc.get(), ze.get());
  out.Wq = DeviceBuffer<float>(size_t(rows * cols), "RTN dequantized weights");
  DeviceBuffer<uint8_t> codes(size_t(rows * cols), "RTN codes");
  rtn_dequantize_kernel<<<blocks_for(rows * cols), 256>>>(W, rows, cols, s.group_size > 0 ? s.group_size : cols, sc.get(), ze.get(),
                                                          with_min ? mn.get() : nullptr, form, s.maxq(), out.Wq.get(), codes.get());
  PTQ_CUDA_LAUNCH("rtn_dequantize_kernel");
  const int64_t nw = packed_words(cols, s.bits);
  DeviceBuffer<uint32_t> words(size_t(rows * nw), "packed codes");
  pack_rows_device(codes.get(), rows, cols, s.bits, words.get());
  copy_to_host(q.scales.data(), sc.get(), q.scales.size() * 4);
  copy_to_host(q.zeros.data(), ze.get(), q.zeros.size() * 4);
  copy_to_host_staged(q.packed.data(), words.get(), q.packed.size() * 4);
  return out;
}

ResidentSolve gptq_solve_cuda(const std::vector<SolveProblem>& problems, int64_t cols, const QuantSpec& s, SolveKeep keep,
                              std::vector<SolveStats>* stats, const std::vector<float>* limits) {
  const int E = int(problems.size());
  std::vector<int64_t> part_rows;
  std::vector<HessianRef> Hs;
  int64_t rows_per = -1;
  for (const SolveProblem& p : problems) {
    int64_t r = 0;
    for (const WeightRows& w : p.parts) { r += w.rows; part_rows.push_back(w.rows); }
    if (rows_per >= 0 && r != rows_per) fail(Errc::usage, "", "gptq_solve_cuda", "the problems of a batch must have the same rows");
    rows_per = r;
    Hs.push_back(p.H);
  }
  ResidentSolve out;
  const int64_t rows = E * rows_per;
  out.W = DeviceBuffer<float>(size_t(rows * cols), "GPTQ weights (fp32)");
  int64_t r0 = 0;
  for (const SolveProblem& pr : problems)
    for (const WeightRows& p : pr.parts) {
      float* dst = out.W.get() + r0 * cols;
      if (p.host) {
        if (p.host->rows() != p.rows || p.host->cols() != cols) fail(Errc::usage, "", "gptq_solve_cuda", "weight shape mismatch");
        copy_to_device_staged(dst, p.host->data(), size_t(p.host->size()) * 4);
      } else {   // 16-bit or fp32 device rows, widened exactly
        widen_to_f32_kernel<<<blocks_for(p.rows * cols), 256>>>(p.device, dtype_code(p.dtype), p.rows * cols, dst);
        PTQ_CUDA_LAUNCH("widen_to_f32_kernel");
      }
      r0 += p.rows;
    }
  std::vector<SolveStats> local(static_cast<size_t>(E));
  std::vector<SolveStats>& S = stats ? *stats : local;
  S.assign(size_t(E), SolveStats());
  if (keep == SolveKeep::codes) {   // codes and grids to the host, nothing kept on the device
    solve(out.W.get(), E, rows_per, cols, Hs, s, S, nullptr, nullptr, nullptr, part_rows, out.parts, limits);
    out.W = DeviceBuffer<float>();
    return out;
  }
  solve(out.W.get(), E, rows_per, cols, Hs, s, S, &out.Wq, keep == SolveKeep::weights_and_rtn ? &out.Wr : nullptr, &out.damped, part_rows,
        out.parts, limits);
  return out;
}

ResidentSolve gptq_solve_cuda(const std::vector<WeightRows>& parts, int64_t cols, HessianRef H, const QuantSpec& s, SolveKeep keep,
                              SolveStats* st, const std::vector<float>* limits) {
  std::vector<SolveStats> S;
  ResidentSolve out = gptq_solve_cuda({SolveProblem{parts, H}}, cols, s, keep, &S, limits);
  if (st) *st = std::move(S[0]);
  return out;
}

}  // namespace ptq::cuda
