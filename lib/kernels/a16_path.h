// a16_path.h — which kernel serves a 16-bit-activation call (W4A16, W8A16, NF4).
#pragma once

namespace ptq::cuda {

// automatic picks by M: the tensor-core kernel (kernels/a16_mma.cuh) for M <= 64, dequantize to
// f16 + cuBLAS above. The others force one (benchmarks, tests); mma refuses M > 64 (Errc::usage).
enum class A16Path { automatic, mma, dequant };

}  // namespace ptq::cuda
