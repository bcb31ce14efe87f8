// runtime.h — the CUDA runtime layer: checked calls that name the file and line, device
// discovery that never throws, and device buffers from a caching pool (cudaMalloc'd blocks are
// kept and reused by size; out of memory is an error that says what was being allocated and how
// to need less).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>
#include <utility>

#include "core/env.h"   // env_int, env_switch, env_int_list: the kernels' sweep and on/off switches

namespace ptq::cuda {

bool available();                 // a usable GPU is present (false, not an error, without one)
void synchronize();               // cudaDeviceSynchronize, checked
std::string describe();           // "NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 79.2 GiB" or why none
// The current device's compute capability as major * 10 + minor (90 for sm_90), 0 without a usable
// device. Asked once per process (a process uses one device).
int compute_capability();
// The current device's streaming multiprocessors; asked once per process. Throws without a device.
int sm_count();
// Whether kernels launched with launch_pdl (cuda/pdl.cuh) may overlap the one before them: an
// sm_90+ GPU and PTQKIT_PDL not "0" (env_switch). Decided once per process.
bool pdl_enabled();
void check(int err, const char* what, const char* file, int line);          // cudaError_t
void check_cublas(int st, const char* what, const char* file, int line);    // cublasStatus_t
void check_cusolver(int st, const char* what, const char* file, int line);  // cusolverStatus_t
// cuBLAS, cuSOLVER and NCCL are opened at their first call, not at process start (cuda/libs.cpp).
// This opens a shared library by soname, then in `dir` (where the build found it); one that cannot
// be opened is a ptq::Error (io) naming it and `what`, and saying what to do (`remedy`).
void* open_library(const std::string& soname, const std::string& what, const std::string& dir, const std::string& remedy);
#define PTQ_CUDA(call) ::ptq::cuda::check(int(call), #call, __FILE__, __LINE__)
#define PTQ_CUBLAS(call) ::ptq::cuda::check_cublas(int(call), #call, __FILE__, __LINE__)
#define PTQ_CUSOLVER(call) ::ptq::cuda::check_cusolver(int(call), #call, __FILE__, __LINE__)
#define PTQ_CUDA_LAUNCH(what) ::ptq::cuda::check(int(cudaGetLastError()), what, __FILE__, __LINE__)

// A consumer of device rows [rows, width] in a 16-bit (or fp32) dtype: the GPU forward hands each
// stage's output to one (a Hessian) without knowing what it computes.
struct DeviceRowSink {
  virtual ~DeviceRowSink() = default;
  virtual void add_device(const void* rows_data, int64_t rows) = 0;
};

// The stream every ptqkit kernel (and cuBLAS call) of this thread is issued on: the legacy default
// stream unless set, e.g. to a stream being captured into a CUDA graph (eval/decode_cuda.cu).
// `s` is a cudaStream_t; nullptr is the default stream. Also sets blas_handle()'s stream.
void* current_stream();
void set_current_stream(void* s);

// Device memory from the pool. `what` names the buffer in the out-of-memory message.
void* device_alloc(size_t bytes, const char* what);
void device_free(void* p);
// Blocks freed on this thread while a PoolHold is open are kept by it instead of going back to the
// cache, until it is destroyed. A CUDA graph captured meanwhile keeps the workspaces its kernels
// were given this way: nothing else is handed them (or frees them to the driver) while it lives.
class PoolHold {
 public:
  PoolHold() = default;
  PoolHold(const PoolHold&) = delete;
  PoolHold& operator=(const PoolHold&) = delete;
  ~PoolHold();
  void open();    // from now on this thread's freed blocks are held here (one hold open at a time)
  void close();   // stop collecting; what was collected stays held
  size_t bytes() const;   // what it holds
 private:
  std::vector<std::pair<size_t, void*>> blocks_;
};
size_t pool_peak_bytes();          // peak bytes handed out (the pipeline's peak GPU memory)
void pool_release_cached();        // return cached blocks to the driver
size_t device_free_bytes();        // free on the device plus the pool's cached blocks
void copy_device(void* dst, const void* src, size_t bytes);   // device to device, stream-ordered (may return before it completes)
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void fill_bytes(void* dst, int byte, size_t bytes);             // device memset, synchronous
// A page-locked host buffer of at least `bytes`, reused across calls (grown when needed): fill it
// on the host, then cudaMemcpy from it at full PCIe speed. One per process; main thread only.
void* pinned_staging(size_t bytes);
void upload_from_staging(void* dst, size_t bytes);   // staging -> device, synchronous
// Host <-> device through the staging buffer in 256 MiB parts, each part copied on the host by
// every core: PCIe at page-locked speed for pageable host memory (main thread only).
void copy_to_device_staged(void* dst, const void* src, size_t bytes);
void copy_to_host_staged(void* dst, const void* src, size_t bytes);
void parallel_memcpy(void* dst, const void* src, size_t bytes);   // host to host, by every core

// A page-locked host buffer of its own (e.g. the next layer's weights, filled by another thread).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : n_(o.n_), p_(o.p_) { o.p_ = nullptr; o.n_ = 0; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept { std::swap(n_, o.n_); std::swap(p_, o.p_); return *this; }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* get() const { return p_; }
  size_t size() const { return n_; }
 private:
  size_t n_ = 0;
  void* p_ = nullptr;
};

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t n, const char* what) : n_(n), p_(static_cast<T*>(device_alloc(n * sizeof(T), what))) {}
  ~DeviceBuffer() { if (p_) device_free(p_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : n_(o.n_), p_(o.p_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept { std::swap(n_, o.n_); std::swap(p_, o.p_); return *this; }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
 private:
  size_t n_ = 0;
  T* p_ = nullptr;
};

}  // namespace ptq::cuda
