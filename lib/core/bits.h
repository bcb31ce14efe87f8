// bits.h — the little-endian bitstream every integer packing in ptqkit uses (formats.md): value k
// occupies bits [k*bits, (k+1)*bits) of the stream, word w holds stream bits [32w, 32w+32). For
// 2/4/8 bits a word holds 16/8/4 whole values; for 3 bits this is exactly GPTQ's "10, one split,
// 10, one split, 10" layout of 32 values in 3 words.
#pragma once
#include <cstdint>

namespace ptq {

inline int64_t packed_words(int64_t n, int bits) { return (n * bits + 31) / 32; }
// Packs n values (each < 2^bits) into packed_words(n, bits) words; the tail is zero-padded.
void pack_bits(const uint32_t* values, int64_t n, int bits, uint32_t* words);
uint32_t unpack_bit(const uint32_t* words, int64_t k, int bits);   // value k of the stream
// Each of `rows` rows of `cols` codes as its own stream: row r in words [r * w, (r + 1) * w),
// w = packed_words(cols, bits) (the layer store's P.qcodes; lib/cuda packs the same on the GPU).
void pack_rows(const uint8_t* codes, int64_t rows, int64_t cols, int bits, uint32_t* words);
void unpack_rows(const uint32_t* words, int64_t rows, int64_t cols, int bits, uint8_t* codes);
// One stream of n values (bits <= 8) into bytes, read in order (no per-value word arithmetic).
void unpack_stream(const uint32_t* words, int64_t n, int bits, uint8_t* codes);
// Its inverse: n bytes (each < 2^bits, bits <= 8) into packed_words(n, bits) words, the tail zero.
void pack_stream(const uint8_t* codes, int64_t n, int bits, uint32_t* words);

}  // namespace ptq
