// core/parallel.h: parallel_for runs every index once, and of the indices that throw it rethrows the
// lowest one's exception, the one a serial loop would have met first, whatever the thread count.
#include <omp.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "testing.h"

using namespace ptq;

TEST_CASE("parallel_for: every index once, and the lowest index's exception rethrown") {
  const int64_t n = 10000;
  const int was = omp_get_max_threads();
  for (int threads : {1, 2, 7}) {
    INFO(threads << " threads");
    omp_set_num_threads(threads);
    std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
    parallel_for(n, [&](int64_t i) { seen[size_t(i)]++; });
    for (int64_t i = 0; i < n; ++i) REQUIRE(seen[size_t(i)] == 1);
    // Indices 9001, 4242 and 8000 throw: the serial loop's first is 4242.
    try {
      parallel_for(n, [&](int64_t i) {
        if (i == 9001 || i == 4242 || i == 8000) throw std::runtime_error("index " + std::to_string(i));
      });
      FAIL("no exception");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "index 4242");
    }
  }
  omp_set_num_threads(was);
}
