// testing_gptq.h — the random GPTQ problems the CPU and GPU solve tests share: correlated inputs X
// with unequal column scales (a few large, like activation outliers), weights W, and H from X.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "core/rng.h"
#include "gptq/hessian.h"

namespace ptqtest {

struct Problem {
  ptq::MatF W, X;
  ptq::MatD H;
};
struct ProblemShape {
  int outlier_every = 17, outlier_at = 3;   // column c is an outlier where c % every == at
  double outlier_scale = 8.0;               // its scale; the others 0.5 + U(0, 1)
  bool f16_inputs = false;                  // X rounded to f16 (the GPU forward's activations)
  bool dead_column = false;                 // column 5 of X all zero
};
inline Problem correlated_problem(int rows, int cols, int tokens, uint64_t seed, const ProblemShape& sh = {}) {
  using ptq::MatF;
  ptq::Rng r(seed);
  MatF Z(tokens, cols), A(cols, cols);
  for (int i = 0; i < Z.size(); ++i) Z.data()[i] = float(r.normal());
  for (int i = 0; i < A.size(); ++i) A.data()[i] = float(r.normal() / std::sqrt(double(cols)));
  A.diagonal().array() += 1.0f;
  MatF X = Z * A;
  for (int c = 0; c < cols; ++c) X.col(c) *= float(c % sh.outlier_every == sh.outlier_at ? sh.outlier_scale : 0.5 + r.uniform());
  if (sh.dead_column) X.col(5).setZero();
  if (sh.f16_inputs)
    for (int i = 0; i < X.size(); ++i) X.data()[i] = ptq::round_to(ptq::DType::F16, X.data()[i]);
  MatF W(rows, cols);
  for (int i = 0; i < W.size(); ++i) W.data()[i] = float(r.normal() * 0.05);
  ptq::Hessian h(cols);
  h.add(X);
  return {W, X, h.finalize()};
}

}  // namespace ptqtest
