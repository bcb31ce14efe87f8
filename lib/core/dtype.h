// dtype.h — element types of tensors and the exact conversions between them.
// f16/bf16 use Eigen::half / Eigen::bfloat16: float -> 16-bit rounds to nearest even,
// keeps NaN a NaN, overflows to Inf, and keeps subnormals.
#pragma once
#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ptq {

enum class DType : uint8_t { F32, F16, BF16, I8, I32, U8, I64, F64, I16, U16, U32, U64, BOOL, F8_E4M3, F8_E5M2 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);               // safetensors spelling: "F32", "BF16", ...
bool parse_dtype(std::string_view s, DType* out);   // false for an unknown name
bool dtype_is_float16(DType t);                     // F16 or BF16

inline uint16_t f32_to_f16_bits(float x) { return Eigen::numext::bit_cast<uint16_t>(Eigen::half(x)); }
inline uint16_t f32_to_bf16_bits(float x) { return Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(x)); }
inline float f16_bits_to_f32(uint16_t b) { return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(b)); }
inline float bf16_bits_to_f32(uint16_t b) { return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(b)); }

// Round a float to the nearest value representable in `t` (F16/BF16; identity for F32).
float round_to(DType t, float x);

// Converts n elements of type `src` (F32, F16, BF16, I8, I32, U8) to float.
void convert_to_f32(DType src, const void* in, float* out, size_t n);
// Converts n floats to `dst` (F32, F16, BF16). Integer targets are not conversions, they are quantization.
void convert_from_f32(DType dst, const float* in, void* out, size_t n);

}  // namespace ptq
