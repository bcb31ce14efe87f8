// relayout_cuda.h — the A16 kernels' fragment order (kernels/relayout.h) formed on the GPU, from
// the codes as a checkpoint stores them (contract in relayout.cu). The loaders upload the stored
// codes and lay them out on the device: one pass over the bytes on the host instead of a
// code-by-code scatter (a 7B model's 7 billion codes).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/relayout.h"

namespace ptq::cuda {

enum class StoredCodes {
  stream,     // `bits`-bit codes, each row its own core/bits.h stream of packed_words(K, bits) words
  nf4_bytes,  // bitsandbytes' NF4: two codes a byte, the first in the high nibble, rows back to back (K even)
};

// `rows` rows of codes as stored, in host memory (a vector, or a mapped checkpoint: any alignment).
struct StoredRows {
  const void* data;
  int64_t rows;
  // Streams only: the rows' words interleaved, word w of row r at w * rows + r (GPTQ's qweight
  // [K * bits / 32, N], whose column r is row r's stream); else each row's words together
  // (QuantizedLinear::packed).
  bool by_column = false;
};

// out (fragment_words(N, K, codes) words, device) = W [N, K] in fragment order, W's rows the parts'
// rows in order (together N), code (r, k) taken from stored column perm[k] of row r (perm: device
// [K], or null for k itself). Rows past N and columns past K hold zero codes. Each part goes to the
// device through pinned staging and is laid out there; on the thread's current stream, returning
// when out is complete.
void upload_relayout(const std::vector<StoredRows>& parts, StoredCodes kind, int bits, int64_t N, int64_t K, const int* perm, FragmentCodes codes, uint32_t* out);

}  // namespace ptq::cuda
