// pdl.cuh — programmatic dependent launch (Hopper): a kernel launched with launch_pdl may be
// scheduled while the kernel before it in the stream still runs, so a layer's weight stream starts
// during the previous kernel's tail instead of after it and its launch gap.
//
// Contract for a kernel launched with launch_pdl:
//   - before wait_prior_grid() it reads only what no kernel writes (packed weights: written by
//     synchronous host copies when a Linear is built, never by a kernel);
//   - wait_prior_grid() returns once the previous kernel in the stream has completed and its
//     writes are visible: every read of activations or workspaces, and every write, comes after it,
//     and none of those reads goes through the non-coherent path (__ldg, or a const __restrict__
//     pointer the compiler turns into one): the kernel may have launched before the data was
//     written, and such reads measured stale (docs/lab/2026-11-24-decode-h200.md, runs 16-19, 27);
//     use plain loads, __ldcg or cp.async.cg;
//   - allow_dependents() lets the next such kernel be scheduled as this grid's CTAs exit (once
//     every CTA has called it or exited). Without it the next kernel starts at this one's end.
// Below sm_90 both are no-ops and launch_pdl is a plain launch. PTQKIT_PDL=0 turns the attribute
// off (benchmarks compare the two).
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "cuda/runtime.h"

namespace ptq::cuda {

namespace pdl {
__device__ __forceinline__ void wait_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}
}  // namespace pdl

// kern<<<grid, block, smem>>>(args...) on the thread's current stream (cuda/runtime.h), with programmatic stream
// serialization where `pdl` and pdl_enabled(), a shared-memory carveout (percent of the largest)
// when carveout >= 0, and thread-block clusters of cluster.x x cluster.y x cluster.z CTAs when
// cluster.x > 0 (sm_90; an int n is n CTAs along x); a launch error names `what`.
template <class... P, class... A>
void launch_ex(const char* what, bool pdl, int carveout, dim3 cluster, void (*kern)(P...), dim3 grid, dim3 block, size_t smem, A&&... args) {
  cudaLaunchAttribute attr[3];
  unsigned n = 0;
  if (pdl && pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (carveout >= 0) {
    attr[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attr[n++].val.sharedMemCarveout = unsigned(carveout);
  }
  if (cluster.x > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n++].val.clusterDim = {cluster.x, cluster.y, cluster.z};
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = static_cast<cudaStream_t>(current_stream());
  cfg.attrs = attr;
  cfg.numAttrs = n;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kern, std::forward<A>(args)...);
  if (e != cudaSuccess) cudaGetLastError();   // a refused launch: not left for the next launch's check
  check(int(e), what, __FILE__, __LINE__);
}
// How many clusters of `cluster` CTAs of kern (`block` threads, `smem` bytes of dynamic shared
// memory each) the GPU holds at once (cudaOccupancyMaxActiveClusters): a cluster's CTAs share a
// GPC, so this can be fewer than the resident CTAs over the cluster's size. The kernel's shared
// memory attribute must already allow `smem`.
inline int resident_clusters(const void* kern, dim3 cluster, dim3 block, size_t smem) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim = {cluster.x, cluster.y, cluster.z};
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = cluster;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = 0;
  check(int(cudaOccupancyMaxActiveClusters(&n, kern, &cfg)), "cudaOccupancyMaxActiveClusters", __FILE__, __LINE__);
  return n;
}
// The same without clusters.
template <class... P, class... A>
void launch_pdl(const char* what, bool pdl, int carveout, void (*kern)(P...), dim3 grid, dim3 block, size_t smem, A&&... args) {
  launch_ex(what, pdl, carveout, dim3(0), kern, grid, block, smem, std::forward<A>(args)...);
}

}  // namespace ptq::cuda
