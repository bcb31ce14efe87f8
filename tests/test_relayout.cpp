// The A16 kernels' fragment order (lib/kernels/relayout.h) on the CPU: every code lands in its own
// bits, the inverse reads each back (unrelayout(relayout(codes)) == codes), and hand-placed
// anchors match the layout documented in docs/fragment-layout.md. And which grids the kernels take
// in that layout (a16_grid.h), with the runs of columns they hold groups in.
#include <algorithm>
#include <cmath>
#include <set>

#include "core/bits.h"
#include "core/rng.h"
#include "kernels/a16_grid.h"
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

// The loaders' path: the words of relayout_rows (a tile's rows at a time, one block's map) are
// those of relayout_codes (code by code through fragment_bits) on every layout and ragged shape,
// rows read from a bitstream by unpack_stream, whose bytes are unpack_bit's at every width.
TEST_CASE("relayout: whole rows give the words of the code-by-code reference, and unpack_stream reads the bitstream as unpack_bit") {
  for (int bits = 1; bits <= 8; ++bits) {
    for (int64_t n : {1, 7, 32, 33, 100, 257}) {
      Rng r(uint64_t(bits * 1000 + n));
      std::vector<uint32_t> v(static_cast<size_t>(n));
      for (auto& x : v) x = uint32_t(r.next() & ((1u << bits) - 1));
      std::vector<uint32_t> w(size_t(packed_words(n, bits)));
      pack_bits(v.data(), n, bits, w.data());
      std::vector<uint8_t> got(static_cast<size_t>(n));
      unpack_stream(w.data(), n, bits, got.data());
      int64_t wrong = 0;
      for (int64_t k = 0; k < n; ++k) wrong += got[size_t(k)] != unpack_bit(w.data(), k, bits) || got[size_t(k)] != v[size_t(k)];
      INFO(bits << " bits, " << n << " values");
      CHECK(wrong == 0);
    }
  }
  const std::pair<int64_t, int64_t> shapes[] = {{16, 64}, {1, 16}, {37, 80}, {50, 200}, {64, 256}, {300, 4160}};
  for (FragmentCodes fc : {FragmentCodes::gptq4, FragmentCodes::gptq8, FragmentCodes::nf4}) {
    const int bits = fragment_code_bits(fc);
    for (auto [N, K] : shapes) {
      INFO(bits << "-bit layout " << int(fc) << ", " << N << " x " << K);
      Rng r(uint64_t(N * 7 + K + bits));
      std::vector<uint8_t> codes(size_t(N * K));
      for (auto& c : codes) c = uint8_t(r.next() & ((1u << bits) - 1));
      const std::vector<uint32_t> want = relayout_codes(N, K, fc, [&](int64_t i, int64_t k) { return codes[size_t(i * K + k)]; });
      const std::vector<uint32_t> got = relayout_rows(N, K, fc, [&](int64_t i, uint8_t* row) { std::copy_n(codes.data() + i * K, K, row); });
      CHECK(got == want);
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

// Which grids the A16 kernels take (a16_grid.h: the GPU loaders ask it, and dequantize what it
// refuses; W4A16Linear::from_quantized refuses by it), and the equal runs of columns the kernels hold
// them in. Each refusal names its field. The grids are the quantizer's own (QuantizedLinear::empty):
// distilled-13m's 384-wide inputs at group_size 256 give groups of 256 and 128 columns, which run as
// three runs of 128.
TEST_CASE("a16_takes: the grids the A16 kernels take, their runs of columns, and each refusal naming its field") {
  auto grid = [](int bits, int64_t rows, int64_t cols, int group, GridForm form = GridForm::integer_zero) {
    QuantSpec s;
    s.bits = bits;
    s.group_size = group;
    s.form = form;
    return QuantizedLinear::empty(rows, cols, s);
  };
  auto refusal = [](const QuantizedLinear& q) {
    A16Refusal why;
    return a16_takes(q, &why) ? std::string("taken") : why.field;
  };
  // Taken, with the runs' width: every code width 1..8, one group, groups of 16 .. 128 columns,
  // act-order's g_idx, unequal groups, mins.
  for (int bits = 1; bits <= 8; ++bits) CHECK(refusal(grid(bits, 24, 256, 128)) == "taken");
  CHECK(a16_group_columns(grid(4, 24, 256, 128)) == 128);
  CHECK(refusal(grid(4, 8, 64, -1)) == "taken");     // stories260k's 64-wide Linears: one group
  CHECK(a16_group_columns(grid(4, 8, 64, -1)) == 64);
  CHECK(a16_group_columns(grid(4, 8, 96, 16)) == 16);
  CHECK(a16_group_columns(grid(4, 8, 96, 48)) == 48);
  QuantizedLinear act = grid(4, 8, 256, 64);
  for (int64_t c = 0; c < 256; ++c) act.g_idx[size_t(c)] = int32_t((c * 7) % 4);   // a permutation: 64 columns a group
  CHECK(refusal(act) == "taken");
  CHECK(a16_group_columns(act) == 64);
  CHECK(refusal(grid(4, 8, 384, 256)) == "taken");   // groups of 256 and 128: runs of 128
  CHECK(a16_group_columns(grid(4, 8, 384, 256)) == 128);
  CHECK(a16_group_columns(grid(4, 8, 80, 48)) == 16);   // 48 and 32: runs of 16
  CHECK(a16_group_columns(grid(4, 8, 1024, 384)) == 128);   // 384, 384, 256
  CHECK(refusal(grid(4, 8, 256, 32, GridForm::f16_min)) == "taken");
  CHECK(a16_group_columns(grid(4, 8, 256, 32, GridForm::f16_min)) == 32);
  CHECK(refusal(grid(5, 8, 256, 32, GridForm::k_min)) == "taken");
  CHECK(a16_group_columns(grid(4, 8, 256, -1, GridForm::f16_min)) == 128);   // one group with mins: two runs
  CHECK(a16_group_columns(grid(4, 8, 96, -1, GridForm::f16_min)) == 48);
  CHECK(a16_group_columns(grid(4, 8, 48, -1, GridForm::f16_min)) == 16);
  {   // the quantizer's own one-group grid with mins (as the GPU case of it quantizes)
    QuantSpec sp;
    sp.group_size = -1;
    sp.form = GridForm::f16_min;
    sp.static_groups = false;
    MatF W(8, 256);
    Rng rw(3);
    for (int64_t i = 0; i < W.size(); ++i) W.data()[i] = float(rw.normal() * 0.02 + 0.004);
    const QuantizedLinear q = rtn_quantize(W, sp);
    CHECK(q.groups == 1);
    CHECK(q.mins.size() == 8);
    CHECK(refusal(q) == "taken");
    CHECK(a16_group_columns(q) == 128);
  }
  // Refused.
  CHECK(refusal(grid(9, 8, 256, 128)) == "bits");
  CHECK(refusal(grid(0, 8, 256, 128)) == "bits");
  CHECK(refusal(grid(4, 8, 172, -1)) == "in_features");   // stories260k's down projection
  CHECK(refusal(grid(4, 8, 80, 40)) == "group_size");     // groups of 40 columns
  CHECK(a16_group_columns(grid(4, 8, 80, 40)) == 0);
  CHECK(refusal(grid(4, 8, 96, 88)) == "group_size");     // 88 and 8: runs of 8
  QuantizedLinear stray = grid(4, 8, 256, 128);
  stray.g_idx[3] = 2;
  CHECK(refusal(stray) == "g_idx");
  CHECK(refusal(grid(4, 8, 16, -1, GridForm::f16_min)) == "mins");   // one group with mins, 16 columns: no two runs of 16
  QuantizedLinear big = grid(4, 8, 256, 128);
  big.scales[5] = 1e5f;
  CHECK(refusal(big) == "scales");
  big.scales[5] = std::nanf("");
  CHECK(refusal(big) == "scales");
  QuantizedLinear low = grid(4, 8, 256, 32, GridForm::f16_min);
  low.mins[2] = -7e4f;
  CHECK(refusal(low) == "mins");
  QuantizedLinear zero = grid(4, 8, 256, 128);
  zero.zeros[1] = 1025;
  CHECK(refusal(zero) == "zeros");
  zero.zeros[1] = 1024;
  CHECK(refusal(zero) == "taken");
  A16Refusal why;
  CHECK_FALSE(a16_takes(grid(4, 8, 172, -1), &why));
  CHECK(why.reason == "must be a multiple of 16, got 172");
  CHECK_FALSE(a16_takes(grid(4, 8, 172, -1)));   // without a reason asked for
}
