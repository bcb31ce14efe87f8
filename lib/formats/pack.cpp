#include "formats/pack.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace ptq {


const std::array<float, 16> kNf4Code = {-1.0f,
                                         -0.6961928009986877f,
                                         -0.5250730514526367f,
                                         -0.39491748809814453f,
                                         -0.28444138169288635f,
                                         -0.18477343022823334f,
                                         -0.09105003625154495f,
                                         0.0f,
                                         0.07958029955625534f,
                                         0.16093020141124725f,
                                         0.24611230194568634f,
                                         0.33791524171829224f,
                                         0.44070982933044434f,
                                         0.5626170039176941f,
                                         0.7229568362236023f,
                                         1.0f};

uint8_t nf4_index(float x) {
  uint8_t i = 0;
  for (uint8_t k = 1; k < 16; ++k)   // above the midpoint to code k: at least k
    if (x > 0.5f * (kNf4Code[k - 1] + kNf4Code[k])) i = k;
  return i;
}

std::vector<float> bnb_dynamic_map() {
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const int n = (1 << i) + 1;
    for (int k = 0; k + 1 < n; ++k) {
      const float b0 = 0.1f + 0.9f * float(k) / float(n - 1), b1 = 0.1f + 0.9f * float(k + 1) / float(n - 1);
      const float mean = (b0 + b1) / 2.0f, scale = float(std::pow(10.0, -6 + i));
      data.push_back(scale * mean);
      data.push_back(-scale * mean);
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  std::sort(data.begin(), data.end());
  return data;
}

namespace {
uint8_t nearest(const std::vector<float>& sorted, float x) {
  auto it = std::lower_bound(sorted.begin(), sorted.end(), x);
  if (it == sorted.begin()) return 0;
  if (it == sorted.end()) return uint8_t(sorted.size() - 1);
  const size_t hi = size_t(it - sorted.begin());
  return uint8_t(x - sorted[hi - 1] <= sorted[hi] - x ? hi - 1 : hi);
}
}  // namespace

Nf4Tensor nf4_quantize(const float* x, int64_t n, int blocksize, bool double_quant) {
  Nf4Tensor t;
  t.blocksize = blocksize;
  const int64_t nb = (n + blocksize - 1) / blocksize;
  t.absmax.resize(size_t(nb));
  t.packed.assign(size_t((n + 1) / 2), 0);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t e = std::min(n, (b + 1) * blocksize);
    float m = 0;
    for (int64_t i = b * blocksize; i < e; ++i) m = std::max(m, std::abs(x[i]));
    t.absmax[size_t(b)] = m;
    const float inv = m > 0 ? 1.0f / m : 0.0f;
    for (int64_t i = b * blocksize; i < e; ++i) {
      const uint8_t q = nf4_index(x[i] * inv);
      t.packed[size_t(i / 2)] |= uint8_t(i % 2 == 0 ? q << 4 : q);
    }
  }
  if (double_quant) {
    t.nested = true;
    double mean = 0;
    for (float a : t.absmax) mean += a;
    t.offset = float(mean / double(nb));
    t.nested_map = bnb_dynamic_map();
    const int64_t nb2 = (nb + t.nested_blocksize - 1) / t.nested_blocksize;
    t.nested_absmax.resize(size_t(nb2));
    t.absmax_q.resize(size_t(nb));
    for (int64_t b = 0; b < nb2; ++b) {
      const int64_t e = std::min(nb, (b + 1) * t.nested_blocksize);
      float m = 0;
      for (int64_t i = b * t.nested_blocksize; i < e; ++i) m = std::max(m, std::abs(t.absmax[size_t(i)] - t.offset));
      t.nested_absmax[size_t(b)] = m;
      for (int64_t i = b * t.nested_blocksize; i < e; ++i)
        t.absmax_q[size_t(i)] = nearest(t.nested_map, m > 0 ? (t.absmax[size_t(i)] - t.offset) / m : 0.0f);
    }
    for (int64_t i = 0; i < nb; ++i)   // what a reader will reconstruct
      t.absmax[size_t(i)] = t.nested_map[t.absmax_q[size_t(i)]] * t.nested_absmax[size_t(i / t.nested_blocksize)] + t.offset;
  }
  return t;
}

void nf4_dequantize(const Nf4Tensor& t, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t byte = t.packed[size_t(i / 2)];
    const uint8_t q = i % 2 == 0 ? byte >> 4 : byte & 15;
    const int64_t b = i / t.blocksize;
    const float absmax = t.nested ? t.nested_map[t.absmax_q[size_t(b)]] * t.nested_absmax[size_t(b / t.nested_blocksize)] + t.offset
                                  : t.absmax[size_t(b)];
    out[i] = kNf4Code[q] * absmax;
  }
}

BlockQ4_0 quantize_block_q4_0(const float* x) {
  float amax = 0, max = 0;
  for (int j = 0; j < kQK; ++j)
    if (std::abs(x[j]) > amax) { amax = std::abs(x[j]); max = x[j]; }
  const float d = max / -8, id = d != 0 ? 1.0f / d : 0.0f;
  BlockQ4_0 b;
  b.d = f32_to_f16_bits(d);
  for (int j = 0; j < kQK / 2; ++j) {
    const uint8_t x0 = uint8_t(std::min(15, int(int8_t(x[j] * id + 8.5f))));
    const uint8_t x1 = uint8_t(std::min(15, int(int8_t(x[kQK / 2 + j] * id + 8.5f))));
    b.qs[j] = uint8_t(x0 | (x1 << 4));
  }
  return b;
}

BlockQ8_0 quantize_block_q8_0(const float* x) {
  float amax = 0;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::abs(x[j]));
  const float d = amax / 127, id = d != 0 ? 1.0f / d : 0.0f;
  BlockQ8_0 b;
  b.d = f32_to_f16_bits(d);
  for (int j = 0; j < kQK; ++j) b.qs[j] = int8_t(std::round(x[j] * id));   // roundf: half away from zero, as llama.cpp
  return b;
}

void dequantize_block_q4_0(const BlockQ4_0& b, float* y) {
  const float d = f16_bits_to_f32(b.d);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = float(int(b.qs[j] & 15) - 8) * d;
    y[j + kQK / 2] = float(int(b.qs[j] >> 4) - 8) * d;
  }
}

void dequantize_block_q8_0(const BlockQ8_0& b, float* y) {
  const float d = f16_bits_to_f32(b.d);
  for (int j = 0; j < kQK; ++j) y[j] = float(b.qs[j]) * d;
}

}  // namespace ptq
