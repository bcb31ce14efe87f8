#include "kernels/reference.h"

#include <vector>

namespace ptq {

namespace {
// y[m, o] += x[m, i] * w for every m: the shared inner step.
inline void axpy_col(const float* x, int64_t M, int64_t in, int64_t i, float w, float* y, int64_t out, int64_t o) {
  for (int64_t m = 0; m < M; ++m) y[m * out + o] += x[m * in + i] * w;
}
}  // namespace

void ref_gemm_gptq(const float* x, int64_t M, const GptqPacked& w, bool v2, float* y) {
  const int64_t in = w.cols, out = w.rows, zw = out * w.bits / 32;
  std::fill(y, y + M * out, 0.0f);
  std::vector<uint32_t> col(static_cast<size_t>(in * w.bits / 32 + 1));
#pragma omp parallel for schedule(static) firstprivate(col)
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t k = 0; k < in * w.bits / 32; ++k) col[size_t(k)] = uint32_t(w.qweight[size_t(k * out + o)]);   // column o of qweight
    for (int64_t i = 0; i < in; ++i) {
      const int64_t g = w.g_idx[size_t(i)];
      const uint32_t q = unpack_bit(col.data(), i, w.bits);
      const uint32_t zs = unpack_bit(reinterpret_cast<const uint32_t*>(w.qzeros.data()) + g * zw, o, w.bits);
      const int32_t z = v2 ? int32_t(zs) : int32_t((zs + 1) & 0xFFFFFFFFu);
      axpy_col(x, M, in, i, w.scales[size_t(g * out + o)] * float(int32_t(q) - z), y, out, o);
    }
  }
}

void ref_gemm_ct(const float* x, int64_t M, const CtPacked& w, bool sym, float* y) {
  const int64_t in = w.cols, out = w.rows, zw = (out * w.bits + 31) / 32;
  std::fill(y, y + M * out, 0.0f);
  const int64_t gs = w.g_idx.empty() ? (in + w.groups - 1) / w.groups : 0;
  // Zero points [groups, out], unpacked once from their columns (packed along the output).
  std::vector<int32_t> zero(static_cast<size_t>(w.groups * out), 1 << (w.bits - 1));
  if (!sym) {
    std::vector<uint32_t> zcol(static_cast<size_t>(zw + 1));
    for (int64_t g = 0; g < w.groups; ++g) {
      for (int64_t k = 0; k < zw; ++k) zcol[size_t(k)] = uint32_t(w.zero_point[size_t(k * w.groups + g)]);
      for (int64_t o = 0; o < out; ++o) zero[size_t(g * out + o)] = int32_t(unpack_bit(zcol.data(), o, w.bits));
    }
  }
  for (int64_t o = 0; o < out; ++o) {
    const uint32_t* row = reinterpret_cast<const uint32_t*>(&w.weight_packed[size_t(o * w.packed_cols)]);
    for (int64_t i = 0; i < in; ++i) {
      const int64_t g = w.g_idx.empty() ? i / gs : w.g_idx[size_t(i)];
      const int32_t z = zero[size_t(g * out + o)];
      axpy_col(x, M, in, i, w.scale[size_t(o * w.groups + g)] * float(int32_t(unpack_bit(row, i, w.bits)) - z), y, out, o);
    }
  }
}

void ref_gemm_nf4(const float* x, int64_t M, const Nf4Tensor& w, int64_t out, int64_t in, float* y) {
  std::fill(y, y + M * out, 0.0f);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      const int64_t e = o * in + i, b = e / w.blocksize;
      const uint8_t byte = w.packed[size_t(e / 2)];
      const float absmax = w.nested ? w.nested_map[w.absmax_q[size_t(b)]] * w.nested_absmax[size_t(b / w.nested_blocksize)] + w.offset
                                    : w.absmax[size_t(b)];
      axpy_col(x, M, in, i, kNf4Code[e % 2 == 0 ? byte >> 4 : byte & 15] * absmax, y, out, o);
    }
}

namespace {
// llama.cpp layouts: each row of W is in/32 blocks, each dequantized on its own.
template <class Block, class Dequant>
void ref_gemm_blocks(const float* x, int64_t M, const Block* w, int64_t out, int64_t in, float* y, Dequant dequant) {
  std::fill(y, y + M * out, 0.0f);
  float v[kQK];
  for (int64_t o = 0; o < out; ++o)
    for (int64_t b = 0; b < in / kQK; ++b) {
      dequant(w[o * (in / kQK) + b], v);
      for (int j = 0; j < kQK; ++j) axpy_col(x, M, in, b * kQK + j, v[j], y, out, o);
    }
}
}  // namespace

void ref_gemm_q4_0(const float* x, int64_t M, const BlockQ4_0* w, int64_t out, int64_t in, float* y) {
  ref_gemm_blocks(x, M, w, out, in, y, dequantize_block_q4_0);
}

void ref_gemm_q8_0(const float* x, int64_t M, const BlockQ8_0* w, int64_t out, int64_t in, float* y) {
  ref_gemm_blocks(x, M, w, out, in, y, dequantize_block_q8_0);
}

void ref_gemm_i8(const int8_t* a, const int8_t* b, int64_t M, int64_t N, int64_t K, int32_t* c) {
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      int32_t s = 0;
      for (int64_t k = 0; k < K; ++k) s += int32_t(a[m * K + k]) * int32_t(b[n * K + k]);
      c[m * N + n] = s;
    }
}

void ref_gemm_w8a8(const int8_t* x, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y) {
  std::vector<int32_t> c(size_t(M * N));
  ref_gemm_i8(x, w, M, N, K, c.data());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) y[m * N + n] = float(double(sx[m]) * double(sw[n]) * double(c[size_t(m * N + n)]));
}

}  // namespace ptq
