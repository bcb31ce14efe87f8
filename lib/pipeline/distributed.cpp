// distributed.cpp — the processes of `quantize --gpus N` (contract in distributed.h).
#include "pipeline/distributed.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/progress.h"
#ifdef PTQKIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/comm.h"
#include "cuda/runtime.h"
#endif

extern char** environ;

namespace ptq {

#ifndef PTQKIT_HAVE_CUDA

nlohmann::json run_quantize_gpus(const Recipe& r, const QuantizeOptions&) {
  fail(Errc::usage, r.source, "gpus", "this build has no CUDA (nvcc was not found when it was built)");
}
void run_quantize_worker(const std::string&, int, int, const std::string&, bool) { fail(Errc::usage, "", "dist-worker", "this build has no CUDA"); }

#else

namespace {

// The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (all of them where it is unset).
std::vector<std::string> visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  std::vector<std::string> out;
  if (const char* e = std::getenv("CUDA_VISIBLE_DEVICES"); e && *e) {
    std::stringstream ss(e);
    for (std::string t; std::getline(ss, t, ',');) out.push_back(t);
    if (int(out.size()) > n) out.resize(size_t(n));
  } else {
    for (int i = 0; i < n; ++i) out.push_back(std::to_string(i));
  }
  return out;
}

// Ranks 1..n-1: this executable again, one GPU each. A watcher thread aborts the communicator as
// soon as one exits with an error, so that rank 0's collectives fail instead of waiting forever.
class Workers {
 public:
  Workers(int n, const std::string& recipe_file, const std::string& id, bool host_hessians) {
    const std::vector<std::string> gpus = visible_gpus();
    const int threads = std::max(1, int(std::thread::hardware_concurrency()) / n);
    const pid_t parent = ::getpid();
    // This executable by its own path, so that each rank shows as ptqkit (/proc/self/exe if
    // unreadable); PTQKIT_DIST_EXE names another (a test binary's ranks run the ptqkit CLI).
    std::error_code ec;
    std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    if (ec || exe.empty()) exe = "/proc/self/exe";
    if (const char* e = std::getenv("PTQKIT_DIST_EXE"); e && *e) exe = e;
    for (int rank = 1; rank < n; ++rank) {
      // Everything the child needs is built before fork (only exec and plain system calls after it).
      std::vector<std::string> args = {exe, "-q", "--threads", std::to_string(threads), "dist-worker", "--recipe", recipe_file,
                                       "--rank", std::to_string(rank), "--size", std::to_string(n), "--id", id};
      if (host_hessians) args.push_back("--host-hessians");
      std::vector<std::string> env;
      for (char** e = environ; *e; ++e)
        if (std::string(*e).rfind("CUDA_VISIBLE_DEVICES=", 0) != 0) env.push_back(*e);
      env.push_back("CUDA_VISIBLE_DEVICES=" + gpus[size_t(rank)]);
      // OpenMP threads that sleep when idle (unless the user chose): N processes' spinning
      // threads took the cores their launching threads needed (two H200s, llama2-7b, 256
      // windows: 0.70 s a layer with spinning threads, 0.59 s passive; docs/lab/2026-11-25-gpus-h200.md).
      if (!std::getenv("OMP_WAIT_POLICY")) env.push_back("OMP_WAIT_POLICY=passive");
      std::vector<char*> argv, envp;
      for (auto& a : args) argv.push_back(a.data());
      for (auto& e : env) envp.push_back(e.data());
      argv.push_back(nullptr);
      envp.push_back(nullptr);
      const pid_t pid = ::fork();
      if (pid < 0) fail(Errc::io, "", "--gpus", "fork failed for rank " + std::to_string(rank));
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);   // rank 0 gone: so is this rank
        if (::getppid() != parent) ::_exit(1);
        ::execve(argv[0], argv.data(), envp.data());
        ::_exit(127);
      }
      pids_.push_back(pid);
      status_.push_back(-1);
    }
  }
  ~Workers() {
    stop_watch();
    for (size_t i = 0; i < pids_.size(); ++i)
      if (status_[i] < 0) {   // rank 0 failed: the others are stopped, not left waiting
        ::kill(pids_[i], SIGKILL);
        ::waitpid(pids_[i], nullptr, 0);
      }
  }
  void watch(cuda::Comm& comm) {
    watcher_ = std::thread([this, &comm] {
      while (!stop_) {
        for (size_t i = 0; i < pids_.size(); ++i) {
          std::lock_guard<std::mutex> lock(mu_);
          int st = 0;
          if (status_[i] >= 0 || ::waitpid(pids_[i], &st, WNOHANG) != pids_[i]) continue;
          status_[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
          if (status_[i] != 0) {
            failed_ = int(i) + 1;
            comm.abort();
            return;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  // Waits for every worker; Errc::io naming the first that failed.
  void join() {
    stop_watch();
    for (size_t i = 0; i < pids_.size(); ++i) {
      int st = 0;
      if (status_[i] < 0 && ::waitpid(pids_[i], &st, 0) == pids_[i]) status_[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (status_[i] != 0) fail(Errc::io, "", "--gpus", "rank " + std::to_string(i + 1) + " exited with status " + std::to_string(status_[i]));
    }
  }
  int failed() const { return failed_; }

 private:
  std::vector<pid_t> pids_;
  std::vector<int> status_;   // exit status once reaped, else -1
  std::mutex mu_;
  std::thread watcher_;
  std::atomic<bool> stop_{false};
  std::atomic<int> failed_{0};
  void stop_watch() {
    stop_ = true;
    if (watcher_.joinable()) watcher_.join();
  }
};

// Rank 0's v on every rank: an int64 sum to which the other ranks add 0.
int from_rank0(const cuda::Comm& comm, int v) {
  int64_t x = comm.rank() == 0 ? v : 0;
  cuda::DeviceBuffer<int64_t> d(1, "rank 0's first layer");
  cuda::copy_to_device(d.get(), &x, sizeof x);
  comm.sum(d.get(), 1);
  cuda::copy_to_host(&x, d.get(), sizeof x);
  return int(x);
}

}  // namespace

void check_gpus(const Recipe& r) {
  const int n = r.gpus;
  auto refuse = [&](const std::string& field, const std::string& why) { fail(Errc::usage, r.source, field, "--gpus " + std::to_string(n) + ": " + why); };
  if (r.device == "cpu") refuse("device", "device: cpu runs no GPU");
  if (!cuda::available()) refuse("device", "needs GPUs, but " + cuda::describe());
  if (r.quant.method == "nf4") refuse("quantization.method", "NF4 is data-free: there is no calibration to spread");
  if ((r.smooth.enabled || r.awq.enabled || r.act_mode != ActQuant::none) && !r.gpu_forward && n > 1)
    refuse("gpu_forward", "SmoothQuant's, AWQ's and W8A8's statistics are combined across GPUs only by the GPU forward (gpu_forward: true)");
  if (!r.moe_calibrate_all_experts) refuse("moe.calibrate_all_experts", "false routes each rank's tokens apart; its RTN fallbacks would differ per rank");
  if (r.calibration.samples < n) refuse("calibration.samples", std::to_string(r.calibration.samples) + " windows for " + std::to_string(n) + " GPUs");
  if (!cuda::nccl_built()) refuse("gpus", "this build has no NCCL: rebuild with -DPTQKIT_NCCL=ON where nccl.h and libnccl are installed");
  (void)cuda::nccl_version();   // opens libnccl (cuda/libs.cpp): one that is missing is refused here, naming it, before any worker starts
  const std::vector<std::string> gpus = visible_gpus();
  if (int(gpus.size()) < n) refuse("gpus", std::to_string(gpus.size()) + " GPU(s) visible (" + cuda::describe() + ")");
}

nlohmann::json run_quantize_gpus(const Recipe& r, const QuantizeOptions& opt) {
  const int n = r.gpus;
  check_gpus(r);
  // The effective recipe for the workers, in a private folder removed at the end.
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ptqkit-gpus-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  struct Cleanup { fs::path d; ~Cleanup() { std::error_code ec; fs::remove_all(d, ec); } } cleanup{dir};
  const std::string file = (dir / "recipe.yaml").string();
  YAML::Emitter em;
  em << r.to_yaml();
  write_file_atomic(file, std::string(em.c_str()) + "\n");
  const std::string id = cuda::Comm::new_id();
  const bool host_hessians = !opt.save_stats.empty();   // rank 0 saves statistics: every rank solves from host Hessians
  Workers w(n, file, id, host_hessians);
  omp_set_num_threads(std::max(1, int(std::thread::hardware_concurrency()) / n));   // the cores shared as the workers share them
  cuda::Comm comm(id, 0, n);
  w.watch(comm);
  DistRank d{0, n, &comm, [&comm] { comm.close(); }, [&comm](int l) { return from_rank0(comm, l); }, host_hessians};
  QuantizeOptions o = opt;
  o.dist = &d;
  nlohmann::json rep;
  try {
    rep = run_quantize(r, o);
  } catch (const Error&) {
    if (w.failed()) fail(Errc::io, "", "--gpus", "rank " + std::to_string(w.failed()) + " failed (its error is above); nothing was written");
    throw;
  }
  w.join();
  return rep;
}

void run_quantize_worker(const std::string& recipe_file, int rank, int size, const std::string& id, bool host_hessians) {
  Progress::set_quiet(true);
  const Recipe r = load_recipe(recipe_file);
  try {
    cuda::Comm comm(id, rank, size);
    DistRank d{rank, size, &comm, [&comm] { comm.close(); }, [&comm](int l) { return from_rank0(comm, l); }, host_hessians};
    QuantizeOptions o;
    o.dist = &d;
    run_quantize(r, o);
  } catch (const Error& e) {
    std::fprintf(stderr, "ptqkit: rank %d of %d (CUDA_VISIBLE_DEVICES=%s) failed:\n", rank, size, std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "");
    throw;
  }
}

#endif

}  // namespace ptq
