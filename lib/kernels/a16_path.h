// a16_path.h — which kernel serves a 16-bit-activation call (W4A16, W8A16, NF4).
#pragma once
#include <cstdint>

namespace ptq::cuda {

// automatic picks by shape (a16_auto_path): the tensor-core kernel with x read through L1/L2
// (kernels/a16_mma.cuh, `mma`) for small M, the one with x staged in shared memory
// (kernels/a16_shared_x.cuh, `shared_x`) for 33..64 rows of a layer larger than 4096 x 4096,
// dequantize to f16 + cuBLAS above 64 rows. The others force one (benchmarks, tests); mma
// refuses M > 64 and shared_x M > 128 (Errc::usage).
enum class A16Path { automatic, mma, shared_x, dequant };

// Crossovers measured on the H100 (docs/benchmarks.md, "x staged in shared memory"): at 33..64
// rows shared_x wins on the Llama MLP shapes (W4 M = 64: 0.63-0.71x -> 0.93-1.07x cuBLAS f16);
// on a 4096 x 4096 layer it needs 4 K slices to fill the GPU and loses back to back; at 17..32
// rows it wins only on some shapes; above 64 rows the dequantized weights through cuBLAS are as
// fast.
constexpr int64_t kA16MmaMaxM = 64, kA16SharedXMaxM = 128;   // what a forced mma / shared_x takes; automatic: tensor cores up to 64
constexpr A16Path a16_auto_path(int64_t M, int64_t N, int64_t K) {
  return M > kA16MmaMaxM ? A16Path::dequant : M >= 33 && N * K > int64_t(4096) * 4096 ? A16Path::shared_x : A16Path::mma;
}
constexpr const char* a16_path_name(A16Path p) {
  return p == A16Path::mma ? "mma" : p == A16Path::shared_x ? "shared_x" : p == A16Path::dequant ? "dequant" : "automatic";
}

// The tensor-core kernels' work split: rt row tiles of 16 per warp (mma only: 1 or 2, 2 up to
// M = 32), slices K slices (mma: warps of one CTA; shared_x: CTAs summed by the last to arrive),
// warps row warps per CTA (shared_x only: 4, 8, or 16 up to M = 64). 0 = the planner's choice. Forcing it is for sweeps (`bench kernels`, PTQKIT_A16_SWEEP) and tests;
// process-wide, not thread-safe.
struct A16Split {
  int rt = 0, slices = 0, warps = 0;
};
void set_a16_split(A16Split split);

}  // namespace ptq::cuda
