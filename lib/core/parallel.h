// parallel.h — a loop over independent items on the OpenMP threads that may throw. An exception
// cannot leave an OpenMP region, so each item's is caught, and the one of the lowest index (the
// one a serial loop would have met first) is rethrown after the loop: the error a run reports does
// not depend on the thread count. Each f(i) must write only its own outputs.
#pragma once
#include <cstdint>
#include <exception>

namespace ptq {

template <class F>
void parallel_for(int64_t n, F&& f) {
  int64_t first = n;
  std::exception_ptr error;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    try {
      f(i);
    } catch (...) {
#pragma omp critical(ptq_parallel_for)
      if (i < first) first = i, error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace ptq
