// comm.h — the communicator between the processes of `quantize --gpus N`: one process per GPU,
// NCCL between them (pipeline/workers.h starts the processes; docs/architecture.md says why one
// process a GPU). A build without NCCL (-DPTQKIT_NCCL=OFF, or none found) has the class, and
// every constructor call refuses (Errc::usage) naming the option. A build with it opens libnccl
// at its first call (cuda/libs.cpp: nccl_version(), which check_gpus calls, or the first Comm).
//
// Every collective runs in place on the legacy default stream (where the forward and the Hessian
// GEMMs run) and returns once it is complete. NCCL's reductions are deterministic for a fixed
// number of ranks on one machine: the same bytes on every rank and in every run.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ptq::cuda {

bool nccl_built();
std::string nccl_version();   // "2.28.3", or "none"

class Comm {
 public:
  static std::string new_id();   // a fresh clique id (hex), made by rank 0 before the others start
  // Rank `rank` of `size` joins clique `id` on the current device (blocks until every rank has).
  Comm(const std::string& id, int rank, int size);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }
  void sum(double* dev, size_t n) const;    // fp64 sums (Hessians)
  void sum(int64_t* dev, size_t n) const;   // token counts
  void max(float* dev, size_t n) const;     // elementwise maxima (SmoothQuant's column max |x|: exact in any order)
  bool same(uint64_t v) const;              // whether every rank passed the same v (a digest of what each computed)
  // Rank r's bytes [off[r], off[r + 1]) of the device buffer `dev` copied to every rank (one
  // broadcast per rank, in place): after it every rank holds every rank's part.
  void share(void* dev, const std::vector<size_t>& off) const;
  // The normal end, on every rank at the same point after its last collective: ncclCommFinalize
  // then ncclCommDestroy, which NCCL 2.28 completes only once every rank has called it (a rank
  // that waits for another process before closing deadlocks both: lab, 2026-11-28). Later calls
  // refuse (Errc::usage); a second close() does nothing. Not covered: a peer that dies after its
  // last collective and before its own close() leaves this one waiting (abort() does not
  // interrupt a close in progress: NCCL's teardown owns the communicator then).
  void close();
  // From another thread, when a peer process has died: calls blocked in a collective return an
  // error instead of waiting forever. A communicator neither closed nor aborted is aborted by its
  // destructor (a failing rank must not wait for its peers).
  void abort();

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
  int rank_ = 0, size_ = 1;
};

}  // namespace ptq::cuda
