// linear_types.h — the matrix types of the forward pass and the int8 activation spec of W8A8.
#pragma once
#include <Eigen/Core>
#include <cstdint>

namespace ptq {

using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VecF = Eigen::VectorXf;
using MatI = Eigen::Matrix<int32_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// int8 activations of a W8A8 Linear: per token with a dynamic scale (row absmax / 127), or per
// tensor with a static, calibrated scale. Codes are round-half-even, clamped to [-128, 127].
struct ActQuant {
  enum Mode : uint8_t { none, per_token, per_tensor } mode = none;
  float static_scale = 0;
};

}  // namespace ptq
