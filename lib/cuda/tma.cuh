// tma.cuh — the copy engine (TMA) and mbarriers of the sm_90a kernels that stream tiles into
// shared memory (kernels/w8a8.cu, kernels/w8a8_wgmma_gemv.cu, kernels/a16_wgmma.cu): a tensor map
// over an int8 or f16 [rows, K] matrix in boxes of 128 bytes of K (the 128-byte swizzle wgmma's
// descriptors read) and a 3-D one without swizzle, the box copies completing on an mbarrier, a
// box stored back from shared memory (tma_store: a16_wgmma.cu's y), and the mbarrier's init,
// arrive and wait. One definition each, so the
// kernels agree on the layout their wgmma descriptors assume (cuda/ptx.cuh: smem_desc_sw128).
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "core/error.h"
#include "cuda/ptx.cuh"
#include "cuda/runtime.h"

namespace ptq::cuda {

// Bytes of K a box holds: one 128-byte swizzle row.
constexpr int kTmaBoxBytes = 128;

// The driver's tensor-map encoder, looked up once.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    PTQ_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !fn) fail(Errc::io, "GPU", "cuTensorMapEncodeTiled", "not found in the CUDA driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}
// Everything a tensor map is encoded from, and so the key of its cache (cached_tensor_map): the
// element type and bytes, the base, the extents (dims[0] contiguous), the byte strides of dims 1
// and 2, the box, and the swizzle. Parts of a box past the extents are zero-filled (and counted in
// the bytes the box delivers).
struct TmaMapSpec {
  CUtensorMapDataType type;
  int rank, elem_bytes;
  bool swizzle_128b;
  const void* p;
  int64_t dims[3], strides[2];
  int box[3];
  auto key() const {
    return std::make_tuple(int(type), rank, elem_bytes, swizzle_128b, p, dims[0], dims[1], dims[2], strides[0], strides[1], box[0], box[1], box[2]);
  }
};
// A row-major [rows, cols] matrix of elem_bytes-byte elements (the row pitch a multiple of 16
// bytes, p 16-byte aligned) in boxes of 128 bytes of a row x box_rows, 128-byte swizzle.
inline TmaMapSpec tma_spec_2d(CUtensorMapDataType type, int elem_bytes, const void* p, int64_t rows, int64_t cols, int box_rows) {
  return {type, 2, elem_bytes, true, p, {cols, rows, 1}, {cols * elem_bytes, 0}, {kTmaBoxBytes / elem_bytes, box_rows, 1}};
}
// int8 [rows, K] (K a multiple of 16): boxes of 128 columns.
inline TmaMapSpec tma_spec_int8(const int8_t* p, int64_t rows, int64_t K, int box_rows) { return tma_spec_2d(CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p, rows, K, box_rows); }
// f16 [rows, K] (K a multiple of 8): boxes of 64 columns.
inline TmaMapSpec tma_spec_f16(const void* p, int64_t rows, int64_t K, int box_rows) { return tma_spec_2d(CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, p, rows, K, box_rows); }
// 3-D without swizzle over 8-byte words: dims[0] contiguous, strides (bytes, multiples of 16) of
// dims 1 and 2; boxes of box[0..2] words.
inline TmaMapSpec tma_spec_3d_u64(const void* p, const int64_t (&dims)[3], const int64_t (&strides)[2], const int (&box)[3]) {
  return {CU_TENSOR_MAP_DATA_TYPE_UINT64, 3, 8, false, p, {dims[0], dims[1], dims[2]}, {strides[0], strides[1]}, {box[0], box[1], box[2]}};
}
inline CUtensorMap encode_tensor_map(const TmaMapSpec& s) {
  CUtensorMap m;
  cuuint64_t d[3], st[2];
  cuuint32_t b[3], elem[3] = {1, 1, 1};
  for (int i = 0; i < s.rank; ++i) d[i] = cuuint64_t(s.dims[i]), b[i] = cuuint32_t(s.box[i]);
  for (int i = 0; i + 1 < s.rank; ++i) st[i] = cuuint64_t(s.strides[i]);
  const CUresult r = tensor_map_encoder()(&m, s.type, cuuint32_t(s.rank), const_cast<void*>(s.p), d, st, b, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          s.swizzle_128b ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) fail(Errc::io, "GPU", "cuTensorMapEncodeTiled", std::to_string(s.rank) + "-D map failed with CUresult " + std::to_string(int(r)));
  return m;
}
// A tensor map encoded on the host once per spec: a Linear's weights and the decode's activation
// buffers keep their addresses, so a step does not re-encode them. The key is the whole spec, so a
// freed buffer's address reused for another shape or element width gets its own map (lab run 237:
// a key without the codes' width handed an NF4 layer an 8-bit layer's map at the same address).
// Bounded; returned by value, as a later call may clear it.
inline CUtensorMap cached_tensor_map(const TmaMapSpec& spec) {
  static std::mutex mu;
  static std::map<decltype(spec.key()), CUtensorMap> maps;
  std::lock_guard<std::mutex> lock(mu);
  auto it = maps.find(spec.key());
  if (it == maps.end()) {
    if (maps.size() >= 4096) maps.clear();
    it = maps.emplace(spec.key(), encode_tensor_map(spec)).first;
  }
  return it->second;
}

namespace tma {

__device__ __forceinline__ void mbar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(ptx::smem_addr(b)), "r"(count));
}
// The inits visible to the copy engine and the other threads (then a CTA barrier).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_wait(uint64_t* b, int parity) {
  uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(ptx::smem_addr(b)), "r"(parity)
                 : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(ptx::smem_addr(b)) : "memory");
}
// An arrival that also expects `bytes` more from copies completing on b.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(ptx::smem_addr(b)), "r"(bytes) : "memory");
}
// One box of a 2-D tensor map (inner coordinate c0 in elements of K, outer c1 in rows) into shared
// memory at dst (1024-byte aligned for the swizzle), completing on bar.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(ptx::smem_addr(dst)),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(ptx::smem_addr(bar))
               : "memory");
}
// One box of a 3-D tensor map (coordinates in elements) into shared memory at dst (128-byte aligned).
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(ptx::smem_addr(dst)),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(ptx::smem_addr(bar))
               : "memory");
}

// A box of shared memory at src (1024-byte aligned for the swizzle) to the tensor at coordinates
// (c0, c1), in a bulk group of the issuing thread; parts of the box past the extents are not
// written. The thread waits (bulk_wait_read) before src is written again or the CTA exits.
__device__ __forceinline__ void tma_store(const CUtensorMap* map, int c0, int c1, const void* src) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(reinterpret_cast<uint64_t>(map)), "r"(ptx::smem_addr(src)), "r"(c0), "r"(c1)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// bytes (a multiple of 16; src and dst 16-byte aligned) of global memory into shared memory at
// dst by the copy engine, without a tensor map, completing on bar (bench/chain_probe.cu).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, int bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(ptx::smem_addr(dst)), "l"(src), "r"(bytes),
               "r"(ptx::smem_addr(bar))
               : "memory");
}

}  // namespace tma
}  // namespace ptq::cuda
