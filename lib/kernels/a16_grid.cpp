// a16_grid.cpp — the rule of a16_grid.h.
#include "kernels/a16_grid.h"

#include <cmath>
#include <vector>

namespace ptq {

bool a16_takes(const QuantizedLinear& q, A16Refusal* why) {
  auto refuse = [why](const std::string& field, const std::string& reason) {
    if (why) *why = {field, reason};
    return false;
  };
  const int bits = q.spec.bits;
  const int64_t N = q.rows, K = q.cols, G = q.groups;
  if (bits < 1 || bits > 8) return refuse("bits", "the A16 kernels take 1- to 8-bit weights, got " + std::to_string(bits));
  if (K % 16) return refuse("in_features", "must be a multiple of 16, got " + std::to_string(K));
  if (G < 1 || K % G || (G > 1 && (K / G) % 16))
    return refuse("group_size", "groups must hold a multiple of 16 columns each, equally (" + std::to_string(G) + " groups over " + std::to_string(K) + " columns)");
  if (q.g_idx.size() != size_t(K)) return refuse("g_idx", "want one group index a column");
  std::vector<int64_t> count(size_t(G), 0);
  for (int32_t g : q.g_idx) {
    if (g < 0 || g >= G) return refuse("g_idx", "group index " + std::to_string(g) + " outside [0, " + std::to_string(G) + ")");
    ++count[size_t(g)];
  }
  for (int64_t n : count)
    if (n != K / G) return refuse("g_idx", "groups of unequal sizes are not served by the A16 kernels");
  const size_t grids = size_t(G * N);
  const bool min = has_min(q.spec.form);
  if (q.scales.size() != grids) return refuse("scales", "want a scale per group and row");
  if (min && (G < 2 || q.mins.size() != grids)) return refuse("mins", "a grid with mins needs groups of columns and a min per group and row");
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
