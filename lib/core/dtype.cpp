#include "core/dtype.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace ptq {

namespace {
struct DTypeInfo { DType t; const char* name; size_t size; };
constexpr DTypeInfo kTypes[] = {
    {DType::F32, "F32", 4},   {DType::F16, "F16", 2},   {DType::BF16, "BF16", 2},
    {DType::I8, "I8", 1},     {DType::I32, "I32", 4},   {DType::U8, "U8", 1},
    {DType::I64, "I64", 8},   {DType::F64, "F64", 8},   {DType::I16, "I16", 2},
    {DType::U16, "U16", 2},   {DType::U32, "U32", 4},   {DType::U64, "U64", 8},
    {DType::BOOL, "BOOL", 1}, {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
};
const DTypeInfo& info(DType t) { return kTypes[static_cast<int>(t)]; }
}  // namespace

size_t dtype_size(DType t) { return info(t).size; }
std::string_view dtype_name(DType t) { return info(t).name; }
bool dtype_is_float16(DType t) { return t == DType::F16 || t == DType::BF16; }

bool parse_dtype(std::string_view s, DType* out) {
  for (const auto& i : kTypes)
    if (s == i.name) { *out = i.t; return true; }
  return false;
}

float round_to(DType t, float x) {
  switch (t) {
    case DType::F16: return f16_bits_to_f32(f32_to_f16_bits(x));
    case DType::BF16: return bf16_bits_to_f32(f32_to_bf16_bits(x));
    default: return x;
  }
}

// Element loads through memcpy: tensors in a safetensors file need not be aligned to their dtype.
template <class T>
static T load(const void* base, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const uint8_t*>(base) + i * sizeof(T), sizeof(T));
  return v;
}

void convert_to_f32(DType src, const void* in, float* out, size_t n) {
  constexpr size_t kPar = size_t(1) << 20;   // large tensors: every core (a 7B layer is 200M values)
  if (n >= 2 * kPar) {
    const size_t es = dtype_size(src);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < int64_t((n + kPar - 1) / kPar); ++b) {
      const size_t i0 = size_t(b) * kPar;
      convert_to_f32(src, static_cast<const uint8_t*>(in) + i0 * es, out + i0, std::min(kPar, n - i0));
    }
    return;
  }
  switch (src) {
    case DType::F32: std::memcpy(out, in, n * 4); return;
    case DType::F16: for (size_t i = 0; i < n; ++i) out[i] = f16_bits_to_f32(load<uint16_t>(in, i)); return;
    case DType::BF16: for (size_t i = 0; i < n; ++i) out[i] = bf16_bits_to_f32(load<uint16_t>(in, i)); return;
    case DType::I8: for (size_t i = 0; i < n; ++i) out[i] = load<int8_t>(in, i); return;
    case DType::U8: for (size_t i = 0; i < n; ++i) out[i] = load<uint8_t>(in, i); return;
    case DType::I32: for (size_t i = 0; i < n; ++i) out[i] = float(load<int32_t>(in, i)); return;
    default: fail(Errc::format, "", std::string(dtype_name(src)), "cannot convert this dtype to f32");
  }
}

void convert_from_f32(DType dst, const float* in, void* out, size_t n) {
  constexpr size_t kPar = size_t(1) << 20;
  if (n >= 2 * kPar) {
    const size_t es = dtype_size(dst);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < int64_t((n + kPar - 1) / kPar); ++b) {
      const size_t i0 = size_t(b) * kPar;
      convert_from_f32(dst, in + i0, static_cast<uint8_t*>(out) + i0 * es, std::min(kPar, n - i0));
    }
    return;
  }
  switch (dst) {
    case DType::F32: std::memcpy(out, in, n * 4); return;
    case DType::F16: { auto p = static_cast<uint16_t*>(out); for (size_t i = 0; i < n; ++i) p[i] = f32_to_f16_bits(in[i]); return; }
    case DType::BF16: { auto p = static_cast<uint16_t*>(out); for (size_t i = 0; i < n; ++i) p[i] = f32_to_bf16_bits(in[i]); return; }
    default: fail(Errc::format, "", std::string(dtype_name(dst)), "cannot convert f32 to this dtype");
  }
}

}  // namespace ptq
