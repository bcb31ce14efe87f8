// tasks.h — the CPU's dense fp work split into fixed tasks over the OpenMP threads (the Hessian's
// tiles, the solve's blocked factorization and inverse). A task's arithmetic does not depend on
// which thread runs it nor on how many there are, so neither do the bytes it writes.
#pragma once
#include <omp.h>

#include <cstdint>

namespace ptq {

// f(0) .. f(tasks - 1) on the threads (dynamic: the tasks differ in size), or in turn where the
// caller is already inside a team. Eigen does not parallelize a GEMM inside a team of threads,
// so the GEMMs within f run serially either way.
template <class F>
void over_threads(int64_t tasks, F&& f) {
  if (omp_in_parallel()) {
    for (int64_t t = 0; t < tasks; ++t) f(t);
  } else {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) f(t);
  }
}

// The tiles of a lower triangle of T x T tiles, numbered row by row: t = I (I + 1) / 2 + J, J <= I.
struct LowerTile {
  int64_t I, J;
};
inline int64_t lower_tiles(int64_t T) { return T * (T + 1) / 2; }
inline LowerTile lower_tile(int64_t t) {
  int64_t I = 0;
  while ((I + 1) * (I + 2) / 2 <= t) ++I;
  return {I, t - I * (I + 1) / 2};
}

}  // namespace ptq
