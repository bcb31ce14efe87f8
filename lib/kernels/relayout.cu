// relayout.cu — the A16 kernels' fragment order (kernels/relayout.h) formed on the GPU at load.
//
// Contract. In (device, one part at a time): rows [r0, r0 + rows) of W [N, K] as stored
// (StoredCodes): little-endian `bits`-bit streams (1..8 bits), each row's words together
// (QuantizedLinear::packed, compressed-tensors' rows, GGUF's blocks decoded) or interleaved by
// column (GPTQ's qweight [K * bits / 32, N]), or bitsandbytes' NF4 bytes; an optional permutation
// perm [K] of the columns (act-order: the kernel's column k is stored column perm[k]). Out
// (device): fragment_words(N, K, codes) uint32 in fragment order, every code at the word and shift
// that fragment_bits gives (the same constexpr function the host path calls); rows past N and
// columns past K zero.
// Work: one CTA a block of 16 rows x 64 columns (a tile's k-step: its words are a run of their own,
// laid out alike in every block); each thread fetches codes of the block and ORs each into its
// word in shared memory; the block's words are then stored, or ORed into `out` where the block's
// tile is shared with another part (out zeroed first). Exact: integer moves only.
// Reference: relayout_rows (host), itself checked against relayout_codes code by code
// (tests/test_relayout.cpp); tests/test_kernels_cuda.cpp checks upload_relayout's words equal
// relayout_rows' bit for bit (1..8-bit streams in both layouts, parts meeting inside a tile,
// permutations, NF4).
#include "kernels/relayout_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "core/bits.h"
#include "core/error.h"
#include "cuda/runtime.h"

namespace ptq::cuda {
namespace {

template <StoredCodes kKind>
__global__ void relayout_kernel(const uint32_t* __restrict__ stored, int bits, int64_t row_stride, int64_t word_stride, int64_t r0, int64_t rows,
                                int64_t N, int64_t K, const int* __restrict__ perm, FragmentCodes codes, uint32_t* __restrict__ out) {
  __shared__ uint32_t block[256];   // one block's words: 128 at 4 bits, 256 at 8
  const int64_t KS = gridDim.x, s = blockIdx.x, t = r0 / 16 + blockIdx.y;
  const int words = 128 * (fragment_code_bits(codes) / 4);
  for (int i = int(threadIdx.x); i < words; i += int(blockDim.x)) block[i] = 0;
  __syncthreads();
  for (int i = int(threadIdx.x); i < 16 * 64; i += int(blockDim.x)) {
    const int rr = i / 64, kk = i % 64;
    const int64_t r = 16 * t + rr, k = 64 * s + kk;
    if (r < r0 || r >= r0 + rows || k >= K) continue;
    const int64_t col = perm ? perm[k] : k, lr = r - r0;
    uint32_t code;
    if constexpr (kKind == StoredCodes::nf4_bytes) {
      const uint8_t b = reinterpret_cast<const uint8_t*>(stored)[(lr * K + col) / 2];
      code = col % 2 ? b & 15u : b >> 4;
    } else {
      const int64_t bit = col * bits, w = bit / 32;
      const int off = int(bit % 32);
      uint64_t v = stored[lr * row_stride + w * word_stride];
      if (off + bits > 32) v |= uint64_t(stored[lr * row_stride + (w + 1) * word_stride]) << 32;   // a code across two words (3-bit streams); never past the row's last word
      code = uint32_t(v >> off) & ((1u << bits) - 1);
    }
    const FragmentBits b = fragment_bits(rr, kk, 1, codes);
    atomicOr(&block[b.word], code << b.shift);
  }
  __syncthreads();
  // The tile's rows below N all in this part: its words are whole here.
  const bool whole = 16 * t >= r0 && std::min<int64_t>(16 * t + 16, N) <= r0 + rows;
  uint32_t* dst = out + size_t(t * KS + s) * size_t(words);
  for (int i = int(threadIdx.x); i < words; i += int(blockDim.x)) {
    if (whole) dst[i] = block[i];
    else atomicOr(&dst[i], block[i]);
  }
}

}  // namespace

void upload_relayout(const std::vector<StoredRows>& parts, StoredCodes kind, int bits, int64_t N, int64_t K, const int* perm, FragmentCodes codes, uint32_t* out) {
  if (bits < 1 || bits > fragment_code_bits(codes))
    fail(Errc::usage, "", "bits", "the fragment layout holds codes of 1 to " + std::to_string(fragment_code_bits(codes)) + " bits, got " + std::to_string(bits));
  if (kind == StoredCodes::nf4_bytes && (K % 2 || perm || bits != 4)) fail(Errc::usage, "", "NF4", "4-bit codes in rows of whole bytes (K even), no permutation");
  int64_t rows = 0;
  for (const StoredRows& p : parts) rows += p.rows;
  if (rows != N) fail(Errc::usage, "", "codes", "the parts hold " + std::to_string(rows) + " rows, the Linear " + std::to_string(N));
  const int64_t KS = (K + 63) / 64, tiles = (N + 15) / 16, row_words = packed_words(K, bits);
  if (KS == 0 || tiles == 0) return;
  if (tiles > 65535) fail(Errc::usage, "", "out_features", "at most 65535 tiles of 16 rows, got " + std::to_string(N));
  auto* st = static_cast<cudaStream_t>(current_stream());
  if (parts.size() > 1) PTQ_CUDA(cudaMemsetAsync(out, 0, fragment_words(N, K, codes) * 4, st));   // parts meeting inside a tile OR into it
  auto bytes_of = [&](const StoredRows& p) { return kind == StoredCodes::nf4_bytes ? size_t(p.rows * K / 2) : size_t(p.rows * row_words) * 4; };
  size_t most = 0;
  for (const StoredRows& p : parts) most = std::max(most, bytes_of(p));
  DeviceBuffer<uint32_t> stored((most + 3) / 4, "codes as stored");
  int64_t r0 = 0;
  for (const StoredRows& p : parts) {
    if (p.rows == 0) continue;
    copy_to_device_staged(stored.get(), p.data, bytes_of(p));
    const dim3 grid{unsigned(KS), unsigned((r0 + p.rows - 1) / 16 - r0 / 16 + 1)};
    const int64_t row_stride = p.by_column ? 1 : row_words, word_stride = p.by_column ? p.rows : 1;
    if (kind == StoredCodes::nf4_bytes)
      relayout_kernel<StoredCodes::nf4_bytes><<<grid, 256, 0, st>>>(stored.get(), bits, row_stride, word_stride, r0, p.rows, N, K, perm, codes, out);
    else
      relayout_kernel<StoredCodes::stream><<<grid, 256, 0, st>>>(stored.get(), bits, row_stride, word_stride, r0, p.rows, N, K, perm, codes, out);
    PTQ_CUDA_LAUNCH("relayout_kernel");
    PTQ_CUDA(cudaStreamSynchronize(st));   // before the next part overwrites `stored`, and before it goes back to the pool
    r0 += p.rows;
  }
}

}  // namespace ptq::cuda
