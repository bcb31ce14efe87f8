// product.h — dst = a · b with the same bytes on any thread count and any cache size (for one build:
// another instruction set changes Eigen's reductions elsewhere, e.g. a norm's sum of squares).
//
// Eigen's GEMM adds the products of an output in blocks of kc columns of K, each block's sum
// formed from zero in the micro-kernel and then added to the output. kc comes from heuristics that
// read the L1 size and whether the product runs on one thread or several: on distilled-13m one
// thread and two gave different bytes, and a 48 KB L1 gives another kc than a 32 KB one. Here K
// is cut into chunks of kDepth = 256 columns, fewer than any kc those heuristics give for fp32 with
// a 32 KB L1 or larger (288 there, more with a larger L1), so Eigen never cuts a chunk: each
// output's chunk sums run in the micro-kernel's fixed order and the chunks are added in order.
// How the rows and columns are shared among threads does not change any output's arithmetic.
// Costs nothing measurable: Eigen cut K at 288 anyway.
#pragma once
#include <Eigen/Core>
#include <algorithm>

namespace ptq {

constexpr Eigen::Index kDepth = 256;

// dst (an expression that can be assigned, e.g. a block) = a · b, with a.cols() == b.rows().
template <class A, class B, class D>
void fixed_depth_product(const A& a, const B& b, D&& dst) {
  const Eigen::Index K = a.cols();
  if (K <= kDepth) {
    dst.noalias() = a * b;
    return;
  }
  dst.noalias() = a.leftCols(kDepth) * b.topRows(kDepth);
  for (Eigen::Index k0 = kDepth; k0 < K; k0 += kDepth) {
    const Eigen::Index kn = std::min(kDepth, K - k0);
    dst.noalias() += a.middleCols(k0, kn) * b.middleRows(k0, kn);
  }
}

}  // namespace ptq
