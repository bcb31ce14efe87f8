// distributed.h — `quantize --gpus N` (recipe `gpus: N`): data-parallel calibration, one process
// per GPU, NCCL between them (cuda/comm.h).
//
// Why processes, not threads: every CUDA resource ptqkit keeps (the device pool, the cuBLAS and
// cuSOLVER handles, the kernels' plans and split-K counters, page-locked staging) is per process
// and belongs to one device; a process per GPU keeps all of it correct unchanged, as PyTorch's
// DDP does, and a rank that fails cannot corrupt another's memory. This process is rank 0 on the
// first visible GPU; ranks 1..N-1 are this executable started again (`ptqkit dist-worker`), each
// seeing only its own GPU (CUDA_VISIBLE_DEVICES), with cores / N OpenMP threads, killed if rank
// 0 dies (PR_SET_PDEATHSIG); rank 0 aborts the collectives and fails as soon as a worker fails.
//
// What each rank does: the same recipe, model and calibration windows; windows
// [S k / N, S (k + 1) / N) run through its own forward; each group's Hessian (the fp64 sum) and
// token count are summed across the ranks by one NCCL all-reduce before anything reads them
// (gptq/hessian_cuda.h); each group's stacked solve is then split by rows over the ranks, and one
// broadcast per rank gives every rank all quantized weights and codes (backend_cuda.cpp,
// CudaSolver::solve_split); where a solve is not split (an MoE layer's batched experts, Phi-3's
// fused Linears), every rank solves the whole of it. Either way one more all-reduce checks that
// every rank holds the same codes. Rank 0 alone writes the layer store, the export and the report.
//
// SmoothQuant and W8A8: each group's input statistics are every rank's before any is read
// (cuda::StageStats::across_ranks): the column maxima by a max all-reduce, the α search's rows
// (every rank's share of subsample_rows' choice) by one broadcast per rank, so each rank searches
// the same rows, picks the same α and folds the same factors, and W8A8's static scales are the
// maxima over all windows. The one-GPU run's statistics exactly: a maximum is exact in any order,
// and each sampled row is the one the one-GPU run samples.
//
// --save-stats: rank 0 writes the statistics, which are every rank's by then (the Hessians and
// token counts summed, the SmoothQuant statistics combined, the routed counts summed); every rank's
// solves then read the finalized host Hessians, as a saving run's must (DistRank::host_hessians),
// so no rank splits a solve that another does whole. --load-stats runs no calibration forward:
// it runs on one GPU (run_quantize says so), whatever gpus says.
//
// Refused with --gpus, each naming why: SmoothQuant and W8A8 where the forward runs on the CPU
// (gpu_forward: false, or a model the GPU forward does not serve: its statistics are per rank),
// MoE with calibrate_all_experts: false (routing decisions would differ per rank), device: cpu,
// nf4 (data-free: nothing to spread), fewer windows than GPUs.
//
// --resume: rank 0 finds the finished layers in its output's layer store (`DIR.partial/.layers`),
// as a one-GPU run does, and tells the others its first layer to quantize (DistRank::first_layer);
// every rank replays the finished layers from that store through its own windows, so it holds the
// activations an uninterrupted run would.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "pipeline/pipeline.h"

namespace ptq {

nlohmann::json run_quantize_gpus(const Recipe& r, const QuantizeOptions& opt);
// What `--gpus N` needs before any process starts (a GPU device, N visible GPUs, NCCL in the build,
// at least N windows, settings every rank can share): refused naming the field. run_quantize_gpus
// and `quantize --dry-run` call it.
void check_gpus(const Recipe& r);
// Rank `rank` of `size` (`ptqkit dist-worker`): the recipe rank 0 wrote and the clique id it made.
// host_hessians: rank 0 saves statistics (DistRank::host_hessians).
void run_quantize_worker(const std::string& recipe_file, int rank, int size, const std::string& id, bool host_hessians);

}  // namespace ptq
