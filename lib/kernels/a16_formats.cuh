// a16_formats.cuh — the Formats of the 16-bit-activation tensor-core kernels (kernels/a16_mma.cuh
// states the concept): GPTQ 4- and 8-bit (w4a16.cu converts to it) and NF4 (nf4.cu). One
// definition, shared by the sm_90 kernels (a16_mma.cuh, a16_shared_x.cuh) and the sm_90a wgmma
// kernel (a16_wgmma.cu), which is built in its own library.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/a16_mma.cuh"

namespace ptq::cuda::a16 {

using ptx::and_or;
using ptx::prmt;

// The GPTQ format of kernels/a16_mma.cuh: Meta = the (1024 + z, s) pairs of rows g and g + 8 for
// the lane's group; a fragment's codes less z, in f16 (exact), times s in f16 when SCALED.
// MIN: a grid with a min in place of the zero point, w = s q + m (llama.cpp's Q4_1, Q5_1, Q4_K and
// Q5_K blocks): Meta = the (m, s) pairs, q formed exactly in f16 as above (z = 0) and s q + m by one
// f16 FMA. Always SCALED (groups of whole k-steps would scale partials, which cannot add m): the
// dispatch never instantiates it otherwise, and scales() is not its grid.
template <int BITS, bool MIN = false>
struct GptqFormat {
  static constexpr int kU4 = BITS / 4;   // uint4 per lane per k-step
  static constexpr bool kMin = MIN;
  static constexpr bool kPairTable = false;
  // One row tile at M <= 8 overlaps its batches too (a16_mma.cuh, overlap_variants): measured for
  // 4-bit codes (docs/lab/kernels.md); 8-bit codes have both loops there, the planner's choice
  // (docs/lab/2026-11-24-decode-h200.md, run 43).
  static constexpr bool kOverlapM8 = true;
  static constexpr bool kRowMajor = false;   // codes in fragment order (relayout.h)
  static constexpr int kLoadsM8 = 4;     // deeper batches were slower (W4 M = 1 11008x4096: 2.93x -> 2.51x at 8)
  // At one row (x staged) each slot of the next batch is loaded as soon as its k-step is done
  // (a16_mma.cuh's kRoll): 8-bit codes only. Decode batch 1 (docs/lab/2026-11-24-decode-h200.md,
  // runs 257-258, 261): W8A16 +0.7 to +1.2%; W4A16 -1.7 to -3.2%.
  static constexpr bool kRollM1 = BITS == 8;
  using Meta = uint2;                    // half2 {1024 + z, s} (MIN: {m, s}) of row g, of row g + 8
  struct Prep {
    __half2 z_lo, z_hi, s_lo, s_hi;      // 4-bit: z_hi = -(64 + z) of row g + 8 (the FMA form); 8-bit: {1024 + z} x 2
    __half2 m_lo, m_hi;                  // MIN only
  };
  const uint2* zs;   // [tiles][groups][8]
  int groups;
  a16::GroupOf group;
  __device__ const Meta* meta_ptr(int tile, int s, int lane, bool k_step_uniform) const {
    const int col = 64 * s + (k_step_uniform ? 0 : 16 * (lane & 3));
    // A lane whose columns lie past K (K not a multiple of 64) reads the last group: finite weights times zero x.
    return zs + (int64_t(tile) * groups + min(group(col), groups - 1)) * 8 + (lane >> 2);
  }
  __device__ float2 scales(const Meta& m) const {
    return make_float2(__high2float(*reinterpret_cast<const __half2*>(&m.x)), __high2float(*reinterpret_cast<const __half2*>(&m.y)));
  }
  template <bool SCALED>
  __device__ Prep prep(const Meta& m) const {
    const __half2 lo = *reinterpret_cast<const __half2*>(&m.x), hi = *reinterpret_cast<const __half2*>(&m.y);
    Prep p;
    if constexpr (MIN) {   // q itself: z = 0
      static_assert(SCALED, "a grid with mins is always scaled in f16");
      p.z_lo = __float2half2_rn(1024.0f);
      p.z_hi = BITS == 4 ? __float2half2_rn(-64.0f) : p.z_lo;
      p.m_lo = __half2half2(__low2half(lo));
      p.m_hi = __half2half2(__low2half(hi));
    } else {
      p.z_lo = __half2half2(__low2half(lo));
      p.z_hi = BITS == 4 ? __hneg2(__hsub2(__half2half2(__low2half(hi)), __float2half2_rn(960.0f))) : __half2half2(__low2half(hi));
    }
    if (SCALED) {
      p.s_lo = __half2half2(__high2half(lo));
      p.s_hi = __half2half2(__high2half(hi));
    }
    return p;
  }
  template <bool SCALED, bool kWide = false>
  __device__ void dequant(const uint4 (&q)[kU4], int f, const Prep& p, uint32_t* a) const {
    constexpr uint32_t magic = 0x64006400u;
    auto h2 = [](uint32_t u) { return *reinterpret_cast<const __half2*>(&u); };
    __half2 d[4];
    if constexpr (BITS == 4) {   // (w & mask) | magic: one LOP3 each (and_or)
      const uint32_t w = f == 0 ? q[0].x : f == 1 ? q[0].y : f == 2 ? q[0].z : q[0].w, w8 = w >> 8;
      const __half2 sixteenth = __float2half2_rn(0.0625f);
      d[0] = __hsub2(h2(and_or(w, 0x000F000Fu, magic)), p.z_lo);               // row g, columns k0 k0+1
      d[1] = __hfma2(h2(and_or(w, 0x00F000F0u, magic)), sixteenth, p.z_hi);    // row g + 8
      d[2] = __hsub2(h2(and_or(w8, 0x000F000Fu, magic)), p.z_lo);              // row g, columns k0+2 k0+3
      d[3] = __hfma2(h2(and_or(w8, 0x00F000F0u, magic)), sixteenth, p.z_hi);   // row g + 8
    } else {   // bytes 0, 2 (row g) or 1, 3 (row g + 8) of a word, each under byte 1 of magic (0x64): one PRMT
      const uint4& u = q[f / 2];
      const uint32_t wa = f % 2 ? u.z : u.x, wb = f % 2 ? u.w : u.y;
      d[0] = __hsub2(h2(prmt(wa, magic, 0x5250u)), p.z_lo);
      d[1] = __hsub2(h2(prmt(wa, magic, 0x5351u)), p.z_hi);
      d[2] = __hsub2(h2(prmt(wb, magic, 0x5250u)), p.z_lo);
      d[3] = __hsub2(h2(prmt(wb, magic, 0x5351u)), p.z_hi);
    }
    if constexpr (MIN) {
      d[0] = __hfma2(d[0], p.s_lo, p.m_lo);
      d[1] = __hfma2(d[1], p.s_hi, p.m_hi);
      d[2] = __hfma2(d[2], p.s_lo, p.m_lo);
      d[3] = __hfma2(d[3], p.s_hi, p.m_hi);
    } else if constexpr (SCALED) {
      d[0] = __hmul2(d[0], p.s_lo);
      d[1] = __hmul2(d[1], p.s_hi);
      d[2] = __hmul2(d[2], p.s_lo);
      d[3] = __hmul2(d[3], p.s_hi);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = *reinterpret_cast<const uint32_t*>(&d[i]);
  }
};

// The NF4 format of the shared-x and dequantize kernels (the L2-fed and wgmma kernels run
// Nf4PairFormat below; the wgmma kernel this one under PTQKIT_A16_WG_PAIRS=0). tab: low bytes
// (lo[0..3]: codes 0-3, 4-7, 8-11, 12-15) and high bytes (hi[0..3]) of the 16 f16 NF4 values, a
// kernel argument (registers, no table in memory).
// Meta = the absmax of rows g and g + 8 for the lane's block.
struct Nf4Format {
  static constexpr int kU4 = 1;
  static constexpr bool kMin = false;
  static constexpr bool kPairTable = false;
  static constexpr bool kOverlapM8 = false;   // the L2-fed kernel runs Nf4PairFormat below, which overlaps
  static constexpr bool kRollM1 = false;
  static constexpr bool kRowMajor = false;
  using Meta = float2;
  using Prep = __half2;   // {absmax g, absmax g + 8}, used when SCALED (B = 32)
  uint32_t lo[4], hi[4];
  const float2* absmax;   // [tiles][blocks][8]
  int blocks;
  a16::GroupOf block;
  __device__ const Meta* meta_ptr(int tile, int s, int lane, bool k_step_uniform) const {
    const int col = 64 * s + (k_step_uniform ? 0 : 16 * (lane & 3));
    return absmax + (int64_t(tile) * blocks + min(block(col), blocks - 1)) * 8 + (lane >> 2);   // past K: the last block
  }
  __device__ float2 scales(const Meta& m) const { return m; }
  template <bool SCALED>
  __device__ Prep prep(const Meta& m) const { return SCALED ? __floats2half2_rn(m.x, m.y) : __half2{}; }
  // 4 codes (nibbles n0..n3 of the low 16 bits of v) -> {V(n0), V(n1)}, {V(n2), V(n3)}.
  __device__ void lookup4(uint32_t v, uint32_t& p01, uint32_t& p23) const {
    const uint32_t s7 = v & 0x7777u;                          // byte of the table half
    const uint32_t pick = ((v >> 1) & 0x4444u) | 0x3210u;     // byte i from the upper half when nibble i >= 8
    const uint32_t l = prmt(prmt(lo[0], lo[1], s7), prmt(lo[2], lo[3], s7), pick);
    const uint32_t h = prmt(prmt(hi[0], hi[1], s7), prmt(hi[2], hi[3], s7), pick);
    p01 = prmt(l, h, 0x5140u);   // bytes l0 h0 l1 h1
    p23 = prmt(l, h, 0x7362u);
  }
  template <bool SCALED, bool kWide = false>
  __device__ void dequant(const uint4 (&q)[1], int f, const Prep& p, uint32_t* a) const {
    const uint32_t w = f == 0 ? q[0].x : f == 1 ? q[0].y : f == 2 ? q[0].z : q[0].w;
    lookup4(w, a[0], a[1]);         // a0a1 row g, a2a3 row g + 8 (columns k0, k0 + 1)
    lookup4(w >> 16, a[2], a[3]);   // columns k0 + 2, k0 + 3
    if constexpr (SCALED) scale(p, a);
  }
  __device__ static void scale(const Prep& p, uint32_t* a) {
    const __half2 sg = __low2half2(p), sh = __high2half2(p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&a[i]), i % 2 ? sh : sg);
      a[i] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
};

// NF4 for the L2-fed kernel (a16_mma.cuh) and the wgmma kernel (a16_wgmma.cu), which hold a pair
// table in shared memory: word [b][lane] = {V(b & 15), V(b >> 4)} for each byte b of codes, one
// copy per lane (a lane reads only its own column: no bank conflicts), 32 KB. A byte of codes is
// one fragment register: per 2 codes a PRMT, an IMAD and an LDS (pair_at; in the L2-fed kernel at
// 16 rows and more the C form below), where the in-register PRMT lookup of Nf4Format takes 11
// integer instructions per 4 codes. The kernel fills the table once per CTA.
struct Nf4PairFormat : Nf4Format {
  static constexpr bool kPairTable = true;
  static constexpr int kPairWords = 256 * 32;
  static constexpr int kLoadsM8 = 4;   // 8 (the PRMT lookup's choice): 78 -> 109 registers, M = 1 single launch 5-15% slower
  // One row tile at M <= 8 overlaps its batches (x staged at M = 1), as GPTQ 4-bit: decode batch 1
  // +3.5% on llama2-7b, batch 8 +0.6% (docs/lab/2026-11-24-decode-h200.md, run 40).
  static constexpr bool kOverlapM8 = true;
  // And at one row the next batch's slots are loaded as this batch's k-steps free them (kRoll):
  // decode batch 1 +4.0% on llama2-7b, +5.0% on llama3-8b, +3.6% on phi3-mini (runs 258, 261).
  static constexpr bool kRollM1 = true;
  explicit Nf4PairFormat(const Nf4Format& f) : Nf4Format(f) {}
  __device__ static uint32_t* pair_table() {
    __shared__ __align__(16) uint32_t table[kPairWords];
    return table;
  }
  // Fills the table with the CTA's threads; the caller syncs before the first dequant. 16-byte
  // pieces in address order (4 copies a piece, consecutive lanes consecutive pieces: no bank
  // conflicts). kShared (the kernels of 9 rows and more): each warp forms 32 of the 256 words, one
  // lookup a lane, and each piece takes its word from the lane that formed it by a shuffle: decode
  // batch 32 +5.2% on llama2-7b (lab run 145). At one n8 tile each piece's word is looked up again
  // (8 lookups a word): that form measured 1.3% faster at batch 1 (run 145), batch 8 equal.
  template <bool kShared = false>
  __device__ void fill_pairs() const {
    if constexpr (kShared) {
      const int lane = threadIdx.x & 31;
      for (int base = 32 * int(threadIdx.x >> 5); base < 256; base += int(blockDim.x)) {   // warp-uniform
        uint32_t p, unused;
        lookup4(uint32_t(base + lane), p, unused);
#pragma unroll
        for (int j = 0; j < 8; ++j) {   // piece 8 base + 32 j + lane holds the copies of byte base + 4 j + lane / 8
          const uint32_t v = __shfl_sync(0xffffffffu, p, 4 * j + (lane >> 3));
          reinterpret_cast<uint4*>(pair_table())[8 * base + 32 * j + lane] = make_uint4(v, v, v, v);
        }
      }
    } else {
      for (int i = threadIdx.x; i < kPairWords / 4; i += blockDim.x) {
        uint32_t p, unused;
        lookup4(uint32_t(i >> 3), p, unused);
        reinterpret_cast<uint4*>(pair_table())[i] = make_uint4(p, p, p, p);
      }
    }
  }
  // Byte i of w -> a[i] (a0a1 row g, a2a3 row g + 8 at k0, k0 + 1; a4..a7 at k0 + 2, k0 + 3): the
  // byte by one PRMT, its word's shared address (byte x 128 + the lane's column) by one multiply-add
  // from the lane's base, one 32-bit LDS. Written as C (shift, mask, or with the lane, add of the
  // table), ptxas spent ~5.6 integer instructions a lookup (lab run 122). Not volatile: the table
  // is constant once filled (fill_pairs, then a barrier), so the compiler may schedule it freely.
  template <uint32_t SEL>
  __device__ static uint32_t pair_at(uint32_t w, uint32_t base) {
    uint32_t v;
    asm("{\n .reg .b32 b, ad;\n prmt.b32 b, %1, 0, %2;\n mad.lo.u32 ad, b, 128, %3;\n ld.shared.u32 %0, [ad];\n}\n"
        : "=r"(v)
        : "r"(w), "n"(SEL), "r"(base));
    return v;
  }
  // kWide (k_step with 2 or more n8 tiles, M > 8): the lookup as C, whose schedules measured faster
  // there (the PRMT form took the 4096² kernel at 32 rows from 26.9 to 36.2 µs, lab run 129, and at
  // 16 rows from 12.6 to 18.2, run 130; at one n8 tile it is 4-6% faster, run 131).
  template <bool SCALED, bool kWide = false>
  __device__ void dequant(const uint4 (&q)[1], int f, const Prep& p, uint32_t* a) const {
    const uint32_t w = f == 0 ? q[0].x : f == 1 ? q[0].y : f == 2 ? q[0].z : q[0].w;
    if constexpr (kWide) {
      const uint32_t lane4 = (threadIdx.x & 31) * 4;
      const char* t = reinterpret_cast<const char*>(pair_table());
      auto at = [&](uint32_t byte_x128) { return *reinterpret_cast<const uint32_t*>(t + (byte_x128 | lane4)); };
      a[0] = at((w << 7) & 0x7F80u);
      a[1] = at((w >> 1) & 0x7F80u);
      a[2] = at((w >> 9) & 0x7F80u);
      a[3] = at((w >> 17) & 0x7F80u);
    } else {
      const uint32_t base = ptx::smem_addr(pair_table()) + (threadIdx.x & 31) * 4;
      a[0] = pair_at<0x4440>(w, base);
      a[1] = pair_at<0x4441>(w, base);
      a[2] = pair_at<0x4442>(w, base);
      a[3] = pair_at<0x4443>(w, base);
    }
    if constexpr (SCALED) scale(p, a);
  }
};

// f16 weights as stored ([N, K] row-major, K % 64 == 0), for the L2-fed kernel only: the identity
// dequantization, no metadata. The kernel loads each lane's fragments in place (kRowMajor,
// code_ptr): lane (g, c) of row tile t at k-step s reads columns 64s + 16c .. + 15 of rows
// 16t + g (uint4 0, 1) and 16t + g + 8 (uint4 2, 3; rows past N read row N - 1, never stored), and
// fragment f is its columns k0 = 64s + 16c + 4f .. + 3 (a16_mma.cuh's k order, which x's B
// operand follows). A warp's loads of a k-step cover 16 rows x 128 bytes: whole cache lines.
// The point: f16 Linears at decode batch 1 under PDL (cuBLAS's kernels cannot wait under it).
struct F16RowFormat {
  static constexpr int kU4 = 4;
  static constexpr bool kMin = false;
  static constexpr bool kPairTable = false;
  static constexpr bool kOverlapM8 = true;   // both loops at M <= 8 (overlap_variants); the planner picks
  static constexpr bool kRollM1 = false;     // the rolled loads at one row: equal for f16 (run 257)
  static constexpr bool kRowMajor = true;
  static constexpr int kLoadsM8 = 4;
  using Meta = uint32_t;   // none: meta_ptr points at any readable word
  using Prep = int;
  const uint32_t* any_word;
  int N, K;
  __device__ const Meta* meta_ptr(int, int, int, bool) const { return any_word; }
  __device__ float2 scales(const Meta&) const { return make_float2(1.0f, 1.0f); }
  template <bool SCALED>
  __device__ Prep prep(const Meta&) const { return 0; }
  __device__ const uint4* code_ptr(const uint4* W, int tile, int s, int j, int lane) const {
    const int row = min(16 * tile + (lane >> 2) + 8 * (j >> 1), N - 1);
    return W + (int64_t(row) * K + 64 * s + 16 * (lane & 3) + 8 * (j & 1)) / 8;
  }
  template <bool SCALED, bool kWide = false>
  __device__ void dequant(const uint4 (&q)[4], int f, const Prep&, uint32_t* a) const {
    const uint4 &g = q[f >> 1], &g8 = q[2 + (f >> 1)];   // rows g, g + 8: columns 16c + 8 (f >> 1) .. + 7
    const bool upper = f & 1;                             // columns + 4 .. + 7 of those
    a[0] = upper ? g.z : g.x;    // row g, k0 k0+1
    a[1] = upper ? g8.z : g8.x;  // row g + 8
    a[2] = upper ? g.w : g.y;    // row g, k0+2 k0+3
    a[3] = upper ? g8.w : g8.y;
  }
};

// The codes' bits as a16_path.h's tables take them: 4 or 8 (GPTQ), 0 (NF4, either form), -1 (f16
// weights read in place).
template <class Format>
constexpr int code_bits() {
  return std::is_base_of_v<Nf4Format, Format> ? 0 : Format::kRowMajor ? -1 : 4 * Format::kU4;
}

// The format the L2-fed kernel runs: NF4 with its pair table, the others as they are.
template <class Format>
Format mma_format(const Format& f) {
  return f;
}
inline Nf4PairFormat mma_format(const Nf4Format& f) { return Nf4PairFormat(f); }

}  // namespace ptq::cuda::a16
