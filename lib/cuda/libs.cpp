// libs.cpp — cuBLAS, cuSOLVER and (where the build has it) NCCL opened at their first call, not
// when a process starts.
//
// Contract: every cuBLAS, cuSOLVER and NCCL function ptqkit calls is defined here, with the
// parameter list of the library's own declaration (a list that differs does not compile: the
// header declares the same extern "C" name), and forwards to the library's definition, looked up
// once with dlsym. The libraries are opened by soname (LD_LIBRARY_PATH, this binary's run path and
// the loader's cache, as a linked library would be found), then in the folder the build found
// them in. A library or function that cannot be found is a ptq::Error (io) naming it, at that
// first call.
//
// Why: linking libcublas makes every process run libcublasLt's static initializers at start,
// about 0.3 s of CPU and 270 MB resident on a 2-core host, before `ptqkit schemes` prints a line
// or a test binary lists its cases. A process that never touches the GPU's BLAS now never loads
// it. NCCL serves only `quantize --gpus N`: linked, a binary built where it is installed would not
// start on a machine without it, one GPU or none; opened here, only --gpus needs it, and says so.
// A function used without a forwarder here is an undefined symbol at link time: add it below.
#include <dlfcn.h>

#include <cublas_v2.h>
#include <cusolverDn.h>
#ifdef PTQKIT_HAVE_NCCL
#include <nccl.h>
#endif

#include <string>

#include "core/error.h"
#include "cuda/runtime.h"

namespace ptq::cuda {

const char* const kToolkitRemedy =
    "the GPU path needs the CUDA Toolkit's libraries; put their folder on LD_LIBRARY_PATH, or run on the CPU (--device cpu, recipe device: cpu)";

void* open_library(const std::string& soname, const std::string& what, const std::string& dir, const std::string& remedy) {
  if (void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string by_name = dlerror();
  const std::string path = dir + "/" + soname;
  if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string by_path = dlerror();
  fail(Errc::io, soname, "", what + " cannot be loaded (" + by_name + "; " + by_path + "): " + remedy);
}

namespace {
void* cublas() {
  static void* h = open_library("libcublas.so." + std::to_string(CUBLAS_VER_MAJOR), "cuBLAS", PTQKIT_CUDA_LIBRARY_DIR, kToolkitRemedy);
  return h;
}
void* cusolver() {
  static void* h = open_library("libcusolver.so." + std::to_string(CUSOLVER_VER_MAJOR), "cuSOLVER", PTQKIT_CUDA_LIBRARY_DIR, kToolkitRemedy);
  return h;
}
#ifdef PTQKIT_HAVE_NCCL
void* nccl() {
  static void* h = open_library("libnccl.so." + std::to_string(NCCL_MAJOR), "NCCL", PTQKIT_NCCL_LIBRARY_DIR,
                                "quantize --gpus N needs NCCL; install it (Debian: libnccl2) or put its folder on LD_LIBRARY_PATH, "
                                "or run on one GPU (without --gpus)");
  return h;
}
#endif
template <class Fn>
Fn resolve(void* lib, const char* name) {
  dlerror();
  void* f = dlsym(lib, name);
  if (!f) fail(Errc::io, name, "", std::string("not found in the loaded CUDA library: ") + dlerror());
  return reinterpret_cast<Fn>(f);
}
}  // namespace
}  // namespace ptq::cuda

// NAME's definition, returning RET: PARAMS its parameter list, ARGS the same names in a call.
#define PTQ_FORWARD(LIB, RET, NAME, PARAMS, ARGS)                                 \
  extern "C" RET NAME PARAMS {                                                    \
    using Fn = RET(*) PARAMS;                                                     \
    static const Fn f = ::ptq::cuda::resolve<Fn>(::ptq::cuda::LIB(), #NAME);      \
    return f ARGS;                                                                \
  }
#define PTQ_CUBLAS_FN(NAME, PARAMS, ARGS) PTQ_FORWARD(cublas, cublasStatus_t, NAME, PARAMS, ARGS)
#define PTQ_CUSOLVER_FN(NAME, PARAMS, ARGS) PTQ_FORWARD(cusolver, cusolverStatus_t, NAME, PARAMS, ARGS)

PTQ_CUBLAS_FN(cublasCreate_v2, (cublasHandle_t* handle), (handle))
PTQ_CUBLAS_FN(cublasDestroy_v2, (cublasHandle_t handle), (handle))
PTQ_CUBLAS_FN(cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream), (handle, stream))
PTQ_CUBLAS_FN(cublasSgemm_v2,
            (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* alpha, const float* A, int lda,
             const float* B, int ldb, const float* beta, float* C, int ldc),
            (h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc))
PTQ_CUBLAS_FN(cublasDgemm_v2,
            (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const double* alpha, const double* A,
             int lda, const double* B, int ldb, const double* beta, double* C, int ldc),
            (h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc))
PTQ_CUBLAS_FN(cublasDtrmm_v2,
            (cublasHandle_t h, cublasSideMode_t side, cublasFillMode_t uplo, cublasOperation_t trans, cublasDiagType_t diag, int m, int n,
             const double* alpha, const double* A, int lda, const double* B, int ldb, double* C, int ldc),
            (h, side, uplo, trans, diag, m, n, alpha, A, lda, B, ldb, C, ldc))
PTQ_CUBLAS_FN(cublasDtrsm_v2,
            (cublasHandle_t h, cublasSideMode_t side, cublasFillMode_t uplo, cublasOperation_t trans, cublasDiagType_t diag, int m, int n,
             const double* alpha, const double* A, int lda, double* B, int ldb),
            (h, side, uplo, trans, diag, m, n, alpha, A, lda, B, ldb))
PTQ_CUBLAS_FN(cublasDtrsmBatched,
            (cublasHandle_t h, cublasSideMode_t side, cublasFillMode_t uplo, cublasOperation_t trans, cublasDiagType_t diag, int m, int n,
             const double* alpha, const double* const A[], int lda, double* const B[], int ldb, int batch),
            (h, side, uplo, trans, diag, m, n, alpha, A, lda, B, ldb, batch))
PTQ_CUBLAS_FN(cublasSgemmStridedBatched,
            (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* alpha, const float* A, int lda,
             long long int sA, const float* B, int ldb, long long int sB, const float* beta, float* C, int ldc, long long int sC, int batch),
            (h, ta, tb, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch))
PTQ_CUBLAS_FN(cublasGemmEx,
            (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* alpha, const void* A,
             cudaDataType At, int lda, const void* B, cudaDataType Bt, int ldb, const void* beta, void* C, cudaDataType Ct, int ldc,
             cublasComputeType_t compute, cublasGemmAlgo_t algo),
            (h, ta, tb, m, n, k, alpha, A, At, lda, B, Bt, ldb, beta, C, Ct, ldc, compute, algo))
PTQ_CUBLAS_FN(cublasGemmStridedBatchedEx,
            (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* alpha, const void* A,
             cudaDataType At, int lda, long long int sA, const void* B, cudaDataType Bt, int ldb, long long int sB, const void* beta,
             void* C, cudaDataType Ct, int ldc, long long int sC, int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo),
            (h, ta, tb, m, n, k, alpha, A, At, lda, sA, B, Bt, ldb, sB, beta, C, Ct, ldc, sC, batch, compute, algo))

PTQ_CUSOLVER_FN(cusolverDnCreate, (cusolverDnHandle_t* handle), (handle))
PTQ_CUSOLVER_FN(cusolverDnDpotrf_bufferSize, (cusolverDnHandle_t h, cublasFillMode_t uplo, int n, double* A, int lda, int* lwork),
            (h, uplo, n, A, lda, lwork))
PTQ_CUSOLVER_FN(cusolverDnDpotrf,
            (cusolverDnHandle_t h, cublasFillMode_t uplo, int n, double* A, int lda, double* work, int lwork, int* info),
            (h, uplo, n, A, lda, work, lwork, info))
PTQ_CUSOLVER_FN(cusolverDnDpotrfBatched,
            (cusolverDnHandle_t h, cublasFillMode_t uplo, int n, double* A[], int lda, int* info, int batch), (h, uplo, n, A, lda, info, batch))

#ifdef PTQKIT_HAVE_NCCL
#define PTQ_NCCL_FN(NAME, PARAMS, ARGS) PTQ_FORWARD(nccl, ncclResult_t, NAME, PARAMS, ARGS)
PTQ_NCCL_FN(ncclGetVersion, (int* version), (version))
PTQ_NCCL_FN(ncclGetUniqueId, (ncclUniqueId* uniqueId), (uniqueId))
PTQ_NCCL_FN(ncclCommInitRank, (ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank), (comm, nranks, commId, rank))
PTQ_NCCL_FN(ncclCommFinalize, (ncclComm_t comm), (comm))
PTQ_NCCL_FN(ncclCommDestroy, (ncclComm_t comm), (comm))
PTQ_NCCL_FN(ncclCommAbort, (ncclComm_t comm), (comm))
PTQ_FORWARD(nccl, const char*, ncclGetErrorString, (ncclResult_t result), (result))
PTQ_FORWARD(nccl, const char*, ncclGetLastError, (ncclComm_t comm), (comm))
PTQ_NCCL_FN(ncclAllReduce,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),
            (sendbuff, recvbuff, count, datatype, op, comm, stream))
PTQ_NCCL_FN(ncclBroadcast,
            (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream),
            (sendbuff, recvbuff, count, datatype, root, comm, stream))
PTQ_NCCL_FN(ncclGroupStart, (), ())
PTQ_NCCL_FN(ncclGroupEnd, (), ())
#endif
