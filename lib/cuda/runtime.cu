#include "cuda/runtime.h"
#include "cuda/blas.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <map>
#include <mutex>
#include <string>
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace ptq::cuda {

namespace {
std::string where(const char* file, int line) { return std::string(file) + ":" + std::to_string(line); }

struct Pool {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;   // size -> block
  std::map<void*, size_t> sizes;
  size_t in_use = 0, peak = 0;
};
Pool& pool() {
  static Pool p;
  return p;
}
size_t round_up(size_t b) { return b < (1u << 20) ? (b + 511) / 512 * 512 : (b + (2u << 20) - 1) / (2u << 20) * (2u << 20); }
}  // namespace

bool available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void synchronize() { PTQ_CUDA(cudaDeviceSynchronize()); }

int compute_capability() {
  static const int cc = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return major * 10 + minor;
  }();
  return cc;
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    PTQ_CUDA(cudaGetDevice(&dev));
    PTQ_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

bool pdl_enabled() {
  static const bool on = env_switch("PTQKIT_PDL", true) && compute_capability() >= 90;
  return on;
}

std::string describe() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no usable GPU (") + cudaGetErrorString(e) + ")";
  if (n == 0) return "no GPU";
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, 0);
  char b[256];
  std::snprintf(b, sizeof b, "%s, sm_%d%d, %d SMs, %.1f GiB", p.name, p.major, p.minor, p.multiProcessorCount, double(p.totalGlobalMem) / (1u << 30));
  return b;
}

void check(int err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  fail(Errc::io, where(file, line), what, std::string("CUDA error: ") + cudaGetErrorString(cudaError_t(err)));
}
void check_cublas(int st, const char* what, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  fail(Errc::io, where(file, line), what, "cuBLAS error " + std::to_string(st));
}
void check_cusolver(int st, const char* what, const char* file, int line) {
  if (st == CUSOLVER_STATUS_SUCCESS) return;
  fail(Errc::io, where(file, line), what, "cuSOLVER error " + std::to_string(st));
}

void* device_alloc(size_t bytes, const char* what) {
  Pool& P = pool();
  std::lock_guard<std::mutex> lock(P.mu);
  const size_t b = round_up(std::max<size_t>(bytes, 1));
  void* p = nullptr;
  auto it = P.free_blocks.lower_bound(b);
  if (it != P.free_blocks.end() && it->first <= 2 * b) {   // reuse a cached block that is not far too big
    p = it->second;
    P.free_blocks.erase(it);
  } else {
    cudaError_t e = cudaMalloc(&p, b);
    if (e == cudaErrorMemoryAllocation) {   // give the cache back and try once more
      cudaGetLastError();
      for (auto& [s, q] : P.free_blocks) { cudaFree(q); P.sizes.erase(q); }
      P.free_blocks.clear();
      e = cudaMalloc(&p, b);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total = 0;
      cudaMemGetInfo(&free_b, &total);
      char m[512];
      std::snprintf(m, sizeof m,
                    "out of GPU memory allocating %.1f MiB (%.1f MiB in use by ptqkit, %.1f of %.1f MiB free on the device); "
                    "reduce calibration.samples or calibration.seq_len, keep the calibration activations on the host "
                    "(gpu_activations: host), or run with device: cpu",
                    double(b) / (1 << 20), double(P.in_use) / (1 << 20), double(free_b) / (1 << 20), double(total) / (1 << 20));
      fail(Errc::io, "GPU", what, m);
    }
  }
  P.sizes[p] = b;
  P.in_use += b;
  P.peak = std::max(P.peak, P.in_use);
  return p;
}

namespace {
thread_local std::vector<std::pair<size_t, void*>>* g_hold = nullptr;   // the open PoolHold's blocks
}

void device_free(void* p) {
  Pool& P = pool();
  std::lock_guard<std::mutex> lock(P.mu);
  auto it = P.sizes.find(p);
  if (it == P.sizes.end()) return;
  if (g_hold) {   // still in use (by a graph), counted as such until the hold ends
    g_hold->emplace_back(it->second, p);
    return;
  }
  P.in_use -= it->second;
  P.free_blocks.emplace(it->second, p);
}

void PoolHold::open() {
  if (g_hold) fail(Errc::usage, "", "PoolHold", "a pool hold is already open on this thread");
  g_hold = &blocks_;
}
void PoolHold::close() {
  if (g_hold == &blocks_) g_hold = nullptr;
}
size_t PoolHold::bytes() const {
  size_t n = 0;
  for (const auto& [b, p] : blocks_) n += b;
  return n;
}
PoolHold::~PoolHold() {
  close();
  Pool& P = pool();
  std::lock_guard<std::mutex> lock(P.mu);
  for (auto [b, p] : blocks_) {
    P.in_use -= b;
    P.free_blocks.emplace(b, p);
  }
}

size_t pool_peak_bytes() { return pool().peak; }

void pool_release_cached() {
  Pool& P = pool();
  std::lock_guard<std::mutex> lock(P.mu);
  for (auto& [s, q] : P.free_blocks) { cudaFree(q); P.sizes.erase(q); }
  P.free_blocks.clear();
}

size_t device_free_bytes() {
  Pool& P = pool();
  std::lock_guard<std::mutex> lock(P.mu);
  size_t free_b = 0, total = 0;
  PTQ_CUDA(cudaMemGetInfo(&free_b, &total));
  for (auto& [s, q] : P.free_blocks) free_b += s;
  return free_b;
}

namespace {
thread_local void* g_stream = nullptr;
}
void* current_stream() { return g_stream; }
void set_current_stream(void* s) {
  g_stream = s;
  PTQ_CUBLAS(cublasSetStream(blas_handle(), static_cast<cudaStream_t>(s)));
}

cublasHandle_t blas_handle() {
  static cublasHandle_t h = [] {
    cublasHandle_t x;
    PTQ_CUBLAS(cublasCreate(&x));
    return x;
  }();
  return h;
}

void copy_device(void* dst, const void* src, size_t bytes) { PTQ_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice)); }
void copy_to_device(void* dst, const void* src, size_t bytes) { PTQ_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice)); }
void copy_to_host(void* dst, const void* src, size_t bytes) { PTQ_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost)); }
void fill_bytes(void* dst, int byte, size_t bytes) {
  PTQ_CUDA(cudaMemset(dst, byte, bytes));
  PTQ_CUDA(cudaDeviceSynchronize());
}

namespace {
struct Staging {
  void* p = nullptr;
  size_t n = 0;
  ~Staging() { if (p) cudaFreeHost(p); }
} g_staging;
}  // namespace

void* pinned_staging(size_t bytes) {
  if (bytes > g_staging.n) {
    if (g_staging.p) PTQ_CUDA(cudaFreeHost(g_staging.p));
    g_staging.p = nullptr;
    g_staging.n = 0;
    PTQ_CUDA(cudaMallocHost(&g_staging.p, bytes));
    g_staging.n = bytes;
  }
  return g_staging.p;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : n_(bytes) {
  if (cudaMallocHost(&p_, bytes) != cudaSuccess) {
    cudaGetLastError();
    fail(Errc::io, "", "pinned host memory", "cannot page-lock " + std::to_string(bytes >> 20) + " MiB");
  }
}
PinnedBuffer::~PinnedBuffer() { if (p_) cudaFreeHost(p_); }

void upload_from_staging(void* dst, size_t bytes) { PTQ_CUDA(cudaMemcpy(dst, g_staging.p, bytes, cudaMemcpyHostToDevice)); }

void parallel_memcpy(void* dst, const void* src, size_t n) {
  const int64_t kPiece = int64_t(1) << 22;
  auto* d = static_cast<uint8_t*>(dst);
  auto* s = static_cast<const uint8_t*>(src);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < int64_t((n + kPiece - 1) / kPiece); ++b)
    std::memcpy(d + b * kPiece, s + b * kPiece, std::min<size_t>(size_t(kPiece), n - size_t(b * kPiece)));
}

namespace {
constexpr size_t kStagedPart = size_t(256) << 20;
}  // namespace

void copy_to_device_staged(void* dst, const void* src, size_t bytes) {
  void* st = pinned_staging(std::min(bytes, kStagedPart));
  for (size_t o = 0; o < bytes; o += kStagedPart) {
    const size_t n = std::min(kStagedPart, bytes - o);
    parallel_memcpy(st, static_cast<const uint8_t*>(src) + o, n);
    PTQ_CUDA(cudaMemcpy(static_cast<uint8_t*>(dst) + o, st, n, cudaMemcpyHostToDevice));
  }
}

void copy_to_host_staged(void* dst, const void* src, size_t bytes) {
  void* st = pinned_staging(std::min(bytes, kStagedPart));
  for (size_t o = 0; o < bytes; o += kStagedPart) {
    const size_t n = std::min(kStagedPart, bytes - o);
    PTQ_CUDA(cudaMemcpy(st, static_cast<const uint8_t*>(src) + o, n, cudaMemcpyDeviceToHost));
    parallel_memcpy(static_cast<uint8_t*>(dst) + o, st, n);
  }
}

}  // namespace ptq::cuda
