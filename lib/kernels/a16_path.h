// a16_path.h — which kernel serves a 16-bit-activation call (W4A16, W8A16, NF4).
#pragma once

namespace ptq::cuda {

// automatic picks by M: the GEMV (CUDA cores) for M <= 4, the tensor-core kernel
// (kernels/a16_mma.cuh) for M <= 64, dequantize + cuBLAS above. The others force one (benchmarks,
// tests) and refuse an M they do not take (Errc::usage).
enum class A16Path { automatic, gemv, mma, dequant };

}  // namespace ptq::cuda
