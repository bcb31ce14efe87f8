// relayout.h — the A16 kernels' weight layout ("fragment order"), in one place: where each code of
// W [N, K] goes so that one 16-byte load of a lane is exactly its mma.sync A operands for one
// k-step. The W4A16/W8A16 (GPTQ) and NF4 loaders lay their codes out with relayout_rows; the
// kernels (a16_mma.cuh, a16_shared_x.cuh, a16_wgmma.cu) read them through a16_formats.cuh.
// docs/fragment-layout.md draws the bits; tests/test_relayout.cpp checks the round trip.
//
// W is cut into tiles of 16 rows and k-steps of 64 columns. Tile t, k-step s gives 32 lanes one
// uint4 each (lane_u4 = (t * KS + s) * 32 + lane): for lane = g * 4 + c (g = row % 8, c = 16-column
// quarter of the k-step), four mma fragments f = 0..3 (columns 16c + 4f .. 16c + 4f + 3 of rows
// g and g + 8: element e = column % 4, hi = row / 8 of the tile).
//   GPTQ 4-bit: one uint32 per fragment, word lane_u4 * 4 + f; the pair p = hi + 2 (e / 2) of
//     columns (e even, e odd) at bits 4p and 16 + 4p.
//   GPTQ 8-bit: two uint4 per lane (k-step halves); fragment f in uint4 f / 2, words (f % 2) * 2 + e / 2;
//     byte hi of the word, + 2 for odd e.
//   NF4: one uint32 per fragment, word lane_u4 * 4 + f; nibble (e / 2) * 4 + hi * 2 + e % 2.
// Rows past N and columns past K hold zero codes.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ptq {

enum class FragmentCodes { gptq4, gptq8, nf4 };

// Where code (row r, column k) of an N x K matrix goes in fragment order: the lane's uint4 slot
// (counted in uint32 words), the fragment f, the element e (0..3: columns k0 .. k0 + 3), and hi
// (0: row g, 1: row g + 8 of the tile). KS = ceil(K / 64) k-steps.
struct FragmentSlot {
  int64_t lane_u4;   // index of (tile, k-step, lane) = ((t * KS + s) * 32 + lane)
  int f, e, hi;
};
constexpr FragmentSlot fragment_slot(int64_t r, int64_t k, int64_t KS) {
  const int64_t t = r / 16, s = k / 64;
  const int rr = int(r % 16), kk = int(k % 64);
  const int g = rr % 8, c = kk / 16;
  return {(t * KS + s) * 32 + g * 4 + c, (kk % 16) / 4, kk % 4, rr / 8};
}

// The uint32 word and bit offset of code (r, k).
struct FragmentBits {
  size_t word;
  int shift;
};
constexpr FragmentBits fragment_bits(int64_t r, int64_t k, int64_t KS, FragmentCodes codes) {
  const FragmentSlot fs = fragment_slot(r, k, KS);
  switch (codes) {
    case FragmentCodes::gptq4: return {size_t(fs.lane_u4 * 4 + fs.f), (fs.e % 2 ? 16 : 0) + 4 * (fs.hi + 2 * (fs.e / 2))};
    case FragmentCodes::gptq8: {
      const int64_t t_s = fs.lane_u4 / 32, lane = fs.lane_u4 % 32;
      return {size_t(((t_s * 2 + fs.f / 2) * 32 + lane) * 4 + (fs.f % 2) * 2 + fs.e / 2), (fs.e % 2 ? 16 : 0) + 8 * fs.hi};
    }
    case FragmentCodes::nf4: break;
  }
  return {size_t(fs.lane_u4 * 4 + fs.f), 4 * ((fs.e / 2) * 4 + fs.hi * 2 + fs.e % 2)};
}
constexpr int fragment_code_bits(FragmentCodes codes) { return codes == FragmentCodes::gptq8 ? 8 : 4; }

// uint32 words of an N x K matrix in fragment order (whole tiles and k-steps).
inline size_t fragment_words(int64_t N, int64_t K, FragmentCodes codes) {
  return size_t((N + 15) / 16 * ((K + 63) / 64) * 32 * 4 * (fragment_code_bits(codes) / 4));
}

// W in fragment order from code_of(r, k) (r < N, k < K; each < 2^bits), code by code: the
// reference. Tiles in parallel: a tile's 16 rows fill words no other tile touches.
template <class CodeOf>
std::vector<uint32_t> relayout_codes(int64_t N, int64_t K, FragmentCodes codes, CodeOf&& code_of) {
  const int64_t KS = (K + 63) / 64, tiles = (N + 15) / 16;
  std::vector<uint32_t> W(fragment_words(N, K, codes), 0);
#pragma omp parallel for schedule(static) if (N * K > (int64_t(1) << 20))
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t r = 16 * t; r < (N < 16 * t + 16 ? N : 16 * t + 16); ++r)
      for (int64_t k = 0; k < K; ++k) {
        const FragmentBits b = fragment_bits(r, k, KS, codes);
        W[b.word] |= uint32_t(code_of(r, k)) << b.shift;
      }
  return W;
}

// The same words from whole rows: row_of(r, dst) writes row r's K codes (bytes, each < 2^bits)
// to dst. Every (tile, k-step) block is laid out alike in a run of its own words, so one block's
// map (word and shift of each of its 16 x 64 codes) places every code; a tile's 16 rows are
// fetched once. The loaders' path (relayout_codes is its reference: tests/test_relayout.cpp).
template <class RowOf>
std::vector<uint32_t> relayout_rows(int64_t N, int64_t K, FragmentCodes codes, RowOf&& row_of) {
  const int64_t KS = (K + 63) / 64, tiles = (N + 15) / 16;
  const size_t block = size_t(128 * (fragment_code_bits(codes) / 4));   // words of one block
  uint16_t word[16 * 64];
  uint8_t shift[16 * 64];
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < 64; ++k) {
      const FragmentBits b = fragment_bits(r, k, 1, codes);
      word[r * 64 + k] = uint16_t(b.word);
      shift[r * 64 + k] = uint8_t(b.shift);
    }
  std::vector<uint32_t> W(fragment_words(N, K, codes), 0);
#pragma omp parallel if (N * K > (int64_t(1) << 20))
  {
    std::vector<uint8_t> rows(size_t(16 * KS * 64), 0);   // the tile's rows; columns past K stay zero
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) {
      for (int64_t i = 0; i < 16; ++i) {
        uint8_t* dst = rows.data() + i * KS * 64;
        if (16 * t + i < N) row_of(16 * t + i, dst);
        else std::fill(dst, dst + K, uint8_t(0));
      }
      for (int64_t s = 0; s < KS; ++s) {
        uint32_t* w = W.data() + size_t(t * KS + s) * block;
        for (int i = 0; i < 16; ++i) {
          const uint8_t* c = rows.data() + i * KS * 64 + 64 * s;
          for (int k = 0; k < 64; ++k) w[word[i * 64 + k]] |= uint32_t(c[k]) << shift[i * 64 + k];
        }
      }
    }
  }
  return W;
}

// The inverse: code (r, k) of W in fragment order.
inline uint32_t fragment_code(const std::vector<uint32_t>& W, int64_t r, int64_t k, int64_t K, FragmentCodes codes) {
  const FragmentBits b = fragment_bits(r, k, (K + 63) / 64, codes);
  return (W[b.word] >> b.shift) & ((1u << fragment_code_bits(codes)) - 1);
}

}  // namespace ptq
