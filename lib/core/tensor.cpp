#include "core/tensor.h"

namespace ptq {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

Tensor::Tensor(DType t, Shape s) : dtype(t), shape(std::move(s)), bytes(size_t(ptq::numel(shape)) * dtype_size(t)) {}

Tensor tensor_from_f32(const float* x, Shape shape, DType dtype) {
  Tensor t(dtype, std::move(shape));
  convert_from_f32(dtype, x, t.bytes.data(), size_t(t.numel()));
  return t;
}

std::vector<float> tensor_to_f32(const TensorView& t) {
  std::vector<float> out(size_t(t.numel()));
  convert_to_f32(t.dtype, t.data, out.data(), out.size());
  return out;
}

}  // namespace ptq
