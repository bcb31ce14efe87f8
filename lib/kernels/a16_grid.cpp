// a16_grid.cpp — the rule of a16_grid.h.
#include "kernels/a16_grid.h"

#include <cmath>
#include <numeric>
#include <vector>

namespace ptq {

namespace {
// Columns per group (g_idx in range and one a column; else empty).
std::vector<int64_t> group_sizes(const QuantizedLinear& q) {
  if (q.groups < 1 || q.g_idx.size() != size_t(q.cols)) return {};
  std::vector<int64_t> count(size_t(q.groups), 0);
  for (int32_t g : q.g_idx) {
    if (g < 0 || g >= q.groups) return {};
    ++count[size_t(g)];
  }
  return count;
}
}  // namespace

int64_t a16_group_columns(const QuantizedLinear& q) {
  const std::vector<int64_t> count = group_sizes(q);
  int64_t d = 0;
  for (int64_t n : count) d = std::gcd(d, n);   // groups without columns add nothing
  if (d == 0) return 0;
  if (has_min(q.spec.form) && d == q.cols) {   // two runs or more (s q + m is scaled per group in f16): the widest
    for (int64_t p = 2; p <= q.cols / 16; ++p)
      if (q.cols % p == 0 && (q.cols / p) % 16 == 0) return q.cols / p;
    return 0;
  }
  if (d == q.cols) return d;
  return d % 16 == 0 ? d : 0;
}

bool a16_takes(const QuantizedLinear& q, A16Refusal* why) {
  auto refuse = [why](const std::string& field, const std::string& reason) {
    if (why) *why = {field, reason};
    return false;
  };
  const int bits = q.spec.bits;
  const int64_t N = q.rows, K = q.cols, G = q.groups;
  if (bits < 1 || bits > 8) return refuse("bits", "the A16 kernels take 1- to 8-bit weights, got " + std::to_string(bits));
  if (K % 16) return refuse("in_features", "must be a multiple of 16, got " + std::to_string(K));
  const std::vector<int64_t> count = group_sizes(q);
  if (count.empty()) return refuse("g_idx", "want one group index in [0, " + std::to_string(G) + ") a column");
  const bool min = has_min(q.spec.form);
  if (a16_group_columns(q) == 0) {
    if (min && G == 1) return refuse("mins", "a grid with mins in one group needs two runs of 16 columns or more");
    std::string sizes;
    for (size_t g = 0; g < count.size() && g < 4; ++g) sizes += (g ? ", " : "") + std::to_string(count[g]);
    return refuse("group_size", "groups of " + sizes + (count.size() > 4 ? ", ..." : "") +
                                    " columns: the kernels take groups whose sizes share a divisor that is a multiple of 16");
  }
  const size_t grids = size_t(G * N);
  if (q.scales.size() != grids) return refuse("scales", "want a scale per group and row");
  if (min && q.mins.size() != grids) return refuse("mins", "want a min per group and row");
  if (!min && q.zeros.size() != grids) return refuse("zeros", "want a zero point per group and row");
  auto f16 = [](float x) { return std::abs(x) <= 65504.0f; };   // false for NaN
  for (float s : q.scales)
    if (!f16(s)) return refuse("scales", "a scale outside f16's range (" + std::to_string(s) + ")");
  for (float m : q.mins)
    if (!f16(m)) return refuse("mins", "a min outside f16's range (" + std::to_string(m) + ")");
  if (!min)
    for (int32_t z : q.zeros)
      if (z < -1024 || z > 1024) return refuse("zeros", "a zero point outside [-1024, 1024] (" + std::to_string(z) + ")");
  return true;
}

}  // namespace ptq
