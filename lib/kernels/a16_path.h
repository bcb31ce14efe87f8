// a16_path.h — which kernel serves a 16-bit-activation call (W4A16, W8A16, NF4).
#pragma once

namespace ptq::cuda {

// automatic picks by M: the tensor-core kernel (kernels/a16_mma.cuh) for M <= 64, dequantize to
// f16 + cuBLAS above. The others force one (benchmarks, tests); mma refuses M > 64 (Errc::usage).
enum class A16Path { automatic, mma, dequant };

// The tensor-core kernel's work split: rt row tiles of 16 per warp (1 or 2; 2 up to M = 32) and
// slices warps per CTA, each a K slice. 0 = the planner's choice (one wave of resident CTAs with
// the most (tile, slice) pairs). Forcing it is for sweeps (`bench kernels`, PTQKIT_A16_SWEEP) and
// tests; process-wide, not thread-safe.
struct A16Split {
  int rt = 0, slices = 0;
};
void set_a16_split(A16Split split);

}  // namespace ptq::cuda
