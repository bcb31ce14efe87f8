#include "model/weights.h"

#include <cstring>

#include "core/error.h"

namespace ptq {

void WeightSource::read_rows_f32(const std::string& name, const std::vector<int32_t>& rows, float* out) const {
  const Shape s = shape(name);
  std::vector<float> all(static_cast<size_t>(numel(s)));
  read_f32(name, all.data());
  const size_t cols = size_t(s[1]);
  for (size_t i = 0; i < rows.size(); ++i) std::memcpy(out + i * cols, all.data() + size_t(rows[i]) * cols, cols * 4);
}

namespace {
TensorView float_tensor(const Checkpoint& ck, const std::string& n) {
  TensorView t = ck.get(n);
  if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16)
    fail(Errc::format, ck.file_of(n), n, "dtype " + std::string(dtype_name(t.dtype)) + " is not a float dtype");
  return t;
}
}  // namespace

void check_rows(const std::vector<int32_t>& rows, int64_t count, const std::string& file, const std::string& n) {
  for (int32_t r : rows)
    if (r < 0 || r >= count) fail(Errc::input, file, n, "row " + std::to_string(r) + " outside [0, " + std::to_string(count) + ")");
}

void read_rows_f32(const Checkpoint& ck, const std::string& n, const std::vector<int32_t>& rows, float* out) {
  const TensorView t = float_tensor(ck, n);
  if (t.shape.size() != 2) fail(Errc::format, ck.file_of(n), n, "rows read from a tensor that is not 2-D");
  const size_t cols = size_t(t.shape[1]), es = dtype_size(t.dtype);
  check_rows(rows, t.shape[0], ck.file_of(n), n);
#pragma omp parallel for schedule(static) if (rows.size() > 1024)
  for (int64_t i = 0; i < int64_t(rows.size()); ++i) convert_to_f32(t.dtype, t.data + size_t(rows[size_t(i)]) * cols * es, out + size_t(i) * cols, cols);
}

void SafetensorsSource::read_f32(const std::string& n, float* out) const {
  const TensorView t = float_tensor(ck_, n);
  convert_to_f32(t.dtype, t.data, out, size_t(t.numel()));
}

void SafetensorsSource::read_rows_f32(const std::string& n, const std::vector<int32_t>& rows, float* out) const { ptq::read_rows_f32(ck_, n, rows, out); }

}  // namespace ptq
