// Packed formats: known words written out by hand, bit-exact round trips, config blocks key by
// key, a hand-built GPTQ checkpoint read back, refusals up front, the reference kernels against
// an fp64 product, and llama2xs in every format evaluating like its fake export.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/rng.h"
#include "model/corpus.h"
#include "eval/perplexity.h"
#include "formats/gguf.h"
#include "formats/open.h"
#include "formats/nf4.h"
#include "formats/packed.h"
#include "kernels/reference.h"
#include "model/schedule.h"
#include "model/synth.h"
#include "pipeline/pipeline.h"
#include "golden.h"
#include "testing.h"

using namespace ptq;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {
QuantizedLinear random_quantized(int64_t rows, int64_t cols, int bits, int group, bool sym, bool permuted_groups, uint64_t seed) {
  Rng r(seed);
  MatF W(rows, cols);
  for (int64_t i = 0; i < W.size(); ++i) W.data()[i] = float(r.normal());
  QuantSpec s;
  s.bits = bits;
  s.group_size = group;
  s.sym = sym;
  QuantizedLinear q = rtn_quantize(W, s);
  if (permuted_groups)   // an act-order g_idx: a permutation of the natural one
    for (int64_t i = cols - 1; i > 0; --i) std::swap(q.g_idx[size_t(i)], q.g_idx[size_t(r.below(uint64_t(i + 1)))]);
  return q;
}
void check_same(const QuantizedLinear& a, const QuantizedLinear& b) {
  CHECK(a.unpacked_codes() == b.unpacked_codes());
  CHECK(a.zeros == b.zeros);
  CHECK(a.scales == b.scales);
  CHECK(a.g_idx == b.g_idx);
}
}  // namespace

TEST_CASE("bitstreams: known words") {
  uint32_t v[8] = {1, 2, 3, 4, 5, 6, 7, 8}, w[3];
  pack_bits(v, 8, 4, w);
  CHECK(w[0] == 0x87654321u);   // least significant nibble first
  uint32_t v3[32];
  for (auto& x : v3) x = 0;
  v3[10] = 5;                   // 0b101 straddles words 0 and 1
  v3[21] = 6;                   // 0b110 straddles words 1 and 2
  pack_bits(v3, 32, 3, w);
  CHECK(w[0] == 0x40000000u);   // low two bits (01) of value 10 at bits 30-31
  CHECK(w[1] == 0x00000001u);   // its third bit at bit 0; value 21's low bit (0) at bit 31
  CHECK(w[2] == 0x00000003u);   // value 21's upper bits (11) at bits 0-1
  CHECK(unpack_bit(w, 10, 3) == 5);
  CHECK(unpack_bit(w, 21, 3) == 6);
  uint32_t v8[4] = {0x12, 0x34, 0x56, 0x78};
  pack_bits(v8, 4, 8, w);
  CHECK(w[0] == 0x78563412u);
  // pack_stream, from one byte a code: the same words, the tail zero
  const uint8_t b4[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  w[1] = 0xffffffffu;
  pack_stream(b4, 9, 4, w);
  CHECK(w[0] == 0x87654321u);
  CHECK(w[1] == 0x00000009u);
  uint8_t b3[32] = {};
  b3[10] = 5;
  b3[21] = 6;
  pack_stream(b3, 32, 3, w);
  CHECK(w[0] == 0x40000000u);
  CHECK(w[1] == 0x00000001u);
  CHECK(w[2] == 0x00000003u);
  const uint8_t b8[4] = {0x12, 0x34, 0x56, 0x78};
  pack_stream(b8, 4, 8, w);
  CHECK(w[0] == 0x78563412u);
}

TEST_CASE("GPTQ packing of a hand matrix: qweight along the input, v1 qzeros 0x77777777") {
  QuantizedLinear q;
  q.spec.bits = 4;
  q.rows = 8;
  q.cols = 8;
  q.groups = 1;
  std::vector<uint8_t> codes;
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c) codes.push_back(uint8_t((r + c) % 16));
  q.set_codes(codes.data());
  q.scales.assign(8, 0.5f);
  q.zeros.assign(8, 8);
  q.g_idx.assign(8, 0);
  GptqPacked p = pack_gptq(q, false);
  REQUIRE(p.qweight.size() == 8);   // [in*4/32 = 1, out = 8]
  CHECK(uint32_t(p.qweight[0]) == 0x76543210u);   // output column 0: inputs 0..7
  CHECK(uint32_t(p.qweight[1]) == 0x87654321u);
  REQUIRE(p.qzeros.size() == 1);
  CHECK(uint32_t(p.qzeros[0]) == 0x77777777u);
  CHECK(uint32_t(pack_gptq(q, true).qzeros[0]) == 0x88888888u);   // v2: zeros as they are (v1 + 0x11111111)
  CtPacked c = pack_ct(q);
  CHECK(uint32_t(c.weight_packed[0]) == 0x76543210u);   // compressed-tensors: along the input, per output row
  CHECK(c.zero_point.empty());
}

TEST_CASE("pack -> unpack returns the codes bit for bit, every bit width and format") {
  for (int bits : {1, 2, 3, 4, 5, 6, 7, 8})
    for (bool sym : {true, false}) {
      QuantizedLinear q = random_quantized(64, 96, bits, 32, sym, bits == 4, uint64_t(bits * 10 + sym));
      INFO("bits " << bits << " sym " << sym);
      if (sym) check_same(q, unpack_gptq(pack_gptq(q, false), false, true));
      check_same(q, unpack_gptq(pack_gptq(q, true), true, sym));
      if (bits == 4 || bits == 8) {
        QuantizedLinear q2 = random_quantized(60, 90, bits, -1, sym, false, 7);   // shapes that do not divide 8
        check_same(q2, unpack_ct(pack_ct(q2), sym));
        check_same(q, unpack_ct(pack_ct(q), sym));
      }
    }
}

TEST_CASE("q/k/v stacked into one Linear: the stacked quantized and NF4 Linears dequantize to the parts rows in order") {
  for (int bits : {3, 4, 5, 8}) {
    std::vector<QuantizedLinear> qs = {random_quantized(64, 96, bits, 32, true, false, 1), random_quantized(32, 96, bits, 32, true, false, 2),
                                       random_quantized(30, 96, bits, 32, true, false, 3)};
    QuantizedLinear st;
    REQUIRE(concat_rows(qs, &st));
    CHECK(st.rows == 126);
    const MatF W = st.dequantize();
    int64_t r0 = 0;
    for (auto& q : qs) {
      const MatF Wi = q.dequantize();
      CHECK(W.middleRows(r0, q.rows) == Wi);   // the same fp32 values: the same codes, scales and zeros
      r0 += q.rows;
    }
    qs[1] = random_quantized(32, 96, bits, 32, true, true, 4);   // act-order: another g_idx
    CHECK_FALSE(concat_rows(qs, &st));
  }
  // Grids with mins (GGUF's Q4_K: w = (d sc) q - dmin m, super-blocks of 8 groups of 32).
  QuantSpec k;
  k.bits = 4;
  k.group_size = 32;
  k.sym = false;
  k.form = GridForm::k_min;
  k.static_groups = true;
  std::vector<QuantizedLinear> ks;
  for (int i = 0; i < 3; ++i) {
    Rng r(uint64_t(20 + i));
    MatF Wk(16 * (i + 1), 256);
    for (int64_t j = 0; j < Wk.size(); ++j) Wk.data()[j] = float(r.normal());
    ks.push_back(rtn_quantize(Wk, k));
  }
  QuantizedLinear kst;
  REQUIRE(concat_rows(ks, &kst));
  REQUIRE(kst.mins.size() == size_t(8 * 96));
  const MatF Wk = kst.dequantize();
  CHECK(Wk.middleRows(16, 32) == ks[1].dequantize());
  CHECK(Wk.middleRows(48, 48) == ks[2].dequantize());
  ks[2] = random_quantized(48, 256, 4, 32, false, false, 5);   // zero points, not mins: not one grid
  CHECK_FALSE(concat_rows(ks, &kst));
  Rng r(9);
  std::vector<float> W(size_t(128 * 64));
  for (auto& v : W) v = float(r.normal());
  const std::vector<int64_t> n = {64 * 64, 32 * 64, 32 * 64};
  std::vector<Nf4Tensor> ts;
  for (size_t i = 0, at = 0; i < 3; at += size_t(n[i]), ++i) ts.push_back(nf4_quantize(&W[at], n[i], 64, i != 1));   // nested and not
  const Nf4Tensor st = concat_nf4_rows(ts, n);
  CHECK_FALSE(st.nested);
  std::vector<float> whole(W.size()), part;
  nf4_dequantize(st, int64_t(W.size()), whole.data());
  for (size_t i = 0, at = 0; i < 3; at += size_t(n[i]), ++i) {
    part.resize(size_t(n[i]));
    nf4_dequantize(ts[i], n[i], part.data());
    CHECK(std::equal(part.begin(), part.end(), whole.begin() + std::ptrdiff_t(at)));
  }
  // Codes held apart (the GPU loader's parts): the same absmax, no codes.
  std::vector<Nf4Tensor> apart = ts;
  for (auto& t : apart) t.packed.clear();
  const Nf4Tensor sa = concat_nf4_rows(apart, n);
  CHECK(sa.packed.empty());
  CHECK(sa.absmax == st.absmax);
  apart[1] = ts[1];   // some codes apart and some not: a part's size is checked as before
  apart[1].packed.pop_back();
  CHECK_THROWS_AS(concat_nf4_rows(apart, n), Error);
  ts[2] = nf4_quantize(&W[0], 32 * 64, 128, false);
  CHECK_THROWS_AS(concat_nf4_rows(ts, n), Error);
}

// A bitsandbytes checkpoint holds ceil(n / blocksize) absmax values for n elements (nested: as
// many 8-bit codes, ceil(blocks / 256) nested values, a 256-value map). Written by hand with one
// tensor short at a time, each is refused naming that tensor, before a reader indexes past it.
TEST_CASE("NF4: a weight whose codes, absmax, nested absmax or map hold fewer values than its quant_state's shape is refused naming the tensor") {
  ptqtest::TempDir d;
  const std::string w = "model.layers.0.mlp.down_proj.weight";
  std::vector<float> x(size_t(4 * 96));   // 384 elements: 6 blocks of 64
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i));
  for (bool nested : {false, true}) {
    const Nf4Tensor t = nf4_quantize(x.data(), int64_t(x.size()), 64, nested);
    for (const std::string& shortened : {std::string(), w, w + ".absmax", w + ".nested_absmax", w + ".nested_quant_map"}) {
      if (!nested && (shortened == w + ".nested_absmax" || shortened == w + ".nested_quant_map")) continue;
      auto part = [&](const std::string& name, DType dt, auto v) {
        if (name == shortened) v.pop_back();
        return NamedTensor{name, tensor_of_raw(dt, {int64_t(v.size())}, v)};
      };
      json st = {{"quant_type", "nf4"}, {"blocksize", 64}, {"dtype", "float32"}, {"shape", {4, 96}}};
      std::vector<NamedTensor> ts = {part(w, DType::U8, t.packed)};
      if (nested) {
        st["nested_blocksize"] = 256;
        st["nested_offset"] = t.offset;
        ts.push_back(part(w + ".absmax", DType::U8, t.absmax_q));
        ts.push_back(part(w + ".nested_absmax", DType::F32, t.nested_absmax));
        ts.push_back(part(w + ".nested_quant_map", DType::F32, t.nested_map));
      } else {
        ts.push_back(part(w + ".absmax", DType::F32, t.absmax));
      }
      const std::string js = st.dump();
      ts.push_back({w + ".quant_state.bitsandbytes__nf4", tensor_of_raw(DType::U8, {int64_t(js.size())}, std::vector<uint8_t>(js.begin(), js.end()))});
      std::filesystem::remove_all(d / "m");
      std::filesystem::create_directories(d / "m");
      write_safetensors(d / "m/model.safetensors", ts, {{"format", "pt"}});
      Checkpoint ck(d / "m");
      INFO((nested ? "nested, " : "plain, ") << "short: " << (shortened.empty() ? "none" : shortened));
      if (shortened.empty()) {
        const Nf4Tensor r = read_nf4(ck, w, nullptr);
        std::vector<float> a(x.size()), b(x.size());
        nf4_dequantize(r, int64_t(x.size()), a.data());
        nf4_dequantize(t, int64_t(x.size()), b.data());
        CHECK(a == b);
        continue;
      }
      try {
        read_nf4(ck, w, nullptr);
        FAIL("a short tensor was read");
      } catch (const Error& e) {
        CHECK(e.code == Errc::format);
        CHECK(e.field == shortened);
        CHECK(e.file.find("model.safetensors") != std::string::npos);
      }
      const uint8_t* codes = nullptr;   // the GPU loader's read: the codes left where the file maps them
      CHECK_THROWS_AS(read_nf4(ck, w, nullptr, &codes), Error);
    }
  }
}

TEST_CASE("NF4: nearest code by midpoints, first element in the high nibble, double quantization") {
  CHECK(nf4_index(1.0f) == 15);
  CHECK(nf4_index(-1.0f) == 0);
  CHECK(nf4_index(0.0f) == 7);
  const float mid = 0.5f * (0.0f + 0.07958029955625534f);
  CHECK(nf4_index(mid) == 7);                       // on the midpoint: the lower code
  CHECK(nf4_index(std::nextafter(mid, 1.0f)) == 8);
  const float x[4] = {2.0f, -2.0f, 0.0f, 1.0f};
  Nf4Tensor t = nf4_quantize(x, 4, 64, false);
  CHECK(t.absmax[0] == 2.0f);
  CHECK(t.packed[0] == 0xF0);                       // 15 (x[0]) high, 0 (x[1]) low
  CHECK(t.packed[1] == ((7 << 4) | nf4_index(0.5f)));
  CHECK(bnb_dynamic_map().size() == 256);
  std::vector<float> big(64 * 600);
  Rng r(5);
  for (auto& v : big) v = float(r.normal());
  Nf4Tensor a = nf4_quantize(big.data(), int64_t(big.size()), 64, false), b = nf4_quantize(big.data(), int64_t(big.size()), 64, true);
  CHECK(b.nested_absmax.size() == 3);               // 600 blocks, nested blocks of 256
  for (size_t i = 0; i < a.absmax.size(); ++i) CHECK(std::abs(b.absmax[i] - a.absmax[i]) < 0.02f * a.absmax[i]);
}

TEST_CASE("Q4_0 / Q8_0: llama.cpp's reference quantizers on a hand block") {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = float(j - 16);   // largest magnitude: -16, so d = -16 / -8 = 2
  BlockQ4_0 b = quantize_block_q4_0(x);
  CHECK(b.d == 0x4000);                  // 2.0 in f16
  CHECK(b.qs[0] == 0x80);                // element 0 (q 0) low nibble, element 16 (q 8) high nibble
  CHECK(b.qs[15] == ((15 << 4) | 8));    // element 15 (x=-1: -0.5 + 8.5 truncates to 8), element 31 (x=15: 16, clamped to 15)
  float y[32];
  dequantize_block_q4_0(b, y);
  CHECK(y[0] == -16.0f);
  CHECK(y[31] == 14.0f);                 // 15 is clamped to code 15: (15 - 8) * 2
  BlockQ8_0 c = quantize_block_q8_0(x);
  CHECK(f16_bits_to_f32(c.d) == round_to(DType::F16, 16.0f / 127));
  CHECK(c.qs[0] == -127);
  CHECK(gguf_permuted_row(0, 8) == 0);
  CHECK(gguf_permuted_row(1, 8) == 2);
  CHECK(gguf_permuted_row(4, 8) == 1);   // second rotary half interleaved
  CHECK(gguf_permuted_row(13, 8) == 8 + 3);
}

// The K-quant and 5-bit blocks' bytes for hand-chosen codes and parameters, derived from
// ggml-common.h's layout (the client test decodes random blocks with llama.cpp's own library).
TEST_CASE("Q4_K / Q5_K / Q6_K / Q5_0 blocks: bytes for hand-chosen codes and scales") {
  BlockParams p;
  p.d = 0x3c00;      // 1.0
  p.dmin = 0x3800;   // 0.5
  for (int j = 0; j < 8; ++j) { p.sc[j] = j + 1; p.mc[j] = j + 9; }
  std::vector<uint8_t> q(256);
  for (int e = 0; e < 256; ++e) q[size_t(e)] = uint8_t(e % 32);   // 5-bit codes; Q4_K takes the low 4 bits' share below
  BlockQ5_K b5;
  encode_block(GgmlType::Q5_K, p, q.data(), &b5);
  // scales: bytes 0-3 sc 0-3 with sc 4-7's top two bits in bits 6-7 (none here); bytes 4-7 mc 0-3
  // with mc 4-7's top bits (mc 7 = 16: byte 7 gets bit 6); bytes 8-11 sc 4-7 | mc 4-7 << 4 (low 4 bits)
  const uint8_t scales[12] = {1, 2, 3, 4, 9, 10, 11, 12 | 64, 5 | 13 << 4, 6 | 14 << 4, 7 | 15 << 4, 8 | 0 << 4};
  CHECK(std::memcmp(b5.scales, scales, 12) == 0);
  // element 64c + l in qs[32c + l]'s low nibble, 64c + 32 + l in its high nibble, fifth bits in qh[l]
  CHECK(b5.qs[0] == (0 | 0 << 4));           // elements 0 (code 0) and 32 (code 0)
  CHECK(b5.qs[17] == 0x11);                  // elements 17 and 49 (code 17 each): low four bits 1 and 1
  CHECK(b5.qh[17] == 0xFF);                  // codes 17 at elements 17, 49, 81, ..., 241: every fifth bit set
  CHECK(b5.qh[3] == 0x00);
  float y[256];
  dequantize_row(GgmlType::Q5_K, &b5, y, 256);
  CHECK(y[17] == 1.0f * 1 * 17 - 0.5f * 9);      // sub-block 0: d sc 1, dmin mc 9
  CHECK(y[255] == 1.0f * 8 * 31 - 0.5f * 16);    // sub-block 7: sc 8, mc 16
  for (auto& c : q) c &= 15;
  BlockQ4_K b4;
  encode_block(GgmlType::Q4_K, p, q.data(), &b4);
  CHECK(std::memcmp(b4.scales, scales, 12) == 0);
  dequantize_row(GgmlType::Q4_K, &b4, y, 256);
  CHECK(y[100] == 1.0f * 4 * (100 % 32 % 16) - 0.5f * 12);   // element 100: sub-block 3
  // Q6_K: ql[l] holds elements l (low) and l + 64 (high), ql[l + 32] elements l + 32 and l + 96;
  // qh[l] their top two bits in that order; sc one signed byte per 16 elements
  BlockParams p6;
  p6.d = 0x3c00;
  for (int j = 0; j < 16; ++j) p6.sc[j] = j % 2 ? -j : j;
  std::vector<uint8_t> q6(256);
  for (int e = 0; e < 256; ++e) q6[size_t(e)] = uint8_t((e * 7) % 64);
  BlockQ6_K b6;
  encode_block(GgmlType::Q6_K, p6, q6.data(), &b6);
  CHECK(b6.ql[1] == ((7 & 15) | ((65 * 7 % 64) & 15) << 4));
  CHECK(b6.qh[1] == ((7 >> 4) | (33 * 7 % 64 >> 4) << 2 | (65 * 7 % 64 >> 4) << 4 | (97 * 7 % 64 >> 4) << 6));
  CHECK(b6.scales[3] == -3);
  dequantize_row(GgmlType::Q6_K, &b6, y, 256);
  for (int e : {0, 1, 50, 129, 255}) CHECK(y[e] == float(p6.sc[e / 16]) * float(q6[size_t(e)] - 32));
  // Q5_0: the fifth bits as a little-endian u32, bit j for element j
  BlockParams p5;
  p5.d = 0x4000;   // 2.0
  uint8_t c5[32];
  for (int j = 0; j < 32; ++j) c5[j] = uint8_t(j == 3 || j == 20 ? 16 + j % 16 : j % 16);
  BlockQ5_0 b50;
  encode_block(GgmlType::Q5_0, p5, c5, &b50);
  CHECK(b50.qh[0] == 1 << 3);
  CHECK(b50.qh[2] == 1 << 4);   // element 20: bit 20
  dequantize_row(GgmlType::Q5_0, &b50, y, 32);
  CHECK(y[20] == 2.0f * (16 + 4 - 16));
}

TEST_CASE("reference kernels compute x * dequant(W)^T straight from the packed layouts") {
  Rng r(9);
  const int64_t M = 3;
  auto check = [&](const QuantizedLinear& q, const std::vector<float>& y, const char* what) {
    std::vector<float> x(size_t(M * q.cols));
    Rng rx(1);
    for (auto& v : x) v = float(rx.normal());
    MatF W = q.dequantize();
    double maxd = 0, maxv = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t o = 0; o < q.rows; ++o) {
        double s = 0;
        for (int64_t i = 0; i < q.cols; ++i) s += double(x[size_t(m * q.cols + i)]) * W(o, i);
        maxd = std::max(maxd, std::abs(s - y[size_t(m * q.rows + o)]));
        maxv = std::max(maxv, std::abs(s));
      }
    INFO(what << ": max error " << maxd << " of " << maxv);
    CHECK(maxd <= 1e-5 * maxv);
  };
  std::vector<float> x(size_t(M * 96));
  Rng rx(1);
  for (auto& v : x) v = float(rx.normal());
  for (int bits : {2, 3, 4, 8}) {
    QuantizedLinear q = random_quantized(64, 96, bits, 32, bits != 3, true, uint64_t(bits));
    std::vector<float> y(size_t(M * 64));
    ref_gemm_gptq(x.data(), M, pack_gptq(q, true), true, y.data());
    check(q, y, "gptq");
    if (bits == 4 || bits == 8) {
      ref_gemm_ct(x.data(), M, pack_ct(q), q.spec.sym, y.data());
      check(q, y, "compressed-tensors");
      QuantizedLinear qa = random_quantized(60, 96, bits, 32, false, false, uint64_t(bits + 100));   // asymmetric: packed zero points
      std::vector<float> ya(size_t(M * 60));
      ref_gemm_ct(x.data(), M, pack_ct(qa), false, ya.data());
      check(qa, ya, "compressed-tensors asymmetric");
    }
  }
  // NF4, Q4_0, Q8_0: against an fp64 product of the blocks' dequantized values (the decoders were
  // checked on hand blocks above).
  {
    const int64_t out = 24, in = 96;
    std::vector<float> W(size_t(out * in)), Wd(W.size()), y(size_t(M * out));
    for (auto& v : W) v = float(r.normal());
    auto check_dense = [&](const char* what) {
      double maxd = 0, maxv = 0;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t o = 0; o < out; ++o) {
          double acc = 0;
          for (int64_t i = 0; i < in; ++i) acc += double(x[size_t(m * 96 + i)]) * Wd[size_t(o * in + i)];
          maxd = std::max(maxd, std::abs(acc - y[size_t(m * out + o)]));
          maxv = std::max(maxv, std::abs(acc));
        }
      INFO(what << ": max error " << maxd << " of " << maxv);
      CHECK(maxd <= 1e-5 * maxv);
    };
    Nf4Tensor t = nf4_quantize(W.data(), out * in, 64, true);
    nf4_dequantize(t, out * in, Wd.data());
    ref_gemm_nf4(x.data(), M, t, out, in, y.data());
    check_dense("nf4");
    std::vector<BlockQ4_0> b4;
    std::vector<BlockQ8_0> b8;
    for (int64_t k = 0; k < out * in; k += kQK) { b4.push_back(quantize_block_q4_0(&W[size_t(k)])); b8.push_back(quantize_block_q8_0(&W[size_t(k)])); }
    for (size_t k = 0; k < b4.size(); ++k) dequantize_block_q4_0(b4[k], &Wd[k * kQK]);
    ref_gemm_q4_0(x.data(), M, b4.data(), out, in, y.data());
    check_dense("q4_0");
    for (size_t k = 0; k < b8.size(); ++k) dequantize_block_q8_0(b8[k], &Wd[k * kQK]);
    ref_gemm_q8_0(x.data(), M, b8.data(), out, in, y.data());
    check_dense("q8_0");
  }
  int8_t a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
  int32_t c[4];
  ref_gemm_i8(a, b, 2, 2, 2, c);
  CHECK(c[0] == 17);
  CHECK(c[1] == 23);
  CHECK(c[2] == 39);
  CHECK(c[3] == 53);
  std::vector<int8_t> big(4096, -128);
  int32_t d;
  ref_gemm_i8(big.data(), big.data(), 1, 1, 4096, &d);
  CHECK(d == 128 * 128 * 4096);
}

TEST_CASE("a GPTQ checkpoint built by hand (as another tool writes it) is read back") {
  ptqtest::TempDir d;
  // one module, in 8, out 8, 4-bit, group 8, v1: code of (o, i) = (i + o) % 16, zero 8 (stored 7), scale 0.25
  std::vector<int32_t> qweight(8), qzeros(1, int32_t(0x77777777u)), g_idx(8, 0);
  for (int o = 0; o < 8; ++o) {
    uint32_t w = 0;
    for (int i = 0; i < 8; ++i) w |= uint32_t((i + o) % 16) << (4 * i);
    qweight[size_t(o)] = int32_t(w);
  }
  auto raw = [](DType t, Shape s, const void* p) { Tensor x(t, std::move(s)); std::memcpy(x.bytes.data(), p, x.bytes.size()); return x; };
  std::vector<float> sc(8, 0.25f);
  std::vector<NamedTensor> ts;
  ts.push_back({"m.qweight", raw(DType::I32, {1, 8}, qweight.data())});
  ts.push_back({"m.qzeros", raw(DType::I32, {1, 1}, qzeros.data())});
  ts.push_back({"m.scales", tensor_from_f32(sc.data(), {1, 8}, DType::F16)});
  ts.push_back({"m.g_idx", raw(DType::I32, {8}, g_idx.data())});
  std::vector<float> emb(5 * 3);   // a float tensor beside them: row r = (r, r + 0.5, -r), exact in f16
  for (int r = 0; r < 5; ++r) emb[size_t(r * 3)] = float(r), emb[size_t(r * 3 + 1)] = float(r) + 0.5f, emb[size_t(r * 3 + 2)] = -float(r);
  ts.push_back({"model.embed_tokens.weight", tensor_from_f32(emb.data(), {5, 3}, DType::F16)});
  write_safetensors(d / "model.safetensors", ts);
  auto src = packed_source(d.path.string(), {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 8}, {"sym", true}});
  CHECK(src->shape("m.weight") == Shape{8, 8});
  std::vector<float> W(64);
  src->read_f32("m.weight", W.data());
  for (int o = 0; o < 8; ++o)
    for (int i = 0; i < 8; ++i) CHECK(W[size_t(o * 8 + i)] == 0.25f * float((i + o) % 16 - 8));
  // Row gathers: the float tensor straight from the file, the packed one through its dequantization.
  std::vector<float> rows(9), wrows(16);
  src->read_rows_f32("model.embed_tokens.weight", {4, 0, 4}, rows.data());
  CHECK(rows == std::vector<float>{4, 4.5f, -4, 0, 0.5f, 0, 4, 4.5f, -4});
  src->read_rows_f32("m.weight", {7, 2}, wrows.data());
  for (int i = 0; i < 8; ++i) {
    CHECK(wrows[size_t(i)] == 0.25f * float((i + 7) % 16 - 8));
    CHECK(wrows[size_t(8 + i)] == 0.25f * float((i + 2) % 16 - 8));
  }
  CHECK_THROWS_AS(src->read_rows_f32("model.embed_tokens.weight", {5}, rows.data()), Error);
  // A qweight shorter than scales and g_idx say (found by fuzzing: it was read past its end), and a
  // bit width GPTQ does not pack, are refused naming the tensor / the field.
  ts[0] = {"m.qweight", raw(DType::I32, {1, 4}, qweight.data())};
  write_safetensors(d / "model.safetensors", ts);
  auto short_q = packed_source(d.path.string(), {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 8}, {"sym", true}});
  CHECK_THROWS_WITH(short_q->read_f32("m.weight", W.data()), Catch::Contains("m.qweight: size does not match scales [1, 8] and g_idx [8]"));
  auto five = packed_source(d.path.string(), {{"quant_method", "gptq"}, {"bits", 5}, {"group_size", 8}, {"sym", true}});
  CHECK_THROWS_WITH(five->read_f32("m.weight", W.data()), Catch::Contains("quantization_config.bits: must be 2, 3, 4 or 8, got 5"));
  // quantization_config fields of the wrong JSON type are Errors naming the field (model_format and
  // GptqReader read them before PackedSource's guard).
  const std::string cfg = R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
    "num_attention_heads": 2, "vocab_size": 5, "torch_dtype": "float16", "quantization_config": )";
  write_file_atomic(d / "config.json", cfg + R"({"quant_method": 4}})");
  CHECK_THROWS_WITH(model_format(d.path.string()), Catch::Contains("config.json: quantization_config.quant_method: must be a string"));
  CHECK_THROWS_WITH(GptqReader(d.path.string()), Catch::Contains("quantization_config.quant_method: must be a string"));
  write_file_atomic(d / "config.json", cfg + R"({"quant_method": "gptq", "checkpoint_format": ["gptq_v2"]}})");
  CHECK_THROWS_WITH(model_format(d.path.string()), Catch::Contains("quantization_config.checkpoint_format: must be a string"));
  write_file_atomic(d / "config.json", cfg + R"({"quant_method": "gptq", "bits": "4"}})");
  CHECK_THROWS_WITH(GptqReader(d.path.string()), Catch::Contains("quantization_config.bits: must be an integer"));
  write_file_atomic(d / "config.json", cfg + R"({"quant_method": "gptq", "bits": 4}})");
  CHECK(model_format(d.path.string()) == "gptq");
}

TEST_CASE("formats refuse what they cannot hold, before calibration") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  Recipe r = parse_recipe(YAML::Load("quantization: {bits: 4, group_size: 32}\n"), "r.yaml");
  r.model = ptqtest::assets() + "/models/stories260k";
  r.output = d / "out";
  r.formats = {"gptq"};
  CHECK_THROWS_WITH(run_quantize(r, {}), Catch::Contains("model.layers.0.mlp.gate_proj: gptq: packs 4-bit codes into int32 along both dimensions"));
  r.formats = {"gguf", "gptq_v2"};   // (a run of GGUF, compressed-tensors and fake keeps such Linears in float instead: below)
  CHECK_THROWS_WITH(run_quantize(r, {}), Catch::Contains("blocks of 32 need in_features divisible by 32, got 172"));
  // compressed-tensors reads a Linear's group size as in_features / groups: llama2xs's down_proj,
  // 192 wide in groups of 128, would have its columns 96-127 decoded with the wrong scale
  Recipe c = parse_recipe(YAML::Load("quantization: {bits: 4, group_size: 128}\n"), "r.yaml");
  c.model = ptqtest::assets() + "/models/llama2xs";
  c.output = d / "ct";
  c.formats = {"compressed-tensors", "gptq_v2"};
  CHECK_THROWS_WITH(run_quantize(c, {}), Catch::Contains("model.layers.0.mlp.down_proj: compressed-tensors: infers the group size as in_features / groups, which needs in_features 192 to be a multiple of group_size 128"));
  r.model = ptqtest::assets() + "/models/llama2xs";
  r.quant.sym = false;
  r.formats = {"gptq"};
  CHECK_THROWS_WITH(run_quantize(r, {}), Catch::Contains("v1 stores zero - 1"));
  r.quant.sym = true;
  r.quant.bits = 3;
  r.formats = {"compressed-tensors"};
  CHECK_THROWS_WITH(run_quantize(r, {}), Catch::Contains("holds 4- and 8-bit weights"));
  // GGUF embeds the vocabulary: a model folder without tokenizer files (tiny-phi3) is refused by
  // the checks, before the calibration text (which needs the tokenizer too) is read
  Recipe t = parse_recipe(YAML::Load("quantization: {bits: 4, group_size: 32, sym: true}\n"), "r.yaml");
  t.model = ptqtest::assets() + "/models/tiny-phi3";
  t.output = d / "out";
  t.calibration.dataset = ptqtest::assets() + "/text/tinystories/calib.txt";
  t.formats = {"gguf"};
  CHECK_THROWS_WITH(run_quantize(t, {}), Catch::Contains("tiny-phi3: tokenizer: no tokenizer.model") && Catch::Contains("a GGUF file embeds the model's vocabulary"));
  CHECK_FALSE(fs::exists(d / "out"));
  // GGUF alone: stories260k's downs (172 wide) stay float, named in the report and the recipe
  Recipe g = parse_recipe(YAML::Load("quantization: {bits: 4, group_size: 32, sym: true}\ncalibration: {samples: 4, seq_len: 64}\n"), "r.yaml");
  g.model = ptqtest::assets() + "/models/stories260k";
  g.calibration.dataset = ptqtest::assets() + "/text/tinystories/calib.txt";
  g.output = d / "gguf";
  g.formats = {"gguf"};
  const nlohmann::json rep = run_quantize(g, {});
  REQUIRE(rep.contains("gguf_float_fallback"));
  const int layers = rep["model"]["layers"];
  CHECK(rep["gguf_float_fallback"].size() == size_t(layers));
  CHECK(rep["gguf_float_fallback"][0] == "model.layers.0.mlp.down_proj");
  CHECK(rep["recipe"]["quantization"]["ignore"].dump().find("model.layers.0.mlp.down_proj") != std::string::npos);
  GgufFile f(d / "gguf/model.gguf");
  CHECK(f.find("blk.0.ffn_down.weight")->type != GgmlType::Q4_0);
  CHECK(f.find("blk.0.ffn_up.weight")->type == GgmlType::Q4_0);
}

TEST_CASE("llama2xs in every format: configs key by key, and each evaluates like the fake export") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string a = ptqtest::assets();
  Recipe r = parse_recipe(YAML::Load("quantization: {bits: 4, group_size: 32, sym: true, act_order: true, static_groups: true}\n"), "r.yaml");
  r.model = a + "/models/llama2xs";
  r.output = d / "q";
  r.calibration = {a + "/text/tinystories/calib.txt", 64, 256, 0};
  r.formats = {"fake", "gptq", "gptq_v2", "compressed-tensors", "gguf"};
  r.gguf_output_type = r.gguf_embedding_type = "float";   // the Linears alone differ from float, as in the fake export (the next case rounds these)
  run_quantize(r, {});
  Recipe n = r;
  n.quant.method = "nf4";
  n.output = d / "n";
  n.formats = {"fake", "nf4"};
  n.nf4_double_quant = true;
  run_quantize(n, {});

  json qc = json::parse(read_text_file(d / "q/gptq/quantize_config.json"));
  CHECK(qc == json::parse(read_text_file(d / "q/gptq/config.json"))["quantization_config"]);
  CHECK(qc["bits"] == 4);
  CHECK(qc["group_size"] == 32);
  CHECK(qc["desc_act"] == true);
  CHECK(qc["static_groups"] == true);
  CHECK(qc["sym"] == true);
  CHECK(qc["true_sequential"] == true);
  CHECK(qc["damp_percent"] == 0.01);
  CHECK(qc["quant_method"] == "gptq");
  CHECK(qc["checkpoint_format"] == "gptq");
  CHECK(qc["model_file_base_name"] == "model");
  CHECK(json::parse(read_text_file(d / "q/gptq_v2/quantize_config.json"))["checkpoint_format"] == "gptq_v2");
  json ct = json::parse(read_text_file(d / "q/compressed-tensors/config.json"))["quantization_config"];
  CHECK(ct["quant_method"] == "compressed-tensors");
  CHECK(ct["format"] == "pack-quantized");
  CHECK(ct["quantization_status"] == "compressed");
  CHECK(ct["ignore"] == json::array({"lm_head"}));
  CHECK(ct["kv_cache_scheme"].is_null());
  json w = ct["config_groups"]["group_0"]["weights"];
  CHECK(ct["config_groups"]["group_0"]["targets"] == json::array({"Linear"}));
  CHECK(ct["config_groups"]["group_0"]["input_activations"].is_null());
  CHECK(w["num_bits"] == 4);
  CHECK(w["type"] == "int");
  CHECK(w["symmetric"] == true);
  CHECK(w["strategy"] == "group");
  CHECK(w["group_size"] == 32);
  CHECK(w["actorder"] == "weight");   // static groups: act-order without a stored g_idx
  CHECK(w["dynamic"] == false);
  json bnb = json::parse(read_text_file(d / "n/nf4/config.json"))["quantization_config"];
  CHECK(bnb["quant_method"] == "bitsandbytes");
  CHECK(bnb["load_in_4bit"] == true);
  CHECK(bnb["bnb_4bit_quant_type"] == "nf4");
  CHECK(bnb["bnb_4bit_use_double_quant"] == true);
  CHECK(bnb["bnb_4bit_quant_storage"] == "uint8");
  Checkpoint nck(d / "n/nf4");
  TensorView st = nck.get("model.layers.0.mlp.down_proj.weight.quant_state.bitsandbytes__nf4");
  json state = json::parse(st.data, st.data + st.nbytes);
  CHECK(state["quant_type"] == "nf4");
  CHECK(state["blocksize"] == 64);
  CHECK(state["dtype"] == "float32");
  CHECK(state["shape"] == json::array({64, 192}));
  CHECK(state["nested_blocksize"] == 256);
  CHECK(state["nested_dtype"] == "float32");
  CHECK(nck.get("model.layers.0.mlp.down_proj.weight").shape == Shape{64 * 192 / 2, 1});
  CHECK(nck.get("model.layers.0.mlp.down_proj.weight.absmax").dtype == DType::U8);
  CHECK(nck.get("model.layers.0.mlp.down_proj.weight.quant_map").shape == Shape{16});
  GgufFile gg(d / "q/gguf/model.gguf");
  CHECK(gg.metadata()["general.architecture"] == "llama");
  CHECK(gg.metadata()["llama.block_count"] == 5);
  CHECK(gg.metadata()["tokenizer.ggml.model"] == "llama");
  CHECK(gg.find("blk.0.attn_q.weight")->type == GgmlType::Q4_0);
  CHECK(gg.find("blk.0.attn_norm.weight")->type == GgmlType::F32);
  CHECK(gg.find("output.weight") == nullptr);   // tied embeddings
  CHECK(ggml_block_elems(gg.find("token_embd.weight")->type) == 1);

  auto tok = load_tokenizer(r.model, 1);
  const auto ids = encode_corpus(*tok, a + "/text/tinystories/eval.txt");
  EvalOptions o;
  o.seq_len = 256;
  o.max_windows = 300;
  auto ppl = [&](const std::string& p) { return evaluate(*open_model(p), ids, o).perplexity; };
  const double fake = ppl(d / "q/fake");
  for (auto f : {"gptq", "gptq_v2", "compressed-tensors", "gguf"}) {
    const double x = ppl(d / ("q/" + std::string(f)));
    INFO(f << ": " << x << " vs fake " << fake);
    CHECK(std::abs(x - fake) <= 1e-5 * fake);
  }
  const double nf4_fake = ppl(d / "n/fake"), nf4 = ppl(d / "n/nf4");
  CHECK(std::abs(nf4 - nf4_fake) <= 1e-5 * nf4_fake);
}

// llama.cpp's quantizer (src/llama-quant.cpp: llama_tensor_get_type_impl, tensor_type_fallback)
// gives output.weight Q6_K, or Q8_0 in a Q8_0 file and where the file type's blocks do not divide
// the row; token_embd.weight the file's type; tied embeddings the output's; each falling back where
// its blocks do not divide the row (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0), F16 where none does.
// The table is that source's outcome for each input, read off by hand.
TEST_CASE("GGUF: output.weight and token_embd.weight take the types llama.cpp's quantizer gives them, and its rounding") {
  struct Row {
    GgmlType base;
    int64_t cols;
    const char *output, *embedding;   // "": stays float
  };
  for (const Row& w : {Row{GgmlType::Q4_K, 4096, "Q6_K", "Q4_K"}, Row{GgmlType::Q5_K, 4096, "Q6_K", "Q5_K"}, Row{GgmlType::Q6_K, 4096, "Q6_K", "Q6_K"},
                       Row{GgmlType::Q4_0, 4096, "Q6_K", "Q4_0"}, Row{GgmlType::Q5_1, 3072, "Q6_K", "Q5_1"}, Row{GgmlType::Q8_0, 4096, "Q8_0", "Q8_0"},
                       Row{GgmlType::Q4_K, 384, "Q8_0", "Q5_0"}, Row{GgmlType::Q5_K, 384, "Q8_0", "Q5_1"}, Row{GgmlType::Q6_K, 384, "Q8_0", "Q8_0"},
                       Row{GgmlType::Q4_0, 64, "Q8_0", "Q4_0"}, Row{GgmlType::Q4_0, 48, "", ""}}) {
    GgmlType t;
    INFO(ggml_type_name(w.base) << ", rows of " << w.cols);
    CHECK((gguf_output_type(w.base, w.cols, &t) ? std::string(ggml_type_name(t)) : std::string()) == w.output);
    CHECK((gguf_embedding_type(w.base, w.cols, &t) ? std::string(ggml_type_name(t)) : std::string()) == w.embedding);
  }

  // llama2xs (tied embeddings, rows of 64) as Q4_0: its token_embd is the output, Q6_K's 256 do not
  // divide its rows, so Q8_0. The run's recipe records the resolved types.
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string a = ptqtest::assets();
  auto run = [&](const std::string& out, const std::string& beside) {
    Recipe r = parse_recipe(YAML::Load("quantization: {method: rtn}\nexport: {format: [gguf], gguf_type: Q4_0" + beside + "}\n"), "r.yaml");
    r.model = a + "/models/llama2xs";
    r.output = d / out;
    r.device = "cpu";
    r.calibration = {"random", 2, 32, 0};
    return run_quantize(r, {});
  };
  const json rep = run("q", "");
  CHECK(rep["recipe"]["export"]["gguf_output_type"] == "Q8_0");
  CHECK(rep["recipe"]["export"]["gguf_embedding_type"] == "Q8_0");
  const GgufFile g(d / "q/model.gguf");
  const GgufFile::TensorInfo* e = g.find("token_embd.weight");
  REQUIRE(e != nullptr);
  REQUIRE(e->type == GgmlType::Q8_0);
  CHECK(g.find("blk.0.attn_q.weight")->type == GgmlType::Q4_0);
  CHECK(g.metadata()["general.file_type"] == 2);   // Q4_0: the Linears' type, whatever the embeddings take
  // Each value within 0.6 of its block's step d = max|x| / 127 (llama.cpp's Q8_0: half a step, and
  // the f16 rounding of d times codes up to 127), against the stored floats read in float64.
  // (The blocks are llama.cpp's own, byte for byte: tests/test_client.cpp.)
  const LlamaModel m(a + "/models/llama2xs");
  const Shape sh = m.weights().shape("model.embed_tokens.weight");
  std::vector<float> x(size_t(numel(sh))), y(x.size());
  m.weights().read_f32("model.embed_tokens.weight", x.data());
  g.read_f32(*e, y.data());
  size_t changed = 0;
  for (size_t b = 0; b < x.size(); b += 32) {
    double amax = 0;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::abs(double(x[i])));
    const double step = amax / 127;
    for (size_t i = b; i < b + 32; ++i) {
      INFO("element " << i);
      CHECK(std::abs(double(y[i]) - double(x[i])) <= 0.6 * step + 1e-12);
      changed += y[i] != x[i];
    }
  }
  CHECK(changed > x.size() / 2);
  // float keeps the model's float type; ptqkit's evaluation of the two files within 0.5%.
  run("f", ", gguf_output_type: float, gguf_embedding_type: float");
  const GgufFile gf(d / "f/model.gguf");
  CHECK(ggml_block_elems(gf.find("token_embd.weight")->type) == 1);
  auto tok = load_tokenizer(a + "/models/llama2xs", 1);
  const auto ids = encode_corpus(*tok, a + "/text/tinystories/eval.txt");
  EvalOptions o;
  o.seq_len = 256;
  o.max_windows = 40;
  const double pq = evaluate(*open_model(d / "q"), ids, o).perplexity, pf = evaluate(*open_model(d / "f"), ids, o).perplexity;
  INFO("Q8_0 embeddings " << pq << ", float " << pf);
  CHECK(pq != pf);
  CHECK(std::abs(pq - pf) <= 5e-3 * pf);
  // A type whose blocks do not divide the rows is refused before calibration, naming the setting.
  try {
    run("x", ", gguf_output_type: Q4_K");
    FAIL("Q4_K on rows of 64 was written");
  } catch (const Error& err) {
    CHECK(err.field == "export.gguf_output_type");
    CHECK(err.message.find("hidden_size") != std::string::npos);
  }
}

TEST_CASE("GGUF: output and embedding blocks formed ahead of the export are written as given, where their type is the file's") {
  // A GPU run forms these two tensors on a thread beside its calibration (pipeline/export.h's
  // gguf_tables_ahead) and hands them to the writer. distilled-13m (rows of 384, untied) with its
  // Linears in float: the file with the tables handed over must be the one the writer forms
  // itself, a table of another type must be formed again, a changed byte must reach the file (the
  // writer took what it was given), and a table of the wrong size is refused.
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const LlamaModel m(ptqtest::assets() + "/models/distilled-13m");
  const auto [out, emb] = gguf_table_names(m.checkpoint());
  REQUIRE(out == "lm_head.weight");
  REQUIRE(emb == "model.embed_tokens.weight");
  ExportJob job;
  job.model = &m;
  job.gguf_output = GgmlType::Q8_0;
  job.gguf_embedding = GgmlType::Q5_0;
  auto write = [&](const std::string& name, const std::map<std::string, GgufTable>* t) {
    job.out_dir = d / name;
    std::filesystem::create_directories(job.out_dir);
    job.gguf_tables = t;
    export_gguf(job);
    return read_text_file(job.out_dir + "/model.gguf");
  };
  const std::string plain = write("plain", nullptr);
  std::map<std::string, GgufTable> ahead{{out, {GgmlType::Q8_0, gguf_table_bytes(m, out, GgmlType::Q8_0)}},
                                         {emb, {GgmlType::Q5_0, gguf_table_bytes(m, emb, GgmlType::Q5_0)}}};
  CHECK(write("ahead", &ahead) == plain);
  ahead[out].type = GgmlType::Q4_0;   // not the file's type for it: formed again
  ahead[out].bytes.assign(ahead[out].bytes.size(), '\x55');
  CHECK(write("other-type", &ahead) == plain);
  ahead[emb].bytes[5] ^= 0x01;   // within the first block's codes
  const std::string flipped = write("flipped", &ahead);
  REQUIRE(flipped.size() == plain.size());
  size_t diff = 0;
  for (size_t i = 0; i < plain.size(); ++i) diff += plain[i] != flipped[i];
  CHECK(diff == 1);
  const GgufFile g(d / "flipped/model.gguf"), gp(d / "plain/model.gguf");
  CHECK(std::memcmp(g.find("token_embd.weight")->data, gp.find("token_embd.weight")->data, 5) == 0);
  CHECK(g.find("token_embd.weight")->data[5] != gp.find("token_embd.weight")->data[5]);
  ahead[emb].bytes.pop_back();
  CHECK_THROWS_WITH(write("short", &ahead), Catch::Contains("do not fill the tensor"));
}

TEST_CASE("a malformed GGUF file is refused naming the field") {
  ptqtest::TempDir d;
  write_file_atomic(d / "x.gguf", "GGML");
  CHECK_THROWS_WITH(GgufFile(d / "x.gguf"), Catch::Contains("not a GGUF file"));
  std::string h = "GGUF";
  h += std::string("\x03\0\0\0", 4);
  h += std::string("\x01\0\0\0\0\0\0\0", 8);   // one tensor
  h += std::string("\x01\0\0\0\0\0\0\0", 8);   // one metadata entry
  h += std::string("\xff\0\0\0\0\0\0\0", 8);   // key length 255: past the end
  h += std::string(10, 'x');
  write_file_atomic(d / "y.gguf", h);
  CHECK_THROWS_WITH(GgufFile(d / "y.gguf"), Catch::Contains("runs past the end of the file"));
  // One F32 tensor of one element at offset 2^64 - 1: data_start + offset wraps to just before the
  // data, which a naive "start + offset + bytes <= size" check accepts (found by the GGUF fuzzer).
  auto u64 = [](uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); };
  auto u32 = [](uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); };
  auto one_tensor = [&](uint64_t offset, const std::string& kv, uint64_t nkv) {
    std::string f = "GGUF" + u32(3) + u64(1) + u64(nkv) + kv + u64(1) + "w" + u32(1) + u64(1) + u32(0) + u64(offset);
    f.resize((f.size() + 31) / 32 * 32 + 64, '\0');
    return f;
  };
  write_file_atomic(d / "wrap.gguf", one_tensor(~uint64_t(0), "", 0));
  CHECK_THROWS_WITH(GgufFile(d / "wrap.gguf"), Catch::Contains("w: data lies outside the file"));
  write_file_atomic(d / "ok.gguf", one_tensor(60, "", 0));   // the last 4 bytes: accepted
  CHECK(GgufFile(d / "ok.gguf").tensors().size() == 1);
  write_file_atomic(d / "past.gguf", one_tensor(61, "", 0));
  CHECK_THROWS_WITH(GgufFile(d / "past.gguf"), Catch::Contains("data lies outside the file"));
  const std::string align_str = u64(17) + "general.alignment" + u32(8) + u64(2) + "32";   // a string value
  write_file_atomic(d / "align.gguf", one_tensor(0, align_str, 1));
  CHECK_THROWS_WITH(GgufFile(d / "align.gguf"), Catch::Contains("general.alignment: must be an unsigned integer"));
  const std::string align_huge = u64(17) + "general.alignment" + u32(10) + u64(uint64_t(1) << 63);   // u64, wraps the rounding
  write_file_atomic(d / "align2.gguf", one_tensor(0, align_huge, 1));
  CHECK_THROWS_WITH(GgufFile(d / "align2.gguf"), Catch::Contains("must be a power of two no larger than the file"));
  // The model metadata a GGUF is opened with: keys of the wrong type are refused naming the key.
  auto str_kv = [&](const std::string& k, const std::string& v) { return u64(k.size()) + k + u32(8) + u64(v.size()) + v; };
  write_file_atomic(d / "arch.gguf", one_tensor(0, str_kv("general.architecture", "llama") + str_kv("llama.attention.head_count", "8"), 2));
  CHECK_THROWS_WITH(gguf_config_json(GgufFile(d / "arch.gguf")), Catch::Contains("llama.attention.head_count: must be a number"));
  write_file_atomic(d / "arch2.gguf", one_tensor(0, u64(20) + "general.architecture" + u32(4) + u32(7), 1));   // a uint32
  CHECK_THROWS_WITH(gguf_config_json(GgufFile(d / "arch2.gguf")), Catch::Contains("general.architecture: must be a string"));
}

// A tiny checkpoint of `family` written by transformers: quantized on the CPU (4-bit g16, asymmetric,
// act-order with static groups), exported in gptq, gptq_v2, compressed-tensors and fake, read back.
// The packed readers' forward equals the fake export's, GPTQ's output error is at most RTN's for
// every Linear, experts included, and every Linear the schedule lists was quantized.
// Logits of two forwards of the same quantized model within `tol` (relative). MoE: a rounding
// difference can flip a near-tied router choice, which moves that token's logits wholesale; then
// the positions (rows) within tol must be nearly all of them instead.
void check_logits_close(const MatF& got, const MatF& want, const LlamaConfig& c, double tol) {
  int agree = 0;
  for (Eigen::Index row = 0; row < got.rows(); ++row) agree += (got.row(row) - want.row(row)).norm() <= tol * want.row(row).norm();
  INFO("relative difference " << (got - want).norm() / want.norm() << ", rows within " << tol << ": " << agree << " of " << got.rows());
  if (c.moe == MoeRouting::none) CHECK((got - want).norm() <= tol * want.norm());
  else CHECK(agree >= got.rows() * 9 / 10);
}

// A tiny checkpoint of `family` written by transformers, quantized on the CPU at 4 bits g16 with
// act-order and static groups: asymmetric into gptq_v2, compressed-tensors and fake, symmetric into
// gptq (v1 cannot hold a zero of 0) and fake; each read back. The packed readers' forward equals
// the fake export's, GPTQ's output error is at most RTN's for every Linear, experts included, and
// every Linear the schedule lists was quantized.
void check_family_roundtrip(const std::string& family, size_t linears) {
  ptqtest::TempDir d;
  const std::string a = ptqtest::assets();
  const ptqtest::Golden g = ptqtest::golden("tiny-" + family);
  const std::vector<int32_t>& ids = g.ids;
  const int S = g.S, T = g.T;
  const std::string model = a + "/models/tiny-" + family;   // no tokenizer: random calibration tokens
  const LlamaConfig c = LlamaModel(model).config();
  const MatF flt = LlamaModel(model).forward(ids, S, T);
  for (const bool sym : {false, true}) {
    Recipe r = parse_recipe(YAML::Load("quantization: {bits: 4, group_size: 16, act_order: true, static_groups: true}\n"), "r.yaml");
    r.quant.sym = sym;
    r.model = model;
    r.output = d / (sym ? "s" : "a");
    r.device = "cpu";
    r.calibration = {"random", 16, 48, 0};
    r.formats = sym ? std::vector<std::string>{"fake", "gptq"} : std::vector<std::string>{"fake", "gptq_v2", "compressed-tensors"};
    const json rep = run_quantize(r, {});
    REQUIRE(rep["modules"].size() == linears);
    for (auto& m : rep["modules"]) {
      INFO(m["name"]);
      CHECK(m["method"] == "gptq");
      CHECK(m["loss"].get<double>() <= m["rtn_loss"].get<double>() * (1 + 1e-6));
      if (m.contains("expert")) CHECK(m["hessian_tokens"] == 16 * 48);   // every token through every expert
    }
    const MatF fake = open_model(r.output + "/fake")->forward(ids, S, T);
    CHECK((fake - flt).norm() > 0);   // the weights did change
    std::vector<MatF> packed;
    for (size_t i = 1; i < r.formats.size(); ++i) {
      auto m = open_model(r.output + "/" + r.formats[i]);
      CHECK(m->config().model_type == c.model_type);
      packed.push_back(m->forward(ids, S, T));
      // The packed readers dequantize s * (q - z) in fp32; the fake export stored those weights
      // rounded to the checkpoint's bf16 (2^-9 relative), which moves these logits by ~0.5%.
      INFO(r.formats[i]);
      check_logits_close(packed.back(), fake, c, 1e-2);
    }
    if (!sym) CHECK(packed[0] == packed[1]);   // the same codes and bf16 scales in two layouts: the same model
    // MoE: the routers stay float, and the formats' lists of unquantized modules name them.
    if (c.moe == MoeRouting::none) continue;
    const std::string f = sym ? "gptq" : "compressed-tensors";
    const json qc = json::parse(read_text_file(r.output + "/" + f + "/config.json"))["quantization_config"];
    Checkpoint ck(r.output + "/" + f);
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      if (!sym) CHECK(std::find(qc["ignore"].begin(), qc["ignore"].end(), router_name(c, l)) != qc["ignore"].end());
      CHECK(ck.get(router_name(c, l) + ".weight").dtype == DType::BF16);
    }
    if (sym) CHECK(qc["modules_in_block_to_quantize"].size() == 2 + 2 * size_t(c.num_experts));
  }
}

TEST_CASE("tiny-qwen3 quantized, exported in every weight-only format and read back: packed forward equals the fake export's, GPTQ beats RTN") {
  PTQ_REQUIRE_ASSETS();
  check_family_roundtrip("qwen3", 14);   // 2 layers x 7 Linears; q_norm / k_norm stay float
}
TEST_CASE("tiny-mixtral quantized (every expert), exported in every weight-only format and read back") {
  PTQ_REQUIRE_ASSETS();
  check_family_roundtrip("mixtral", 2 * (4 + 4 * 3));
}
TEST_CASE("tiny-qwen3-moe quantized (every expert), exported in every weight-only format and read back") {
  PTQ_REQUIRE_ASSETS();
  check_family_roundtrip("qwen3-moe", 2 * (4 + 8 * 3));
}
TEST_CASE("tiny-phi3 quantized (fused qkv_proj and gate_up_proj as stored), exported in every weight-only format and read back") {
  PTQ_REQUIRE_ASSETS();
  check_family_roundtrip("phi3", 2 * 4);
}

TEST_CASE("MoE routed calibration: each expert's Hessian from its routed tokens, and an expert with fewer than its input width falls back to RTN") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string model = ptqtest::assets() + "/models/tiny-qwen3-moe";
  const LlamaConfig c = LlamaModel(model).config();
  for (const int samples : {16, 1}) {
    Recipe r = parse_recipe(YAML::Load("moe: {calibrate_all_experts: false}\nquantization: {bits: 4, group_size: 16}\n"), "r.yaml");
    r.model = model;
    r.output = d / ("q" + std::to_string(samples));
    r.device = "cpu";
    r.calibration = {"random", samples, 24, 0};
    r.formats = {"compressed-tensors"};
    const json rep = run_quantize(r, {});
    REQUIRE(rep["modules"].size() == 2 * (4 + 8 * 3));
    std::map<int, int64_t> routed_per_layer;
    for (auto& m : rep["modules"]) {
      if (!m.contains("expert")) continue;
      INFO(m["name"]);
      const int64_t routed = m["routed_tokens"];
      CHECK(m["hessian_tokens"] == routed);
      // gate/up read the hidden size (64), down the expert's ffn (48)
      const int64_t width = m["cols"];
      CHECK(m["method"] == (routed < width ? "rtn" : "gptq"));
      if (m["name"].get<std::string>().find("down_proj") != std::string::npos)
        routed_per_layer[std::stoi(m["name"].get<std::string>().substr(13))] += routed;
    }
    // every token goes to num_experts_per_tok experts
    for (auto& [l, n] : routed_per_layer) CHECK(n == int64_t(samples) * 24 * c.experts_per_token);
    if (samples == 1) {   // 24 tokens x 2 experts: no expert sees 48 tokens, every expert is rounded to nearest
      for (auto& m : rep["modules"])
        if (m.contains("expert")) CHECK(m["method"] == "rtn");
    }
  }
}

TEST_CASE("a synthetic MoE checkpoint loads, and quantizing it quantizes every expert (none left in float)") {
  ptqtest::TempDir d;
  SynthOptions o;
  o.preset = "tiny-moe";
  synth_model(o, d / "m");
  LlamaModel model(d / "m");
  const LlamaConfig& c = model.config();
  REQUIRE(c.num_experts == 8);
  Recipe r = parse_recipe(YAML::Load("quantization: {bits: 4, group_size: 32}\n"), "r.yaml");
  r.model = d / "m";
  r.output = d / "q";
  r.device = "cpu";
  r.calibration = {"random", 4, 64, 0};
  r.formats = {"compressed-tensors"};
  const nlohmann::json rep = run_quantize(r, {});
  std::set<std::string> quantized;
  for (auto& mod : rep["modules"]) quantized.insert(mod["name"].get<std::string>());
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (int e = 0; e < c.num_experts; ++e)
      for (Proj p : {Proj::gate, Proj::up, Proj::down}) CHECK(quantized.count(linear_name(c, l, LinearId(p, e))) == 1);
  CHECK(quantized.size() == size_t(c.num_hidden_layers) * (4 + 3 * size_t(c.num_experts)));
  // in the checkpoint: every expert Linear packed, the routers float
  Checkpoint ck(d / "q");
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    CHECK(ck.has(linear_name(c, l, LinearId(Proj::down, 7)) + ".weight_packed"));
    CHECK(!ck.has(linear_name(c, l, LinearId(Proj::down, 7)) + ".weight"));
    CHECK(ck.get(router_name(c, l) + ".weight").dtype == DType::F16);
  }
}

TEST_CASE("NF4 of the MoE and fused families: every expert and fused Linear stored as NF4, the routers float, read back equal to the fake export") {
  PTQ_REQUIRE_ASSETS();
  const std::string a = ptqtest::assets();
  for (const std::string family : {"mixtral", "qwen3-moe", "phi3"}) {
    ptqtest::TempDir d;
    Recipe r = parse_recipe(YAML::Load("quantization: {method: nf4}\nexport: {format: [nf4, fake], nf4_blocksize: 64}\n"), "r.yaml");
    r.model = a + "/models/tiny-" + family;
    r.output = d / "q";
    r.device = "cpu";
    run_quantize(r, {});
    const LlamaConfig c = LlamaModel(r.model).config();
    Checkpoint ck(d / "q/nf4");
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      for (LinearId id : layer_schedule(c, l).linears()) CHECK(ck.get(linear_name(c, l, id) + ".weight").dtype == DType::U8);
      if (c.moe_layer(l)) CHECK(ck.get(router_name(c, l) + ".weight").dtype == DType::BF16);
    }
    const json skip = json::parse(read_text_file(d / "q/nf4/config.json"))["quantization_config"]["llm_int8_skip_modules"];
    CHECK(skip.size() == 1 + size_t(c.moe != MoeRouting::none ? c.num_hidden_layers : 0));
    const ptqtest::Golden g = ptqtest::golden("tiny-" + family);
    const MatF packed = open_model(d / "q/nf4")->forward(g.ids, g.S, g.T);
    const MatF fake = open_model(d / "q/fake")->forward(g.ids, g.S, g.T);
    INFO(family);
    check_logits_close(packed, fake, c, 2e-2);
  }
}

TEST_CASE("MoE statistics saved and reloaded: the same experts' Hessians, routed counts and codes") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  for (const bool all : {true, false}) {
    Recipe r = parse_recipe(YAML::Load("quantization: {bits: 4, group_size: 16}\n"), "r.yaml");
    r.model = ptqtest::assets() + "/models/tiny-mixtral";
    r.moe_calibrate_all_experts = all;
    r.device = "cpu";
    r.calibration = {"random", 8, 48, 0};
    r.formats = {"fake"};
    const std::string tag = all ? "all" : "routed";
    r.output = d / ("saved-" + tag);
    QuantizeOptions so;
    so.save_stats = d / ("stats-" + tag);
    const json a = run_quantize(r, so);
    r.output = d / ("loaded-" + tag);
    QuantizeOptions lo;
    lo.load_stats = so.save_stats;
    const json b = run_quantize(r, lo);
    REQUIRE(a["modules"].size() == b["modules"].size());
    for (size_t i = 0; i < a["modules"].size(); ++i) {
      const json &ma = a["modules"][i], &mb = b["modules"][i];
      INFO(ma["name"]);
      CHECK(ma["name"] == mb["name"]);
      CHECK(ma.value("routed_tokens", int64_t(-2)) == mb.value("routed_tokens", int64_t(-2)));
      CHECK(ma.value("hessian_tokens", int64_t(-2)) == mb.value("hessian_tokens", int64_t(-2)));
      CHECK(ma["loss"] == mb["loss"]);   // the same H, the same weights: the same solve
    }
    CHECK(read_text_file(d / ("saved-" + tag + "/model.safetensors")) == read_text_file(d / ("loaded-" + tag + "/model.safetensors")));
  }
}

// Every GGUF block type ptqkit writes, read back: each quantized weight decodes to the solve's
// value. The fake export holds the same values rounded to the model's dtype, so the two agree
// after that rounding, element for element. distilled-13m's ffn_down (1024 wide) takes Q4_K / Q6_K
// (Q4_K_M) or Q5_K / Q6_K (Q5_K_M), its 384-wide Linears the fallbacks Q5_0 / Q8_0 or Q5_1 / Q8_0;
// llama2xs takes Q4_1. (llama.cpp's own decoding of the same blocks: tests/test_client.cpp.)
TEST_CASE("GGUF of every block type: each weight decodes to the solve's value") {
  PTQ_REQUIRE_ASSETS();
  const std::string a = ptqtest::assets();
  std::map<std::string, int64_t> seen;
  for (auto [model, type] : {std::pair<const char*, const char*>{"llama2xs", "Q4_1"}, {"distilled-13m", "Q4_K_M"}, {"distilled-13m", "Q5_K_M"}}) {
    INFO(model << " " << type);
    ptqtest::TempDir d;
    Recipe r = parse_recipe(YAML::Load(std::string("quantization: {act_order: true}\nexport: {format: [gguf, fake], gguf_type: ") + type + "}\n"), "r.yaml");
    r.model = a + "/models/" + model;
    r.output = d / "q";
    r.calibration = {a + "/text/tinystories/calib.txt", 4, 128, 0};
    run_quantize(r, {});
    Checkpoint fake(d / "q/fake");
    GgufFile g(d / "q/gguf/model.gguf");
    const DType dt = fake.get("model.layers.0.mlp.down_proj.weight").dtype;
    for (const std::string& n : fake.names()) {
      // the Linears written in HF row order (llama.cpp permutes q/k rows: checked by the client test)
      if (n.find("layers.") == std::string::npos || n.find("_proj.weight") == std::string::npos || n.find("q_proj") != std::string::npos ||
          n.find("k_proj") != std::string::npos)
        continue;
      const GgufFile::TensorInfo* t = g.find(hf_to_gguf_name(n));
      REQUIRE(t != nullptr);
      std::vector<float> ours(size_t(t->ne[0] * t->ne[1]));
      g.read_f32(*t, ours.data());
      const std::vector<float> expect = tensor_to_f32(fake.get(n));
      REQUIRE(expect.size() == ours.size());
      int64_t differ = 0;
      for (size_t i = 0; i < ours.size(); ++i) differ += round_to(dt, ours[i]) != expect[i];
      INFO(n << " (" << ggml_type_name(t->type) << ")");
      CHECK(differ == 0);
      seen[ggml_type_name(t->type)]++;
    }
  }
  for (const char* t : {"Q4_1", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1", "Q8_0"}) {
    INFO(t);
    CHECK(seen[t] > 0);
  }
}

// compressed-tensors' own dequantization of a pack-quantized Linear, step for step as the library
// does it (compressed_tensors/quantization/lifecycle/forward.py and its int32 unpacking): 4-bit
// values packed 8 to an int32, first in the lowest bits, stored + 8; the group size inferred as
// int(in_features / scale columns); a width the group size does not divide raises (ValueError);
// group i covers columns [i g, i g + g); w = (q - zero_point) · scale.
namespace {
std::vector<float> ct_library_dequantize(const SafetensorsFile& f, const std::string& m, std::string* error) {
  const TensorView shp = f.get(m + ".weight_shape"), pk = f.get(m + ".weight_packed"), sc = f.get(m + ".weight_scale");
  const int32_t* s = reinterpret_cast<const int32_t*>(shp.data);
  const int64_t rows = s[0], cols = s[1], ngroups = sc.shape[1];
  const int64_t group = int64_t(double(cols) / double(ngroups));   // Python's int(x_q.shape[1] / scale.shape[1])
  if (cols >= group && cols % group != 0) {
    *error = "tensor column shape must be divisible by the given group_size " + std::to_string(group);
    return {};
  }
  const std::vector<float> scale = tensor_to_f32(sc);
  const int32_t* packed = reinterpret_cast<const int32_t*>(pk.data);
  std::vector<float> w(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint32_t word = uint32_t(packed[r * pk.shape[1] + c / 8]);
      const int q = int((word >> (4 * (c % 8))) & 15u) - 8;
      const int64_t i = c / group;   // the loop over ceil(cols / group) groups of `group` columns
      w[size_t(r * cols + c)] = float(q) * scale[size_t(r * ngroups + i)];
    }
  return w;
}
}  // namespace

TEST_CASE("compressed-tensors: every packed Linear ptqkit writes dequantizes by the library's own rule to the fake export's weights") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string A = ptqtest::assets();
  int checked = 0;
  // g128 on llama2xs: 64-wide Linears hold one group (the library infers 64); the 192-wide
  // down_proj stays float (in the ignore list). g32: 2 and 6 groups.
  for (const char* scheme : {"W4A16", "W4A16-G32"}) {
    const std::string out = d / scheme;
    auto r = ptqtest::run_ptqkit("-q quantize --model " + A + "/models/llama2xs --scheme " + scheme + " --dataset " + A +
                                 "/text/tinystories/calib.txt --set calibration.samples=8 --set calibration.seq_len=64 --set 'export.format=[compressed-tensors,fake]' -o " +
                                 out);
    INFO(r.out);
    REQUIRE(r.code == 0);
    const SafetensorsFile ct(out + "/compressed-tensors/model.safetensors");
    const SafetensorsFile fake(out + "/fake/model.safetensors");
    for (const std::string& n : ct.names()) {
      if (n.size() < 14 || n.compare(n.size() - 14, 14, ".weight_packed") != 0) continue;
      const std::string m = n.substr(0, n.size() - 14);
      INFO(scheme << " " << m);
      std::string error;
      const std::vector<float> got = ct_library_dequantize(ct, m, &error);
      CHECK(error.empty());
      const std::vector<float> want = tensor_to_f32(fake.get(m + ".weight"));
      REQUIRE(got.size() == want.size());
      size_t off = 0;
      for (size_t i = 0; i < got.size(); ++i) off += std::abs(got[i] - want[i]) > 1e-6f * std::abs(want[i]);
      CHECK(off == 0);
      ++checked;
    }
  }
  CHECK(checked == 2 * 30 + 5);   // g128: 6 Linears x 5 layers (down_proj float); g32: all 35
}

// The GPU path (eval/generate --device cuda) serves pack-quantized checkpoints through GptqReader,
// which hands them to the W4A16 / W8A16 kernels as the quantizer's representation. Here that is
// checked against an independent writer of the same quantization: the gptq_v2 export of the same
// run (one calibration, two formats) read by the same reader, module by module, every field.
TEST_CASE("compressed-tensors pack-quantized read as codes and grids equals the gptq_v2 export of the same run") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string A = ptqtest::assets();
  struct Case { const char* scheme; const char* sets; };
  const Case cases[] = {{"W4A16-G32", ""},   // symmetric, static groups
                        {"W4A16-G32", " --set quantization.sym=false --set quantization.static_groups=false"},   // zero points, g_idx permuted
                        {"W8A16", ""}};   // 8-bit, one group a row
  int k = 0;
  for (const Case& cs : cases) {
    const std::string out = d / ("q" + std::to_string(k++));
    auto r = ptqtest::run_ptqkit("-q quantize --model " + A + "/models/llama2xs --scheme " + cs.scheme + " --dataset " + A +
                                 "/text/tinystories/calib.txt --set calibration.samples=8 --set calibration.seq_len=64 --set 'export.format=[gptq_v2,compressed-tensors]'" +
                                 cs.sets + " -o " + out);
    INFO(cs.scheme << cs.sets << "\n" << r.out);
    REQUIRE(r.code == 0);
    REQUIRE(model_format(out + "/compressed-tensors") == "compressed-tensors/pack-quantized");
    const GptqReader ct(out + "/compressed-tensors"), v2(out + "/gptq_v2");
    CHECK(ct.v2());
    int modules = 0, permuted = 0;
    for (int l = 0; l < 5; ++l)
      for (const char* p : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
        const std::string m = "model.layers." + std::to_string(l) + "." + p;
        INFO(m);
        REQUIRE(ct.has(m));
        REQUIRE(v2.has(m));
        const QuantizedLinear a = ct.read(m), b = v2.read(m);
        CHECK(a.spec.bits == b.spec.bits);
        CHECK(a.rows == b.rows);
        CHECK(a.cols == b.cols);
        CHECK(a.groups == b.groups);
        check_same(a, b);   // codes, zero points, scales, g_idx
        for (int64_t c = 0; c < b.cols; ++c) permuted += b.g_idx[size_t(c)] != int32_t(c * b.groups / b.cols);
        ++modules;
      }
    CHECK(modules == 35);
    if (k == 2) CHECK(permuted > 0);   // act-order without static groups: the g_idx path is exercised
  }
  // A module whose sizes do not fill GPTQ's int32 words (pack-quantized pads each row to a word, as
  // stories260k's 172-row gate and up) reads as well: here [4, 8] of codes 0 on the symmetric grid
  // (zero point 8) and scales 1, so every weight is -8.
  const std::string cfg = R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
    "vocab_size": 5, "torch_dtype": "float16", "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "symmetric": true, "group_size": 8}}}}})";
  const std::string bad = d / "bad";
  std::filesystem::create_directories(bad);
  write_file_atomic(bad + "/config.json", cfg);
  auto i32 = [](Shape s, std::vector<int32_t> v) { Tensor x(DType::I32, std::move(s)); std::memcpy(x.bytes.data(), v.data(), x.bytes.size()); return x; };
  const std::vector<float> scale(4, 1.0f);
  write_safetensors(bad + "/model.safetensors", {{"m.weight_shape", i32({2}, {4, 8})},
                                                 {"m.weight_packed", i32({4, 1}, {0, 0, 0, 0})},
                                                 {"m.weight_scale", tensor_from_f32(scale.data(), {4, 1}, DType::F16)}});
  const GptqReader r(bad);
  REQUIRE(r.has("m"));
  CHECK_FALSE(r.has("n"));
  const QuantizedLinear q = r.read("m");
  CHECK(q.rows == 4);
  CHECK(q.cols == 8);
  CHECK(q.dequantize() == MatF::Constant(4, 8, -8.0f));
  write_file_atomic(bad + "/config.json", cfg.substr(0, cfg.find("pack-quantized")) + "int-quantized" + cfg.substr(cfg.find("pack-quantized") + 14));
  CHECK_THROWS_WITH(GptqReader(bad), Catch::Contains("quantization_config.format: the packed-Linear reader takes pack-quantized compressed-tensors, not 'int-quantized'"));
}

// The GPU loads a GGUF's quantized Linears as codes and grids (gguf_quantized). Checked against
// llama.cpp's own rule as the reader applies it (dequantize_row, then llama's q/k rows un-permuted by
// gguf_source): the codes and grids dequantize to exactly those floats, module by module, for every
// block type. A synthetic model of 512-wide layers, so that the K-quants take every Linear.
TEST_CASE("GGUF Linears of every block type as codes and grids dequantize to the GGUF reader's weights, q/k rows in Hugging Face order") {
  ptqtest::TempDir d;
  SynthOptions so;
  so.preset = "small";
  so.layers = 2;
  synth_model(so, d / "float");
  for (const char* type : {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}) {
    INFO(type);
    Recipe r = parse_recipe(YAML::Load(std::string("quantization: {method: rtn}\nexport: {format: [gguf], gguf_type: ") + type + "}\n"), "r.yaml");
    r.model = d / "float";
    r.output = d / type;
    r.calibration = {"random", 2, 32, 0};
    run_quantize(r, {});
    auto m = open_model(r.output);
    const GgufFile g(gguf_path(r.output));
    QuantSpec want_spec;
    apply_gguf_type(type, want_spec);
    int modules = 0;
    for (int l = 0; l < 2; ++l)
      for (const char* p : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
        const std::string n = "model.layers." + std::to_string(l) + "." + p + ".weight";
        INFO(n);
        QuantizedLinear q;
        REQUIRE(gguf_quantized(g, n, m->config().head_dim, nullptr));
        REQUIRE(gguf_quantized(g, n, m->config().head_dim, &q));
        CHECK(q.spec.bits == want_spec.bits);
        CHECK(q.spec.form == want_spec.form);
        CHECK(q.groups == q.cols / want_spec.group_size);
        CHECK(q.mins.empty() == !has_min(want_spec.form));
        const MatF got = q.dequantize();
        const Shape s = m->weights().shape(n);
        REQUIRE(got.rows() == s[0]);
        REQUIRE(got.cols() == s[1]);
        std::vector<float> want(size_t(s[0] * s[1]));
        m->weights().read_f32(n, want.data());
        CHECK(std::memcmp(got.data(), want.data(), want.size() * 4) == 0);
        ++modules;
      }
    CHECK(modules == 14);
    QuantizedLinear none;
    CHECK_FALSE(gguf_quantized(g, "model.norm.weight", m->config().head_dim, &none));   // float tensors: read by the WeightSource
    CHECK_FALSE(gguf_quantized(g, "model.layers.0.input_layernorm.weight", m->config().head_dim, nullptr));
  }
}
