// backend.cpp — the backend factory: the one file of lib/pipeline that knows whether this build
// has CUDA. Everything else in the pipeline talks to backend.h's interfaces.
#include "pipeline/backend.h"

#include "core/error.h"

namespace ptq {

Device select_device(const Recipe& r) {
#ifdef PTQKIT_HAVE_CUDA
  return select_cuda_device(r);
#else
  if (r.device == "cuda") fail(Errc::usage, r.source, "device", "this build has no CUDA (nvcc was not found when it was built); use cpu or auto");
  return Device{false, false, "cpu"};
#endif
}

double Device::peak_gpu_mb() const {
#ifdef PTQKIT_HAVE_CUDA
  if (cuda) return cuda_peak_mb();
#endif
  return 0.0;
}

Backend make_backend(const Device& dev, const Recipe& r, const CalibrationPass& pass, MatF&& X, PhaseTimes& t) {
#ifdef PTQKIT_HAVE_CUDA
  if (dev.cuda) return make_cuda_backend(dev, r, pass, std::move(X), t);
#endif
  Backend b;
  if (pass.saved) b.forward = saved_statistics_forward(pass);
  else b.forward = cpu_forward(pass, std::move(X), r.true_sequential, [](int64_t cols) { return std::make_unique<Hessian>(cols); }, t);
  b.solver = cpu_solver();
  b.forward_description = "cpu (fp32)";
  return b;
}

}  // namespace ptq
