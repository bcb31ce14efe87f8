// tensor.h — a tensor is a dtype, a shape and bytes: either owned (Tensor) or borrowed from a
// mapped file (TensorView). Compute happens on Eigen matrices; these types carry data in and out.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ptq {

using Shape = std::vector<int64_t>;
int64_t numel(const Shape& s);
std::string shape_str(const Shape& s);   // "[4096, 11008]"

struct TensorView {
  DType dtype{DType::F32};
  Shape shape;
  const uint8_t* data{nullptr};
  size_t nbytes{0};
  int64_t numel() const { return ptq::numel(shape); }
};

struct Tensor {
  DType dtype{DType::F32};
  Shape shape;
  std::vector<uint8_t> bytes;
  Tensor() = default;
  Tensor(DType t, Shape s);                       // zero-filled
  int64_t numel() const { return ptq::numel(shape); }
  TensorView view() const { return {dtype, shape, bytes.data(), bytes.size()}; }
  template <class T> T* as() { return reinterpret_cast<T*>(bytes.data()); }
  template <class T> const T* as() const { return reinterpret_cast<const T*>(bytes.data()); }
};

// Float tensors from/to f32 buffers (dtype F32, F16 or BF16; the input may be any convertible dtype).
Tensor tensor_from_f32(const float* x, Shape shape, DType dtype);
std::vector<float> tensor_to_f32(const TensorView& t);
// A tensor holding v's bytes as they are (v.size() * sizeof(T) must be the shape's bytes).
template <class T>
Tensor tensor_of_raw(DType t, Shape s, const std::vector<T>& v) {
  Tensor x(t, std::move(s));
  std::memcpy(x.bytes.data(), v.data(), x.bytes.size());
  return x;
}

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

}  // namespace ptq
