// The A16 kernels' fragment order (lib/kernels/relayout.h) on the CPU: every code lands in its own
// bits, the inverse reads each back (unrelayout(relayout(codes)) == codes), and hand-placed
// anchors match the layout documented in docs/fragment-layout.md.
#include <set>

#include "core/rng.h"
#include "kernels/relayout.h"
#include "testing.h"

using namespace ptq;

TEST_CASE("relayout: fragment order round-trips every code and uses each bit once (GPTQ 4/8-bit, NF4, ragged N and K)") {
  const std::pair<int64_t, int64_t> shapes[] = {{16, 64}, {1, 16}, {37, 80}, {50, 200}, {64, 256}};
  for (FragmentCodes fc : {FragmentCodes::gptq4, FragmentCodes::gptq8, FragmentCodes::nf4}) {
    const int bits = fragment_code_bits(fc);
    for (auto [N, K] : shapes) {
      Rng r(uint64_t(N * 1000 + K + bits));
      std::vector<uint32_t> codes(size_t(N * K));
      for (auto& c : codes) c = uint32_t(r.next() & ((1u << bits) - 1));
      const std::vector<uint32_t> W = relayout_codes(N, K, fc, [&](int64_t i, int64_t k) { return codes[size_t(i * K + k)]; });
      REQUIRE(W.size() == fragment_words(N, K, fc));
      std::set<std::pair<size_t, int>> used;
      int64_t wrong = 0;
      for (int64_t i = 0; i < N; ++i)
        for (int64_t k = 0; k < K; ++k) {
          const FragmentBits b = fragment_bits(i, k, (K + 63) / 64, fc);
          CHECK(b.word < W.size());
          CHECK(b.shift + bits <= 32);
          CHECK(used.insert({b.word, b.shift}).second);   // no two codes share bits
          wrong += fragment_code(W, i, k, K, fc) != codes[size_t(i * K + k)];
        }
      CHECK(wrong == 0);
      // bits no code owns (rows past N, columns past K) stay zero
      std::vector<uint32_t> mask(W.size(), 0);
      for (auto [w, s] : used) mask[w] |= ((1u << bits) - 1) << s;
      for (size_t w = 0; w < W.size(); ++w) CHECK((W[w] & ~mask[w]) == 0u);
    }
  }
}

TEST_CASE("relayout: anchors of the documented layout (word, bit) for 4-bit GPTQ, 8-bit GPTQ and NF4") {
  const int64_t KS = 2;   // K = 128
  auto at = [&](int64_t r, int64_t k, FragmentCodes fc) { return fragment_bits(r, k, KS, fc); };
  using F = FragmentCodes;
  // 4-bit GPTQ: lane = (row % 8) * 4 + (k % 64) / 16, word lane * 4 + fragment; pair hi + 2 (e / 2) at 4p, +16 for odd e
  CHECK(at(0, 0, F::gptq4).word == 0);
  CHECK(at(0, 0, F::gptq4).shift == 0);
  CHECK(at(0, 1, F::gptq4).shift == 16);
  CHECK(at(8, 0, F::gptq4).shift == 4);
  CHECK(at(0, 2, F::gptq4).shift == 8);
  CHECK(at(8, 3, F::gptq4).shift == 16 + 12);
  CHECK(at(0, 4, F::gptq4).word == 1);
  CHECK(at(0, 16, F::gptq4).word == 4);
  CHECK(at(1, 0, F::gptq4).word == 16);
  CHECK(at(0, 64, F::gptq4).word == 32 * 4);          // k-step 1 of tile 0
  CHECK(at(16, 0, F::gptq4).word == 2 * 32 * 4);      // tile 1 (after both k-steps of tile 0)
  // 8-bit GPTQ: two uint4 per lane; fragment f in uint4 f / 2, word (f % 2) * 2 + e / 2, byte hi (+2 for odd e)
  CHECK(at(0, 0, F::gptq8).word == 0);
  CHECK(at(8, 0, F::gptq8).shift == 8);
  CHECK(at(0, 1, F::gptq8).shift == 16);
  CHECK(at(0, 2, F::gptq8).word == 1);
  CHECK(at(0, 4, F::gptq8).word == 2);
  CHECK(at(0, 8, F::gptq8).word == 32 * 4);           // fragment 2: the lane's second uint4
  CHECK(at(0, 16, F::gptq8).word == 4);
  // NF4: nibble (e / 2) * 4 + hi * 2 + e % 2
  CHECK(at(0, 1, F::nf4).shift == 4);
  CHECK(at(8, 0, F::nf4).shift == 8);
  CHECK(at(0, 2, F::nf4).shift == 16);
  CHECK(at(8, 3, F::nf4).shift == 28);
}
