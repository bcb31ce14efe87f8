// Conversions against hand-computed IEEE bit patterns (not against another conversion routine).
#include <bit>
#include <cmath>
#include <limits>

#include "core/dtype.h"
#include "testing.h"

using namespace ptq;

static float f32(uint32_t b) { return std::bit_cast<float>(b); }
static uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

TEST_CASE("f32 -> f16 rounds to nearest even, with Inf, NaN and subnormals") {
  CHECK(f32_to_f16_bits(1.0f) == 0x3C00);
  CHECK(f32_to_f16_bits(-2.0f) == 0xC000);
  CHECK(f32_to_f16_bits(0.1f) == 0x2E66);
  CHECK(f32_to_f16_bits(65504.0f) == 0x7BFF);                      // largest finite
  CHECK(f32_to_f16_bits(65520.0f) == 0x7C00);                      // halfway to 65536: ties to even = Inf
  CHECK(f32_to_f16_bits(65519.0f) == 0x7BFF);
  CHECK(f32_to_f16_bits(std::numeric_limits<float>::infinity()) == 0x7C00);
  CHECK(f32_to_f16_bits(-std::numeric_limits<float>::infinity()) == 0xFC00);
  const uint16_t nan = f32_to_f16_bits(std::numeric_limits<float>::quiet_NaN());
  CHECK((nan & 0x7C00) == 0x7C00);
  CHECK((nan & 0x03FF) != 0);
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -24)) == 0x0001);        // smallest subnormal
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -25)) == 0x0000);        // tie between 0 and 2^-24: even
  CHECK(f32_to_f16_bits(std::ldexp(3.0f, -25)) == 0x0002);        // tie between 1 and 2 ulps: even
  CHECK(f32_to_f16_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3C00); // tie: down to even
  CHECK(f32_to_f16_bits(1.0f + std::ldexp(3.0f, -11)) == 0x3C02); // tie: up to even
  CHECK(f32_to_f16_bits(-0.0f) == 0x8000);
}

TEST_CASE("f16 -> f32 is exact") {
  CHECK(f16_bits_to_f32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(f16_bits_to_f32(0x3555) == 0.333251953125f);
  CHECK(f16_bits_to_f32(0x7BFF) == 65504.0f);
  CHECK(std::isinf(f16_bits_to_f32(0x7C00)));
  CHECK(std::isnan(f16_bits_to_f32(0x7E00)));
  CHECK(bits(f16_bits_to_f32(0x8000)) == 0x80000000u);
}

TEST_CASE("f32 -> bf16 rounds to nearest even and keeps NaN a NaN") {
  CHECK(f32_to_bf16_bits(1.0f) == 0x3F80);
  CHECK(f32_to_bf16_bits(f32(0x3F808000)) == 0x3F80);   // tie: even
  CHECK(f32_to_bf16_bits(f32(0x3F818000)) == 0x3F82);   // tie: even (up)
  CHECK(f32_to_bf16_bits(f32(0x3F808001)) == 0x3F81);   // above the tie
  CHECK(f32_to_bf16_bits(f32(0x7F7FFFFF)) == 0x7F80);   // max float rounds to Inf
  CHECK(f32_to_bf16_bits(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(f32_to_bf16_bits(f32(0x00010000)) == 0x0001);   // subnormal, exact
  CHECK(f32_to_bf16_bits(-0.0f) == 0x8000);
  const uint16_t snan = f32_to_bf16_bits(f32(0x7F800001));   // naive rounding would give Inf
  CHECK((snan & 0x7F80) == 0x7F80);
  CHECK((snan & 0x007F) != 0);
  CHECK(bf16_bits_to_f32(0x3F80) == 1.0f);
  CHECK(bits(bf16_bits_to_f32(0x0001)) == 0x00010000u);
}

TEST_CASE("dtype names and sizes follow safetensors") {
  DType t;
  CHECK(parse_dtype("BF16", &t));
  CHECK(t == DType::BF16);
  CHECK(dtype_size(t) == 2);
  CHECK(parse_dtype("I32", &t));
  CHECK(dtype_size(t) == 4);
  CHECK_FALSE(parse_dtype("F12", &t));
  CHECK(dtype_name(DType::U8) == "U8");
}

TEST_CASE("bulk conversions agree with the scalar bit patterns") {
  const float in[4] = {1.0f, -2.0f, 65520.0f, std::ldexp(1.0f, -24)};
  uint16_t h[4];
  convert_from_f32(DType::F16, in, h, 4);
  CHECK(h[0] == 0x3C00);
  CHECK(h[1] == 0xC000);
  CHECK(h[2] == 0x7C00);
  CHECK(h[3] == 0x0001);
  float back[4];
  convert_to_f32(DType::F16, h, back, 4);
  CHECK(back[3] == std::ldexp(1.0f, -24));
  const int8_t i8[3] = {-128, 0, 127};
  convert_to_f32(DType::I8, i8, back, 3);
  CHECK(back[0] == -128.0f);
  CHECK(back[2] == 127.0f);
}
