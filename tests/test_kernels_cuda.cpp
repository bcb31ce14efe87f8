// The packed-weight kernels (lib/kernels/*.cu) against the reference kernels of lib/kernels:
// W4A16/W8A16, NF4, W8A8, int8 activations, split-K, PDL chains, shared-x and wgmma paths.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <map>
#include <type_traits>

#include "core/bits.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/attention_cuda.h"
#include "model/forward_cuda.h"
#include "gptq/gptq_cuda.h"
#include "cuda/random.h"
#include "kernels/act_quant.h"
#include "kernels/bench_kernels.h"
#include "kernels/f16_gemv.h"
#include "kernels/a16_grid.h"
#include "kernels/reference.h"
#include "kernels/relayout.h"
#include "kernels/relayout_cuda.h"
#include "kernels/nf4.h"
#include "kernels/w4a16.h"
#include "kernels/w8a8.h"
#include "cuda/runtime.h"
#include <cublas_api.h>
#include <cusolverDn.h>
#include "model/corpus.h"
#include "eval/perplexity.h"
#include "eval/nll_cuda.h"
#include "eval/perplexity_cuda.h"
#include "formats/open.h"
#include "model/synth.h"
#include "pipeline/pipeline.h"
#include "testing.h"
#include "testing_cuda.h"

using namespace ptq;
using nlohmann::json;

namespace {
// A random 4-bit GPTQ module: codes, f16-representable scales, zeros (sym: 8), and act-order
// groups (a random column permutation cut into groups) when asked.
// A16 kernel against its fp32 reference on fresh f16-representable x [M, K]: norm-wise relative
// error of y [M, N]. ref(x, y) is the reference GEMM; L->gemm the kernel.
// Norm-wise relative error of f16 results yh against the fp32 reference yr (in fp64).
double rel_error_f16(const std::vector<uint16_t>& yh, const std::vector<float>& yr) {
  double num = 0, den = 0;
  for (size_t i = 0; i < yr.size(); ++i) {
    const double d = double(f16_bits_to_f32(yh[i])) - yr[i];
    num += d * d;
    den += double(yr[i]) * yr[i];
  }
  return std::sqrt(num / den);
}

template <class Kernel, class Ref>
double a16_error(const Kernel& L, int64_t M, int64_t K, int64_t N, Rng& r, cuda::A16Path path, Ref&& ref) {
  std::vector<float> x(size_t(M * K)), yr(size_t(M * N));
  std::vector<uint16_t> xh(x.size()), yh(yr.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = round_to(DType::F16, float(r.normal()));
    xh[i] = f32_to_f16_bits(x[i]);
  }
  ref(x.data(), yr.data());
  cuda::DeviceBuffer<uint16_t> dx(xh.size(), "x"), dy(yh.size(), "y");
  cuda::copy_to_device(dx.get(), xh.data(), xh.size() * 2);
  L.gemm(dx.get(), M, dy.get(), path);
  cuda::copy_to_host(yh.data(), dy.get(), yh.size() * 2);
  return rel_error_f16(yh, yr);
}

QuantizedLinear random_q(int bits, int64_t out, int64_t in, int gs, bool sym, bool act_order, uint64_t seed) {
  QuantSpec s;
  s.bits = bits;
  s.group_size = gs;
  s.sym = sym;
  QuantizedLinear q = QuantizedLinear::empty(out, in, s);
  Rng r(seed);
  const int levels = 1 << bits;
  std::vector<uint8_t> codes(size_t(out * in));
  for (auto& c : codes) c = uint8_t(int(r.uniform() * levels) & (levels - 1));
  q.set_codes(codes.data());
  for (auto& v : q.scales) v = round_to(DType::F16, float((0.002 + 0.02 * r.uniform()) * 16 / levels));
  for (auto& z : q.zeros) z = sym ? levels / 2 : int32_t(r.uniform() * levels) & (levels - 1);
  if (act_order && gs > 0) {
    std::vector<int> perm(static_cast<size_t>(in));
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = in - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(r.uniform() * double(i + 1)) % size_t(i + 1)]);
    for (int64_t i = 0; i < in; ++i) q.g_idx[size_t(perm[size_t(i)])] = int32_t(i / gs);
  }
  return q;
}

// The NF4 counterpart: weights drawn normal (sd 0.02) from seed, NF4 in blocks of 64 with nested absmax.
Nf4Tensor random_nf4(int64_t N, int64_t K, uint64_t seed) {
  Rng rw{seed};
  std::vector<float> W(size_t(N * K));
  for (auto& v : W) v = float(rw.normal() * 0.02);
  return nf4_quantize(W.data(), int64_t(W.size()), 64, true);
}
}  // namespace

// The loaders lay the codes out on the device (kernels/relayout.cu): its words must be those of the
// host path, relayout_rows (itself checked code by code against relayout_codes in test_relayout),
// bit for bit: 1..8-bit streams (3-bit codes straddle words) with each row's words together or
// interleaved by column (GPTQ's qweight), in one part or in parts that meet inside a tile of 16
// rows, with and without a column permutation, NF4's bytes, and ragged N and K (rows past N and
// columns past K zero).
TEST_CASE("gpu: codes laid out on the device equal relayout_rows' words (1- to 8-bit streams by row and by column, parts, act-order permutations, NF4 bytes)") {
  PTQ_REQUIRE_GPU();
  Rng r(11);
  for (auto [N, K] : {std::pair<int64_t, int64_t>{37, 200}, {48, 64}, {5, 1000}, {300, 130}}) {
    std::vector<int> perm(static_cast<size_t>(K));
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = K - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(r.uniform() * double(i + 1)) % size_t(i + 1)]);
    cuda::DeviceBuffer<int> dperm(perm.size(), "perm");
    cuda::copy_to_device(dperm.get(), perm.data(), perm.size() * 4);
    // The row counts of the parts: whole, and cut where tiles are shared (N = 37: 10 + 27).
    std::vector<std::vector<int64_t>> cuts = {{N}};
    if (N > 10) cuts.push_back({10, N - 10});
    if (N >= 48) cuts.push_back({16, 7, N - 23});
    auto device_words = [&](const std::vector<cuda::StoredRows>& parts, cuda::StoredCodes kind, int bits, FragmentCodes fc, const int* dp) {
      cuda::DeviceBuffer<uint32_t> dw(fragment_words(N, K, fc), "words");
      cuda::fill_bytes(dw.get(), 0xA5, dw.size() * 4);   // garbage: every word must be written
      cuda::upload_relayout(parts, kind, bits, N, K, dp, fc, dw.get());
      std::vector<uint32_t> got(dw.size());
      cuda::copy_to_host(got.data(), dw.get(), got.size() * 4);
      return got;
    };
    for (int bits = 1; bits <= 8; ++bits)
      for (bool permuted : {false, true}) {
        const FragmentCodes fc = bits <= 4 ? FragmentCodes::gptq4 : FragmentCodes::gptq8;
        std::vector<uint8_t> codes(size_t(N * K));
        for (auto& c : codes) c = uint8_t(int(r.uniform() * (1 << bits)) & ((1 << bits) - 1));
        const std::vector<uint32_t> want = relayout_rows(N, K, fc, [&](int64_t i, uint8_t* row) {
          for (int64_t k = 0; k < K; ++k) row[k] = codes[size_t(i * K + (permuted ? perm[size_t(k)] : k))];
        });
        const int64_t nw = packed_words(K, bits);
        for (const auto& cut : cuts)
          for (bool by_column : {false, true}) {
            INFO("N " << N << ", K " << K << ", " << bits << " bits" << (permuted ? ", permuted" : "") << ", " << cut.size() << " parts"
                      << (by_column ? ", by column" : ""));
            std::vector<std::vector<uint32_t>> stored;
            std::vector<cuda::StoredRows> parts;
            int64_t r0 = 0;
            for (int64_t rows : cut) {
              std::vector<uint32_t> w(size_t(rows * nw));
              pack_rows(codes.data() + r0 * K, rows, K, bits, w.data());
              if (by_column) {   // GPTQ's qweight: word j of row i at j * rows + i
                std::vector<uint32_t> t(w.size());
                for (int64_t i = 0; i < rows; ++i)
                  for (int64_t j = 0; j < nw; ++j) t[size_t(j * rows + i)] = w[size_t(i * nw + j)];
                w = t;
              }
              stored.push_back(std::move(w));
              parts.push_back({stored.back().data(), rows, by_column});
              r0 += rows;
            }
            REQUIRE(device_words(parts, cuda::StoredCodes::stream, bits, fc, permuted ? dperm.get() : nullptr) == want);
          }
      }
    if (K % 2 == 0) {
      INFO("NF4, N " << N << ", K " << K);
      std::vector<uint8_t> codes(size_t(N * K)), bytes(size_t(N * K / 2));
      for (auto& c : codes) c = uint8_t(int(r.uniform() * 16) & 15);
      for (size_t j = 0; j < bytes.size(); ++j) bytes[j] = uint8_t(codes[2 * j] << 4 | codes[2 * j + 1]);   // bitsandbytes: the first in the high nibble
      const std::vector<uint32_t> want = relayout_rows(N, K, FragmentCodes::nf4, [&](int64_t i, uint8_t* row) { std::copy_n(codes.data() + i * K, K, row); });
      for (const auto& cut : cuts) {
        std::vector<cuda::StoredRows> parts;
        int64_t r0 = 0;
        for (int64_t rows : cut) parts.push_back({bytes.data() + r0 * K / 2, rows}), r0 += rows;
        REQUIRE(device_words(parts, cuda::StoredCodes::nf4_bytes, 4, FragmentCodes::nf4, nullptr) == want);
      }
    }
  }
}

TEST_CASE("gpu: W4A16 and W8A16 kernels equal the reference GPTQ GEMM (sym/asym, g128/per-channel, act-order, odd M and shapes)") {
  PTQ_REQUIRE_GPU();
  struct Case { int64_t out, in; int gs; bool sym, act; };
  const Case cases[] = {{96, 160, 32, false, true}, {4096, 4096, 128, true, false}, {4097, 4096, 128, false, true},
                        {1024, 11008, 128, false, false}, {512, 4096, -1, true, false}, {768, 2048, 64, true, true},
                        {64, 384, 96, false, true}};   // groups of 96: 3 (4-bit) or 6 (8-bit) uint4s, the division path
  const int64_t Ms[] = {1, 2, 3, 7, 16, 32, 33, 64, 128, 255};
  for (int bits : {4, 8})
  for (const Case& c : cases) {
    const QuantizedLinear q = random_q(bits, c.out, c.in, c.gs, c.sym, c.act, uint64_t(c.out * 31 + c.in + bits));
    for (bool v2 : {false, true}) {
      if (!v2 && !c.sym) continue;   // v1 is written for symmetric grids only
      const GptqPacked pk = pack_gptq(q, v2);
      auto L = cuda::W4A16Linear::from_gptq(pk, v2);
      for (int64_t M : Ms)
        for (cuda::A16Path path : {cuda::A16Path::automatic, cuda::A16Path::mma, cuda::A16Path::dequant}) {   // automatic: by a16_auto_path
          if (path == cuda::A16Path::dequant && M != 3) continue;   // the dequantization kernel also checked where a tensor-core kernel serves
          if (path == cuda::A16Path::mma && M != 33 && M != 64) continue;   // the x-from-L2 kernel at 4 and 8 n8 tiles, where wgmma or shared_x serves
          Rng r{uint64_t(M)};
          const double rel = a16_error(*L, M, c.in, c.out, r, path, [&](const float* x, float* y) { ref_gemm_gptq(x, M, pk, v2, y); });
          INFO(bits << "-bit " << c.out << "x" << c.in << " g" << c.gs << (c.sym ? " sym" : " asym") << (c.act ? " act-order" : "") << (v2 ? " v2" : " v1")
                    << " M=" << M << " path " << cuda::a16_path_name(path) << ": relative error " << rel);
          CHECK(rel <= 2e-3);
        }
    }
  }
  GptqPacked wide;
  wide.bits = 9;
  CHECK_THROWS_WITH(cuda::W4A16Linear::from_gptq(wide, true), Catch::Contains("1- to 8-bit"));
}

// GPTQ's 2- and 3-bit codes (and 1-bit and 5..7-bit ones, which compressed-tensors' pack-quantized
// may hold) run in the 4- and 8-bit kernels' layouts with their zero points as stored: against the
// same reference GEMM, which reads the checkpoint's own bit stream (3 and 7 bits: codes across word
// edges). Groups of unequal sizes (group_size not dividing in_features) run as equal runs of columns
// with their group's grid (a16_group_columns), at every width. What a16_takes refuses,
// from_quantized refuses too, naming the same field.
TEST_CASE("gpu: 1- to 8-bit GPTQ weights, groups of unequal sizes too, in the A16 kernels' 4- and 8-bit layouts equal the reference GPTQ GEMM") {
  PTQ_REQUIRE_GPU();
  struct Case { int64_t out, in; int gs; bool sym, act; };
  // The last two: groups of unequal sizes (256 and 128; 384, 384 and 256), held as runs of 128 columns.
  const Case cases[] = {{96, 160, 32, false, true}, {4096, 4096, 128, true, false}, {768, 2048, 64, true, true}, {1024, 4096, 128, false, true},
                        {64, 384, 256, false, true}, {96, 1024, 384, true, false}};
  for (int bits : {1, 2, 3, 4, 5, 6, 7, 8})
    for (const Case& c : cases) {
      const QuantizedLinear q = random_q(bits, c.out, c.in, c.gs, c.sym, c.act, uint64_t(c.out * 17 + c.in + bits));
      for (bool v2 : {false, true}) {
        if (!v2 && !c.sym) continue;
        const GptqPacked pk = pack_gptq(q, v2);
        auto L = cuda::W4A16Linear::from_gptq(pk, v2);
        CHECK(L->bits() == (bits <= 4 ? 4 : 8));
        CHECK(L->code_bits() == bits);
        for (int64_t M : {1, 7, 24, 64, 128}) {
          Rng r{uint64_t(M)};
          const double rel = a16_error(*L, M, c.in, c.out, r, cuda::A16Path::automatic, [&](const float* x, float* y) { ref_gemm_gptq(x, M, pk, v2, y); });
          INFO(bits << "-bit " << c.out << "x" << c.in << " g" << c.gs << (c.sym ? " sym" : " asym") << (c.act ? " act-order" : "") << (v2 ? " v2" : " v1")
                    << " M=" << M << " path " << cuda::a16_path_name(L->path_for(M)) << ": relative error " << rel);
          CHECK(rel <= 2e-3);
        }
      }
    }
  // Refused by the rule the loaders ask first (a16_grid.h), each naming its field: groups of 40
  // columns, a 172-wide input, one group with mins over 16 columns.
  const QuantizedLinear forty = random_q(4, 64, 80, 40, false, false, 5), narrow = random_q(4, 64, 172, -1, true, false, 6);
  QuantSpec with_min;
  with_min.form = GridForm::f16_min;
  with_min.group_size = -1;   // one group
  const QuantizedLinear one_min = QuantizedLinear::empty(64, 16, with_min);
  for (const QuantizedLinear* q : {&forty, &narrow, &one_min}) {
    INFO(q->cols << " columns in " << q->groups << " groups" << (q->mins.empty() ? "" : ", with mins"));
    A16Refusal why;
    REQUIRE_FALSE(a16_takes(*q, &why));
    INFO(why.field << ": " << why.reason);
    CHECK_THROWS_WITH(cuda::W4A16Linear::from_quantized(*q), Catch::Contains(why.field) && Catch::Contains(why.reason));
  }
}

// GGUF's blocks on the same kernels (W4A16Linear::from_quantized): grids with mins, w = s q + m
// (Q4_1 / Q4_K at 4 bits, Q5_1 / Q5_K at 5 bits in the 8-bit layout, groups of 32), and Q6_K's
// signed scales on zero point 32 in groups of 16. Reference: the fp64 GEMM of x with the
// quantizer's own dequantization (QuantizedLinear::dequantize), s and m f16 numbers as the blocks
// give them (Q4_1's) or not (a K-quant's d sc, rounded to f16 by the kernel: within the tolerance).
TEST_CASE("gpu: grids with mins (GGUF Q4_1, Q5_1, Q4_K, Q5_K) and Q6_K's groups of 16 on the A16 kernels equal the fp64 GEMM of the dequantized weights") {
  PTQ_REQUIRE_GPU();
  struct Case { int bits; GridForm form; int group; int64_t out, in; };
  const Case cases[] = {{4, GridForm::f16_min, 32, 96, 256},   {4, GridForm::k_min, 32, 4096, 4096}, {5, GridForm::f16_min, 32, 768, 1024},
                        {5, GridForm::k_min, 32, 1024, 4096}, {6, GridForm::k_sym, 16, 512, 2048},  {4, GridForm::k_min, 32, 12288, 4096},
                        {4, GridForm::f16_min, -1, 96, 256},  {5, GridForm::f16_min, -1, 64, 48}};   // one group with mins: runs of 128, 16
  for (const Case& c : cases) {
    QuantSpec sp;
    sp.bits = c.bits;
    sp.group_size = c.group;
    sp.form = c.form;
    sp.sym = c.form == GridForm::k_sym;
    sp.static_groups = c.form != GridForm::f16_min;
    Rng rw{uint64_t(c.out + c.bits)};
    MatF W(c.out, c.in);
    for (int64_t i = 0; i < W.size(); ++i) W.data()[i] = float(rw.normal() * 0.02 + 0.004);   // off-centre: the mins matter
    const QuantizedLinear q = rtn_quantize(W, sp);
    REQUIRE(q.mins.empty() == !has_min(c.form));
    const Eigen::MatrixXd Wq = q.dequantize().cast<double>();
    auto L = cuda::W4A16Linear::from_quantized(q);
    CHECK(L->bits() == (c.bits <= 4 ? 4 : 8));
    CHECK(L->has_min() == has_min(c.form));
    for (int64_t M : {1, 5, 16, 24, 64, 128, 300}) {   // mma, wgmma and (300) dequantize + cuBLAS
      Rng r{uint64_t(M)};
      const double rel = a16_error(*L, M, c.in, c.out, r, cuda::A16Path::automatic, [&](const float* x, float* y) {   // fp64 x · Wqᵀ
        const Eigen::MatrixXd X = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(x, M, c.in).cast<double>();
        const Eigen::MatrixXd Y = X * Wq.transpose();
        for (int64_t i = 0; i < M; ++i)
          for (int64_t o = 0; o < c.out; ++o) y[i * c.out + o] = float(Y(i, o));
      });
      INFO(c.bits << "-bit " << grid_form_name(c.form) << " g" << c.group << " " << c.out << "x" << c.in << " M=" << M << " path "
                  << cuda::a16_path_name(L->path_for(M)) << ": relative error " << rel);
      CHECK(rel <= 2e-3);
    }
  }
}

TEST_CASE("gpu: int8 activations quantized on the device equal quantize_activations (per token and per tensor, f16 and bf16)") {
  PTQ_REQUIRE_GPU();
  const int64_t rows = 37;
  for (int64_t cols : {int64_t(1000), int64_t(1004), int64_t(11008)}) {   // the row in registers (cols % 8 == 0) and the general kernel
    for (DType dt : {DType::F16, DType::BF16})
      for (ActQuant a : {ActQuant{ActQuant::per_token, 0}, ActQuant{ActQuant::per_tensor, 0.02f}}) {
        MatF x(rows, cols);
        Rng r{uint64_t(int(dt) * 10 + a.mode)};
        for (int64_t i = 0; i < x.size(); ++i) x.data()[i] = round_to(dt, float(r.normal() * (i % 97 == 0 ? 8.0 : 1.0)));
        x.row(5).setZero();   // a zero row: scale 1
        std::vector<uint16_t> x16(size_t(x.size()));
        convert_from_f32(dt, x.data(), x16.data(), x16.size());
        cuda::DeviceBuffer<uint16_t> dx(x16.size(), "test x");
        cuda::DeviceBuffer<int8_t> dq(x16.size(), "test q");
        cuda::DeviceBuffer<float> ds(size_t(rows), "test s");
        cuda::copy_to_device(dx.get(), x16.data(), x16.size() * 2);
        cuda::quantize_activations_int8(dx.get(), dt, rows, cols, a, dq.get(), ds.get());
        std::vector<int8_t> q(x16.size());
        VecF s(rows);
        cuda::copy_to_host(q.data(), dq.get(), q.size());
        cuda::copy_to_host(s.data(), ds.get(), size_t(rows) * 4);
        MatI qr;
        VecF sr;
        quantize_activations(x, a, qr, sr);   // the reference (lib/model/llama.cpp)
        int64_t same = 0;
        for (int64_t i = 0; i < qr.size(); ++i) same += qr.data()[i] == q[size_t(i)];
        INFO("dtype " << dtype_name(dt) << ", mode " << int(a.mode) << ", cols " << cols);
        CHECK(same == qr.size());
        CHECK(s == sr);
        CHECK(s[5] == (a.mode == ActQuant::per_token ? 1.0f : 0.02f));
      }
  }
}

TEST_CASE("gpu: the NF4 kernel equals the reference NF4 GEMM (blocks 64 and 128, nested absmax, odd M and shapes)") {
  PTQ_REQUIRE_GPU();
  struct Shape { int64_t N, K; int B; bool nested; };
  const Shape shapes[] = {{96, 128, 64, false}, {333, 512, 64, true}, {1024, 11008, 64, false}, {4097, 4096, 128, true}, {257, 256, 32, false}, {70, 96, 32, true}};   // K = 96: the last k-step half past K
  int k = 0;
  for (const Shape& sh : shapes) {
    Rng r{uint64_t(500 + k++)};
    std::vector<float> W(size_t(sh.N * sh.K));
    for (auto& v : W) v = float(r.normal() * 0.02);
    const Nf4Tensor t = nf4_quantize(W.data(), int64_t(W.size()), sh.B, sh.nested);
    auto L = cuda::Nf4Linear::from_nf4(t, sh.N, sh.K);
    for (int64_t M : {1, 2, 3, 7, 16, 32, 33, 64, 128, 255})
      for (cuda::A16Path path : {cuda::A16Path::automatic, cuda::A16Path::dequant, cuda::A16Path::shared_x}) {
        if (path == cuda::A16Path::dequant && M != 3) continue;
        if (path == cuda::A16Path::shared_x && M != 7 && M != 33 && M != 64) continue;   // x staged in shared memory (automatic only for big layers without sm_90)
        if (sh.N * sh.K > 4096 * 4096 / 2 && M > 33) continue;   // the reference is slow; big shapes at small M
        const double err = a16_error(*L, M, sh.K, sh.N, r, path, [&](const float* x, float* y) { ref_gemm_nf4(x, M, t, sh.N, sh.K, y); });
        INFO("N " << sh.N << " K " << sh.K << " block " << sh.B << " nested " << sh.nested << " M " << M << " path " << cuda::a16_path_name(path)
                  << ": relative error " << err);
        CHECK(err <= 3e-3);
        if (M <= 16 && sh.N == 1024) std::cout << "NF4 1024x11008 M=" << M << (path == cuda::A16Path::dequant ? " dequant" : "") << ": relative error " << err << "\n";
      }
    // The L2-fed kernel's uneven K slices at 17..32 rows (a16_mma_slices takes 3: 3, 3 and 2
    // k-steps of K = 512; 58, 58 and 56 of K = 11008; and 6: 2, 2, 2, 2 and two empty slices of K =
    // 512). 6 and 8 slices ask for 56 and 64 KB of shared memory a CTA (the pair table and the slice
    // sums), past the 48 KB a launch takes without the opt-in limit, which run_mma sets.
    if (sh.N == 333 || sh.N == 1024)
      for (int64_t M : {24, 32})
        for (int slices : {2, 3, 6, 8}) {
          cuda::set_a16_split({2, slices});
          const double err = a16_error(*L, M, sh.K, sh.N, r, cuda::A16Path::mma, [&](const float* x, float* y) { ref_gemm_nf4(x, M, t, sh.N, sh.K, y); });
          cuda::set_a16_split({});
          INFO("N " << sh.N << " K " << sh.K << " M " << M << " slices " << slices << ": relative error " << err);
          CHECK(err <= 3e-3);
        }
  }
  Nf4Tensor odd = nf4_quantize(std::vector<float>(64 * 96, 0.5f).data(), 64 * 96, 64, false);
  CHECK_THROWS_AS(cuda::Nf4Linear::from_nf4(odd, 64, 96), Error);   // in_features 96: not a multiple of the block
  // Fewer absmax values than blocks (a malformed checkpoint) are refused, not read past their end.
  Nf4Tensor few = nf4_quantize(std::vector<float>(64 * 128, 0.5f).data(), 64 * 128, 64, false);
  few.absmax.pop_back();
  CHECK_THROWS_AS(cuda::Nf4Linear::from_nf4(few, 64, 128), Error);
  Nf4Tensor few_nested = nf4_quantize(std::vector<float>(64 * 128, 0.5f).data(), 64 * 128, 64, true);
  few_nested.absmax_q.pop_back();
  CHECK_THROWS_AS(cuda::Nf4Linear::from_nf4(few_nested, 64, 128), Error);
}

namespace {
// L through path on fresh x [M, K]: the same bytes four times (its split-K sums do not depend on
// which warp or CTA finishes first), and its fp32 output with beta = 1 adds y0 (against the
// reference GEMM + y0, 1e-3 relative, norm-wise).
void check_repeat_and_beta(const cuda::W4A16Linear& L, const GptqPacked& pk, int64_t M, int64_t K, cuda::A16Path path, uint64_t seed) {
  const int64_t N = L.out();
  Rng r{seed};
  std::vector<float> x(size_t(M * K)), y0(size_t(M * N)), yr(size_t(M * N));
  std::vector<uint16_t> xh(x.size()), first(yr.size()), again(yr.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = round_to(DType::F16, float(r.normal()));
    xh[i] = f32_to_f16_bits(x[i]);
  }
  for (auto& v : y0) v = float(r.normal());
  ref_gemm_gptq(x.data(), M, pk, true, yr.data());
  cuda::DeviceBuffer<uint16_t> dx(xh.size(), "x"), dy(first.size(), "y");
  cuda::DeviceBuffer<float> df(y0.size(), "y f32");
  cuda::copy_to_device(dx.get(), xh.data(), xh.size() * 2);
  L.gemm(dx.get(), M, dy.get(), path);
  cuda::copy_to_host(first.data(), dy.get(), first.size() * 2);
  for (int rep = 0; rep < 3; ++rep) {
    L.gemm(dx.get(), M, dy.get(), path);
    cuda::copy_to_host(again.data(), dy.get(), again.size() * 2);
    CHECK(again == first);
  }
  cuda::copy_to_device(df.get(), y0.data(), y0.size() * 4);
  L.gemm_f32(dx.get(), M, df.get(), 1.0f, path);
  std::vector<float> yf(y0.size());
  cuda::copy_to_host(yf.data(), df.get(), yf.size() * 4);
  double num = 0, den = 0;
  for (size_t i = 0; i < yf.size(); ++i) {
    const double want = double(yr[i]) + y0[i];
    num += (yf[i] - want) * (yf[i] - want);
    den += want * want;
  }
  INFO(cuda::a16_path_name(path) << " M=" << M << ", fp32 out with beta = 1: relative error " << std::sqrt(num / den));
  CHECK(std::sqrt(num / den) <= 1e-3);
}
}  // namespace

TEST_CASE("gpu: the tensor-core A16 path: split-K reduction deterministic, fp32 output adds beta y, forced paths refuse M they do not take") {
  PTQ_REQUIRE_GPU();
  const int64_t N = 1000, K = 11008, M = 16;   // 63 tiles of 16 rows (the last partial), 172 k-steps in 16 slices
  const QuantizedLinear q = random_q(4, N, K, 128, false, true, 77);
  const GptqPacked pk = pack_gptq(q, true);
  auto L = cuda::W4A16Linear::from_gptq(pk, true);
  check_repeat_and_beta(*L, pk, M, K, cuda::A16Path::automatic, 5);
  cuda::DeviceBuffer<uint16_t> dx(size_t(65 * K), "x"), dy(size_t(65 * N), "y");
  CHECK_THROWS_AS(L->gemm(dx.get(), 65, dy.get(), cuda::A16Path::mma), Error);

  // Every work split the planner can choose gives the reference result: 1 or 2 row tiles per warp
  // (63 tiles: the last CTA's second tile lies past N), 1, 3 or 16 K slices (3: uneven), fp32 per-k-step
  // scales (per channel) and f16 scales (groups of 80, act-order), K = 2000 (the last k-step is a quarter full).
  // 8-bit codes too: at M <= 8 they have both loops with one row tile as well.
  const int64_t Ks = 2000;
  for (int bits : {4, 8})
  for (int gs : {-1, 80}) {
    const QuantizedLinear qs = random_q(bits, N, Ks, gs, gs < 0, gs > 0, 91);
    const GptqPacked ps = pack_gptq(qs, true);
    auto Ls = cuda::W4A16Linear::from_gptq(ps, true);
    for (int64_t Mf : {1, 5, 16, 32})
      for (int rt : {1, 2})
        for (int slices : {1, 3, 16})
          for (int loop : {1, 2}) {   // at M <= 8 with two row tiles (8-bit: one too): the plain loop and the overlapped batches (elsewhere one loop: run once)
            if (loop == 2 && !(Mf <= 8 && (rt == 2 || bits == 8))) continue;
            cuda::set_a16_split({rt, slices, 0, loop});
            Rng rs{uint64_t(Mf * 7 + rt)};
            const double rel = a16_error(*Ls, Mf, Ks, N, rs, cuda::A16Path::mma, [&](const float* xx, float* yy) { ref_gemm_gptq(xx, Mf, ps, true, yy); });
            cuda::set_a16_split({});
            INFO(bits << "-bit g" << gs << " M=" << Mf << " rt=" << rt << " slices=" << slices << " loop=" << loop << ": relative error " << rel);
            CHECK(rel <= 2e-3);
          }
  }
}

// f16 Linears through the A16 kernel reading the weights in place (f16_gemv.h) against the fp64
// product of the same f16 operands: every loop and split at 1..64 rows, rows past a tile (N = 1000),
// beta 0 and 1. fp32 sums of exact f16 products: 1e-5 norm-wise is the fp32 rounding of sums of
// 2048 terms with margin; a misplaced column or row would be O(1).
TEST_CASE("gpu: f16 Linears through the A16 tensor-core kernel, weights in place, equal the fp64 product at every split") {
  PTQ_REQUIRE_GPU();
  struct Shape { int64_t N, K; };
  for (const Shape sh : {Shape{1000, 2048}, Shape{4096, 4096}, Shape{48, 64}}) {
    Rng r{uint64_t(sh.N + sh.K)};
    std::vector<uint16_t> wh(size_t(sh.N * sh.K)), xh(size_t(64 * sh.K));
    std::vector<double> w(wh.size()), x(xh.size());
    for (size_t i = 0; i < wh.size(); ++i) wh[i] = f32_to_f16_bits(float(r.normal() * 0.05)), w[i] = f16_bits_to_f32(wh[i]);
    for (size_t i = 0; i < xh.size(); ++i) xh[i] = f32_to_f16_bits(float(r.normal())), x[i] = f16_bits_to_f32(xh[i]);
    std::vector<float> y0(size_t(64 * sh.N));
    for (auto& v : y0) v = float(r.uniform() - 0.5);
    cuda::DeviceBuffer<uint16_t> dw(wh.size(), "W"), dx(xh.size(), "x");
    cuda::DeviceBuffer<float> dy(y0.size(), "y");
    cuda::copy_to_device(dw.get(), wh.data(), wh.size() * 2);
    cuda::copy_to_device(dx.get(), xh.data(), xh.size() * 2);
    std::vector<double> ref(size_t(64 * sh.N));   // x · Wᵀ in fp64, the 64 rows
    for (int64_t m = 0; m < 64; ++m)
      for (int64_t n = 0; n < sh.N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < sh.K; ++k) acc += x[size_t(m * sh.K + k)] * w[size_t(n * sh.K + k)];
        ref[size_t(m * sh.N + n)] = acc;
      }
    for (int64_t M : {1, 3, 8, 9, 16, 17, 32, 64})
      for (int rt : {1, 2})
        for (int slices : {0, 3})
          for (int loop : {1, 2})
            for (float beta : {0.0f, 1.0f}) {
              if (rt == 2 && M > 32) continue;
              cuda::copy_to_device(dy.get(), y0.data(), size_t(M * sh.N) * 4);
              cuda::set_a16_split({rt, slices, 0, loop});
              cuda::f16_linear_f32(dw.get(), dx.get(), M, sh.N, sh.K, dy.get(), beta, true);
              cuda::set_a16_split({});
              std::vector<float> y(size_t(M * sh.N));
              cuda::copy_to_host(y.data(), dy.get(), y.size() * 4);
              double num = 0, den = 0;
              for (int64_t m = 0; m < M; ++m)
                for (int64_t n = 0; n < sh.N; ++n) {
                  const double want = beta * double(y0[size_t(m * sh.N + n)]) + ref[size_t(m * sh.N + n)];
                  const double d = double(y[size_t(m * sh.N + n)]) - want;
                  num += d * d, den += want * want;
                }
              INFO("N " << sh.N << " K " << sh.K << " M " << M << " rt " << rt << " slices " << slices << " loop " << loop << " beta " << beta);
              CHECK(std::sqrt(num / den) <= 1e-5);
            }
  }
  cuda::DeviceBuffer<uint16_t> a(64 * 96, "a");
  cuda::DeviceBuffer<float> y(64 * 64, "y");
  CHECK_THROWS_AS(cuda::f16_linear_f32(a.get(), a.get(), 1, 64, 96, y.get(), 0.0f, true), Error);   // K not a multiple of 64
  CHECK_THROWS_AS(cuda::f16_linear_f32(a.get(), a.get(), 65, 64, 64, y.get(), 0.0f, true), Error);  // M above 64
}

// The RMSNorm folded into the Linear that writes the row (a16_fold_norm: decode at batch 1, NF4).
// The norm split between two Linears at one row (A16RowNorm row_ss, a16_norm_in): the writer (W4
// and f16 weights, every split) must leave the fp64 sums of squares of each 16 rows of the y it
// wrote (1e-5: fp32 sums of 16 squares) and out = f16(fp32 (y * w) / 16) bit for bit; a reader
// given that out must return its product scaled by 16 / rms(y) in fp64, twice with the same bytes.
// The f16 reader's product is the fp64 one of its host weights and out (1e-5 norm-wise: fp32
// sums). The GPTQ (4-bit g128 act-order, or 8-bit per channel) and NF4 readers' is checked twice:
// against the host reference GEMM of their packed weights (2e-3, as their GEMM cases above: the
// kernels dequantize in f16) and against their own plain call on out (1e-5: the scale alone).
// Readers of K % 64 != 0 and calls at two rows leave the requests untaken.
TEST_CASE("gpu: a norm split between two Linears at one row: the writer's sums and f16(y * w / 16), the reader's sums scaled by 16 / rms(y)") {
  PTQ_REQUIRE_GPU();
  const int64_t K = 2048, N2 = 1000;   // writer K -> N; reader N -> N2 (62.5 row tiles)
  for (const int64_t N : {int64_t(4096), int64_t(1008)}) {   // 1008: a reader's K % 64 != 0
    Rng r{uint64_t(N) + 7};
    std::vector<uint16_t> xh(size_t(2 * K)), wh(size_t(N * K));
    for (auto& v : xh) v = f32_to_f16_bits(float(r.normal()));
    for (auto& v : wh) v = f32_to_f16_bits(float(r.normal() * 0.05));
    std::vector<float> y0(size_t(2 * N)), g(static_cast<size_t>(N));
    for (auto& v : y0) v = float(3.0 * (r.uniform() - 0.5));
    for (auto& v : g) v = float(0.5 + r.uniform());
    const float eps = 1e-5f;
    const int64_t tiles = (N + 15) / 16;
    cuda::DeviceBuffer<uint16_t> dw(wh.size(), "W"), dx(xh.size(), "x"), dout(static_cast<size_t>(N), "out"), dw2(size_t(N2 * N), "W2");
    cuda::DeviceBuffer<float> dy(y0.size(), "y"), dg(g.size(), "w"), dss(static_cast<size_t>(tiles), "row sums"), dy2(static_cast<size_t>(N2), "y2");
    cuda::DeviceBuffer<int> arrivals(1, "arrivals");
    cuda::fill_bytes(arrivals.get(), 0, 4);
    cuda::copy_to_device(dw.get(), wh.data(), wh.size() * 2);
    cuda::copy_to_device(dx.get(), xh.data(), xh.size() * 2);
    cuda::copy_to_device(dg.get(), g.data(), g.size() * 4);
    std::vector<uint16_t> w2h(size_t(N2 * N));
    for (auto& v : w2h) v = f32_to_f16_bits(float(r.normal() * 0.05));
    cuda::copy_to_device(dw2.get(), w2h.data(), w2h.size() * 2);
    const auto w4 = cuda::random_gptq_linear(N, K, 4, 0.002f, r);
    // The readers, packed on the host so that the reference GEMMs read the same codes. K % 64 != 0:
    // 8-bit per channel (groups of 128 need K % 128); NF4 not read there.
    const GptqPacked pk4 = pack_gptq(random_q(N % 64 ? 8 : 4, N2, N, N % 64 ? -1 : 128, true, N % 64 == 0, uint64_t(N) + 11), true);
    const auto r4 = cuda::W4A16Linear::from_gptq(pk4, true);
    const int64_t Knf = N % 64 ? 64 : N;
    std::vector<float> wnf(size_t(N2 * Knf));
    for (auto& v : wnf) v = float(r.normal() * 0.02);
    const Nf4Tensor tnf = nf4_quantize(wnf.data(), int64_t(wnf.size()), 64, false);
    const auto rnf = cuda::Nf4Linear::from_nf4(tnf, N2, Knf);
    cuda::A16RowNorm wn{dg.get(), dout.get(), arrivals.get(), eps};
    wn.row_ss = dss.get();
    cuda::A16RowNorm rn{};
    rn.in_ss = dss.get(), rn.in_eps = eps;
    auto host = [](const auto& buf, size_t n) {
      std::vector<std::remove_cv_t<std::remove_pointer_t<decltype(buf.get())>>> v(n);
      cuda::copy_to_host(v.data(), buf.get(), n * sizeof(v[0]));
      return v;
    };
    // The writer at M rows (beta 1): whether it wrote row_ss (and was not a whole fold).
    auto write = [&](const std::string& fmt, int64_t M) {
      cuda::copy_to_device(dy.get(), y0.data(), size_t(M * N) * 4);
      cuda::a16_fold_norm(&wn);
      if (fmt == "f16") cuda::f16_linear_f32(dw.get(), dx.get(), M, N, K, dy.get(), 1.0f, true);
      else w4->gemm_f32(dx.get(), M, dy.get(), 1.0f);
      return cuda::a16_folded() == cuda::A16Fold::split;
    };
    // A reader on out at one row (beta 0), with the request or plainly: whether it took it.
    auto read = [&](const std::string& fmt, bool request) {
      if (request) cuda::a16_norm_in(&rn);
      if (fmt == "f16") cuda::f16_linear_f32(dw2.get(), dout.get(), 1, N2, N, dy2.get(), 0.0f, true);
      else if (fmt == "w4") r4->gemm_f32(dout.get(), 1, dy2.get(), 0.0f);
      else rnf->gemm_f32(dout.get(), 1, dy2.get(), 0.0f);
      const bool took = cuda::a16_took_norm_in();
      return std::make_pair(took, host(dy2, static_cast<size_t>(N2)));
    };
    for (const std::string wf : {"w4", "f16"})
      for (int rt : {1, 2})
        for (int slices : {0, 3, 16})
          for (int loop : {1, 2}) {
            std::vector<float> first_ss;
            std::vector<uint16_t> first_out;
            for (int rep = 0; rep < 2; ++rep) {
              cuda::set_a16_split({rt, slices, 0, loop});
              const bool wrote = write(wf, 1);
              cuda::set_a16_split({});
              INFO("writer " << wf << " N " << N << " rt " << rt << " slices " << slices << " loop " << loop << " rep " << rep);
              REQUIRE(wrote);
              const std::vector<float> y = host(dy, static_cast<size_t>(N)), ss = host(dss, static_cast<size_t>(tiles));
              const std::vector<uint16_t> out = host(dout, static_cast<size_t>(N));
              double worst = 0, total = 0;
              int64_t out_wrong = 0;
              for (int64_t t = 0; t < tiles; ++t) {
                double want = 0;
                for (int64_t n = 16 * t; n < std::min(N, 16 * t + 16); ++n) want += double(y[size_t(n)]) * y[size_t(n)];
                worst = std::max(worst, std::abs(double(ss[size_t(t)]) - want) / want);
                total += want;
              }
              for (int64_t n = 0; n < N; ++n) out_wrong += out[size_t(n)] != f32_to_f16_bits(y[size_t(n)] * g[size_t(n)] * cuda::kSplitNormScale);
              INFO("worst relative error of a 16-row sum " << worst << ", elements of out off " << out_wrong);
              CHECK(worst <= 1e-5);
              CHECK(out_wrong == 0);
              if (rep == 0) first_ss = ss, first_out = out;
              else CHECK((ss == first_ss && out == first_out));
              if (wf != "w4" || slices != 0) continue;
              // Readers of out: their plain product scaled by 16 / rms(y) (fp64).
              const double scale = 1.0 / std::sqrt(total / double(N) + eps) / double(cuda::kSplitNormScale);
              for (const std::string rf : {"w4", "nf4", "f16"}) {
                if (rf != "w4" && N % 64) continue;   // the f16 kernel takes K % 64 == 0 only; NF4 whole blocks
                const auto [plain_took, plain] = read(rf, false);
                const auto [took, got] = read(rf, true);
                const auto [took2, got2] = read(rf, true);
                INFO("reader " << rf);
                CHECK_FALSE(plain_took);
                CHECK(took == (N % 64 == 0));
                if (!took) continue;
                // The product independent of the kernel: fp64 for the f16 reader's weights, the
                // host reference GEMM for the packed ones.
                std::vector<float> xf(static_cast<size_t>(N)), yref(static_cast<size_t>(N2));
                for (int64_t k = 0; k < N; ++k) xf[size_t(k)] = f16_bits_to_f32(out[size_t(k)]);
                std::vector<double> product(static_cast<size_t>(N2));
                if (rf == "w4") ref_gemm_gptq(xf.data(), 1, pk4, true, yref.data());
                if (rf == "nf4") ref_gemm_nf4(xf.data(), 1, tnf, N2, Knf, yref.data());
                for (int64_t n = 0; n < N2; ++n) {
                  double sum = yref[size_t(n)];
                  if (rf == "f16") {
                    sum = 0;
                    for (int64_t k = 0; k < N; ++k) sum += double(f16_bits_to_f32(w2h[size_t(n * N + k)])) * xf[size_t(k)];
                  }
                  product[size_t(n)] = sum;
                }
                auto norm_error = [&](auto&& want_of) {
                  double err = 0, ref = 0;
                  for (int64_t n = 0; n < N2; ++n) {
                    const double want = want_of(n) * scale;
                    err += (got[size_t(n)] - want) * (got[size_t(n)] - want), ref += want * want;
                  }
                  return std::sqrt(err / ref);
                };
                const double independent = norm_error([&](int64_t n) { return product[size_t(n)]; });
                const double against_plain = norm_error([&](int64_t n) { return double(plain[size_t(n)]); });
                INFO("norm-wise error of the reader: against the independent product " << independent << ", against its plain call " << against_plain);
                CHECK(independent <= (rf == "f16" ? 1e-5 : 2e-3));
                CHECK(against_plain <= 1e-5);
                CHECK(got2 == got);
              }
            }
          }
    CHECK_FALSE(write("w4", 2));   // two rows: no split
    cuda::a16_norm_in(&rn);
    r4->gemm_f32(dout.get(), 1, dy2.get(), 0.0f);
    CHECK(cuda::a16_took_norm_in() == (N % 64 == 0));
    CHECK_FALSE(cuda::a16_took_norm_in());   // cleared
  }
}

// At M = 1 the NF4 kernel's last CTA normalizes y after its beta y: out must equal the fp64 norm of
// the y the kernel wrote (its GEMM is checked against the reference above), rounded to f16, at
// every split, twice in a row with the same bytes (the arrival counter resets; the sum of squares
// runs in a fixed order). The formats it does not fold for (f16, GPTQ) and NF4 at M = 2 leave the
// request untaken and out untouched.
TEST_CASE("gpu: an RMSNorm folded into the NF4 kernel at one row equals the fp64 norm of its output") {
  PTQ_REQUIRE_GPU();
  const int64_t K = 2048;
  for (const int64_t N : {int64_t(4096), int64_t(1000)}) {
    Rng r{uint64_t(N)};
    std::vector<uint16_t> xh(size_t(2 * K));
    for (auto& v : xh) v = f32_to_f16_bits(float(r.normal()));
    std::vector<float> y0(size_t(2 * N)), g(static_cast<size_t>(N));
    for (auto& v : y0) v = float(r.uniform() - 0.5);
    for (auto& v : g) v = float(0.5 + r.uniform());
    const float eps = 1e-5f;
    cuda::DeviceBuffer<uint16_t> dw(size_t(N * K), "W"), dx(xh.size(), "x"), dout(static_cast<size_t>(N), "out");
    cuda::DeviceBuffer<float> dy(y0.size(), "y"), dg(g.size(), "w");
    cuda::DeviceBuffer<int> arrivals(1, "arrivals");
    cuda::fill_bytes(arrivals.get(), 0, 4);
    cuda::fill_bytes(dw.get(), 0, size_t(N * K) * 2);
    cuda::copy_to_device(dx.get(), xh.data(), xh.size() * 2);
    cuda::copy_to_device(dg.get(), g.data(), g.size() * 4);
    const auto w4 = cuda::random_gptq_linear(N, K, 4, 0.002f, r);
    const auto nf = cuda::random_nf4_linear(N, K, 0.02f, r);
    const cuda::A16RowNorm rn{dg.get(), dout.get(), arrivals.get(), eps};
    auto out_bytes = [&] {
      std::vector<uint16_t> out(static_cast<size_t>(N));
      cuda::copy_to_host(out.data(), dout.get(), out.size() * 2);
      return out;
    };
    // One call with the fold asked: whether it was taken.
    auto run = [&](const std::string& fmt, int64_t M) {
      cuda::fill_bytes(dout.get(), 0, size_t(N) * 2);
      cuda::copy_to_device(dy.get(), y0.data(), size_t(M * N) * 4);
      cuda::a16_fold_norm(&rn);
      if (fmt == "f16") cuda::f16_linear_f32(dw.get(), dx.get(), M, N, K, dy.get(), 1.0f, true);
      else if (fmt == "w4") w4->gemm_f32(dx.get(), M, dy.get(), 1.0f);
      else nf->gemm_f32(dx.get(), M, dy.get(), 1.0f);
      return cuda::a16_folded();
    };
    using cuda::A16Fold;
    for (int rt : {1, 2})
      for (int slices : {0, 3, 16})
        for (int loop : {1, 2}) {
          std::vector<uint16_t> first;   // rep 0's out: rep 1 must give the same bytes
          for (int rep = 0; rep < 2; ++rep) {
            cuda::set_a16_split({rt, slices, 0, loop});
            const A16Fold taken = run("nf4", 1);
            cuda::set_a16_split({});
            INFO("N " << N << " rt " << rt << " slices " << slices << " loop " << loop << " rep " << rep);
            REQUIRE(taken == A16Fold::whole);
            std::vector<float> y(static_cast<size_t>(N));
            cuda::copy_to_host(y.data(), dy.get(), y.size() * 4);
            double ss = 0;
            for (float v : y) ss += double(v) * v;
            const double inv = 1.0 / std::sqrt(ss / double(N) + eps);
            const std::vector<uint16_t> out = out_bytes();
            double worst = 0;
            for (int64_t n = 0; n < N; ++n) {
              const double want = double(y[size_t(n)]) * inv * g[size_t(n)], got = f16_bits_to_f32(out[size_t(n)]);
              worst = std::max(worst, std::abs(got - want) / std::max(std::abs(want), 1e-3));
            }
            INFO("worst relative error of the folded norm " << worst);
            CHECK(worst <= 1.5e-3);   // f16 rounding (2^-11) plus fp32 sums
            if (rep == 0) first = out;
            else CHECK(out == first);
          }
        }
    CHECK(run("nf4", 2) == A16Fold::none);
    CHECK(run("w4", 1) == A16Fold::none);
    CHECK(run("f16", 1) == A16Fold::none);
    CHECK(cuda::a16_folded() == A16Fold::none);   // cleared
    const std::vector<uint16_t> out = out_bytes();
    CHECK(std::all_of(out.begin(), out.end(), [](uint16_t v) { return v == 0; }));
  }
}

namespace {
// The three A16 modules of one shape the fold tests call, random (GPTQ 4-bit g128, 8-bit per
// channel, NF4 blocks of 64), each writing fp32 y [M, N] from x [M, K].
struct FoldModules {
  std::unique_ptr<cuda::W4A16Linear> w4, w8;
  std::unique_ptr<cuda::Nf4Linear> nf;
  FoldModules(int64_t N, int64_t K, Rng& r)
      : w4(cuda::random_gptq_linear(N, K, 4, 0.002f, r)), w8(cuda::random_gptq_linear(N, K, 8, 0.0002f, r)), nf(cuda::random_nf4_linear(N, K, 0.02f, r)) {}
  void gemm_f32(const std::string& fmt, const void* x, int64_t M, float* y, cuda::A16Path path) const {
    if (fmt == "w4") w4->gemm_f32(x, M, y, 0.0f, path);
    else if (fmt == "w8") w8->gemm_f32(x, M, y, 0.0f, path);
    else nf->gemm_f32(x, M, y, 0.0f, path);
  }
};
// The model's rotary tables for heads of 128 (kA16RopeHead), max_len positions x 64 dims, angle
// p 10000^(-j / 64) in fp64 rounded to fp32: on the host (the tests' references) and the device.
struct RopeTables {
  std::vector<float> cos, sin;
  cuda::DeviceBuffer<float> dcos, dsin;
  explicit RopeTables(int max_len) : cos(size_t(max_len * 64)), sin(cos.size()), dcos(cos.size(), "cos"), dsin(cos.size(), "sin") {
    for (int p = 0; p < max_len; ++p)
      for (int j = 0; j < 64; ++j) {
        const double a = p * std::pow(10000.0, -j / 64.0);
        cos[size_t(p * 64 + j)] = float(std::cos(a)), sin[size_t(p * 64 + j)] = float(std::sin(a));
      }
    cuda::copy_to_device(dcos.get(), cos.data(), cos.size() * 4);
    cuda::copy_to_device(dsin.get(), sin.data(), sin.size() * 4);
  }
};
// The worst relative error of act [M, F] (f16 bits) against the fp64 silu(g) · u of y = [g | u]
// [M, N = 2F] (relative to max(|want|, 1e-2)).
double silu_act_error(const std::vector<float>& y, const std::vector<uint16_t>& a, int64_t M, int64_t F) {
  double worst = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < F; ++j) {
      const double g = y[size_t(m * 2 * F + j)], u = y[size_t(m * 2 * F + F + j)];
      const double want = g / (1.0 + std::exp(-g)) * u, got = f16_bits_to_f32(a[size_t(m * F + j)]);
      worst = std::max(worst, std::abs(got - want) / std::max(std::abs(want), 1e-2));
    }
  return worst;
}
}  // namespace

// silu(gate) · up written by a stacked gate, up Linear (a16_fold_silu: the decode's MLP up to 8
// rows). The folded call's act [M, F] must equal the fp64 silu(g) · u of the same Linear's unfolded
// output y = [g | u] (whose GEMM the tests above check against their references), rounded to f16,
// for f16 weights, GPTQ 4 and 8-bit and NF4, at 1, 3 and 8 rows and forced K slices; at 9 rows and
// with a forced one-row-tile split the request is not taken.
TEST_CASE("gpu: silu of gate times up folded into a stacked A16 or f16 Linear equals the fp64 silu of its output") {
  PTQ_REQUIRE_GPU();
  const int64_t F = 1008, N = 2 * F, K = 1024;   // 63 row tiles a half
  Rng r{42};
  std::vector<uint16_t> wh(size_t(N * K)), xh(size_t(9 * K));
  for (auto& v : wh) v = f32_to_f16_bits(float(r.normal() * 0.05));
  for (auto& v : xh) v = f32_to_f16_bits(float(r.normal()));
  cuda::DeviceBuffer<uint16_t> dw(wh.size(), "W"), dx(xh.size(), "x"), act(size_t(9 * F), "act");
  cuda::DeviceBuffer<float> dy(size_t(9 * N), "y");
  cuda::copy_to_device(dw.get(), wh.data(), wh.size() * 2);
  cuda::copy_to_device(dx.get(), xh.data(), xh.size() * 2);
  const auto w4 = cuda::random_gptq_linear(N, K, 4, 0.002f, r);
  const auto w8 = cuda::random_gptq_linear(N, K, 8, 0.0002f, r);
  const auto nf = cuda::random_nf4_linear(N, K, 0.02f, r);
  auto call = [&](const std::string& fmt, int64_t M) {
    if (fmt == "f16") cuda::f16_linear_f32(dw.get(), dx.get(), M, N, K, dy.get(), 0.0f, true);
    else if (fmt == "w4") w4->gemm_f32(dx.get(), M, dy.get(), 0.0f);
    else if (fmt == "w8") w8->gemm_f32(dx.get(), M, dy.get(), 0.0f);
    else nf->gemm_f32(dx.get(), M, dy.get(), 0.0f);
  };
  for (const std::string fmt : {"f16", "w4", "w8", "nf4"})
    for (int64_t M : {1, 3, 8})
      for (int slices : {0, 3})
        for (int loop : {1, 2}) {
          INFO(fmt << " M " << M << " slices " << slices << " loop " << loop);
          call(fmt, M);   // unfolded: y = [g | u]
          std::vector<float> y(size_t(M * N));
          cuda::copy_to_host(y.data(), dy.get(), y.size() * 4);
          cuda::fill_bytes(act.get(), 0, size_t(9 * F) * 2);
          cuda::set_a16_split({0, slices, 0, loop});
          cuda::a16_fold_silu(act.get());
          call(fmt, M);
          const cuda::A16Fold taken = cuda::a16_folded();
          cuda::set_a16_split({});
          REQUIRE(taken == cuda::A16Fold::whole);
          std::vector<uint16_t> a(size_t(M * F));
          cuda::copy_to_host(a.data(), act.get(), a.size() * 2);
          const double worst = silu_act_error(y, a, M, F);
          INFO("worst relative error " << worst);
          CHECK(worst <= 2e-3);   // f16 rounding (2^-11), fp32 silu, another split's sums
        }
  cuda::a16_fold_silu(act.get());
  call("w4", 9);
  CHECK(cuda::a16_folded() == cuda::A16Fold::none);
  cuda::set_a16_split({1, 0, 0, 0});
  cuda::a16_fold_silu(act.get());
  call("w8", 1);
  cuda::set_a16_split({});
  CHECK(cuda::a16_folded() == cuda::A16Fold::none);
}

// The same fold in the wgmma kernel's streamed form at 9..32 rows (GPTQ 4-bit g128, 8-bit per
// channel, NF4; 1 and 3 K slices): act must equal the fp64 silu(g) · u of that form's unfolded
// output at the same slices (the same sums), rounded to f16, and its copy in the wgmma kernel's
// order hold the same values at a16_wgmma_x_col's columns. The L2-fed kernel declines a request
// with that copy (it does not write it).
TEST_CASE("gpu: silu of gate times up folded into the wgmma kernel's streamed form at 9 to 32 rows equals the fp64 silu of its output") {
  PTQ_REQUIRE_GPU();
  if (!cuda::a16_wgmma_supported()) PTQ_SKIP("the wgmma A16 kernel needs sm_90: " + cuda::describe());
  const int64_t F = 1024, N = 2 * F, K = 1024, Mmax = 32;
  Rng r{43};
  std::vector<uint16_t> xh(size_t(Mmax * K));
  for (auto& v : xh) v = f32_to_f16_bits(float(r.normal()));
  cuda::DeviceBuffer<uint16_t> dx(xh.size(), "x"), act(size_t(Mmax * F), "act"), perm(size_t(Mmax * F), "act in the wgmma order");
  cuda::DeviceBuffer<float> dy(size_t(Mmax * N), "y");
  cuda::copy_to_device(dx.get(), xh.data(), xh.size() * 2);
  const FoldModules mods(N, K, r);
  auto call = [&](const std::string& fmt, int64_t M, cuda::A16Path path) { mods.gemm_f32(fmt, dx.get(), M, dy.get(), path); };
  for (const std::string fmt : {"w4", "w8", "nf4"})
    for (int64_t M : {9, 17, 32})
      for (int slices : {1, 3}) {
        INFO(fmt << " M " << M << " slices " << slices);
        cuda::set_a16_split({0, slices, 0, 0, 2});   // the streamed form
        call(fmt, M, cuda::A16Path::wgmma);           // unfolded: y = [g | u]
        std::vector<float> y(size_t(M * N));
        cuda::copy_to_host(y.data(), dy.get(), y.size() * 4);
        cuda::fill_bytes(act.get(), 0, size_t(Mmax * F) * 2);
        cuda::fill_bytes(perm.get(), 0, size_t(Mmax * F) * 2);
        cuda::a16_fold_silu(act.get(), perm.get());
        call(fmt, M, cuda::A16Path::wgmma);
        const cuda::A16Fold taken = cuda::a16_folded();
        cuda::set_a16_split({});
        REQUIRE(taken == cuda::A16Fold::whole);
        std::vector<uint16_t> a(size_t(M * F)), p(size_t(M * F));
        cuda::copy_to_host(a.data(), act.get(), a.size() * 2);
        cuda::copy_to_host(p.data(), perm.get(), p.size() * 2);
        const double worst = silu_act_error(y, a, M, F);
        int64_t moved = 0;
        for (int64_t m = 0; m < M; ++m)
          for (int64_t j = 0; j < F; ++j) moved += p[size_t(m * F + cuda::a16_wgmma_x_col(j))] != a[size_t(m * F + j)];
        INFO("worst relative error " << worst);
        CHECK(worst <= 2e-3);   // f16 rounding (2^-11), fp32 silu
        CHECK(moved == 0);
      }
  cuda::a16_fold_silu(act.get(), perm.get());   // the L2-fed kernel at 8 rows: no copy in that order, so it declines
  call("w4", 8, cuda::A16Path::automatic);
  CHECK(cuda::a16_folded() == cuda::A16Fold::none);
}

// The rotary embedding and KV append folded into a stacked q, k, v Linear (a16_fold_rope: the
// wgmma kernel's streamed form at 17..32 rows, GPTQ 4-bit g128, 8-bit per channel and NF4 blocks of
// 64, 1 and 3 K slices; 4 query and 2 key/value heads of 128). Against the fp64 rotation of the
// same form's unfolded output y at the same slices: q rotated, and at each token's row (n / T, pos
// + n % T) of the caches the rotated key and the value, rounded to f16; every other cache row
// untouched. The L2-fed kernel (8 rows) and a shape that is not (nh + 2 nkv) heads decline.
TEST_CASE("gpu: the rotary and KV append folded into the wgmma kernel's streamed q, k, v Linear equal the fp64 rotation of its output") {
  PTQ_REQUIRE_GPU();
  if (!cuda::a16_wgmma_supported()) PTQ_SKIP("the wgmma A16 kernel needs sm_90: " + cuda::describe());
  const int nh = 4, nkv = 2, hd = 128, max_len = 16, pos = 5, Mmax = 32;
  const int64_t N = int64_t(nh + 2 * nkv) * hd, K = 1024;
  Rng r{44};
  std::vector<uint16_t> xh(size_t(Mmax * K));
  for (auto& v : xh) v = f32_to_f16_bits(float(r.normal()));
  const RopeTables tab(max_len);
  const std::vector<float>& cs = tab.cos;
  const std::vector<float>& sn = tab.sin;
  const size_t cache = size_t(Mmax) * max_len * nkv * hd;   // up to Mmax sequences
  cuda::DeviceBuffer<uint16_t> dx(xh.size(), "x"), q(size_t(Mmax) * nh * hd, "q"), kc(cache, "k cache"), vc(cache, "v cache");
  cuda::DeviceBuffer<float> dy(size_t(Mmax * N), "y");
  const cuda::DeviceBuffer<float>& dcos = tab.dcos;
  const cuda::DeviceBuffer<float>& dsin = tab.dsin;
  cuda::DeviceBuffer<int> dpos(1, "pos");
  cuda::copy_to_device(dx.get(), xh.data(), xh.size() * 2);
  cuda::copy_to_device(dpos.get(), &pos, sizeof(int));
  const FoldModules mods(N, K, r);
  auto call = [&](const std::string& fmt, int64_t M, cuda::A16Path path) { mods.gemm_f32(fmt, dx.get(), M, dy.get(), path); };
  const uint16_t kUntouched = 0x3C00;   // 1.0 in f16
  auto fill_caches = [&] {
    const std::vector<uint16_t> ones(cache, kUntouched);
    cuda::copy_to_device(kc.get(), ones.data(), cache * 2);
    cuda::copy_to_device(vc.get(), ones.data(), cache * 2);
  };
  for (const std::string fmt : {"w4", "w8", "nf4"})
    for (auto [M, T] : {std::pair{17, 1}, std::pair{24, 3}, std::pair{32, 1}})
      for (int slices : {1, 3}) {
        INFO(fmt << " M " << M << " T " << T << " slices " << slices);
        cuda::set_a16_split({0, slices, 0, 0, 2});   // the streamed form
        call(fmt, M, cuda::A16Path::wgmma);           // unfolded: y = [q | k | v]
        std::vector<float> y(size_t(M) * size_t(N));
        cuda::copy_to_host(y.data(), dy.get(), y.size() * 4);
        cuda::fill_bytes(q.get(), 0, q.size() * 2);
        fill_caches();
        const cuda::A16Rope rope{dcos.get(), dsin.get(), dpos.get(), q.get(), kc.get(), vc.get(), T, nh, nkv, max_len};
        cuda::a16_fold_rope(&rope);
        call(fmt, M, cuda::A16Path::wgmma);
        const cuda::A16Fold taken = cuda::a16_folded();
        cuda::set_a16_split({});
        REQUIRE(taken == cuda::A16Fold::whole);
        std::vector<uint16_t> qg(q.size()), kg(cache), vg(cache);
        cuda::copy_to_host(qg.data(), q.get(), qg.size() * 2);
        cuda::copy_to_host(kg.data(), kc.get(), cache * 2);
        cuda::copy_to_host(vg.data(), vc.get(), cache * 2);
        double worst = 0;
        std::vector<char> written(cache, 0);
        for (int n = 0; n < M; ++n) {
          const int b = n / T, p = pos + n % T;
          for (int h = 0; h < nh + 2 * nkv; ++h)
            for (int j = 0; j < hd; ++j) {
              const float* yh = y.data() + size_t(n) * size_t(N) + size_t(h * hd);
              const double c = cs[size_t(p * 64 + j % 64)], s = sn[size_t(p * 64 + j % 64)];
              const double lo = yh[j % 64], hi = yh[64 + j % 64];
              const double want = h >= nh + nkv ? yh[j] : j < 64 ? lo * c - hi * s : hi * c + lo * s;
              size_t at = size_t(n) * nh * hd + size_t(h * hd + j);
              const uint16_t* got = qg.data();
              if (h >= nh) {
                const int kv = (h - nh) % nkv;
                at = (size_t(b) * max_len + size_t(p)) * nkv * hd + size_t(kv * hd + j);
                got = h < nh + nkv ? kg.data() : vg.data();
                written[at] |= char(h < nh + nkv ? 1 : 2);
              }
              worst = std::max(worst, std::abs(f16_bits_to_f32(got[at]) - want) / std::max(std::abs(want), 1e-2));
            }
        }
        int64_t stray = 0;
        for (size_t i = 0; i < cache; ++i) stray += (!(written[i] & 1) && kg[i] != kUntouched) + (!(written[i] & 2) && vg[i] != kUntouched);
        INFO("worst relative error " << worst);
        CHECK(worst <= 2e-3);   // f16 rounding (2^-11), fp32 products
        CHECK(stray == 0);
      }
  const cuda::A16Rope rope{dcos.get(), dsin.get(), dpos.get(), q.get(), kc.get(), vc.get(), 1, nh, nkv, max_len};
  cuda::set_a16_split({0, 0, 0, 0, 2});
  const cuda::A16Rope other{dcos.get(), dsin.get(), dpos.get(), q.get(), kc.get(), vc.get(), 1, nh + 1, nkv, max_len};
  cuda::a16_fold_rope(&other);   // N is not (nh + 2 nkv) heads
  call("w4", 32, cuda::A16Path::wgmma);
  CHECK(cuda::a16_folded() == cuda::A16Fold::none);
  cuda::set_a16_split({});
  cuda::a16_fold_rope(&rope);   // the L2-fed kernel at 8 rows
  call("w4", 8, cuda::A16Path::automatic);
  CHECK(cuda::a16_folded() == cuda::A16Fold::none);
}

// The norm split at 17..32 rows (decode at batch 17..32; A16RowNorm): the writer (the L2-fed
// kernel, GPTQ 4-bit g128, 8-bit per channel and NF4, row tiles 1 and 2, K slices 1 and 3; the
// wgmma kernel's k-step loop, GPTQ codes, 2 and 3 K slices; beta 1) must leave each token's fp64 sums of squares of each 16 rows of the y it wrote (1e-5: fp32 sums
// of 16 squares), out = f16(fp32 (y * w) / 16) bit for bit and out's copy at a16_wgmma_x_col's
// columns, twice with the same bytes. A reader on the wgmma kernel's streamed form (GPTQ 4-bit,
// 8-bit per channel and NF4, 1 and 3 K slices), given out's copy, must return its product scaled
// by 16 / rms(y_n) per token in fp64: silu(g) · u of the scaled sums of its own plain call on out
// (2e-3: f16 rounding) with a16_fold_silu, and the rotated scaled q with a16_fold_rope. The L2-fed
// kernel at 17..32 rows is no reader, the streamed form's plain epilogue declines the reader's
// request, and the streamed form and the k-step loop at one K slice the writer's.
TEST_CASE("gpu: a norm split between two Linears at 17 to 32 rows: the writer's sums per token, the streamed reader's sums scaled by 16 / rms(y_n)") {
  PTQ_REQUIRE_GPU();
  const int64_t Kw = 512, D = 1024, F = 1024, Mmax = 32;   // writer Kw -> D; readers D -> 2F (silu) or 8 heads of 128 (rope)
  Rng r{45};
  std::vector<uint16_t> xh(size_t(Mmax * Kw));
  for (auto& v : xh) v = f32_to_f16_bits(float(r.normal()));
  std::vector<float> y0(size_t(Mmax * D)), g(static_cast<size_t>(D));
  for (auto& v : y0) v = float(3.0 * (r.uniform() - 0.5));
  for (auto& v : g) v = float(0.5 + r.uniform());
  const float eps = 1e-5f;
  const int64_t tiles = D / 16;
  cuda::DeviceBuffer<uint16_t> dx(xh.size(), "x"), dout(size_t(Mmax * D), "out"), dperm(size_t(Mmax * D), "out in the wgmma order");
  cuda::DeviceBuffer<uint16_t> act(size_t(Mmax * F), "act"), act_perm(size_t(Mmax * F), "act in the wgmma order");
  cuda::DeviceBuffer<float> dy(y0.size(), "y"), dg(g.size(), "w"), dss(size_t(Mmax * tiles), "row sums"), dy2(size_t(Mmax * 2 * F), "y2");
  cuda::DeviceBuffer<int> arrivals(1, "arrivals");
  cuda::fill_bytes(arrivals.get(), 0, 4);
  cuda::copy_to_device(dx.get(), xh.data(), xh.size() * 2);
  cuda::copy_to_device(dg.get(), g.data(), g.size() * 4);
  auto host = [](const auto& buf, size_t n) {
    std::vector<std::remove_cv_t<std::remove_pointer_t<decltype(buf.get())>>> v(n);
    cuda::copy_to_host(v.data(), buf.get(), n * sizeof(v[0]));
    return v;
  };
  const auto w4 = cuda::random_gptq_linear(D, Kw, 4, 0.002f, r);
  const auto w8 = cuda::random_gptq_linear(D, Kw, 8, 0.0002f, r);
  const auto nf = cuda::random_nf4_linear(D, Kw, 0.02f, r);
  cuda::A16RowNorm wn{dg.get(), dout.get(), arrivals.get(), eps};
  wn.row_ss = dss.get(), wn.out_perm = dperm.get();
  cuda::A16RowNorm rn{};
  rn.in_ss = dss.get(), rn.in_eps = eps;
  std::vector<double> inv(static_cast<size_t>(Mmax));   // 16 / rms(y_n) of the last write, fp64
  // The writers: the L2-fed kernel (GPTQ and NF4 codes, one or two row tiles a warp, the planner's
  // or 3 K slices) and the wgmma kernel's k-step loop (GPTQ codes, 2 or 3 K slices: its split-K sum
  // writes it).
  for (const std::string wf : {"w4", "w8", "nf4", "w4 loop", "w8 loop"})
    for (int64_t M : {17, 24, 32})
      for (int rt : {1, 2})
        for (int slices : {0, 3}) {
          const bool loop = wf.size() > 3;
          if (loop && rt == 2) continue;
          std::vector<float> first_ss;
          std::vector<uint16_t> first_out;
          for (int rep = 0; rep < 2; ++rep) {
            INFO("writer " << wf << " M " << M << " rt " << rt << " slices " << slices << " rep " << rep);
            cuda::copy_to_device(dy.get(), y0.data(), size_t(M * D) * 4);
            if (loop) cuda::set_a16_split({0, slices == 0 ? 2 : slices, 0, 0, 1});
            else cuda::set_a16_split({rt, slices, 0, 0});
            cuda::a16_fold_norm(&wn);
            const cuda::A16Path path = loop ? cuda::A16Path::wgmma : cuda::A16Path::automatic;
            if (wf[0] == 'w') (wf[1] == '4' ? w4 : w8)->gemm_f32(dx.get(), M, dy.get(), 1.0f, path);
            else nf->gemm_f32(dx.get(), M, dy.get(), 1.0f);
            const cuda::A16Fold taken = cuda::a16_folded();
            cuda::set_a16_split({});
            REQUIRE(taken == cuda::A16Fold::split);
            const std::vector<float> y = host(dy, size_t(M * D)), ss = host(dss, size_t(M * tiles));
            const std::vector<uint16_t> out = host(dout, size_t(M * D)), perm = host(dperm, size_t(M * D));
            double worst = 0;
            int64_t out_wrong = 0, perm_wrong = 0;
            for (int64_t m = 0; m < M; ++m) {
              double total = 0;
              for (int64_t t = 0; t < tiles; ++t) {
                double want = 0;
                for (int64_t n = 16 * t; n < 16 * t + 16; ++n) want += double(y[size_t(m * D + n)]) * y[size_t(m * D + n)];
                worst = std::max(worst, std::abs(double(ss[size_t(m * tiles + t)]) - want) / want);
                total += want;
              }
              inv[size_t(m)] = 1.0 / std::sqrt(total / double(D) + eps) / double(cuda::kSplitNormScale);
              for (int64_t n = 0; n < D; ++n) {
                const uint16_t want = f32_to_f16_bits(y[size_t(m * D + n)] * g[size_t(n)] * cuda::kSplitNormScale);
                out_wrong += out[size_t(m * D + n)] != want;
                perm_wrong += perm[size_t(m * D + cuda::a16_wgmma_x_col(n))] != want;
              }
            }
            INFO("worst relative error of a 16-row sum " << worst << ", elements of out off " << out_wrong << ", of its copy " << perm_wrong);
            CHECK(worst <= 1e-5);
            CHECK(out_wrong == 0);
            CHECK(perm_wrong == 0);
            if (rep == 0) first_ss = ss, first_out = out;
            else CHECK((ss == first_ss && out == first_out));
          }
        }
  // The readers, on the last write (M = 32): the plain call's sums scaled per token.
  const int64_t M = 32;
  const FoldModules gate_up(2 * F, D, r);
  for (const std::string fmt : {"w4", "w8", "nf4"})
    for (int slices : {1, 3}) {
      INFO("silu reader " << fmt << " slices " << slices);
      cuda::set_a16_split({0, slices, 0, 0, 2});   // the streamed form
      gate_up.gemm_f32(fmt, dout.get(), M, dy2.get(), cuda::A16Path::wgmma);
      std::vector<float> y = host(dy2, size_t(M * 2 * F));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < 2 * F; ++j) y[size_t(m * 2 * F + j)] = float(y[size_t(m * 2 * F + j)] * inv[size_t(m)]);
      cuda::a16_norm_in(&rn);
      cuda::a16_fold_silu(act.get(), act_perm.get());
      cuda::a16_offer_wgmma_x(dout.get(), dperm.get());
      gate_up.gemm_f32(fmt, dout.get(), M, dy2.get(), cuda::A16Path::wgmma);
      const bool took_x = cuda::a16_took_wgmma_x(), took_in = cuda::a16_took_norm_in();
      const cuda::A16Fold folded = cuda::a16_folded();
      cuda::set_a16_split({});
      REQUIRE(took_in);
      CHECK(took_x);
      CHECK(folded == cuda::A16Fold::whole);
      const double worst = silu_act_error(y, host(act, size_t(M * F)), M, F);
      INFO("worst relative error " << worst);
      CHECK(worst <= 2e-3);
    }
  {   // the rotary reader: 4 query and 2 key/value heads of 128, one token a sequence, position 3
    const int nh = 4, nkv = 2, hd = 128, max_len = 8, pos = 3;
    const int64_t N = int64_t(nh + 2 * nkv) * hd;
    const RopeTables tab(max_len);
    const std::vector<float>& cs = tab.cos;
    const std::vector<float>& sn = tab.sin;
    const size_t cache = size_t(M) * max_len * nkv * hd;
    cuda::DeviceBuffer<uint16_t> q(size_t(M) * nh * hd, "q"), kc(cache, "k cache"), vc(cache, "v cache");
    cuda::DeviceBuffer<float> dyq(size_t(M * N), "y");
    const cuda::DeviceBuffer<float>& dcos = tab.dcos;
    const cuda::DeviceBuffer<float>& dsin = tab.dsin;
    cuda::DeviceBuffer<int> dpos(1, "pos");
    cuda::copy_to_device(dpos.get(), &pos, sizeof(int));
    const FoldModules qkv(N, D, r);
    for (const std::string fmt : {"w4", "w8", "nf4"}) {
      INFO("rotary reader " << fmt);
      cuda::set_a16_split({0, 3, 0, 0, 2});
      qkv.gemm_f32(fmt, dout.get(), M, dyq.get(), cuda::A16Path::wgmma);
      const std::vector<float> y = host(dyq, size_t(M * N));
      const cuda::A16Rope rope{dcos.get(), dsin.get(), dpos.get(), q.get(), kc.get(), vc.get(), 1, nh, nkv, max_len};
      cuda::a16_norm_in(&rn);
      cuda::a16_fold_rope(&rope);
      qkv.gemm_f32(fmt, dout.get(), M, dyq.get(), cuda::A16Path::wgmma);
      const bool took_in = cuda::a16_took_norm_in();
      const cuda::A16Fold folded = cuda::a16_folded();
      cuda::set_a16_split({});
      REQUIRE(took_in);
      CHECK(folded == cuda::A16Fold::whole);
      const std::vector<uint16_t> qg = host(q, q.size()), vg = host(vc, cache);
      double worst = 0;
      for (int64_t n = 0; n < M; ++n)
        for (int h = 0; h < nh; ++h)
          for (int j = 0; j < hd; ++j) {   // q rotated; the value heads as they are
            const float* yh = y.data() + size_t(n * N + h * hd);
            const double c = cs[size_t(pos * 64 + j % 64)], s = sn[size_t(pos * 64 + j % 64)];
            const double lo = yh[j % 64] * inv[size_t(n)], hi = yh[64 + j % 64] * inv[size_t(n)];
            const double want = j < 64 ? lo * c - hi * s : hi * c + lo * s;
            worst = std::max(worst, std::abs(f16_bits_to_f32(qg[size_t((n * nh + h) * hd + j)]) - want) / std::max(std::abs(want), 1e-2));
            if (h < nkv) {
              const double v = y[size_t(n * N + (nh + nkv + h) * hd + j)] * inv[size_t(n)];
              const size_t at = (size_t(n) * max_len + size_t(pos)) * nkv * hd + size_t(h * hd + j);
              worst = std::max(worst, std::abs(f16_bits_to_f32(vg[at]) - v) / std::max(std::abs(v), 1e-2));
            }
          }
      INFO("worst relative error " << worst);
      CHECK(worst <= 2e-3);
    }
  }
  // No reader: the L2-fed kernel at 32 rows, the streamed form's plain epilogue; no writer: the
  // streamed form.
  cuda::a16_norm_in(&rn);
  gate_up.gemm_f32("w4", dout.get(), M, dy2.get(), cuda::A16Path::mma);
  CHECK_FALSE(cuda::a16_took_norm_in());
  cuda::set_a16_split({0, 0, 0, 0, 2});
  cuda::a16_norm_in(&rn);
  gate_up.gemm_f32("w4", dout.get(), M, dy2.get(), cuda::A16Path::wgmma);
  CHECK_FALSE(cuda::a16_took_norm_in());
  cuda::a16_fold_norm(&wn);
  w4->gemm_f32(dx.get(), M, dy.get(), 1.0f, cuda::A16Path::wgmma);
  CHECK(cuda::a16_folded() == cuda::A16Fold::none);
  cuda::set_a16_split({0, 1, 0, 0, 1});   // the k-step loop without a split-K sum
  cuda::a16_fold_norm(&wn);
  w4->gemm_f32(dx.get(), M, dy.get(), 1.0f, cuda::A16Path::wgmma);
  CHECK(cuda::a16_folded() == cuda::A16Fold::none);
  cuda::set_a16_split({});
}

// The A16 kernels are launched with programmatic dependent launch (cuda/pdl.cuh): each may start
// while the one before it runs, reading only W before it waits. A chain of calls queued without a
// host sync, each reading the previous call's output and overwriting the buffer the call before
// it read (ping-pong), must equal the reference chain (fp32 GEMMs, each output rounded to f16 as
// the kernels store it): a read of x or a write of y before the wait would read stale activations
// (the chain's input two steps back) or clobber the previous call's input. Six square layers
// alternating two modules (g128 symmetric, per-channel asymmetric), at M = 1 and 16 (the L2-fed
// kernel) and 64 (wgmma on sm_90: permute_x then the GEMM, both with PDL).
TEST_CASE("gpu: A16 calls chained without a host sync (PDL) equal the reference chain") {
  PTQ_REQUIRE_GPU();
  const int64_t D = 2048;
  for (int bits : {4, 8}) {
    // Scales brought down so that each layer keeps |y| ~ |x| (rms of W ~ 1/sqrt(D)): six f16 layers
    // must not overflow.
    auto contractive = [&](QuantizedLinear q) {
      double ss = 0;
      for (int64_t o = 0; o < D; ++o)
        for (int64_t i = 0; i < D; ++i) {
          const int64_t gi = int64_t(q.g_idx[size_t(i)]) * D + o;
          const double w = (double(q.code(o, i)) - q.zeros[size_t(gi)]) * q.scales[size_t(gi)];
          ss += w * w;
        }
      const double f = 1.0 / std::sqrt(ss / double(D));   // rms(W) * sqrt(D) -> 1
      for (auto& v : q.scales) v = round_to(DType::F16, float(v * f));
      return q;
    };
    const GptqPacked pk[2] = {pack_gptq(contractive(random_q(bits, D, D, 128, true, false, 5)), true),
                              pack_gptq(contractive(random_q(bits, D, D, -1, false, false, 6)), true)};
    const std::unique_ptr<cuda::W4A16Linear> L[2] = {cuda::W4A16Linear::from_gptq(pk[0], true), cuda::W4A16Linear::from_gptq(pk[1], true)};
    for (int64_t M : {1, 16, 64}) {
      Rng r{uint64_t(M + bits)};
      std::vector<float> cur(size_t(M * D)), next(cur.size());
      std::vector<uint16_t> xh(cur.size()), yh(cur.size());
      for (size_t i = 0; i < cur.size(); ++i) {
        cur[i] = round_to(DType::F16, float(r.normal()));
        xh[i] = f32_to_f16_bits(cur[i]);
      }
      cuda::DeviceBuffer<uint16_t> buf[2] = {cuda::DeviceBuffer<uint16_t>(xh.size(), "x"), cuda::DeviceBuffer<uint16_t>(xh.size(), "y")};
      cuda::copy_to_device(buf[0].get(), xh.data(), xh.size() * 2);
      constexpr int kSteps = 6;
      for (int i = 0; i < kSteps; ++i) L[i % 2]->gemm(buf[i % 2].get(), M, buf[1 - i % 2].get());   // no sync between calls
      for (int i = 0; i < kSteps; ++i) {
        ref_gemm_gptq(cur.data(), M, pk[i % 2], true, next.data());
        for (size_t j = 0; j < next.size(); ++j) cur[j] = round_to(DType::F16, next[j]);
      }
      cuda::copy_to_host(yh.data(), buf[kSteps % 2].get(), yh.size() * 2);
      const double rel = rel_error_f16(yh, cur);
      INFO(bits << "-bit M=" << M << " path " << cuda::a16_path_name(L[0]->path_for(M)) << " (PDL " << (cuda::pdl_enabled() ? "on" : "off")
                << "): relative error after " << kSteps << " chained calls " << rel);
      CHECK(rel <= 5e-3);   // one call: <= 2e-3; rounding differences of the intermediates compound
    }
  }
}

// The kernel with x in shared memory (kernels/a16_shared_x.cuh): every work split it can be given
// (4, 8 or 16 warps per CTA, 1, 3 or 16 K slices) against the reference GEMM, at M = 9 .. 128 (16
// to 128 staged x rows, rows past M zero). N = 1000: 63 tiles, so the last CTA's warps partly lie
// past N; K = 2000: the last chunk partial and its last k-step a quarter full; per-channel scales
// and act-order groups of 80. Then a 16-slice split four times (same bytes), fp32 output with beta,
// and M past 128 refused.
TEST_CASE("gpu: the shared-x A16 kernel: every split equals the reference GEMM, its split-K sum is deterministic, M > 128 refused") {
  PTQ_REQUIRE_GPU();
  const int64_t N = 1000, K = 2000;
  for (int gs : {-1, 80}) {
    const QuantizedLinear q = random_q(4, N, K, gs, gs < 0, gs > 0, 93);
    const GptqPacked pk = pack_gptq(q, true);
    auto L = cuda::W4A16Linear::from_gptq(pk, true);
    for (int64_t M : {9, 17, 33, 64, 65, 128}) {
      Rng r{uint64_t(M + gs)};
      std::vector<float> x(size_t(M * K)), yr(size_t(M * N));
      std::vector<uint16_t> xh(x.size()), yh(yr.size());
      for (size_t i = 0; i < x.size(); ++i) {
        x[i] = round_to(DType::F16, float(r.normal()));
        xh[i] = f32_to_f16_bits(x[i]);
      }
      ref_gemm_gptq(x.data(), M, pk, true, yr.data());
      cuda::DeviceBuffer<uint16_t> dx(xh.size(), "x"), dy(yh.size(), "y");
      cuda::copy_to_device(dx.get(), xh.data(), xh.size() * 2);
      for (int warps : {4, 8, 16})   // 16: where the kernel is compiled for 512 threads (M <= 64), else the planner takes 8
        for (int slices : {1, 3, 16}) {
          cuda::set_a16_split({0, slices, warps});
          L->gemm(dx.get(), M, dy.get(), cuda::A16Path::shared_x);
          cuda::set_a16_split({});
          cuda::copy_to_host(yh.data(), dy.get(), yh.size() * 2);
          const double rel = rel_error_f16(yh, yr);
          INFO("g" << gs << " M=" << M << " warps=" << warps << " slices=" << slices << ": relative error " << rel);
          CHECK(rel <= 2e-3);
        }
    }
  }
  // Split-K: the partials summed in slice order by whichever CTA arrives last: the same bytes every time.
  const QuantizedLinear q = random_q(4, 4096, 4096, 128, true, false, 94);
  const GptqPacked pk = pack_gptq(q, true);
  auto L = cuda::W4A16Linear::from_gptq(pk, true);
  cuda::set_a16_split({0, 16, 4});
  check_repeat_and_beta(*L, pk, 64, 4096, cuda::A16Path::shared_x, 6);
  cuda::set_a16_split({});
  cuda::DeviceBuffer<uint16_t> dx(size_t(129 * 4096), "x"), dy(size_t(129 * 4096), "y");
  CHECK_THROWS_AS(L->gemm(dx.get(), 129, dy.get(), cuda::A16Path::shared_x), Error);
}

// The sweep lists of the A16 kernels (a16_sweep_cells: PTQKIT_A16_TMA_CELLS, PTQKIT_A16_MMA_CELLS,
// through core/env.h's list parser, whose integer and on/off switches test_core checks) give the
// entries written, each field in place and 0 where left out. A malformed entry is refused with an
// error that names the variable, never skipped or read as 0 (an A/B would otherwise time the
// default while its log says otherwise). No GPU needed.
TEST_CASE("sweep lists: the A16 kernels' cells parse as written, a malformed one is refused naming the variable") {
  const char* var = "PTQKIT_A16_MMA_CELLS";
  ::setenv(var, "4096x4096:4:2:8,12288x4096:0:-1", 1);
  const std::vector<cuda::A16SweepCell> c = cuda::a16_sweep_cells(var);
  REQUIRE(c.size() == 2);
  CHECK((c[0].N == 4096 && c[0].K == 4096 && c[0].bits == 4 && c[0].a == 2 && c[0].b == 8));
  CHECK((c[1].N == 12288 && c[1].K == 4096 && c[1].bits == 0 && c[1].a == -1 && c[1].b == 0));
  for (const char* bad : {"4096x4096:4,12288x4096:x", "4096:4096:4", "4096x4096", "4096x4096:4:", "4096x4096:4,,", "4096x4096: 4", "4096x4096:4:1:2:3",
                          "99999999999999999999x4096:4"}) {
    INFO(bad);
    ::setenv(var, bad, 1);
    try {
      (void)cuda::a16_sweep_cells(var);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.code == Errc::usage);
      CHECK(e.field == var);
      CHECK(std::string(e.what()).find("want NxK:bits[:a[:b]]") != std::string::npos);
    }
  }
  ::setenv(var, "", 1);
  CHECK(cuda::a16_sweep_cells(var).empty());
  ::unsetenv(var);
  CHECK(cuda::a16_sweep_cells(var).empty());
}

// cuBLAS and cuSOLVER are opened at their first call (cuda/libs.cpp), not when a process starts;
// the CLI's case "cli: a command that does not use the GPU's BLAS ..." checks the "not before"
// through the dynamic loader's log, and every GPU case calls them through cuda/libs.cpp. Here: the
// toolkit's libraries open by soname without a GPU (CI), and a library that cannot be opened is an
// io error naming it and what it is.
TEST_CASE("cuda libraries: the toolkit's cuBLAS and cuSOLVER open by soname, a missing one is an error naming it") {
  CHECK(cuda::open_library("libcublas.so." + std::to_string(CUBLAS_VER_MAJOR), "cuBLAS", "/nonexistent", "-") != nullptr);
  CHECK(cuda::open_library("libcusolver.so." + std::to_string(CUSOLVER_VER_MAJOR), "cuSOLVER", "/nonexistent", "-") != nullptr);
  try {
    (void)cuda::open_library("libptqkit-absent.so.7", "cuBLAS", "/nonexistent", "put its folder on LD_LIBRARY_PATH");
    FAIL("opened a library that does not exist");
  } catch (const Error& e) {
    CHECK(e.code == Errc::io);
    CHECK(e.file == "libptqkit-absent.so.7");
    CHECK(std::string(e.what()).find("cuBLAS cannot be loaded") != std::string::npos);
    CHECK(std::string(e.what()).find("/nonexistent/libptqkit-absent.so.7") != std::string::npos);   // dlopen's own message for the folder
    CHECK(std::string(e.what()).find("LD_LIBRARY_PATH") != std::string::npos);
  }
}

// The Hopper kernel (kernels/a16_wgmma.cu): every split it can be given (1, 3 or 16 K slices)
// against the reference GEMMs at M = 1 .. 256 (8, 16, 32, 64, 128 and 256 staged x rows, rows past M
// zero). N = 1000: the last CTA's rows partly past N; K = 2000: the last k-step a quarter full;
// GPTQ 4- and 8-bit with per-channel scales, act-order groups of 80 and groups of 16; NF4 blocks of
// 64. Then a 16-slice split four times (same bytes), fp32 output with beta, and M past 256 refused.
// The automatic path's table at 17..32 rows on sm_90 (a16_path.h), as measured on the H200 (lab
// run 86; W8 11008 x 4096 with 3 K slices, run 197; W8 12288 x 4096 and 3072 x 8192 with the
// wgmma kernel's streamed form, run 234; W8 6144 x 4096 with it, runs 296-297; W4 6144 x 4096 with
// it at 4 K slices, runs 338-339): which kernel was fastest on each of the nine Llama and
// stacked decode shapes, and where the streamed form serves. No GPU needed.
TEST_CASE("the A16 path at 17 to 32 rows follows the H200 measurements on the Llama and Phi-3 shapes") {
  using P = cuda::A16Path;
  struct Cell { int64_t N, K; P w4, w8, nf4; };
  const Cell cells[] = {
      {4096, 4096, P::wgmma, P::mma, P::mma},      {6144, 4096, P::wgmma, P::wgmma, P::wgmma},      {11008, 4096, P::wgmma, P::wgmma, P::mma},
      {12288, 4096, P::wgmma, P::wgmma, P::wgmma}, {14336, 4096, P::wgmma, P::wgmma, P::mma},  {22016, 4096, P::wgmma, P::wgmma, P::wgmma},
      {28672, 4096, P::wgmma, P::wgmma, P::wgmma}, {4096, 11008, P::wgmma, P::wgmma, P::mma},  {4096, 14336, P::wgmma, P::wgmma, P::mma}};
  for (const Cell& c : cells) {
    INFO(c.N << " x " << c.K);
    for (int64_t M : {17, 24, 32}) {
      INFO("M = " << M);
      CHECK(cuda::a16_auto_path(M, c.N, c.K, 4, true) == c.w4);
      CHECK(cuda::a16_auto_path(M, c.N, c.K, 8, true) == c.w8);
      CHECK(cuda::a16_auto_path(M, c.N, c.K, 0, true) == c.nf4);
      CHECK(cuda::a16_auto_path(M, c.N, c.K, 4, false) == P::mma);   // without sm_90
    }
    CHECK(cuda::a16_auto_path(16, c.N, c.K, 4, true) == P::mma);     // the table's bounds
    CHECK(cuda::a16_auto_path(33, c.N, c.K, 0, true) == P::wgmma);
  }
  // Phi-3-mini (lab runs 182, 196: W8's q, k, v on wgmma with 3 K slices): q, k, v 9216 x 3072, o 3072 x 3072, gate, up 16384 x 3072, down 3072 x 8192
  const Cell phi[] = {{9216, 3072, P::wgmma, P::wgmma, P::wgmma}, {3072, 3072, P::mma, P::mma, P::mma},
                      {16384, 3072, P::wgmma, P::wgmma, P::wgmma}, {3072, 8192, P::wgmma, P::wgmma, P::wgmma}};
  for (const Cell& c : phi) {
    INFO(c.N << " x " << c.K);
    for (int64_t M : {17, 24, 32}) {
      INFO("M = " << M);
      CHECK(cuda::a16_auto_path(M, c.N, c.K, 4, true) == c.w4);
      CHECK(cuda::a16_auto_path(M, c.N, c.K, 8, true) == c.w8);   // W8 3072 x 8192: the streamed form from 17 rows (15.2 µs against the L2-fed 19.0, run 232)
      CHECK(cuda::a16_auto_path(M, c.N, c.K, 0, true) == c.nf4);
      CHECK(cuda::a16_auto_path(M, c.N, c.K, 4, false) == P::mma);
    }
  }
  // The wgmma kernel's measured slice counts (lab runs 188, 196): 3 on 9216 x 3072, 22016 x 4096 and 11008 x 4096 for
  // the GPTQ codes at 17..32 rows, the planner's elsewhere.
  for (int bits : {4, 8})
    for (int64_t M : {17, 24, 32}) {
      INFO(bits << "-bit M = " << M);
      CHECK(cuda::a16_wgmma_slices(M, 9216, 3072, bits) == 3);
      CHECK(cuda::a16_wgmma_slices(M, 22016, 4096, bits) == 3);
      CHECK(cuda::a16_wgmma_slices(M, 11008, 4096, bits) == 3);
      CHECK(cuda::a16_wgmma_slices(M, 12288, 4096, bits) == 0);
      CHECK(cuda::a16_wgmma_slices(M, 16384, 3072, bits) == 0);
    }
  CHECK(cuda::a16_wgmma_slices(33, 22016, 4096, 4) == 0);
  CHECK(cuda::a16_wgmma_slices(16, 9216, 3072, 4) == 0);
  CHECK(cuda::a16_wgmma_slices(32, 9216, 3072, 0) == 0);
  // The L2-fed kernel's (lab runs 199, 204-206): NF4 at 17..32 rows only, 3 slices on 16384 x 3072,
  // 6 on 6144 x 4096.
  for (int64_t M : {17, 24, 32}) {
    CHECK(cuda::a16_mma_slices(M, 16384, 3072, 0) == 3);
    CHECK(cuda::a16_mma_slices(M, 6144, 4096, 0) == 6);
    CHECK(cuda::a16_mma_slices(M, 9216, 3072, 0) == 0);
    CHECK(cuda::a16_mma_slices(M, 12288, 4096, 0) == 0);
    CHECK(cuda::a16_mma_slices(M, 4096, 4096, 0) == 0);
    CHECK(cuda::a16_mma_slices(M, 28672, 4096, 0) == 0);
    CHECK(cuda::a16_mma_slices(M, 4096, 11008, 0) == 0);
    CHECK(cuda::a16_mma_slices(M, 16384, 3072, 4) == 0);
    CHECK(cuda::a16_mma_slices(M, 4096, 4096, 8) == 0);
    CHECK(cuda::a16_mma_slices(M, 22016, 4096, 0) == 0);
  }
  CHECK(cuda::a16_mma_slices(16, 16384, 3072, 0) == 0);
  CHECK(cuda::a16_mma_slices(33, 16384, 3072, 0) == 0);
  // The streamed form's cells (decode batch 32 faster with it, runs 234, 240, 297, 300): 4-bit from K = 4096 and Phi-3-mini's
  // gate, up, six 8-bit layers.
  CHECK(cuda::a16_wgmma_streamed(22016, 4096, 4));
  CHECK(cuda::a16_wgmma_streamed(4096, 11008, 4));
  CHECK(cuda::a16_wgmma_streamed(9216, 3072, 4));   // runs 339-340: at 3 K slices (a16_wgmma_tma_slices), phi3-mini W4A16 +3.3%
  CHECK_FALSE(cuda::a16_wgmma_streamed(3072, 3072, 4));
  CHECK(cuda::a16_wgmma_streamed(16384, 3072, 4));   // run 300: phi3-mini W4A16 at batch 32 +4.0% (3 stages)
  CHECK(cuda::a16_wgmma_streamed(12288, 4096, 8));
  CHECK(cuda::a16_wgmma_streamed(3072, 8192, 8));
  CHECK(cuda::a16_wgmma_streamed(22016, 4096, 8));   // run 240: llama2-7b W8A16 at batch 32 +2.8%
  CHECK(cuda::a16_wgmma_streamed(6144, 4096, 8));    // runs 296-297: llama3-8b W8A16 at batch 32 +6.4% (3 stages, the rotary folded)
  CHECK_FALSE(cuda::a16_wgmma_streamed(28672, 4096, 8));
  CHECK_FALSE(cuda::a16_wgmma_streamed(4096, 11008, 8));
  // NF4 (runs 305-307, its pair table in shared memory): the q, k, v and gate, up of each preset and Phi-3-mini's down, not the 4096-row layers or 3072 x 3072.
  CHECK(cuda::a16_wgmma_streamed(12288, 4096, 0));
  CHECK(cuda::a16_wgmma_streamed(22016, 4096, 0));
  CHECK(cuda::a16_wgmma_streamed(28672, 4096, 0));
  CHECK(cuda::a16_wgmma_streamed(6144, 4096, 0));
  CHECK(cuda::a16_wgmma_streamed(9216, 3072, 0));
  CHECK(cuda::a16_wgmma_streamed(16384, 3072, 0));
  CHECK_FALSE(cuda::a16_wgmma_streamed(4096, 4096, 0));
  CHECK_FALSE(cuda::a16_wgmma_streamed(3072, 3072, 0));
  CHECK(cuda::a16_wgmma_streamed(3072, 8192, 0));   // run 307: phi3-mini NF4 +3.8%
  CHECK_FALSE(cuda::a16_wgmma_streamed(4096, 11008, 0));
  CHECK_FALSE(cuda::a16_wgmma_streamed(4096, 14336, 0));
  // Its ring depth (runs 243, 245, 297, 300, 406): 3 stages on 12288 x 4096 (4- and 8-bit), W8 9216 x 3072,
  // 16384 x 3072 (4- and 8-bit), 6144 x 4096 (every code) and W4 28672 x 4096, else 2.
  CHECK(cuda::a16_wgmma_stages(12288, 4096, 4) == 3);
  CHECK(cuda::a16_wgmma_stages(12288, 4096, 8) == 3);
  CHECK(cuda::a16_wgmma_stages(9216, 3072, 8) == 3);
  CHECK(cuda::a16_wgmma_stages(16384, 3072, 8) == 3);
  CHECK(cuda::a16_wgmma_stages(6144, 4096, 8) == 3);
  CHECK(cuda::a16_wgmma_stages(6144, 4096, 4) == 3);   // runs 401-406: the split norm's readers, two CTAs an SM
  CHECK(cuda::a16_wgmma_stages(6144, 4096, 0) == 3);    // run 306: NF4
  CHECK(cuda::a16_wgmma_stages(16384, 3072, 0) == 3);
  CHECK(cuda::a16_wgmma_stages(12288, 4096, 0) == 2);
  CHECK(cuda::a16_wgmma_stages(9216, 3072, 0) == 2);
  CHECK(cuda::a16_wgmma_stages(16384, 3072, 4) == 3);
  CHECK(cuda::a16_wgmma_stages(3072, 8192, 8) == 2);
  CHECK(cuda::a16_wgmma_stages(3072, 8192, 4) == 3);   // run 308: phi3-mini W4A16 +7.3%
  CHECK(cuda::a16_wgmma_stages(28672, 4096, 4) == 3);   // runs 401-406, as 6144 x 4096 above
  CHECK(cuda::a16_wgmma_stages(28672, 4096, 8) == 2);
  CHECK(cuda::a16_wgmma_stages(28672, 4096, 0) == 2);
  CHECK(cuda::a16_wgmma_stages(9216, 3072, 4) == 2);
  CHECK(cuda::a16_wgmma_stages(22016, 4096, 4) == 2);
  CHECK(cuda::a16_wgmma_stages(4096, 11008, 8) == 2);
  // Its k-steps a stage (run 312): 2 on NF4 22016 x 4096 only.
  CHECK(cuda::a16_wgmma_nk(22016, 4096, 0) == 2);
  CHECK(cuda::a16_wgmma_nk(22016, 4096, 4) == 4);
  CHECK(cuda::a16_wgmma_nk(28672, 4096, 0) == 4);
  CHECK(cuda::a16_wgmma_nk(12288, 4096, 0) == 4);
  // Its K slices (runs 338-340): 4 on W4 6144 x 4096, 3 on W4 9216 x 3072, else the planner's.
  CHECK(cuda::a16_wgmma_tma_slices(6144, 4096, 4) == 4);
  CHECK(cuda::a16_wgmma_tma_slices(9216, 3072, 4) == 3);
  CHECK(cuda::a16_wgmma_tma_slices(9216, 3072, 8) == 0);
  CHECK(cuda::a16_wgmma_tma_slices(6144, 4096, 8) == 0);
  CHECK(cuda::a16_wgmma_tma_slices(6144, 4096, 0) == 0);
  CHECK(cuda::a16_wgmma_tma_slices(12288, 4096, 4) == 0);
  CHECK(cuda::a16_wgmma_tma_slices(4096, 11008, 4) == 0);
  // Where the streamed form writes the split norm (runs 396-397, 406): W4's o and down of the Llama presets.
  CHECK(cuda::a16_wgmma_tma_writes_norm(4096, 4096, 4));
  CHECK(cuda::a16_wgmma_tma_writes_norm(4096, 11008, 4));
  CHECK(cuda::a16_wgmma_tma_writes_norm(4096, 14336, 4));
  CHECK_FALSE(cuda::a16_wgmma_tma_writes_norm(4096, 4096, 8));
  CHECK_FALSE(cuda::a16_wgmma_tma_writes_norm(4096, 11008, 0));
  CHECK_FALSE(cuda::a16_wgmma_tma_writes_norm(3072, 8192, 4));
}

TEST_CASE("gpu: the wgmma A16 kernel: every split equals the reference GEMM (GPTQ 4/8-bit, NF4), its split-K sum is deterministic, M > 256 refused") {
  PTQ_REQUIRE_GPU();
  if (!cuda::a16_wgmma_supported()) PTQ_SKIP("the wgmma A16 kernel needs sm_90: " + cuda::describe());
  const int64_t N = 1000, K = 2000;
  const int64_t Ms[] = {1, 7, 16, 30, 33, 64, 65, 128, 129, 200, 256};
  struct Case { int bits, gs; };
  for (const Case& cs : {Case{4, -1}, Case{4, 80}, Case{8, 16}, Case{8, -1}}) {
    const QuantizedLinear q = random_q(cs.bits, N, K, cs.gs, cs.gs < 0, cs.gs == 80, uint64_t(95 + cs.bits + cs.gs));
    const GptqPacked pk = pack_gptq(q, true);
    auto L = cuda::W4A16Linear::from_gptq(pk, true);
    for (int64_t M : Ms)
      for (int slices : {1, 3, 16}) {
        cuda::set_a16_split({0, slices});
        Rng r{uint64_t(M * 3 + 1)};
        const double rel = a16_error(*L, M, K, N, r, cuda::A16Path::wgmma, [&](const float* xx, float* yy) { ref_gemm_gptq(xx, M, pk, true, yy); });
        cuda::set_a16_split({});
        INFO(cs.bits << "-bit g" << cs.gs << " M=" << M << " slices=" << slices << ": relative error " << rel);
        CHECK(rel <= 2e-3);
      }
  }
  {
    // One slice from 128 staged rows writes f16 y by the copy engine, a box of 64 rows a warpgroup.
    // N = 1040 (N % 128 = 16): the last CTA's first box is cut at N and its second lies wholly past
    // it. A box not clipped at N would overwrite the next token's first rows, which the comparison
    // with the reference sees (the last token's overflow, past y's end, it cannot: compute-sanitizer's
    // memcheck found none, lab run 501).
    const int64_t N2 = 1040;
    for (const Case& cs : {Case{4, -1}, Case{8, 16}}) {
      const QuantizedLinear q = random_q(cs.bits, N2, K, cs.gs, cs.gs < 0, false, uint64_t(131 + cs.bits));
      const GptqPacked pk = pack_gptq(q, true);
      auto L = cuda::W4A16Linear::from_gptq(pk, true);
      for (int64_t M : {100, 128, 256}) {
        cuda::set_a16_split({0, 1});
        Rng r{uint64_t(M * 5 + 2)};
        const double rel = a16_error(*L, M, K, N2, r, cuda::A16Path::wgmma, [&](const float* xx, float* yy) { ref_gemm_gptq(xx, M, pk, true, yy); });
        cuda::set_a16_split({});
        INFO(cs.bits << "-bit g" << cs.gs << " N=" << N2 << " M=" << M << " one slice: relative error " << rel);
        CHECK(rel <= 2e-3);
      }
    }
  }
  {
    const int64_t Kn = 1984;   // NF4: a multiple of the block
    Rng r{501};
    std::vector<float> W(size_t(N * Kn));
    for (auto& v : W) v = float(r.normal() * 0.02);
    const Nf4Tensor t = nf4_quantize(W.data(), int64_t(W.size()), 64, true);
    auto F = cuda::Nf4Linear::from_nf4(t, N, Kn);
    for (int64_t M : {1, 16, 32, 65, 128, 256})
      for (int slices : {1, 3}) {
        cuda::set_a16_split({0, slices});
        const double err = a16_error(*F, M, Kn, N, r, cuda::A16Path::wgmma, [&](const float* x, float* y) { ref_gemm_nf4(x, M, t, N, Kn, y); });
        cuda::set_a16_split({});
        INFO("NF4 M=" << M << " slices=" << slices << ": relative error " << err);
        CHECK(err <= 3e-3);
      }
  }
  const QuantizedLinear q = random_q(4, 4096, 4096, 128, true, false, 96);
  const GptqPacked pk = pack_gptq(q, true);
  auto L = cuda::W4A16Linear::from_gptq(pk, true);
  cuda::set_a16_split({0, 16});
  check_repeat_and_beta(*L, pk, 128, 4096, cuda::A16Path::wgmma, 7);
  cuda::set_a16_split({});
  check_repeat_and_beta(*L, pk, 100, 4096, cuda::A16Path::automatic, 8);   // automatic: wgmma at 33..128 on sm_90
  CHECK(L->path_for(100) == cuda::A16Path::wgmma);
  CHECK(L->path_for(200) == cuda::A16Path::dequant);   // 4096 x 4096 above 128 rows: dequantize + cuBLAS (faster there)
  CHECK(L->path_for(32) == cuda::A16Path::wgmma);      // 17..32 rows: the streamed form on W4 4096 x 4096 (the planner's table: below; lab runs 389-391)
  cuda::DeviceBuffer<uint16_t> dx(size_t(257 * 4096), "x"), dy(size_t(257 * 4096), "y");
  CHECK_THROWS_AS(L->gemm(dx.get(), 257, dy.get(), cuda::A16Path::wgmma), Error);
}

// The k-step loop's K slices at 64..256 staged rows summed over a cluster (a16_wgmma.cu,
// cluster_sum_store) in the global workspace sum's order (a16_split_k.cuh): at the same slices the
// same bytes, f16 y and fp32 y + beta y (2 slices; 3: a shorter last slice; 8: the largest portable
// cluster). GPTQ 4-bit g128 and NF4; N = 1000: a partial last row group (8 groups: every cluster
// resident). At 2 and 8 slices the cluster's f16 y is also held to the reference GEMM (fp32, on
// the same f16 x): equal bytes to a wrong sum would pass the first check. The planner's own split,
// which may take fewer slices over a cluster than through the workspace, is checked against the
// reference GEMM by the "every split" case above.
TEST_CASE("gpu: the wgmma A16 loop's K slices summed over a cluster equal the global workspace's sum, byte for byte") {
  PTQ_REQUIRE_GPU();
  if (!cuda::a16_wgmma_supported()) PTQ_SKIP("the wgmma A16 kernel needs sm_90: " + cuda::describe());
  const int64_t N = 1000, K = 4096;
  auto compare = [&](auto& L, const std::string& what, auto&& ref) {
    for (int64_t M : {33, 64, 100, 128, 200})
      for (int slices : {2, 3, 8}) {
        Rng r{uint64_t(M * 11 + slices)};
        std::vector<uint16_t> xh(size_t(M * K));
        for (auto& v : xh) v = f32_to_f16_bits(float(r.normal()));
        std::vector<float> y0(size_t(M * N));
        for (auto& v : y0) v = float(r.normal());
        cuda::DeviceBuffer<uint16_t> dx(xh.size(), "x"), dy(y0.size(), "y");
        cuda::DeviceBuffer<float> df(y0.size(), "y f32");
        cuda::copy_to_device(dx.get(), xh.data(), xh.size() * 2);
        auto run = [&](int sum, bool& was_clustered) {
          std::pair<std::vector<uint16_t>, std::vector<float>> out{std::vector<uint16_t>(y0.size()), std::vector<float>(y0.size())};
          cuda::set_a16_split({0, slices, 0, 0, 0, sum});
          L.gemm(dx.get(), M, dy.get(), cuda::A16Path::wgmma);
          was_clustered = cuda::a16_wgmma_last_clustered();
          cuda::copy_to_device(df.get(), y0.data(), y0.size() * 4);
          L.gemm_f32(dx.get(), M, df.get(), 1.0f, cuda::A16Path::wgmma);
          cuda::set_a16_split({});
          cuda::copy_to_host(out.first.data(), dy.get(), out.first.size() * 2);
          cuda::copy_to_host(out.second.data(), df.get(), out.second.size() * 4);
          return out;
        };
        bool global_clustered = true, cluster_clustered = false;
        const auto global = run(1, global_clustered), cluster = run(2, cluster_clustered);
        INFO(what << " M=" << M << " slices=" << slices << (cluster_clustered ? " (over a cluster)" : " (one slice, or not resident as clusters)"));
        size_t differ_f16 = 0, differ_f32 = 0;   // counts, not the vectors: a failure prints two numbers
        for (size_t i = 0; i < y0.size(); ++i) differ_f16 += cluster.first[i] != global.first[i], differ_f32 += cluster.second[i] != global.second[i];
        CHECK_FALSE(global_clustered);
        CHECK(cluster_clustered);
        CHECK(differ_f16 == 0);
        CHECK(differ_f32 == 0);
        if (slices != 3) {
          std::vector<float> x(xh.size()), yr(y0.size());
          for (size_t i = 0; i < xh.size(); ++i) x[i] = f16_bits_to_f32(xh[i]);
          ref(x.data(), M, yr.data());
          const double rel = rel_error_f16(cluster.first, yr);
          INFO("relative error against the reference GEMM " << rel);
          CHECK(rel <= 3e-3);
        }
      }
  };
  const QuantizedLinear q = random_q(4, N, K, 128, true, false, 1401);
  const GptqPacked pk = pack_gptq(q, true);
  auto L = cuda::W4A16Linear::from_gptq(pk, true);
  compare(*L, "4-bit g128", [&](const float* x, int64_t M, float* y) { ref_gemm_gptq(x, M, pk, true, y); });
  const Nf4Tensor t = random_nf4(N, K, 1402);
  auto F = cuda::Nf4Linear::from_nf4(t, N, K);
  compare(*F, "NF4", [&](const float* x, int64_t M, float* y) { ref_gemm_nf4(x, M, t, N, K, y); });
}

// The decode's stacked shapes at 24 and 48 rows (batch 24: decode steps and two-token prefills),
// the codes the synthetic decode checkpoints have (8-bit per channel, 4-bit g128, symmetric).
TEST_CASE("gpu: the wgmma A16 kernel on the decode's stacked shapes at 24 and 48 rows equals the reference GEMM") {
  PTQ_REQUIRE_GPU();
  if (!cuda::a16_wgmma_supported()) PTQ_SKIP("the wgmma A16 kernel needs sm_90: " + cuda::describe());
  struct Shape { int64_t N, K; };
  for (int bits : {8, 4})
    for (const Shape& sh : {Shape{22016, 4096}, Shape{4096, 11008}, Shape{12288, 4096}}) {
      const QuantizedLinear q = random_q(bits, sh.N, sh.K, bits == 4 ? 128 : -1, true, false, uint64_t(800 + bits));
      const GptqPacked pk = pack_gptq(q, true);
      auto L = cuda::W4A16Linear::from_gptq(pk, true);
      for (int64_t M : {24, 48}) {
        Rng r{uint64_t(M + bits)};
        const double rel = a16_error(*L, M, sh.K, sh.N, r, cuda::A16Path::wgmma, [&](const float* xx, float* yy) { ref_gemm_gptq(xx, M, pk, true, yy); });
        INFO(bits << "-bit " << sh.N << "x" << sh.K << " M=" << M << ": relative error " << rel);
        CHECK(rel <= 2e-3);
      }
    }
  // NF4 22016 x 4096 at 24 rows: the streamed form at 2 k-steps a stage (a16_wgmma_nk).
  const Nf4Tensor t = random_nf4(22016, 4096, 811);
  auto F = cuda::Nf4Linear::from_nf4(t, 22016, 4096);
  Rng r{24};
  const double rel = a16_error(*F, 24, 4096, 22016, r, cuda::A16Path::wgmma, [&](const float* xx, float* yy) { ref_gemm_nf4(xx, 24, t, 22016, 4096, yy); });
  INFO("NF4 22016x4096 M=24: relative error " << rel);
  CHECK(rel <= 3e-3);
}

// The streamed form (a16_wgmma.cu, wgmma_tma_kernel: a producer warp's bulk copies, the K slices of
// a row group one cluster) at 1..32 rows: against the reference GEMM, and against the k-step loop
// at the same slices (the same k-step order and slice sum: the same bytes). K of 68 and 65 k-steps:
// slices and stages that start inside a group of 128, a last stage of one k-step; groups of 64 (a
// stage over two groups), per-channel codes (scales on the accumulators), NF4; N = 1000: the last
// row group partial.
TEST_CASE("gpu: the wgmma A16 kernel's streamed form at 1..32 rows equals the reference GEMM and the k-step loop's bytes") {
  PTQ_REQUIRE_GPU();
  if (!cuda::a16_wgmma_supported()) PTQ_SKIP("the wgmma A16 kernel needs sm_90: " + cuda::describe());
  const int64_t N = 1000;
  auto run_form = [&](auto& L, const cuda::DeviceBuffer<uint16_t>& dx, int64_t M, int slices, int form) {
    cuda::DeviceBuffer<uint16_t> dy(size_t(M * N), "y");
    cuda::set_a16_split({0, slices, 0, 0, form});
    L.gemm(dx.get(), M, dy.get(), cuda::A16Path::wgmma);
    cuda::set_a16_split({});
    std::vector<uint16_t> y(size_t(M * N));
    cuda::copy_to_host(y.data(), dy.get(), y.size() * 2);
    return y;
  };
  auto check = [&](auto& L, int64_t K, const std::string& what, double tol, auto&& ref) {
    for (int64_t M : {1, 9, 17, 32}) {
      Rng r{uint64_t(M * 7 + K)};
      std::vector<float> x(size_t(M * K)), yr(size_t(M * N));
      std::vector<uint16_t> xh(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        x[i] = round_to(DType::F16, float(r.normal()));
        xh[i] = f32_to_f16_bits(x[i]);
      }
      ref(x.data(), M, yr.data());
      cuda::DeviceBuffer<uint16_t> dx(xh.size(), "x");
      cuda::copy_to_device(dx.get(), xh.data(), xh.size() * 2);
      for (int slices : {1, 3, 5}) {
        const std::vector<uint16_t> streamed = run_form(L, dx, M, slices, 2), looped = run_form(L, dx, M, slices, 1);
        INFO(what << " K=" << K << " M=" << M << " slices=" << slices << ": relative error " << rel_error_f16(streamed, yr));
        CHECK(rel_error_f16(streamed, yr) <= tol);
        CHECK(streamed == looped);
      }
    }
  };
  struct Case { int bits, gs; int64_t K; };
  for (const Case& cs : {Case{4, 128, 4352}, Case{8, 64, 4160}, Case{4, -1, 4160}, Case{8, -1, 4352}}) {
    const QuantizedLinear q = random_q(cs.bits, N, cs.K, cs.gs, true, false, uint64_t(1100 + cs.bits + cs.gs));
    const GptqPacked pk = pack_gptq(q, true);
    auto L = cuda::W4A16Linear::from_gptq(pk, true);
    check(*L, cs.K, std::to_string(cs.bits) + "-bit g" + std::to_string(cs.gs), 2e-3, [&](const float* x, int64_t M, float* y) { ref_gemm_gptq(x, M, pk, true, y); });
    if (cs.gs == 128) {   // fp32 out with beta = 1, and the same bytes four times
      cuda::set_a16_split({0, 3, 0, 0, 2});
      check_repeat_and_beta(*L, pk, 24, cs.K, cuda::A16Path::wgmma, 1107);
      cuda::set_a16_split({});
    }
  }
  const int64_t Kn = 4160;
  const Nf4Tensor t = random_nf4(N, Kn, 1109);
  auto F = cuda::Nf4Linear::from_nf4(t, N, Kn);
  check(*F, Kn, "NF4", 3e-3, [&](const float* x, int64_t M, float* y) { ref_gemm_nf4(x, M, t, N, Kn, y); });
}

// One GPTQ layer of random symmetric codes (4-bit groups of 128, or 8-bit per channel) through
// `path` at M rows, its relative error against the reference GEMM; the layer is freed on return.
namespace {
double gptq_layer_error(int bits, int64_t N, int64_t K, int64_t M, uint64_t seed, cuda::A16Path path) {
  const QuantizedLinear q = random_q(bits, N, K, bits == 4 ? 128 : -1, true, false, seed);
  const GptqPacked pk = pack_gptq(q, true);
  auto L = cuda::W4A16Linear::from_gptq(pk, true);
  Rng r{seed + 10};
  return a16_error(*L, M, K, N, r, path, [&](const float* xx, float* yy) { ref_gemm_gptq(xx, M, pk, true, yy); });
}
}  // namespace

// The streamed form's tensor maps are cached by address. The device pool hands a freed block to a
// request of at least half its size, so a 4-bit layer's codes can land where an 8-bit layer of the
// same shape had its codes (twice the bytes, the same tiles and k-steps). A map cached by address
// and extents alone then streamed the 4-bit codes with the 8-bit box (lab run 237: an illegal
// address in bench kernels); keyed by the whole spec, each gets its own.
TEST_CASE("gpu: the wgmma A16 streamed form after a freed layer of the same shape and other codes equals the reference GEMM") {
  PTQ_REQUIRE_GPU();
  if (!cuda::a16_wgmma_supported()) PTQ_SKIP("the wgmma A16 kernel needs sm_90: " + cuda::describe());
  const int64_t N = 1024, K = 4096, M = 32;
  cuda::pool_release_cached();
  cuda::set_a16_split({0, 0, 0, 0, 2});
  for (int bits : {8, 4, 8, 4}) {   // each layer freed before the next is made
    const double rel = gptq_layer_error(bits, N, K, M, uint64_t(1200 + bits), cuda::A16Path::wgmma);
    INFO(bits << "-bit " << N << "x" << K << " M=" << M << ": relative error " << rel);
    CHECK(rel <= 2e-3);
  }
  cuda::set_a16_split({});
}

// The streamed form's 3-stage ring (a16_wgmma_stages: 12288 x 4096) at 24 rows, 4- and 8-bit,
// against the reference GEMM.
TEST_CASE("gpu: the wgmma A16 streamed form with a ring of 3 stages (12288 x 4096) equals the reference GEMM") {
  PTQ_REQUIRE_GPU();
  if (!cuda::a16_wgmma_supported()) PTQ_SKIP("the wgmma A16 kernel needs sm_90: " + cuda::describe());
  const int64_t N = 12288, K = 4096, M = 24;
  for (int bits : {4, 8}) {
    REQUIRE(cuda::a16_wgmma_stages(N, K, bits) == 3);   // the automatic path streams this layer through 3 stages
    REQUIRE(cuda::a16_wgmma_streamed(N, K, bits));
    const double rel = gptq_layer_error(bits, N, K, M, uint64_t(1300 + bits), cuda::A16Path::automatic);
    INFO(bits << "-bit " << N << "x" << K << " M=" << M << ": relative error " << rel);
    CHECK(rel <= 2e-3);
  }
}

// 17024 rows = 133 groups of 128: more than the H200's (and H100's) 132 SMs, so at 33..128 rows the
// kernel runs its variant of two CTAs an SM (a16_wgmma.cu, lab runs 185-186).
TEST_CASE("gpu: the wgmma A16 kernel's two-CTA variant (more 128-row groups than SMs, 33..128 rows) equals the reference GEMM") {
  PTQ_REQUIRE_GPU();
  if (!cuda::a16_wgmma_supported()) PTQ_SKIP("the wgmma A16 kernel needs sm_90: " + cuda::describe());
  const int64_t N = 17024, K = 512;
  for (int bits : {8, 4}) {
    const QuantizedLinear q = random_q(bits, N, K, bits == 4 ? 128 : -1, true, false, uint64_t(900 + bits));
    const GptqPacked pk = pack_gptq(q, true);
    auto L = cuda::W4A16Linear::from_gptq(pk, true);
    for (int64_t M : {48, 128}) {
      Rng r{uint64_t(M + bits)};
      const double rel = a16_error(*L, M, K, N, r, cuda::A16Path::wgmma, [&](const float* xx, float* yy) { ref_gemm_gptq(xx, M, pk, true, yy); });
      INFO(bits << "-bit " << N << "x" << K << " M=" << M << ": relative error " << rel);
      CHECK(rel <= 2e-3);
    }
  }
  const Nf4Tensor t = random_nf4(N, K, 901);
  auto F = cuda::Nf4Linear::from_nf4(t, N, K);
  for (int64_t M : {48, 128}) {
    Rng r{uint64_t(M)};
    const double err = a16_error(*F, M, K, N, r, cuda::A16Path::wgmma, [&](const float* x, float* y) { ref_gemm_nf4(x, M, t, N, K, y); });
    INFO("NF4 " << N << "x" << K << " M=" << M << ": relative error " << err);
    CHECK(err <= 3e-3);
  }
}

// One small call of each A16 kernel form, for compute-sanitizer's racecheck and synccheck, whose
// shared-memory hazard tracking is too slow for the cases above (lab run 502: "every split" did
// not finish in 60 s): `compute-sanitizer --tool racecheck test_cuda "[sanitize]"`. Hidden, so
// CTest does not run it twice; each call is still held to the reference GEMM. The forms: the
// L2-fed kernel at one row (one tile overlapped with x staged, two tiles plain, the planner's),
// 8 rows (both loops), 16, 32 and 64; the shared-x kernel; the wgmma k-step loop at 32 rows, at
// 64 and 128 with its K slices summed through the workspace and over a cluster, one slice from 128
// rows (y by the copy engine) and 256; its streamed form at 1, 8 and 32 rows; its two-CTA variant
// (133 groups of 128 rows). GPTQ 4-bit g128, 8-bit per channel, NF4 blocks of 64.
TEST_CASE("gpu: one small call of each A16 kernel form equals the reference GEMM (for compute-sanitizer)", "[.][sanitize]") {
  PTQ_REQUIRE_GPU();
  using P = cuda::A16Path;
  struct Call { P path; int64_t M; cuda::A16Split split; const char* what; };
  std::vector<Call> calls = {
      {P::mma, 1, {1, 2, 0, 2}, "one row, one tile, overlapped"}, {P::mma, 1, {2, 2, 0, 1}, "one row, two tiles, plain"},
      {P::mma, 1, {}, "one row, planner"},                        {P::mma, 8, {1, 2, 0, 2}, "8 rows, one tile, overlapped"},
      {P::mma, 8, {2, 2, 0, 1}, "8 rows, two tiles, plain"},      {P::mma, 16, {}, "16 rows"},
      {P::mma, 32, {}, "32 rows"},                                {P::mma, 64, {0, 3}, "64 rows, 3 slices"},
      {P::shared_x, 48, {0, 3, 8}, "shared x, 3 slices"}};
  if (cuda::a16_wgmma_supported()) {
    const std::vector<Call> wg = {
        {P::wgmma, 32, {0, 2, 0, 0, 1}, "k-step loop, 32 rows"},   {P::wgmma, 64, {0, 2, 0, 0, 0, 1}, "loop, 64 rows, workspace sum"},
        {P::wgmma, 64, {0, 2, 0, 0, 0, 2}, "loop, 64 rows, cluster sum"}, {P::wgmma, 128, {0, 2, 0, 0, 0, 2}, "loop, 128 rows, cluster sum"},
        {P::wgmma, 128, {0, 1}, "loop, 128 rows, one slice (TMA y)"},     {P::wgmma, 256, {0, 1}, "loop, 256 rows"},
        {P::wgmma, 1, {0, 1, 0, 0, 2}, "streamed, one row"},             {P::wgmma, 8, {0, 1, 0, 0, 2}, "streamed, 8 rows"},
        {P::wgmma, 32, {0, 3, 0, 0, 2}, "streamed, 32 rows, 3 slices"}};
    calls.insert(calls.end(), wg.begin(), wg.end());
  } else {
    WARN("the wgmma forms need sm_90: " + cuda::describe());
  }
  const int64_t N = 256, K = 1024;
  auto run = [&](const auto& L, const std::string& codes, double tol, auto&& ref, int64_t n, const std::vector<Call>& list) {
    for (const Call& c : list) {
      Rng r{uint64_t(c.M * 13 + n)};
      cuda::set_a16_split(c.split);
      const double rel = a16_error(L, c.M, K, n, r, c.path, [&](const float* x, float* y) { ref(x, c.M, y); });
      cuda::set_a16_split({});
      INFO(codes << " " << n << "x" << K << " M=" << c.M << " " << c.what << ": relative error " << rel);
      CHECK(rel <= tol);
      if (c.split.sum) CHECK(cuda::a16_wgmma_last_clustered() == (c.split.sum == 2));   // the sum the call is named for ran
    }
  };
  for (int bits : {4, 8}) {
    const GptqPacked pk = pack_gptq(random_q(bits, N, K, bits == 4 ? 128 : -1, bits == 8, false, uint64_t(1400 + bits)), true);
    auto L = cuda::W4A16Linear::from_gptq(pk, true);
    run(*L, std::to_string(bits) + "-bit", 2e-3, [&](const float* x, int64_t M, float* y) { ref_gemm_gptq(x, M, pk, true, y); }, N, calls);
  }
  const Nf4Tensor t = random_nf4(N, K, 1409);
  auto F = cuda::Nf4Linear::from_nf4(t, N, K);
  run(*F, "NF4", 3e-3, [&](const float* x, int64_t M, float* y) { ref_gemm_nf4(x, M, t, N, K, y); }, N, calls);
  if (cuda::a16_wgmma_supported()) {   // more 128-row groups than SMs: two CTAs an SM at 33..128 rows
    const int64_t N2 = 17024;
    const GptqPacked pk = pack_gptq(random_q(4, N2, K, 128, true, false, 1410), true);
    auto L = cuda::W4A16Linear::from_gptq(pk, true);
    run(*L, "4-bit", 2e-3, [&](const float* x, int64_t M, float* y) { ref_gemm_gptq(x, M, pk, true, y); }, N2,
        {{P::wgmma, 48, {}, "two-CTA variant, 48 rows"}});
  }
}

// The order is a permutation of each k-step's 64 columns that keeps column pairs together, and the
// kernel reading a producer's copy in it (a16_offer_wgmma_x) gives the bytes of its own permute pass.
TEST_CASE("gpu: the wgmma A16 kernel takes x in its k-step order from a producer (a16_offer_wgmma_x): the bytes of its own permute pass") {
  for (int64_t s : {0, 1, 7}) {   // a bijection of each k-step's columns, pairs side by side
    std::vector<int> seen(64, 0);
    for (int64_t j = 0; j < 64; ++j) {
      const int64_t p = cuda::a16_wgmma_x_col(64 * s + j);
      REQUIRE((p >= 64 * s && p < 64 * s + 64));
      ++seen[size_t(p - 64 * s)];
      if (j % 2) CHECK(p == cuda::a16_wgmma_x_col(64 * s + j - 1) + 1);
    }
    CHECK(std::count(seen.begin(), seen.end(), 1) == 64);
  }
  CHECK(cuda::a16_wgmma_x_col(2) == 8);    // pair 1 (word 1 of chunk 0) -> 4
  CHECK(cuda::a16_wgmma_x_col(16) == 2);   // pair 8 (word 0 of chunk 2) -> 1
  PTQ_REQUIRE_GPU();
  if (!cuda::a16_wgmma_supported()) PTQ_SKIP("the wgmma A16 kernel needs sm_90: " + cuda::describe());
  const int64_t N = 1000, K = 2048;
  for (int bits : {4, 8}) {
    const QuantizedLinear q = random_q(bits, N, K, 128, false, false, uint64_t(700 + bits));
    const GptqPacked pk = pack_gptq(q, true);
    auto L = cuda::W4A16Linear::from_gptq(pk, true);
    for (int64_t M : {17, 32, 64, 100}) {
      INFO(bits << "-bit M=" << M);
      Rng r{uint64_t(M)};
      std::vector<uint16_t> xh(size_t(M * K)), xp(xh.size()), y1(size_t(M * N)), y2(y1.size());
      std::vector<float> xf(xh.size()), ref(y1.size());
      for (size_t i = 0; i < xh.size(); ++i) {
        xf[i] = round_to(DType::F16, float(r.normal()));
        xh[i] = f32_to_f16_bits(xf[i]);
      }
      ref_gemm_gptq(xf.data(), M, pk, true, ref.data());
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k) xp[size_t(m * K + cuda::a16_wgmma_x_col(k))] = xh[size_t(m * K + k)];
      cuda::DeviceBuffer<uint16_t> dx(xh.size(), "x"), dxp(xp.size(), "x permuted"), dy(y1.size(), "y");
      cuda::copy_to_device(dx.get(), xh.data(), xh.size() * 2);
      cuda::copy_to_device(dxp.get(), xp.data(), xp.size() * 2);
      L->gemm(dx.get(), M, dy.get(), cuda::A16Path::wgmma);
      cuda::copy_to_host(y1.data(), dy.get(), y1.size() * 2);
      // y2 = the call on x with (x_of, x permuted) offered, y poisoned first; whether it took the offer.
      auto offered = [&](const void* x_of, cuda::A16Path path) {
        cuda::fill_bytes(dy.get(), 0xff, y2.size() * 2);
        cuda::a16_offer_wgmma_x(x_of, dxp.get());
        L->gemm(dx.get(), M, dy.get(), path);
        const bool took = cuda::a16_took_wgmma_x();
        cuda::copy_to_host(y2.data(), dy.get(), y2.size() * 2);
        return took;
      };
      CHECK(offered(dx.get(), cuda::A16Path::wgmma));
      CHECK(y1 == y2);
      CHECK(rel_error_f16(y2, ref) <= 2e-3);   // and the reference GEMM's product
      // Offered for another x, or to a call of another kernel: not taken (the plain call's bytes), and cleared.
      CHECK_FALSE(offered(dxp.get(), cuda::A16Path::wgmma));
      CHECK(y1 == y2);
      CHECK_FALSE(offered(dx.get(), M <= cuda::kA16MmaMaxM ? cuda::A16Path::mma : cuda::A16Path::dequant));
      CHECK(std::none_of(y2.begin(), y2.end(), [](uint16_t v) { return v == 0xffff; }));   // written (not the poison)
    }
  }
}

namespace {
// A random int8 Linear [N, K] with per-row scales, on the host and the device.
struct Int8Linear {
  std::vector<int8_t> w;
  std::vector<float> sw;
  cuda::DeviceBuffer<int8_t> dw;
  cuda::DeviceBuffer<float> dsw;
  int64_t N, K;
  Int8Linear(int64_t N_, int64_t K_, Rng& r) : w(size_t(N_ * K_)), sw(size_t(N_)), dw(size_t(N_ * K_), "w"), dsw(size_t(N_), "sw"), N(N_), K(K_) {
    for (auto& v : w) v = int8_t(int(r.next() % 255) - 127);
    for (auto& v : sw) v = float(1e-4 * (0.5 + r.uniform()));
    cuda::copy_to_device(dw.get(), w.data(), w.size());
    cuda::copy_to_device(dsw.get(), sw.data(), sw.size() * 4);
  }
};
// M random int8 activation rows for L with per-row scales (copied to dx, dsx), a prior y0 [M, N]
// for beta, and the exact reference product ref = x · Lᵀ (ref_gemm_w8a8).
struct W8A8Inputs {
  std::vector<int8_t> x;
  std::vector<float> sx, ref, y0;
  W8A8Inputs(const Int8Linear& L, int64_t M, Rng& r, int8_t* dx, float* dsx)
      : x(size_t(M * L.K)), sx(size_t(M)), ref(size_t(M * L.N)), y0(size_t(M * L.N)) {
    for (auto& v : x) v = int8_t(int(r.next() % 255) - 127);
    for (auto& v : sx) v = float(0.01 * (0.5 + r.uniform()));
    for (auto& v : y0) v = float(r.uniform() - 0.5);
    ref_gemm_w8a8(x.data(), sx.data(), L.w.data(), L.sw.data(), M, L.N, L.K, ref.data());
    cuda::copy_to_device(dx, x.data(), x.size());
    cuda::copy_to_device(dsx, sx.data(), sx.size() * 4);
  }
};
// Elements of a W8A8 product y [M, N] fp32 off the exact reference ref (+ beta y0 where beta is not
// 0): the product as w8a8_gemm's fp32 output (4.8e-7 relative), then one fp32 addition.
size_t w8a8_elements_off(const std::vector<float>& y, const std::vector<float>& ref, const std::vector<float>& y0, float beta) {
  size_t bad = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double want = double(ref[i]) + (beta != 0.0f ? double(y0[i]) : 0.0);
    if (!(std::abs(double(y[i]) - want) <= 4.8e-7 * std::abs(double(ref[i])) + 6e-8 * std::abs(want) + 1e-30)) ++bad;
  }
  return bad;
}
}  // namespace

TEST_CASE("gpu: the W8A8 GEMM (wgmma, fused per-token x per-channel rescale) equals the exact int32 reference, bf16 and fp32 out") {
  PTQ_REQUIRE_GPU();
  if (!cuda::w8a8_supported()) PTQ_SKIP("the W8A8 kernel needs sm_90: " + cuda::describe());
  struct Shape { int64_t N, K; };
  // 2050x272 at M = 4000: 32 x 9 = 288 tiles, more than the 132 CTAs of the persistent grid on
  // an H100, so CTAs take several tiles, the 4-deep ring (3 slices a tile) wraps across tiles, and
  // the row-tile groups of 8 and the last partial tiles are all walked.
  const Shape shapes[] = {{256, 128}, {96, 48}, {334, 2064}, {2050, 272}, {4096, 4096}, {11008, 4096}, {4096, 11008}};
  int seed = 900;
  for (const Shape& sh : shapes) {
    Rng r{uint64_t(seed++)};
    const Int8Linear L(sh.N, sh.K, r);
    const auto& w = L.w;
    const auto& sw = L.sw;
    const auto& dw = L.dw;
    const auto& dsw = L.dsw;
    cuda::DeviceBuffer<int8_t> dx(size_t(4000 * sh.K), "x");
    cuda::DeviceBuffer<float> dsx(4000, "sx"), dy(size_t(4000 * sh.N), "y");
    for (int64_t M : {1, 2, 3, 7, 16, 33, 128, 255, 1000, 4000}) {
      if (sh.N * sh.K > 4096 * 4096 && M > 128) continue;   // the reference is slow
      if (M == 1000 && sh.N * sh.K > 1024 * 4096) continue;
      if (M == 4000 && sh.N * sh.K > 2050 * 272) continue;
      std::vector<int8_t> x(static_cast<size_t>(M * sh.K));
      std::vector<float> sx(static_cast<size_t>(M));
      for (auto& v : x) v = int8_t(int(r.next() % 255) - 127);
      for (auto& v : sx) v = float(0.01 * (0.5 + r.uniform()));
      std::vector<float> ref(static_cast<size_t>(M * sh.N));
      ref_gemm_w8a8(x.data(), sx.data(), w.data(), sw.data(), M, sh.N, sh.K, ref.data());
      cuda::copy_to_device(dx.get(), x.data(), x.size());
      cuda::copy_to_device(dsx.get(), sx.data(), sx.size() * 4);
      for (bool f32 : {true, false}) {
        cuda::fill_bytes(dy.get(), 0xff, size_t(M * sh.N) * 4);   // NaN: every output must be written
        cuda::w8a8_gemm(dx.get(), dsx.get(), dw.get(), dsw.get(), M, sh.N, sh.K, dy.get(), f32);
        std::vector<float> y(static_cast<size_t>(M * sh.N));
        if (f32) {
          cuda::copy_to_host(y.data(), dy.get(), y.size() * 4);
        } else {
          std::vector<uint16_t> b(y.size());
          cuda::copy_to_host(b.data(), dy.get(), b.size() * 2);
          for (size_t i = 0; i < b.size(); ++i) { const uint32_t u = uint32_t(b[i]) << 16; std::memcpy(&y[i], &u, 4); }
        }
        // Elementwise: fp32 out within 4 ulp of the fp64 product (float(acc) rounds above 2^24,
        // then two fp32 products); bf16 out within its half-ulp rounding (2^-8 relative) of that.
        const double tol = f32 ? 4.8e-7 : 1.0 / 256 + 4.8e-7;
        size_t bad = 0;
        double worst = 0;
        for (size_t i = 0; i < y.size(); ++i) {
          const double e = std::abs(double(y[i]) - double(ref[i])), lim = tol * std::abs(double(ref[i])) + 1e-30;
          if (!(e <= lim)) ++bad;
          if (std::isfinite(e)) worst = std::max(worst, e / (std::abs(double(ref[i])) + 1e-30));
        }
        INFO("N " << sh.N << " K " << sh.K << " M " << M << (f32 ? " fp32" : " bf16") << ": " << bad << " elements off, worst relative " << worst);
        CHECK(bad == 0);
      }
    }
  }
  cuda::DeviceBuffer<int8_t> a(64 * 64, "a");
  cuda::DeviceBuffer<float> s(64, "s"), y(64 * 64, "y");
  CHECK_THROWS_AS(cuda::w8a8_gemm(a.get(), s.get(), a.get(), s.get(), 4, 64, 24, y.get(), true), Error);   // K not a multiple of 16
  CHECK_THROWS_AS(cuda::w8a8_gemm(a.get(), s.get(), a.get(), s.get(), 4, 63, 32, y.get(), true), Error);   // N odd
}

TEST_CASE("gpu: a W8A8 Linear at 9 to 128 rows takes the wgmma product: the exact int32 reference, the GEMM's bytes and the mma.sync product's") {
  PTQ_REQUIRE_GPU();
  if (!cuda::w8a8_supported()) PTQ_SKIP("the W8A8 wgmma kernels need sm_90: " + cuda::describe());
  const int64_t N = 9216, K = 256;
  Rng r{2024};
  const Int8Linear L(N, K, r);
  cuda::DeviceBuffer<int8_t> dx(size_t(128 * K), "x");
  cuda::DeviceBuffer<float> dsx(128, "sx"), dy(size_t(128 * N), "y"), dg(size_t(128 * N), "y by the GEMM"), dv(size_t(128 * N), "y by the mma.sync product");
  CHECK_FALSE(cuda::w8a8_wgmma_takes(cuda::kW8A8WgmmaFromM - 1, K));
  CHECK_FALSE(cuda::w8a8_takes_gemv(cuda::kW8A8WgmmaMaxM + 1, N, K));   // past the product's rows: the GEMM
  for (int64_t M : {9, 16, 17, 24, 32, 33, 64, 100, 128}) {
    CHECK(cuda::w8a8_wgmma_takes(M, K));
    CHECK(cuda::w8a8_takes_gemv(M, N, K));
    const W8A8Inputs in(L, M, r, dx.get(), dsx.get());
    const auto &ref = in.ref, &y0 = in.y0;
    cuda::w8a8_gemm(dx.get(), dsx.get(), L.dw.get(), L.dsw.get(), M, N, K, dg.get(), true);   // float(acc) · sx · sw, no beta
    std::vector<float> g(static_cast<size_t>(M * N));
    cuda::copy_to_host(g.data(), dg.get(), g.size() * 4);
    for (float beta : {0.0f, 1.0f}) {
      cuda::copy_to_device(dy.get(), y0.data(), y0.size() * 4);
      cuda::copy_to_device(dv.get(), y0.data(), y0.size() * 4);
      cuda::w8a8_linear_int8_f32(dx.get(), dsx.get(), L.dw.get(), L.dsw.get(), M, N, K, dy.get(), beta);   // the wgmma product
      const bool mma = cuda::w8a8_gemv_serves(M, K);   // the mma.sync product: up to 32 rows
      if (mma) cuda::w8a8_gemv(dx.get(), dsx.get(), L.dw.get(), L.dsw.get(), M, N, K, dv.get(), beta, false);
      std::vector<float> y(static_cast<size_t>(M * N)), v(y.size()), want(y.size());
      cuda::copy_to_host(y.data(), dy.get(), y.size() * 4);
      if (mma) cuda::copy_to_host(v.data(), dv.get(), v.size() * 4);
      for (size_t i = 0; i < want.size(); ++i) want[i] = beta == 0.0f ? g[i] : std::fmaf(beta, y0[i], g[i]);   // add_scaled's rounding
      const size_t bad = w8a8_elements_off(y, ref, y0, beta);
      INFO("M " << M << " beta " << beta << ": " << bad << " elements off");
      CHECK(bad == 0);
      CHECK(std::memcmp(y.data(), want.data(), y.size() * 4) == 0);
      if (mma) CHECK(std::memcmp(y.data(), v.data(), y.size() * 4) == 0);
    }
  }
}

TEST_CASE("gpu: the W8A8 decode GEMV (dp4a up to 16 rows, int8 mma.sync from 3 to 32 where K % 64 == 0) equals the exact int32 reference, with beta") {
  PTQ_REQUIRE_GPU();
  struct Shape { int64_t N, K; };
  const Shape shapes[] = {{17, 16}, {96, 48}, {333, 2064}, {333, 1024}, {4096, 4096}, {1024, 14336}};
  int seed = 1900;
  for (const Shape& sh : shapes) {
    Rng r{uint64_t(seed++)};
    const Int8Linear L(sh.N, sh.K, r);
    cuda::DeviceBuffer<int8_t> dx(size_t(32 * sh.K), "x");
    cuda::DeviceBuffer<float> dsx(32, "sx"), dy(size_t(32 * sh.N), "y");
    for (int64_t M : {1, 2, 3, 5, 8, 9, 16, 17, 24, 32}) {
      if (M > 16 && sh.K % 64) continue;   // refused below
      const W8A8Inputs in(L, M, r, dx.get(), dsx.get());
      const auto &ref = in.ref, &y0 = in.y0;
      for (float beta : {0.0f, 1.0f}) {
        if (beta == 0.0f) cuda::fill_bytes(dy.get(), 0xff, size_t(M * sh.N) * 4);   // NaN: every output must be written
        else cuda::copy_to_device(dy.get(), y0.data(), y0.size() * 4);
        cuda::w8a8_gemv(dx.get(), dsx.get(), L.dw.get(), L.dsw.get(), M, sh.N, sh.K, dy.get(), beta, false);   // dp4a / mma.sync, not the wgmma form
        std::vector<float> y(static_cast<size_t>(M * sh.N));
        cuda::copy_to_host(y.data(), dy.get(), y.size() * 4);
        const size_t bad = w8a8_elements_off(y, ref, y0, beta);
        INFO("N " << sh.N << " K " << sh.K << " M " << M << " beta " << beta << ": " << bad << " elements off");
        CHECK(bad == 0);
      }
    }
  }
  cuda::DeviceBuffer<int8_t> a(64 * 64, "a");
  cuda::DeviceBuffer<float> s(64, "s"), y(64 * 64, "y");
  CHECK_THROWS_AS(cuda::w8a8_gemv(a.get(), s.get(), a.get(), s.get(), 17, 64, 32, y.get(), 0.0f, false), Error);   // M above 16 with K % 64 != 0 (the wgmma form takes it)
  CHECK_THROWS_AS(cuda::w8a8_gemv(a.get(), s.get(), a.get(), s.get(), 129, 64, 64, y.get(), 0.0f), Error);         // M above 128 (the wgmma form's last)
  CHECK_THROWS_AS(cuda::w8a8_gemv(a.get(), s.get(), a.get(), s.get(), 1, 64, 24, y.get(), 0.0f), Error);           // K not a multiple of 16
}

TEST_CASE("gpu: the W8A8 decode product on wgmma (copy-engine ring, K split over a cluster) equals the exact int32 reference and the mma.sync product's bytes") {
  PTQ_REQUIRE_GPU();
  if (!cuda::w8a8_supported()) PTQ_SKIP("the wgmma W8A8 product needs sm_90: " + cuda::describe());
  struct Shape { int64_t N, K; };
  // The planner's K slices (a cluster of CTAs a 128-row group, up to 4, every cluster resident at
  // once: on the H200 clusters of 1..4 CTAs 264 / 132 / 79 / 62, lab run 413; at 9..16 rows one
  // slice where two would double up CTAs on under 40% of the SMs, run 419): 333x2064 4 slices of 5
  // K-steps (the last slice 2, its last box 2064 - 16 x 128 = 16 bytes: mostly past K), 4096x4096
  // 4 at 1..8 rows (from 9 rows a cell, below), 1024x14336 4 (28 K-steps a slice: the 5-stage ring of 9..16 rows wraps at shifting phases),
  // 8960x1024 3 (70 groups), 11008x1024 2 at 17..32 rows and one at 9..16 (86 groups: more than 79
  // clusters of 3, under 0.7 x 132), 12800x512 2 (100 groups), 17000x256 one (133 groups); 96x48 a
  // single box past K and N;
  // 4096x4096 and 1024x14336 also the decode's rows past 16 (K % 64 == 0). CTAs of 64 weight rows
  // (w8a8_wgmma_gemv.cu's measured cells): 4096x4096 at 4 slices (6 stages at 9..16 rows, 5 at
  // 17..32), 6144x4096 at 3 and 2 slices (6 stages), 3072x8192 at 4 (6 stages; 16 K-steps a slice:
  // the ring wraps mid-pass).
  const Shape shapes[] = {{96, 48}, {333, 2064}, {4096, 4096}, {1024, 14336}, {8960, 1024}, {11008, 1024}, {12800, 512}, {17000, 256}, {6144, 4096}, {3072, 8192}};
  int seed = 2300;
  for (const Shape& sh : shapes) {
    Rng r{uint64_t(seed++)};
    const Int8Linear L(sh.N, sh.K, r);
    cuda::DeviceBuffer<int8_t> dx(size_t(128 * sh.K), "x");
    cuda::DeviceBuffer<float> dsx(128, "sx"), dy(size_t(128 * sh.N), "y"), dv(size_t(128 * sh.N), "y by the mma.sync product");
    for (int64_t M : {1, 2, 5, 8, 9, 16, 17, 24, 32, 33, 65, 128}) {   // 33..128: x tiles of 64 and 128 token rows
      const W8A8Inputs in(L, M, r, dx.get(), dsx.get());
      const auto &ref = in.ref, &y0 = in.y0;
      const bool other = cuda::w8a8_gemv_serves(M, sh.K);   // the dp4a / mma.sync forms serve these rows
      for (float beta : {0.0f, 1.0f}) {
        if (beta == 0.0f) cuda::fill_bytes(dy.get(), 0xff, size_t(M * sh.N) * 4);   // NaN: every output must be written
        else cuda::copy_to_device(dy.get(), y0.data(), y0.size() * 4);
        cuda::copy_to_device(dv.get(), y0.data(), y0.size() * 4);
        cuda::w8a8_wgmma_gemv(dx.get(), dsx.get(), L.dw.get(), L.dsw.get(), M, sh.N, sh.K, dy.get(), beta);
        std::vector<float> y(static_cast<size_t>(M * sh.N));
        cuda::copy_to_host(y.data(), dy.get(), y.size() * 4);
        const size_t bad = w8a8_elements_off(y, ref, y0, beta);
        INFO("N " << sh.N << " K " << sh.K << " M " << M << " beta " << beta << ": " << bad << " elements off");
        CHECK(bad == 0);
        if (other) {   // both form float(exact int32 sum) · sx · sw (+ beta y): the same bytes
          cuda::w8a8_gemv(dx.get(), dsx.get(), L.dw.get(), L.dsw.get(), M, sh.N, sh.K, dv.get(), beta, false);
          std::vector<float> v(y.size());
          cuda::copy_to_host(v.data(), dv.get(), v.size() * 4);
          CHECK(std::memcmp(y.data(), v.data(), y.size() * 4) == 0);
        }
      }
    }
  }
  cuda::DeviceBuffer<int8_t> a(64 * 64, "a");
  cuda::DeviceBuffer<float> s(64, "s"), y(64 * 64, "y");
  CHECK_THROWS_AS(cuda::w8a8_wgmma_gemv(a.get(), s.get(), a.get(), s.get(), 129, 64, 64, y.get(), 0.0f), Error);  // M above 128
  CHECK_THROWS_AS(cuda::w8a8_wgmma_gemv(a.get(), s.get(), a.get(), s.get(), 1, 64, 24, y.get(), 0.0f), Error);    // K not a multiple of 16
}

