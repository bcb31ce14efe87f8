// comm.cpp — the NCCL communicator of comm.h (a refusal where the build has no NCCL).
#include "cuda/comm.h"

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/env.h"
#include "core/error.h"
#include "cuda/runtime.h"
#ifdef PTQKIT_HAVE_NCCL
#include <nccl.h>
#endif

namespace ptq::cuda {

#ifdef PTQKIT_HAVE_NCCL

namespace {
// PTQKIT_DIST_TRACE=1: each rank says on stderr when it enters and leaves NCCL's init and every
// collective (seconds since this process's first trace), so that a run that stops shows where.
void trace(int rank, const char* what, size_t n, const char* phase) {
  static const bool on = env_switch("PTQKIT_DIST_TRACE", false);
  if (!on) return;
  static const auto t0 = std::chrono::steady_clock::now();
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "ptqkit: rank %d %9.3f s %s %s (%zu)\n", rank, t, phase, what, n);
}

void nccl_check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  const char* last = ncclGetLastError(nullptr);
  fail(Errc::io, "NCCL", what, std::string(ncclGetErrorString(r)) + (last && *last ? std::string(" (") + last + ")" : ""));
}
}  // namespace

bool nccl_built() { return true; }
std::string nccl_version() {
  int v = 0;
  ncclGetVersion(&v);
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

struct Comm::Impl {
  ncclComm_t comm = nullptr;
  enum State { open, closed, aborted };
  std::atomic<int> state{open};   // one transition out of open: close() or abort(), whichever comes first
  bool leave(State to) {
    int o = open;
    return state.compare_exchange_strong(o, to);
  }
  // Waits for the stream; a collective an abort cut short reports an error, not a hang.
  void usable(const char* what) const {
    if (state == aborted) fail(Errc::io, "NCCL", what, "aborted: a peer process failed");
    if (state == closed) fail(Errc::usage, "NCCL", what, "the communicator is closed");
  }
  // One collective (call() enqueues it: its result) over n elements, traced on entry and exit.
  template <class Call>
  void collective(int rank, const char* what, size_t n, Call call) {
    trace(rank, what, n, "enter");
    nccl_check(call(), what);
    PTQ_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
    if (state == aborted) fail(Errc::io, "NCCL", what, "aborted: a peer process failed");
    trace(rank, what, n, "leave");
  }
};

std::string Comm::new_id() {
  ncclUniqueId id;
  nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  std::string hex;
  char b[3];
  for (char c : id.internal) {
    std::snprintf(b, sizeof b, "%02x", unsigned(uint8_t(c)));
    hex += b;
  }
  return hex;
}

Comm::Comm(const std::string& id, int rank, int size) : p_(std::make_unique<Impl>()), rank_(rank), size_(size) {
  ncclUniqueId u;
  if (id.size() != 2 * sizeof u.internal) fail(Errc::usage, "", "--dist-id", "expected " + std::to_string(2 * sizeof u.internal) + " hex digits");
  for (size_t i = 0; i < sizeof u.internal; ++i) u.internal[i] = char(std::stoi(id.substr(2 * i, 2), nullptr, 16));
  trace(rank, "ncclCommInitRank", size_t(size), "enter");
  nccl_check(ncclCommInitRank(&p_->comm, size, u, rank), "ncclCommInitRank");
  trace(rank, "ncclCommInitRank", size_t(size), "leave");
}

Comm::~Comm() {
  if (p_->comm) abort();   // not closed: this rank is failing, so it does not wait for the others
}

void Comm::close() {
  if (!p_->leave(Impl::closed)) return;
  trace(rank_, "ncclCommFinalize + ncclCommDestroy", size_t(size_), "enter");
  nccl_check(ncclCommFinalize(p_->comm), "ncclCommFinalize");
  nccl_check(ncclCommDestroy(p_->comm), "ncclCommDestroy");
  trace(rank_, "ncclCommFinalize + ncclCommDestroy", size_t(size_), "leave");
}

void Comm::sum(double* dev, size_t n) const {
  p_->usable("ncclAllReduce");
  p_->collective(rank_, "ncclAllReduce (fp64 sum)", n, [&] { return ncclAllReduce(dev, dev, n, ncclFloat64, ncclSum, p_->comm, cudaStreamLegacy); });
}
void Comm::sum(int64_t* dev, size_t n) const {
  p_->usable("ncclAllReduce");
  p_->collective(rank_, "ncclAllReduce (int64 sum)", n, [&] { return ncclAllReduce(dev, dev, n, ncclInt64, ncclSum, p_->comm, cudaStreamLegacy); });
}
void Comm::max(float* dev, size_t n) const {
  p_->usable("ncclAllReduce");
  p_->collective(rank_, "ncclAllReduce (fp32 max)", n, [&] { return ncclAllReduce(dev, dev, n, ncclFloat32, ncclMax, p_->comm, cudaStreamLegacy); });
}
bool Comm::same(uint64_t v) const {
  p_->usable("ncclAllReduce");
  DeviceBuffer<uint64_t> d(2, "digest");
  const uint64_t h[2] = {v, ~v};   // max(v) and max(~v) = ~min(v)
  copy_to_device(d.get(), h, sizeof h);
  p_->collective(rank_, "ncclAllReduce (digest)", 2, [&] { return ncclAllReduce(d.get(), d.get(), 2, ncclUint64, ncclMax, p_->comm, cudaStreamLegacy); });
  uint64_t r[2];
  copy_to_host(r, d.get(), sizeof r);
  return r[0] == v && ~r[1] == v;
}
void Comm::share(void* dev, const std::vector<size_t>& off) const {
  p_->usable("ncclBroadcast");
  if (off.size() != size_t(size_) + 1) fail(Errc::usage, "NCCL", "share", "one offset per rank and the end");
  auto* b = static_cast<uint8_t*>(dev);
  p_->collective(rank_, "ncclGroupEnd (broadcasts)", off.back() - off.front(), [&] {
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size_; ++r)
      nccl_check(ncclBroadcast(b + off[size_t(r)], b + off[size_t(r)], off[size_t(r) + 1] - off[size_t(r)], ncclUint8, r, p_->comm, cudaStreamLegacy),
                 "ncclBroadcast");
    return ncclGroupEnd();
  });
}

void Comm::abort() {
  if (!p_->leave(Impl::aborted)) return;   // closed (or closing: NCCL's own teardown owns it), or aborted already
  ncclCommAbort(p_->comm);
}

#else

bool nccl_built() { return false; }
std::string nccl_version() { return "none"; }
struct Comm::Impl {};
namespace {
[[noreturn]] void no_nccl() {
  fail(Errc::usage, "", "--gpus", "this build has no NCCL: rebuild with -DPTQKIT_NCCL=ON where nccl.h and libnccl are installed");
}
}  // namespace
std::string Comm::new_id() { no_nccl(); }
Comm::Comm(const std::string&, int, int) { no_nccl(); }
Comm::~Comm() = default;
void Comm::sum(double*, size_t) const { no_nccl(); }
void Comm::sum(int64_t*, size_t) const { no_nccl(); }
void Comm::max(float*, size_t) const { no_nccl(); }
bool Comm::same(uint64_t) const { no_nccl(); }
void Comm::share(void*, const std::vector<size_t>&) const { no_nccl(); }
void Comm::close() {}
void Comm::abort() {}

#endif

}  // namespace ptq::cuda
