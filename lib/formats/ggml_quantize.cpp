// ggml_quantize.cpp — llama.cpp's reference quantizers (quantize_row_*_ref in ggml-quants.c, the
// path llama_model_quantize takes without an importance matrix), for the tensors a GGUF run rounds
// without a Hessian: output.weight and token_embd.weight. Same float operations in the same order,
// so the bytes are llama.cpp's own (tests/test_client.cpp compares them with llama_model_quantize's
// file). This file is compiled with -ffp-contract=off: llama.cpp's portable ggml-base has no fused
// multiply-adds in these loops, and a contracted a*b + c rounds differently.
//
//   Q4_0, Q5_0  d = (the value of largest magnitude) / -8 (-16); q = min(15 (31), trunc(x/d + 8.5 (16.5)))
//   Q4_1, Q5_1  d = (max - min) / 15 (31), m = min; q = trunc((x - min)/d + 0.5) (Q4_1: at most 15)
//   Q8_0        d = max|x| / 127; q = round(x/d), half away from zero
//     (these four divide by the unrounded d, then store it as f16)
//   Q4_K, Q5_K  per sub-block of 32: make_qkx2_quants, a weighted least-squares search of scale and
//               min over 21 (Q4_K: rmin -1) or 16 (Q5_K: rmin -0.5) trial ranges, weights
//               sqrt(mean x²) + |x|; the scales and mins then 6-bit multiples of d = max scale / 63
//               and dmin = max min / 63, and every code chosen again on the rounded grid
//   Q6_K        per sub-block of 16: make_qx_quants (rmse_type 1: weights x², 19 trial scales
//               -(32 + 0.1 k)/max, k = -9..9); the scales signed 8-bit multiples of d = max / -128,
//               every code chosen again
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "formats/ggml_blocks.h"

namespace ptq {

namespace {

// llama.cpp's nearest_int: round half to even (its 1.5·2^23 addition), for |x| < 2^22.
inline int nearest(float x) { return int(std::nearbyint(x)); }
inline float f16_round(float x) { return f16_bits_to_f32(f32_to_f16_bits(x)); }

// The value of largest magnitude (the first of equal magnitudes) and that magnitude.
void signed_max(const float* x, int n, float* max, float* amax) {
  *max = 0.0f, *amax = 0.0f;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > *amax) { *amax = std::fabs(x[i]); *max = x[i]; }
}

// make_qx_quants with rmse_type 1 (weights x²): the scale of n values on the signed grid
// -nmax..nmax-1, codes L (+nmax) of the best of 19 trial scales by weighted least squares.
float qx_scale(int n, int nmax, const float* x, int8_t* L) {
  float max, amax;
  signed_max(x, n, &max, &amax);
  if (amax < 1e-15f) {
    std::fill(L, L + n, int8_t(0));
    return 0.0f;
  }
  auto fit = [&](float iscale, float* sumlx, float* suml2) {
    *sumlx = 0, *suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(-nmax, std::min(nmax - 1, nearest(iscale * x[i])));
      const float w = x[i] * x[i];
      *sumlx += w * x[i] * float(l);
      *suml2 += w * float(l) * float(l);
    }
  };
  auto codes = [&](float iscale) {
    for (int i = 0; i < n; ++i) L[i] = int8_t(nmax + std::max(-nmax, std::min(nmax - 1, nearest(iscale * x[i]))));
  };
  float iscale = -float(nmax) / max, sumlx, suml2;
  fit(iscale, &sumlx, &suml2);
  codes(iscale);
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    iscale = -(float(nmax) + 0.1f * float(k)) / max;
    fit(iscale, &sumlx, &suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      codes(iscale);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// make_qkx2_quants (squared errors): the scale and min (returned as -min in *neg_min) of n values
// on 0..nmax, weights w, codes L: min-max first, then nstep + 1 trial ranges
// (rmin + rdelta·k + nmax) / (max - min), each refitted by weighted least squares.
float qkx2_scale(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, uint8_t(0));
    *neg_min = -min;
    return 0.0f;
  }
  float iscale = float(nmax) / (max - min), scale = 1 / iscale, best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = uint8_t(std::max(0, std::min(nmax, nearest(iscale * (x[i] - min)))));
    const float diff = scale * float(L[i]) + min - x[i];
    best_error += w[i] * (diff * diff);
  }
  uint8_t Laux[32];
  for (int k = 0; k <= nstep; ++k) {
    iscale = (rmin + rdelta * float(k) + float(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest(iscale * (x[i] - min))));
      Laux[i] = uint8_t(l);
      sum_l += w[i] * float(l);
      sum_l2 += w[i] * float(l) * float(l);
      sum_xl += w[i] * float(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D, this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * float(Laux[i]) + this_min - x[i];
        err += w[i] * (diff * diff);
      }
      if (err < best_error) {
        std::memcpy(L, Laux, size_t(n));
        best_error = err;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

// One Q4_K or Q5_K super-block: L the codes (0..nmax), the rest written into scales, d, dmin.
void k_block(const float* x, int nmax, float rmin, int nstep, uint8_t* scales12, uint16_t* d_bits, uint16_t* dmin_bits, uint8_t* L) {
  float scales[8], mins[8], weights[32], max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = qkx2_scale(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], rmin, 0.1f, nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  int ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = std::min<uint8_t>(63, uint8_t(nearest(inv_scale * scales[j])));
    lm[j] = std::min<uint8_t>(63, uint8_t(nearest(inv_min * mins[j])));
  }
  pack_scales_k4(ls, lm, scales12);
  *d_bits = f32_to_f16_bits(max_scale / 63.f);
  *dmin_bits = f32_to_f16_bits(max_min / 63.f);
  for (int j = 0; j < 8; ++j) {   // the codes again, on the rounded grid (a sub-block whose scale rounded to 0 keeps the search's)
    int sc, m;
    scale_min_k4(j, scales12, &sc, &m);
    const float d = f16_bits_to_f32(*d_bits) * float(sc);
    if (d == 0.0f) continue;
    const float dm = f16_bits_to_f32(*dmin_bits) * float(m);
    for (int i = 0; i < 32; ++i) L[32 * j + i] = uint8_t(std::max(0, std::min(nmax, nearest((x[32 * j + i] + dm) / d))));
  }
}

void q4_0(const float* x, BlockQ4_0* b) { *b = quantize_block_q4_0(x); }

// Q4_1 and Q5_1: the block's min as m, and d = (max - min) / maxq.
float min_step(const float* x, int maxq, float* min) {
  float max = x[0];
  *min = x[0];
  for (int j = 1; j < kQK; ++j) *min = std::min(*min, x[j]), max = std::max(max, x[j]);
  return (max - *min) / float(maxq);
}

void q4_1(const float* x, BlockQ4_1* b) {
  float min;
  const float d = min_step(x, 15, &min), id = d != 0.0f ? 1.0f / d : 0.0f;
  b->d = f32_to_f16_bits(d);
  b->m = f32_to_f16_bits(min);
  for (int j = 0; j < kQK / 2; ++j) {
    const uint8_t a = uint8_t(std::min(15, int(int8_t((x[j] - min) * id + 0.5f))));
    const uint8_t c = uint8_t(std::min(15, int(int8_t((x[kQK / 2 + j] - min) * id + 0.5f))));
    b->qs[j] = uint8_t(a | (c << 4));
  }
}

// Q5_0 and Q5_1: the low nibbles in qs, the fifth bits in qh (element j at bit j).
void pack5(const uint8_t* q, uint8_t* qs, uint8_t* qh4) {
  uint32_t qh = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    qs[j] = uint8_t((q[j] & 0xF) | ((q[kQK / 2 + j] & 0xF) << 4));
    qh |= uint32_t((q[j] >> 4) & 1) << j;
    qh |= uint32_t((q[kQK / 2 + j] >> 4) & 1) << (j + kQK / 2);
  }
  std::memcpy(qh4, &qh, 4);
}

void q5_0(const float* x, BlockQ5_0* b) {
  float max, amax;
  signed_max(x, kQK, &max, &amax);
  const float d = max / -16, id = d != 0.0f ? 1.0f / d : 0.0f;
  b->d = f32_to_f16_bits(d);
  uint8_t q[kQK];
  for (int j = 0; j < kQK; ++j) q[j] = uint8_t(std::min(31, int(int8_t(x[j] * id + 16.5f))));
  pack5(q, b->qs, b->qh);
}

void q5_1(const float* x, BlockQ5_1* b) {
  float min;
  const float d = min_step(x, 31, &min), id = d != 0.0f ? 1.0f / d : 0.0f;
  b->d = f32_to_f16_bits(d);
  b->m = f32_to_f16_bits(min);
  uint8_t q[kQK];
  for (int j = 0; j < kQK; ++j) q[j] = uint8_t((x[j] - min) * id + 0.5f);
  pack5(q, b->qs, b->qh);
}

void q4_k(const float* x, BlockQ4_K* b) {
  uint8_t L[kQKK];
  k_block(x, 15, -1.0f, 20, b->scales, &b->d, &b->dmin, L);
  for (int j = 0; j < kQKK; j += 64)
    for (int l = 0; l < 32; ++l) b->qs[j / 2 + l] = uint8_t(L[j + l] | (L[j + l + 32] << 4));
}

void q5_k(const float* x, BlockQ5_K* b) {
  uint8_t L[kQKK];
  k_block(x, 31, -0.5f, 15, b->scales, &b->d, &b->dmin, L);
  std::memset(b->qh, 0, sizeof b->qh);
  uint8_t m1 = 1, m2 = 2;
  for (int n = 0; n < kQKK; n += 64) {
    for (int j = 0; j < 32; ++j) {
      int l1 = L[n + j], l2 = L[n + j + 32];
      if (l1 > 15) l1 -= 16, b->qh[j] |= m1;
      if (l2 > 15) l2 -= 16, b->qh[j] |= m2;
      b->qs[n / 2 + j] = uint8_t(l1 | (l2 << 4));
    }
    m1 = uint8_t(m1 << 2), m2 = uint8_t(m2 << 2);
  }
}

void q6_k(const float* x, BlockQ6_K* b) {
  int8_t L[kQKK];
  float scales[16], max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < 16; ++ib) {
    scales[ib] = qx_scale(16, 32, x + 16 * ib, L + 16 * ib);
    if (std::fabs(scales[ib]) > max_abs_scale) { max_abs_scale = std::fabs(scales[ib]); max_scale = scales[ib]; }
  }
  std::memset(b, 0, sizeof *b);
  if (max_abs_scale < 1e-15f) return;   // all zero: d = 0
  const float iscale = -128.f / max_scale;
  b->d = f32_to_f16_bits(1 / iscale);
  for (int ib = 0; ib < 16; ++ib) b->scales[ib] = int8_t(std::min(127, nearest(iscale * scales[ib])));
  for (int j = 0; j < 16; ++j) {   // the codes again on the rounded grid (a scale rounded to 0 keeps the search's)
    const float d = f16_bits_to_f32(b->d) * float(b->scales[j]);
    if (d == 0.0f) continue;
    for (int i = 0; i < 16; ++i) L[16 * j + i] = int8_t(std::max(-32, std::min(31, nearest(x[16 * j + i] / d))) + 32);
  }
  for (int j = 0; j < kQKK; j += 128)
    for (int l = 0; l < 32; ++l) {
      const int a = L[j + l], c = L[j + l + 32], e = L[j + l + 64], f = L[j + l + 96];
      b->ql[j / 2 + l] = uint8_t((a & 0xF) | ((e & 0xF) << 4));
      b->ql[j / 2 + l + 32] = uint8_t((c & 0xF) | ((f & 0xF) << 4));
      b->qh[j / 4 + l] = uint8_t((a >> 4) | ((c >> 4) << 2) | ((e >> 4) << 4) | ((f >> 4) << 6));
    }
}

}  // namespace

BlockQ4_0 quantize_block_q4_0(const float* x) {
  float max, amax;
  signed_max(x, kQK, &max, &amax);
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

void quantize_row_ggml(GgmlType t, const float* x, int64_t n, void* out) {
  const int be = ggml_block_elems(t), bb = ggml_block_bytes(t);
  if (be <= 1 || n % be) fail(Errc::usage, "", ggml_type_name(t), "llama.cpp's quantizer takes whole blocks of a quantized type");
  char* o = static_cast<char*>(out);
  for (int64_t i = 0; i < n / be; ++i, x += be, o += bb) {
    switch (t) {
      case GgmlType::Q4_0: q4_0(x, reinterpret_cast<BlockQ4_0*>(o)); break;
      case GgmlType::Q4_1: q4_1(x, reinterpret_cast<BlockQ4_1*>(o)); break;
      case GgmlType::Q5_0: q5_0(x, reinterpret_cast<BlockQ5_0*>(o)); break;
      case GgmlType::Q5_1: q5_1(x, reinterpret_cast<BlockQ5_1*>(o)); break;
      case GgmlType::Q8_0: *reinterpret_cast<BlockQ8_0*>(o) = quantize_block_q8_0(x); break;
      case GgmlType::Q4_K: q4_k(x, reinterpret_cast<BlockQ4_K*>(o)); break;
      case GgmlType::Q5_K: q5_k(x, reinterpret_cast<BlockQ5_K*>(o)); break;
      case GgmlType::Q6_K: q6_k(x, reinterpret_cast<BlockQ6_K*>(o)); break;
      default: fail(Errc::usage, "", ggml_type_name(t), "not a quantized block type");
    }
  }
}

}  // namespace ptq
