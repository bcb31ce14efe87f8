#include "formats/ggml_blocks.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace ptq {

const char* ggml_type_name(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return "F32";
    case GgmlType::F16: return "F16";
    case GgmlType::BF16: return "BF16";
    case GgmlType::Q4_0: return "Q4_0";
    case GgmlType::Q4_1: return "Q4_1";
    case GgmlType::Q5_0: return "Q5_0";
    case GgmlType::Q5_1: return "Q5_1";
    case GgmlType::Q8_0: return "Q8_0";
    case GgmlType::Q4_K: return "Q4_K";
    case GgmlType::Q5_K: return "Q5_K";
    case GgmlType::Q6_K: return "Q6_K";
  }
  return "?";
}

bool parse_ggml_type(const char* name, GgmlType* t) {
  for (GgmlType x : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
    if (std::string(name) == ggml_type_name(x)) { *t = x; return true; }
  return false;
}

int ggml_block_elems(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: return 1;
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: return kQKK;
    default: return kQK;
  }
}

int ggml_block_bytes(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 4;
    case GgmlType::F16: case GgmlType::BF16: return 2;
    case GgmlType::Q4_0: return sizeof(BlockQ4_0);
    case GgmlType::Q4_1: return sizeof(BlockQ4_1);
    case GgmlType::Q5_0: return sizeof(BlockQ5_0);
    case GgmlType::Q5_1: return sizeof(BlockQ5_1);
    case GgmlType::Q8_0: return sizeof(BlockQ8_0);
    case GgmlType::Q4_K: return sizeof(BlockQ4_K);
    case GgmlType::Q5_K: return sizeof(BlockQ5_K);
    case GgmlType::Q6_K: return sizeof(BlockQ6_K);
  }
  return 0;
}

// The 12 bytes of a K-quant's eight 6-bit scales and mins (llama.cpp's get_scale_min_k4 reads them).
void pack_scales_k4(const int* sc, const int* mc, uint8_t* s) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    const uint8_t ls = uint8_t(sc[j]), lm = uint8_t(mc[j]);
    if (j < 4) {
      s[j] = ls;
      s[j + 4] = lm;
    } else {
      s[j + 4] = uint8_t((ls & 0xF) | ((lm & 0xF) << 4));
      s[j - 4] |= uint8_t((ls >> 4) << 6);
      s[j] |= uint8_t((lm >> 4) << 6);
    }
  }
}
void scale_min_k4(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}
namespace {
// Q5_0 / Q5_1: low nibbles as Q4's (element j and j + 16 share byte j), the fifth bits in a u32.
void pack_q5(const uint8_t* q, uint8_t* qh, uint8_t* qs) {
  uint32_t h = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    qs[j] = uint8_t((q[j] & 0xF) | ((q[j + kQK / 2] & 0xF) << 4));
    h |= uint32_t(q[j] >> 4) << j;
    h |= uint32_t(q[j + kQK / 2] >> 4) << (j + kQK / 2);
  }
  std::memcpy(qh, &h, 4);
}
}  // namespace

void encode_block(GgmlType t, const BlockParams& p, const uint8_t* q, void* out) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: {
      uint8_t qs[kQK / 2];
      for (int j = 0; j < kQK / 2; ++j) qs[j] = uint8_t(q[j] | (q[j + kQK / 2] << 4));
      if (t == GgmlType::Q4_0) { BlockQ4_0 b{p.d, {}}; std::memcpy(b.qs, qs, sizeof qs); std::memcpy(out, &b, sizeof b); }
      else { BlockQ4_1 b{p.d, p.m, {}}; std::memcpy(b.qs, qs, sizeof qs); std::memcpy(out, &b, sizeof b); }
      return;
    }
    case GgmlType::Q5_0: { BlockQ5_0 b{p.d, {}, {}}; pack_q5(q, b.qh, b.qs); std::memcpy(out, &b, sizeof b); return; }
    case GgmlType::Q5_1: { BlockQ5_1 b{p.d, p.m, {}, {}}; pack_q5(q, b.qh, b.qs); std::memcpy(out, &b, sizeof b); return; }
    case GgmlType::Q8_0: {
      BlockQ8_0 b{p.d, {}};
      for (int j = 0; j < kQK; ++j) b.qs[j] = int8_t(int(q[j]) - 128);
      std::memcpy(out, &b, sizeof b);
      return;
    }
    case GgmlType::Q4_K: case GgmlType::Q5_K: {
      // 64 elements at a time: sub-block 2c in the low nibbles of qs[32c ..], 2c + 1 in the high
      // ones; Q5_K's fifth bits in qh[l], bit 2c (2c + 1) for element 64c + l (64c + 32 + l).
      uint8_t scales[12], qs[kQKK / 2], qh[kQKK / 8] = {};
      pack_scales_k4(p.sc, p.mc, scales);
      for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) {
          const uint8_t lo = q[64 * c + l], hi = q[64 * c + 32 + l];
          qs[32 * c + l] = uint8_t((lo & 0xF) | ((hi & 0xF) << 4));
          qh[l] = uint8_t(qh[l] | ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
        }
      if (t == GgmlType::Q4_K) {
        BlockQ4_K b{p.d, p.dmin, {}, {}};
        std::memcpy(b.scales, scales, 12);
        std::memcpy(b.qs, qs, sizeof qs);
        std::memcpy(out, &b, sizeof b);
      } else {
        BlockQ5_K b{p.d, p.dmin, {}, {}, {}};
        std::memcpy(b.scales, scales, 12);
        std::memcpy(b.qh, qh, sizeof qh);
        std::memcpy(b.qs, qs, sizeof qs);
        std::memcpy(out, &b, sizeof b);
      }
      return;
    }
    case GgmlType::Q6_K: {
      // 128 elements at a time: ql[l] holds elements l and l + 64 (low, high nibble), ql[l + 32]
      // elements l + 32 and l + 96; qh[l] their upper two bits, in that order (0, 32, 64, 96).
      BlockQ6_K b{};
      for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
          const uint8_t* e = q + 128 * h + l;
          b.ql[64 * h + l] = uint8_t((e[0] & 0xF) | ((e[64] & 0xF) << 4));
          b.ql[64 * h + l + 32] = uint8_t((e[32] & 0xF) | ((e[96] & 0xF) << 4));
          b.qh[32 * h + l] = uint8_t((e[0] >> 4) | ((e[32] >> 4) << 2) | ((e[64] >> 4) << 4) | ((e[96] >> 4) << 6));
        }
      for (int j = 0; j < 16; ++j) b.scales[j] = int8_t(p.sc[j]);
      b.d = p.d;
      std::memcpy(out, &b, sizeof b);
      return;
    }
    default: fail(Errc::usage, "", ggml_type_name(t), "not a quantized block type");
  }
}

void dequantize_row(GgmlType t, const void* blocks, float* y, int64_t n) {
  const int64_t nb = n / ggml_block_elems(t);
  const uint8_t* base = static_cast<const uint8_t*>(blocks);
  auto block = [&](auto* b, int64_t i) { std::memcpy(b, base + i * int64_t(sizeof *b), sizeof *b); };
  for (int64_t i = 0; i < nb; ++i) {
    float* o = y + i * ggml_block_elems(t);
    switch (t) {
      case GgmlType::Q4_0: {
        BlockQ4_0 b; block(&b, i);
        const float d = f16_bits_to_f32(b.d);
        for (int j = 0; j < kQK / 2; ++j) {
          o[j] = float((b.qs[j] & 0xF) - 8) * d;
          o[j + kQK / 2] = float((b.qs[j] >> 4) - 8) * d;
        }
        break;
      }
      case GgmlType::Q4_1: {
        BlockQ4_1 b; block(&b, i);
        const float d = f16_bits_to_f32(b.d), m = f16_bits_to_f32(b.m);
        for (int j = 0; j < kQK / 2; ++j) {
          o[j] = float(b.qs[j] & 0xF) * d + m;
          o[j + kQK / 2] = float(b.qs[j] >> 4) * d + m;
        }
        break;
      }
      case GgmlType::Q5_0: case GgmlType::Q5_1: {
        uint16_t dh, mh = 0;
        uint8_t qh4[4], qs[kQK / 2];
        if (t == GgmlType::Q5_0) { BlockQ5_0 b; block(&b, i); dh = b.d; std::memcpy(qh4, b.qh, 4); std::memcpy(qs, b.qs, sizeof qs); }
        else { BlockQ5_1 b; block(&b, i); dh = b.d; mh = b.m; std::memcpy(qh4, b.qh, 4); std::memcpy(qs, b.qs, sizeof qs); }
        uint32_t qh;
        std::memcpy(&qh, qh4, 4);
        const float d = f16_bits_to_f32(dh), m = f16_bits_to_f32(mh);
        for (int j = 0; j < kQK / 2; ++j) {
          const int h0 = int(((qh >> j) << 4) & 0x10), h1 = int((qh >> (j + 12)) & 0x10);
          const int x0 = (qs[j] & 0xF) | h0, x1 = (qs[j] >> 4) | h1;
          if (t == GgmlType::Q5_0) { o[j] = float(x0 - 16) * d; o[j + kQK / 2] = float(x1 - 16) * d; }
          else { o[j] = float(x0) * d + m; o[j + kQK / 2] = float(x1) * d + m; }
        }
        break;
      }
      case GgmlType::Q8_0: {
        BlockQ8_0 b; block(&b, i);
        const float d = f16_bits_to_f32(b.d);
        for (int j = 0; j < kQK; ++j) o[j] = float(b.qs[j]) * d;
        break;
      }
      case GgmlType::Q4_K: case GgmlType::Q5_K: {
        uint16_t dh, mh;
        uint8_t scales[12], qs[kQKK / 2], qh[kQKK / 8] = {};
        if (t == GgmlType::Q4_K) { BlockQ4_K b; block(&b, i); dh = b.d; mh = b.dmin; std::memcpy(scales, b.scales, 12); std::memcpy(qs, b.qs, sizeof qs); }
        else { BlockQ5_K b; block(&b, i); dh = b.d; mh = b.dmin; std::memcpy(scales, b.scales, 12); std::memcpy(qs, b.qs, sizeof qs); std::memcpy(qh, b.qh, sizeof qh); }
        const float d = f16_bits_to_f32(dh), dmin = f16_bits_to_f32(mh);
        const bool five = t == GgmlType::Q5_K;
        for (int c = 0; c < 4; ++c) {
          int sc, m;
          scale_min_k4(2 * c, scales, &sc, &m);
          const float d1 = d * float(sc), m1 = dmin * float(m);
          scale_min_k4(2 * c + 1, scales, &sc, &m);
          const float d2 = d * float(sc), m2 = dmin * float(m);
          for (int l = 0; l < 32; ++l) {
            const int lo = (qs[32 * c + l] & 0xF) + (five && (qh[l] >> (2 * c)) & 1 ? 16 : 0);
            const int hi = (qs[32 * c + l] >> 4) + (five && (qh[l] >> (2 * c + 1)) & 1 ? 16 : 0);
            o[64 * c + l] = d1 * float(lo) - m1;
            o[64 * c + 32 + l] = d2 * float(hi) - m2;
          }
        }
        break;
      }
      case GgmlType::Q6_K: {
        BlockQ6_K b; block(&b, i);
        const float d = f16_bits_to_f32(b.d);
        for (int h = 0; h < 2; ++h)
          for (int l = 0; l < 32; ++l) {
            const uint8_t* ql = b.ql + 64 * h;
            const uint8_t qh = b.qh[32 * h + l];
            const int q1 = ((ql[l] & 0xF) | (((qh >> 0) & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 0xF) | (((qh >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4)) - 32;
            const int8_t* sc = b.scales + 8 * h + l / 16;
            float* e = o + 128 * h + l;
            e[0] = d * float(sc[0]) * float(q1);
            e[32] = d * float(sc[2]) * float(q2);
            e[64] = d * float(sc[4]) * float(q3);
            e[96] = d * float(sc[6]) * float(q4);
          }
        break;
      }
      default: fail(Errc::usage, "", ggml_type_name(t), "not a quantized block type");
    }
  }
}

int ggml_block_group(GgmlType t) { return t == GgmlType::Q6_K ? 16 : kQK; }

void decode_block(GgmlType t, const void* block, uint8_t* q, BlockGrid* g) {
  auto read = [&](auto* b) { std::memcpy(b, block, sizeof *b); };
  auto q5 = [&](const uint8_t* qh4, const uint8_t* qs) {   // pack_q5's inverse
    uint32_t h;
    std::memcpy(&h, qh4, 4);
    for (int j = 0; j < kQK / 2; ++j) {
      q[j] = uint8_t((qs[j] & 0xF) | (((h >> j) & 1) << 4));
      q[j + kQK / 2] = uint8_t((qs[j] >> 4) | (((h >> (j + kQK / 2)) & 1) << 4));
    }
  };
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: {
      uint8_t qs[kQK / 2];
      if (t == GgmlType::Q4_0) { BlockQ4_0 b; read(&b); std::memcpy(qs, b.qs, sizeof qs); g[0] = {f16_bits_to_f32(b.d), 0.0f, 8}; }
      else { BlockQ4_1 b; read(&b); std::memcpy(qs, b.qs, sizeof qs); g[0] = {f16_bits_to_f32(b.d), f16_bits_to_f32(b.m), 0}; }
      for (int j = 0; j < kQK / 2; ++j) q[j] = qs[j] & 0xF, q[j + kQK / 2] = qs[j] >> 4;
      return;
    }
    case GgmlType::Q5_0: { BlockQ5_0 b; read(&b); q5(b.qh, b.qs); g[0] = {f16_bits_to_f32(b.d), 0.0f, 16}; return; }
    case GgmlType::Q5_1: { BlockQ5_1 b; read(&b); q5(b.qh, b.qs); g[0] = {f16_bits_to_f32(b.d), f16_bits_to_f32(b.m), 0}; return; }
    case GgmlType::Q8_0: {
      BlockQ8_0 b;
      read(&b);
      for (int j = 0; j < kQK; ++j) q[j] = uint8_t(int(b.qs[j]) + 128);
      g[0] = {f16_bits_to_f32(b.d), 0.0f, 128};
      return;
    }
    case GgmlType::Q4_K: case GgmlType::Q5_K: {
      uint16_t dh, mh;
      uint8_t scales[12], qs[kQKK / 2], qh[kQKK / 8] = {};
      if (t == GgmlType::Q4_K) { BlockQ4_K b; read(&b); dh = b.d; mh = b.dmin; std::memcpy(scales, b.scales, 12); std::memcpy(qs, b.qs, sizeof qs); }
      else { BlockQ5_K b; read(&b); dh = b.d; mh = b.dmin; std::memcpy(scales, b.scales, 12); std::memcpy(qs, b.qs, sizeof qs); std::memcpy(qh, b.qh, sizeof qh); }
      const float d = f16_bits_to_f32(dh), dmin = f16_bits_to_f32(mh);
      for (int j = 0; j < 8; ++j) {
        int sc, m;
        scale_min_k4(j, scales, &sc, &m);
        g[j] = {d * float(sc), -(dmin * float(m)), 0};
      }
      for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) {
          q[64 * c + l] = uint8_t((qs[32 * c + l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4));
          q[64 * c + 32 + l] = uint8_t((qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4));
        }
      return;
    }
    case GgmlType::Q6_K: {
      BlockQ6_K b;
      read(&b);
      const float d = f16_bits_to_f32(b.d);
      for (int j = 0; j < 16; ++j) g[j] = {d * float(b.scales[j]), 0.0f, 32};
      for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
          const uint8_t* ql = b.ql + 64 * h;
          const uint8_t qh = b.qh[32 * h + l];
          uint8_t* e = q + 128 * h + l;
          e[0] = uint8_t((ql[l] & 0xF) | (((qh >> 0) & 3) << 4));
          e[32] = uint8_t((ql[l + 32] & 0xF) | (((qh >> 2) & 3) << 4));
          e[64] = uint8_t((ql[l] >> 4) | (((qh >> 4) & 3) << 4));
          e[96] = uint8_t((ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4));
        }
      return;
    }
    default: fail(Errc::usage, "", ggml_type_name(t), "not a quantized block type");
  }
}

}  // namespace ptq
