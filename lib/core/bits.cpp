#include "core/bits.h"

#include <cstring>

namespace ptq {

void pack_bits(const uint32_t* v, int64_t n, int bits, uint32_t* w) {
  const int64_t words = packed_words(n, bits);
  std::memset(w, 0, size_t(words) * 4);
  for (int64_t k = 0; k < n; ++k) {
    const uint64_t bit = uint64_t(k) * uint64_t(bits);
    const uint64_t word = bit / 32, shift = bit % 32;
    w[word] |= v[k] << shift;
    if (shift + uint64_t(bits) > 32) w[word + 1] |= v[k] >> (32 - shift);
  }
}

uint32_t unpack_bit(const uint32_t* w, int64_t k, int bits) {
  const uint64_t bit = uint64_t(k) * uint64_t(bits), word = bit / 32, shift = bit % 32;
  uint64_t x = w[word] >> shift;
  if (shift + uint64_t(bits) > 32) x |= uint64_t(w[word + 1]) << (32 - shift);
  return uint32_t(x & ((1u << bits) - 1));
}

void pack_rows(const uint8_t* codes, int64_t rows, int64_t cols, int bits, uint32_t* words) {
  const int64_t nw = packed_words(cols, bits);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) pack_stream(codes + r * cols, cols, bits, words + r * nw);
}

void pack_stream(const uint8_t* codes, int64_t n, int bits, uint32_t* w) {
  uint64_t acc = 0;   // the stream's pending `have` bits, lowest first
  int have = 0;
  for (int64_t k = 0; k < n; ++k) {
    acc |= uint64_t(codes[k]) << have;
    have += bits;
    if (have >= 32) {
      *w++ = uint32_t(acc);
      acc >>= 32;
      have -= 32;
    }
  }
  if (have > 0) *w = uint32_t(acc);
}

void unpack_stream(const uint32_t* w, int64_t n, int bits, uint8_t* codes) {
  const uint64_t mask = (uint64_t(1) << bits) - 1;
  uint64_t acc = 0;   // the stream's next `have` bits, lowest first
  int have = 0;
  for (int64_t k = 0; k < n; ++k) {
    if (have < bits) {   // never past the stream's last word: n * bits bits remain to be read
      acc |= uint64_t(*w++) << have;
      have += 32;
    }
    codes[k] = uint8_t(acc & mask);
    acc >>= bits;
    have -= bits;
  }
}

void unpack_rows(const uint32_t* words, int64_t rows, int64_t cols, int bits, uint8_t* codes) {
  const int64_t nw = packed_words(cols, bits);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) unpack_stream(words + r * nw, cols, bits, codes + r * cols);
}

}  // namespace ptq
