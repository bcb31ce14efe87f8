#include "gptq/gptq.h"

#include <Eigen/Cholesky>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/fsutil.h"
#include "gptq/tasks.h"

namespace ptq {

double output_error(const MatF& W, const MatF& Wq, const MatD& H) {
  const MatD dW = (W - Wq).cast<double>();
  return (dW * H).cwiseProduct(dW).sum() / 2.0;
}

namespace {
// tr(D H Dᵀ) / 2 by D's Gram matrix, lower tiles only (output_error_gram's contract), D in Scalar.
template <class Scalar, class Dm>
double gram_form(const Dm& D, const MatD& H) {
  // the Hessian's chunks (hessian.cpp); tiles of 256: here (K = 1,024 rows a product) 25% faster
  // than 128 on two cores, and n = 4096 still makes 136 of them
  constexpr Eigen::Index kTile = 256, kChunk = 1024;
  const Eigen::Index rows = D.rows(), n = D.cols(), T = (n + kTile - 1) / kTile;
  std::vector<double> tile_sum(size_t(lower_tiles(T)));
  over_threads(lower_tiles(T), [&](int64_t t) {
    const auto [I, J] = lower_tile(t);
    const Eigen::Index i0 = I * kTile, j0 = J * kTile, h = std::min(kTile, n - i0), w = std::min(kTile, n - j0);
    Eigen::MatrixXd G = Eigen::MatrixXd::Zero(h, w);
    Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic> g(h, w);
    for (Eigen::Index r0 = 0; r0 < rows; r0 += kChunk) {
      const auto Dc = D.middleRows(r0, std::min(kChunk, rows - r0));
      g.noalias() = Dc.middleCols(i0, h).transpose() * Dc.middleCols(j0, w);
      G += g.template cast<double>();
    }
    // a diagonal tile is whole (its lower and upper halves); an off-diagonal one stands for two
    tile_sum[size_t(t)] = (I == J ? 1.0 : 2.0) * G.cwiseProduct(H.block(i0, j0, h, w)).sum();
  });
  double s = 0;
  for (double v : tile_sum) s += v;
  return s / 2.0;
}
}  // namespace

template <class Scalar>
double output_error_gram(const MatF& W, const MatF& Wq, const MatD& H) {
  using Mat = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Mat D = (W - Wq).template cast<Scalar>();       // the difference in fp32, as output_error's
  return gram_form<Scalar>(D, H);
}
double delta_error_gram(const MatF& dW, const MatD& H) { return gram_form<float>(dW, H); }
template double output_error_gram<float>(const MatF&, const MatF&, const MatD&);
template double output_error_gram<double>(const MatF&, const MatF&, const MatD&);

double damped_output_error(double err2, double live_dw2, double lambda) {
  if (!(lambda * live_dw2 <= 0.9 * err2)) return std::nan("");
  return (err2 - lambda * live_dw2) / 2.0;
}

std::pair<double, double> host_output_errors(const MatF& W, const MatF& Wq, const MatF* Wr, const MatD& H, bool gptq, const SolveStats& st) {
  double loss = std::nan("");
  if (gptq && !std::isnan(st.err2)) {
    // ‖ΔW‖² over the live columns (H_jj != 0) in fp64: each column's sum down its rows in row
    // order (the order of a column's squaredNorm, so the same bits as before), then the columns
    // in order. Rows outer, so that the row-major matrices are read as they lie: 0.014 s for
    // 4096 x 11008 on the 2-core host, against 0.44 s column by column.
    std::vector<double> col(size_t(W.cols()), 0.0);
    for (Eigen::Index i = 0; i < W.rows(); ++i) {
      const float* w = W.row(i).data();
      const float* q = Wq.row(i).data();
      for (Eigen::Index j = 0; j < W.cols(); ++j) {
        const double d = double(w[j] - q[j]);
        col[size_t(j)] += d * d;
      }
    }
    double live_dw2 = 0;
    for (Eigen::Index j = 0; j < W.cols(); ++j)
      if (H(j, j) != 0) live_dw2 += col[size_t(j)];
    loss = damped_output_error(st.err2, live_dw2, st.lambda);
  }
  if (std::isnan(loss)) loss = gptq ? output_error_gram<double>(W, Wq, H) : output_error_gram<float>(W, Wq, H);
  return {loss, Wr ? output_error_gram<float>(W, *Wr, H) : loss};
}

// A right-looking blocked Cholesky in fp64, blocks of kLltBlock: each step factors its diagonal
// block (Eigen's LLT), solves the panel below it (rows split over the threads) and subtracts the
// panel's product from the trailing lower triangle in tiles of kLltBlock x kLltBlock, a thread a
// tile (Eigen's one LLT of the whole matrix ran on one core). Every block's and tile's arithmetic
// is fixed: the same bytes on any thread count. False where a diagonal block is not positive
// definite (H is not).
namespace {
// m resized to rows x cols, its elements unset: the solve's cols^2 matrices are fresh memory, asked
// for in huge pages (advise_huge_pages) before their first touch.
template <class M>
void resize_fresh(M& m, int64_t rows, int64_t cols) {
  m.resize(rows, cols);
  advise_huge_pages(m.data(), sizeof(typename M::Scalar) * size_t(m.size()));
}

constexpr int64_t kLltBlock = 128;
bool blocked_cholesky(Eigen::Map<Eigen::MatrixXd> A) {   // A <- L in its lower triangle
  const int64_t n = A.rows();
  for (int64_t k0 = 0; k0 < n; k0 += kLltBlock) {
    const int64_t b = std::min(kLltBlock, n - k0), m = n - k0 - b;
    Eigen::LLT<Eigen::MatrixXd> llt(A.block(k0, k0, b, b));
    if (llt.info() != Eigen::Success) return false;
    A.block(k0, k0, b, b).triangularView<Eigen::Lower>() = llt.matrixL();
    if (m == 0) break;
    const int64_t panels = (m + kLltBlock - 1) / kLltBlock;
    over_threads(panels, [&](int64_t p) {   // A21 <- A21 L11^-T, rows in blocks
      const int64_t r0 = k0 + b + p * kLltBlock, h = std::min(kLltBlock, n - r0);
      Eigen::MatrixXd P = A.block(r0, k0, h, b);
      A.block(k0, k0, b, b).triangularView<Eigen::Lower>().transpose().solveInPlace<Eigen::OnTheRight>(P);
      A.block(r0, k0, h, b) = P;
    });
    over_threads(lower_tiles(panels), [&](int64_t t) {   // A22 -= A21 A21^T, its lower tiles
      const auto [I, J] = lower_tile(t);
      const int64_t i0 = k0 + b + I * kLltBlock, j0 = k0 + b + J * kLltBlock;
      const int64_t h = std::min(kLltBlock, n - i0), w = std::min(kLltBlock, n - j0);
      Eigen::MatrixXd G(h, w);
      G.noalias() = A.block(i0, k0, h, b) * A.block(j0, k0, w, b).transpose();
      if (I == J) A.block(i0, j0, h, w).triangularView<Eigen::Lower>() -= G;
      else A.block(i0, j0, h, w) -= G;
    });
  }
  return true;
}

// One factorization of the reversed matrix: J H J = L L^T  =>  H^-1 = (J L^-T J)(J L^-1 J), so
// U = J L^-1 J. In H's own storage: the row-major H read backwards is J H^T J column-major, which
// is J H J, so reversing the buffer in place gives the matrix to factor with no copy (its lower
// triangle, which the factorization reads, is H's lower triangle). L^-1 in column blocks of
// kInvBlock, a thread a block: columns c0.. of L^-1 are zero above row c0 and solve the trailing
// triangle, L[c0:, c0:] X = I[:, 0:b] (a sixth of n^3 multiply-adds in all, where one serial solve
// against the whole identity took half); each block writes its band of U's columns, reversed and
// in U's precision, zeros included, so U needs no other pass. Each block's arithmetic is fixed, so
// the bytes are the same on any thread count. On an 11008-column H this removed four 1 GB passes
// (a reversed copy, L^-1 zeroed, U reversed, U narrowed) that took 16.3 of 28.5 s on two cores.
template <class Scalar>
bool inverse_cholesky_upper_in_place(MatD&& H, Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>& U) {
  constexpr int64_t kInvBlock = 64;
  const int64_t n = H.rows(), n2 = n * n;
  double* h = H.data();
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < n2 / 2; ++k) std::swap(h[k], h[n2 - 1 - k]);
  Eigen::Map<Eigen::MatrixXd> L(h, n, n);
  if (!blocked_cholesky(L)) return false;
  resize_fresh(U, n, n);
  const int64_t blocks = (n + kInvBlock - 1) / kInvBlock;
  over_threads(blocks, [&](int64_t k) {   // the longest first (block 0: all n rows)
    const int64_t c0 = k * kInvBlock, b = std::min(kInvBlock, n - c0), m = n - c0;
    Eigen::MatrixXd X = Eigen::MatrixXd::Identity(m, b);
    L.bottomRightCorner(m, m).triangularView<Eigen::Lower>().solveInPlace(X);
    // L^-1(c0 + r, c0 + c) = X(r, c); U(i, j) = L^-1(n - 1 - i, n - 1 - j): the block gives U's
    // columns j0 = n - c0 - b .. n - c0 - 1, rows i < m from X, rows from m on zero
    const int64_t j0 = n - c0 - b;
    for (int64_t i = 0; i < n; ++i) {
      Scalar* u = &U(i, j0);
      for (int64_t c = 0; c < b; ++c) u[c] = i < m ? Scalar(X(m - 1 - i, b - 1 - c)) : Scalar(0);
    }
  });
  return U.allFinite() && (U.diagonal().array() > 0).all();
}
}  // namespace

bool inverse_cholesky_upper(const MatD& H, MatD& U) { return inverse_cholesky_upper_in_place(MatD(H), U); }

namespace {
// H_cc, or 1 for a dead column (H_cc == 0): the diagonal the solve orders and damps by.
double live_diag(const MatD& H, const std::vector<char>& dead, int64_t c) { return dead[size_t(c)] ? 1.0 : H(c, c); }
}  // namespace

GptqProblem gptq_prepare(const MatF& W0, const MatD& H0, const QuantSpec& s, SolveStats& S, const std::vector<float>* limits) {
  const int64_t rows = W0.rows(), cols = W0.cols();
  if (H0.rows() != cols || H0.cols() != cols) fail(Errc::numeric, "", "H", "Hessian size does not match the weight's columns");
  if (!H0.allFinite()) fail(Errc::numeric, "", "H", "Hessian has NaN/Inf entries (inputs overflowed?)");
  GptqProblem P;
  P.W = W0;
  MatF& W = P.W;

  // 1. dead columns: their H_ii becomes 1 (damped_permuted_hessian)
  std::vector<char>& dead = P.dead;
  dead.assign(size_t(cols), 0);
  for (int64_t i = 0; i < cols; ++i)
    if (H0(i, i) == 0) { dead[size_t(i)] = 1; W.col(i).setZero(); ++S.dead_columns; }

  const int64_t gs = s.group_size > 0 ? s.group_size : cols;
  P.gs = gs;
  P.q = QuantizedLinear::empty(rows, cols, s);   // g_idx is rewritten below for permuted groups
  QuantizedLinear& q = P.q;

  // 2. static groups: parameters from the unpermuted weights (K forms: their super-blocks rounded)
  if (groups_per_super(s.form) && !(s.static_groups && s.group_size > 0))
    fail(Errc::usage, "", "quantization.static_groups", std::string(grid_form_name(s.form)) + " grids are static: their super-blocks are rounded before the solve");
  if (limits && !(s.static_groups && s.group_size > 0))
    fail(Errc::usage, "", "quantization.static_groups", "clipped grids (quantization.awq.clip) are fixed before the solve: they need static groups");
  if (s.static_groups && s.group_size > 0) P.static_params = static_grids(W, q, limits);   // (q's scales in natural order: g_idx is c / group)

  // 3. act-order permutation (stable: ties keep their natural order, so runs are deterministic)
  P.perm.resize(size_t(cols));
  std::iota(P.perm.begin(), P.perm.end(), 0);
  if (s.act_order) {
    std::stable_sort(P.perm.begin(), P.perm.end(), [&](int64_t a, int64_t b) { return live_diag(H0, dead, a) > live_diag(H0, dead, b); });
    MatF Wp(rows, cols);
    for (int64_t j = 0; j < cols; ++j) Wp.col(j) = W.col(P.perm[size_t(j)]);
    W.swap(Wp);
  }
  if (s.group_size <= 0) {   // one group per row: parameters from the whole (permuted) row
    P.row_params.resize(size_t(rows));
    for (int64_t r = 0; r < rows; ++r) {
      P.row_params[size_t(r)] = find_grid(&W(r, 0), cols, 1, s);
      q.scales[size_t(r)] = P.row_params[size_t(r)].scale;
      q.zeros[size_t(r)] = P.row_params[size_t(r)].zero;
      if (!q.mins.empty()) q.mins[size_t(r)] = P.row_params[size_t(r)].min;
    }
  }
  return P;
}

double permuted_mean_diag(const MatD& H, const GptqProblem& P) {
  const int64_t n = H.rows();
  double sum = live_diag(H, P.dead, P.perm[0]);   // one by one from the first, the order of Eigen's diagonal().sum(): the bits the permuted copy's mean had
  for (int64_t i = 1; i < n; ++i) sum += live_diag(H, P.dead, P.perm[size_t(i)]);
  return sum / double(n);
}

void damped_permuted_hessian(const MatD& H, const GptqProblem& P, double lambda, MatD& Hd) {
  const int64_t n = H.rows();
  resize_fresh(Hd, n, n);
  const std::vector<int64_t>& perm = P.perm;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {   // (P H P^T)(i, j) = H(p_i, p_j), rows over the threads
    const double* h = &H(perm[size_t(i)], 0);
    double* out = &Hd(i, 0);
    for (int64_t j = 0; j < n; ++j) out[j] = h[perm[size_t(j)]];
  }
  for (int64_t i = 0; i < n; ++i) {
    if (P.dead[size_t(perm[size_t(i)])]) Hd(i, i) = 1;
    Hd(i, i) += lambda;
  }
}

QuantizedLinear gptq_quantize(const MatF& W0, const MatD& H0, const QuantSpec& s, SolveStats* st, const std::vector<float>* limits) {
  const auto t_start = std::chrono::steady_clock::now();
  SolveStats local;
  SolveStats& S = st ? *st : local;
  GptqProblem P = gptq_prepare(W0, H0, s, S, limits);
  MatF& W = P.W;
  QuantizedLinear& q = P.q;
  const std::vector<int64_t>& perm = P.perm;
  const int64_t rows = q.rows, cols = q.cols, gs = P.gs;
  const int maxq = s.maxq();

  // 4-5. damping, retried with 10x more until the factorization succeeds
  const double mean_diag = permuted_mean_diag(H0, P);
  double damp = s.damp_percent;
  MatF U;
  for (;;) {
    MatD Hd;
    damped_permuted_hessian(H0, P, damp * mean_diag, Hd);
    if (inverse_cholesky_upper_in_place(std::move(Hd), U)) break;   // U in fp32, as the loop uses it
    S.log.push_back("Cholesky failed with damp_percent " + std::to_string(damp) + "; retrying with " + std::to_string(damp * 10));
    ++S.retries;
    damp *= 10;
    if (damp > 1e4) fail(Errc::numeric, "", "H", "Hessian is not positive definite even with damping 1e4 x mean(diag)");
  }
  S.damp_percent = damp;
  S.lambda = damp * mean_diag;
  std::vector<double> err2(size_t(rows), 0.0);   // per row (a row is one thread's), summed in order after

  // 6. blocks of block_size columns
  std::vector<GridParams> params = P.row_params;   // the current group's, per row
  params.resize(size_t(rows));
  auto set_group_params = [&](int64_t g) {
    for (int64_t r = 0; r < rows; ++r) {
      q.scales[size_t(g * rows + r)] = params[size_t(r)].scale;
      q.zeros[size_t(g * rows + r)] = params[size_t(r)].zero;
      if (!q.mins.empty()) q.mins[size_t(g * rows + r)] = params[size_t(r)].min;
    }
  };
  const int64_t B = std::max(1, s.block_size);
  std::vector<uint8_t> codes(size_t(rows * cols));   // one byte each while the loop writes them, packed after
  MatF W1, Err1, Gcur;
  for (int64_t i1 = 0; i1 < cols; i1 += B) {
    const int64_t i2 = std::min(i1 + B, cols), count = i2 - i1;
    W1 = W.middleCols(i1, count);
    Err1.setZero(rows, count);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t col = i1 + i;
      if (s.group_size > 0) {
        if (s.static_groups) {
          const int64_t g = perm[size_t(col)] / gs;
          for (int64_t r = 0; r < rows; ++r) params[size_t(r)] = P.static_params[size_t(g * rows + r)];
        } else {
          const int64_t g = col / gs;
          if (col % gs == 0) {
            // The group's current weights: in-block columns from W1 (already updated by the
            // columns before them); columns past the block get this block's pending update now
            // (the reference's quirk takes stale values for both).
            const int64_t n = std::min(gs, cols - col), in_block = std::min(n, count - i);
            Gcur.resize(rows, n);
            Gcur.leftCols(in_block) = W1.middleCols(i, in_block);
            if (n > in_block) {
              Gcur.rightCols(n - in_block) = W.middleCols(i2, n - in_block);
              if (i > 0) Gcur.rightCols(n - in_block).noalias() -= Err1.leftCols(i) * U.block(i1, i2, i, n - in_block);
            }
#pragma omp parallel for schedule(static)
            for (int64_t r = 0; r < rows; ++r) params[size_t(r)] = find_grid(&Gcur(r, 0), n, 1, s);
            set_group_params(g);
          }
          q.g_idx[size_t(perm[size_t(col)])] = int32_t(g);
        }
      }
      const float d = U(col, col);
      const int64_t pc = perm[size_t(col)];
      const bool live = !P.dead[size_t(pc)];
#pragma omp parallel for schedule(static) if (rows * (count - i) > 65536)
      for (int64_t r = 0; r < rows; ++r) {
        const float w = W1(r, i);
        const int32_t code = quantize_code(w, params[size_t(r)], maxq);
        codes[size_t(r * cols + pc)] = uint8_t(code);
        const float err = (w - dequantize_code(code, params[size_t(r)])) / d;
        Err1(r, i) = err;
        if (live) err2[size_t(r)] += double(err) * err;
        float* w1 = &W1(r, 0);
        const float* u = &U(col, i1);
        for (int64_t j = i + 1; j < count; ++j) w1[j] -= err * u[j];
      }
    }
    if (i2 < cols) W.rightCols(cols - i2).noalias() -= Err1 * U.block(i1, i2, count, cols - i2);
  }
  q.set_codes(codes.data());
  S.err2 = 0;
  for (double e : err2) S.err2 += e;
  S.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return std::move(q);
}

}  // namespace ptq
