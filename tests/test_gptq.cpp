// GPTQ against an independent fp64 implementation written here: column by column with the full
// update after every column (no lazy blocks), H^-1 by explicit inverse and its Cholesky factor as
// in the reference's three steps. In that form a group's parameters always come from fully
// updated weights, which is what ptqkit's fix of the reference's mid-block quirk must reproduce.
#include <Eigen/Cholesky>
#include <Eigen/LU>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <omp.h>

#include "core/bits.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "gptq/gptq.h"
#include "quant/qstore.h"
#include "testing.h"
#include "testing_gptq.h"

using namespace ptq;

namespace {
using ptqtest::Problem;
Problem make_problem(int rows, int cols, int tokens, uint64_t seed, bool dead_column = false) {
  ptqtest::ProblemShape sh;
  sh.dead_column = dead_column;
  return ptqtest::correlated_problem(rows, cols, tokens, seed, sh);
}

struct RefResult {
  Eigen::MatrixXd Q;                  // dequantized weights, natural order
  std::vector<int> codes;             // [rows, cols]
};

RefResult reference_gptq(const MatF& W0, const MatD& H0, const QuantSpec& s) {
  const int rows = int(W0.rows()), cols = int(W0.cols());
  Eigen::MatrixXd W = W0.cast<double>(), H = H0;
  for (int i = 0; i < cols; ++i)
    if (H(i, i) == 0) { H(i, i) = 1; W.col(i).setZero(); }
  std::vector<int> perm(static_cast<size_t>(cols));
  std::iota(perm.begin(), perm.end(), 0);
  if (s.act_order) std::stable_sort(perm.begin(), perm.end(), [&](int a, int b) { return H(a, a) > H(b, b); });
  Eigen::MatrixXd Wp(rows, cols), Hp(cols, cols);
  for (int j = 0; j < cols; ++j) Wp.col(j) = W.col(perm[size_t(j)]);
  for (int i = 0; i < cols; ++i)
    for (int j = 0; j < cols; ++j) Hp(i, j) = H(perm[size_t(i)], perm[size_t(j)]);
  Hp.diagonal().array() += s.damp_percent * Hp.diagonal().mean();
  Eigen::MatrixXd Hinv = Hp.inverse();
  Eigen::MatrixXd U = Eigen::LLT<Eigen::MatrixXd>(Hinv).matrixU();
  const int maxq = (1 << s.bits) - 1, gs = s.group_size > 0 ? s.group_size : cols;
  RefResult out{Eigen::MatrixXd(rows, cols), std::vector<int>(size_t(rows) * size_t(cols))};
  std::vector<double> scale(static_cast<size_t>(rows)), zero(static_cast<size_t>(rows));
  auto params = [&](int c0, int n) {
    for (int r = 0; r < rows; ++r) {
      double lo = std::min(0.0, Wp.row(r).segment(c0, n).minCoeff()), hi = std::max(0.0, Wp.row(r).segment(c0, n).maxCoeff());
      if (s.sym) { hi = std::max(-lo, hi); lo = -hi; }
      if (lo == 0 && hi == 0) { lo = -1; hi = 1; }
      scale[size_t(r)] = round_to(s.scale_dtype, float((hi - lo) / maxq));
      zero[size_t(r)] = s.sym ? (maxq + 1) / 2 : std::nearbyint(-lo / scale[size_t(r)]);
    }
  };
  if (s.group_size <= 0) params(0, cols);
  for (int i = 0; i < cols; ++i) {
    if (s.group_size > 0 && i % gs == 0) params(i, std::min(gs, cols - i));
    for (int r = 0; r < rows; ++r) {
      const double w = Wp(r, i);
      const int q = int(std::min<double>(std::max<double>(std::nearbyint(float(w) / float(scale[size_t(r)])) + zero[size_t(r)], 0), maxq));
      const double dq = scale[size_t(r)] * (q - zero[size_t(r)]);
      out.codes[size_t(r) * size_t(cols) + size_t(perm[size_t(i)])] = q;
      out.Q(r, perm[size_t(i)]) = dq;
      const double err = (w - dq) / U(i, i);
      for (int j = i; j < cols; ++j) Wp(r, j) -= err * U(i, j);
    }
  }
  return out;
}

void compare_with_reference(const QuantSpec& s, int rows, int cols, uint64_t seed) {
  Problem p = make_problem(rows, cols, 2048, seed);
  QuantizedLinear q = gptq_quantize(p.W, p.H, s);
  RefResult ref = reference_gptq(p.W, p.H, s);
  int64_t same = 0;
  const std::vector<uint8_t> qc = q.unpacked_codes();
  for (size_t i = 0; i < ref.codes.size(); ++i) same += qc[i] == ref.codes[i];
  const double share = double(same) / double(ref.codes.size());
  const double loss = output_error(p.W, q.dequantize(), p.H);
  const double ref_loss = output_error(p.W, ref.Q.cast<float>(), p.H);
  const double rtn_loss = output_error(p.W, rtn_quantize(p.W, s).dequantize(), p.H);
  INFO("bits " << s.bits << " group " << s.group_size << " sym " << s.sym << " act_order " << s.act_order << ": identical codes "
               << share << ", loss " << loss << " vs fp64 reference " << ref_loss << ", RTN " << rtn_loss);
  CHECK(share > 0.98);
  CHECK(std::abs(loss - ref_loss) <= 0.01 * ref_loss);
  CHECK(loss < rtn_loss);
}
}  // namespace

TEST_CASE("min-max grid on hand-computed values") {
  QuantSpec s;
  s.bits = 4;
  s.sym = false;
  const float x[3] = {-1.0f, 0.5f, 2.0f};
  GridParams g = find_grid(x, 3, 1, s);
  CHECK(g.scale == round_to(DType::F16, 0.2f));
  CHECK(g.zero == 5);
  CHECK(quantize_code(-1.0f, g, 15) == 0);
  CHECK(quantize_code(2.0f, g, 15) == 15);
  s.sym = true;
  g = find_grid(x, 3, 1, s);
  CHECK(g.scale == 0.2666015625f);   // 4/15 rounded to f16
  CHECK(g.zero == 8);
  CHECK(quantize_code(-1.0f, g, 15) == 4);
  CHECK(quantize_code(0.5f, g, 15) == 10);
  CHECK(quantize_code(2.0f, g, 15) == 15);   // 7.5 + 8 clamps to 15
  const float z[2] = {0.0f, 0.0f};
  CHECK(find_grid(z, 2, 1, s).scale == round_to(DType::F16, 2.0f / 15));   // all-zero rows use [-1, 1]
}

TEST_CASE("MSE clipping never does worse than min-max on its own criterion") {
  Rng r(11);
  std::vector<float> x(256);
  for (auto& v : x) v = float(r.normal());
  x[7] = 9.0f;   // an outlier that min-max spends the whole range on
  QuantSpec s;
  s.bits = 3;
  GridParams g0 = find_grid(x.data(), 256, 1, s);
  s.mse = true;
  GridParams g1 = find_grid(x.data(), 256, 1, s);
  auto err = [&](GridParams g) {
    double e = 0;
    for (float v : x) e += std::pow(std::abs(dequantize_code(quantize_code(v, g, 7), g) - v), 2.4);
    return e;
  };
  CHECK(g1.scale < g0.scale);
  CHECK(err(g1) < err(g0));
}

TEST_CASE("GPTQ matches the fp64 reference: 4-bit per channel, symmetric") {
  QuantSpec s;
  s.group_size = -1;
  compare_with_reference(s, 48, 256, 1);
}
TEST_CASE("GPTQ matches the fp64 reference: 4-bit g32 asymmetric (groups start inside blocks)") {
  QuantSpec s;
  s.group_size = 32;
  s.sym = false;
  compare_with_reference(s, 48, 256, 2);
}
TEST_CASE("GPTQ matches the fp64 reference: 3-bit g48 with block 64 (groups cross blocks)") {
  QuantSpec s;
  s.bits = 3;
  s.group_size = 48;
  s.block_size = 64;
  compare_with_reference(s, 40, 240, 3);
}
TEST_CASE("GPTQ matches the fp64 reference: 2-bit and 8-bit, act-order") {
  QuantSpec s;
  s.bits = 2;
  s.group_size = 64;
  s.act_order = true;
  compare_with_reference(s, 32, 256, 4);
  s.bits = 8;
  s.sym = false;
  compare_with_reference(s, 32, 256, 5);
}

TEST_CASE("the reversed-Cholesky inverse factor equals the reference's three steps") {
  Problem p = make_problem(4, 96, 512, 9);
  MatD H = p.H;
  H.diagonal().array() += 0.01 * H.diagonal().mean();
  // ptqkit's U is exercised through gptq_quantize; here we check the identity it relies on.
  Eigen::MatrixXd Href = H;
  Eigen::MatrixXd Uref = Eigen::LLT<Eigen::MatrixXd>(Href.inverse()).matrixU();
  Eigen::LLT<Eigen::MatrixXd> llt(Href.reverse());
  Eigen::MatrixXd Linv = Eigen::MatrixXd::Identity(96, 96);
  llt.matrixL().solveInPlace(Linv);
  Eigen::MatrixXd U = Linv.reverse();
  CHECK((U - Uref).cwiseAbs().maxCoeff() <= 1e-9 * Uref.cwiseAbs().maxCoeff());
}

TEST_CASE("static groups keep g_idx monotone under act-order and still beat RTN") {
  Problem p = make_problem(32, 256, 2048, 6);
  QuantSpec s;
  s.group_size = 32;
  s.act_order = true;
  s.static_groups = true;
  QuantizedLinear q = gptq_quantize(p.W, p.H, s);
  for (int64_t c = 0; c < q.cols; ++c) CHECK(q.g_idx[size_t(c)] == c / 32);
  CHECK(output_error(p.W, q.dequantize(), p.H) < output_error(p.W, rtn_quantize(p.W, s).dequantize(), p.H));
  s.static_groups = false;
  QuantizedLinear q2 = gptq_quantize(p.W, p.H, s);
  std::vector<int> count(8);
  for (auto g : q2.g_idx) count[size_t(g)]++;
  for (int c : count) CHECK(c == 32);   // a permutation: every group still has 32 columns
}

TEST_CASE("dead columns quantize to zero, a non-PD Hessian raises damping and says so") {
  Problem p = make_problem(16, 64, 512, 7, true);
  QuantSpec s;
  s.group_size = 16;
  SolveStats st;
  QuantizedLinear q = gptq_quantize(p.W, p.H, s, &st);
  CHECK(st.dead_columns == 1);
  MatF dq = q.dequantize();
  CHECK(dq.col(5).cwiseAbs().maxCoeff() == 0.0f);
  MatD bad = MatD::Zero(64, 64);
  bad.diagonal().setConstant(1.0);
  bad(0, 1) = bad(1, 0) = 5.0;   // indefinite
  SolveStats st2;
  gptq_quantize(p.W, bad, s, &st2);
  CHECK(st2.retries > 0);
  CHECK(st2.damp_percent > s.damp_percent);
  CHECK(st2.log.size() == size_t(st2.retries));
}

TEST_CASE("the Hessian's chunked fp32 accumulation matches an fp64 sum") {
  Problem p = make_problem(4, 64, 9000, 8);   // more than two chunks of 4096
  Eigen::MatrixXd X = p.X.cast<double>();
  Eigen::MatrixXd ref = 2.0 / 9000.0 * X.transpose() * X;
  CHECK((p.H - ref).cwiseAbs().maxCoeff() <= 1e-5 * ref.cwiseAbs().maxCoeff());
}

TEST_CASE("the Hessian's tiles: 300 columns (tiles of 128: two whole and a part each way), an fp64 sum's values, the same bytes on one thread and on two, and taken in place") {
  Rng r{41};
  MatF X(2500, 300);   // three chunks, the last partial
  for (int i = 0; i < X.size(); ++i) X.data()[i] = float(r.normal());
  const Eigen::MatrixXd Xd = X.cast<double>(), ref = 2.0 / 2500.0 * Xd.transpose() * Xd;
  const int threads = omp_get_max_threads();
  auto hessian = [&](int t) {
    omp_set_num_threads(t);
    Hessian h(300);
    h.add(X.topRows(1700));   // two calls: the chunks restart at each
    h.add(X.bottomRows(800));
    return h.finalize();
  };
  const MatD one = hessian(1), two = hessian(2);
  omp_set_num_threads(2);
  Hessian h(300);
  h.add(X.topRows(1700));
  h.add(X.bottomRows(800));
  const MatD taken = h.take_finalized();   // in place: finalize's bytes
  omp_set_num_threads(threads);
  CHECK(std::memcmp(one.data(), taken.data(), sizeof(double) * size_t(one.size())) == 0);
  CHECK(h.tokens() == 2500);
  CHECK_THROWS_WITH(h.add(X), Catch::Contains("taken"));
  CHECK((one - ref).cwiseAbs().maxCoeff() <= 1e-5 * ref.cwiseAbs().maxCoeff());
  CHECK(one == one.transpose());
  CHECK(std::memcmp(one.data(), two.data(), sizeof(double) * size_t(one.size())) == 0);
}

TEST_CASE("output error: the Gram forms give the fp64 definition's value (fp64 to 1e-12, fp32 to 1e-5), the same bytes on one thread and on two") {
  // 2,100 rows: two whole chunks of 1,024 and a part; 600 columns: tiles of 256, two whole and a part
  Problem p = make_problem(2100, 600, 900, 44);
  QuantSpec s;
  s.group_size = 32;
  const MatF Wr = rtn_quantize(p.W, s).dequantize(), Wq = gptq_quantize(p.W, p.H, s).dequantize();
  // independent of H: the definition's mean over the tokens of ||(W - Wq) x||^2, in fp64
  const Eigen::MatrixXd Y = (p.W - Wr).cast<double>() * p.X.cast<double>().transpose();
  const double by_tokens = Y.squaredNorm() / double(p.X.rows());
  const double def_rtn = output_error(p.W, Wr, p.H), def_gptq = output_error(p.W, Wq, p.H);
  const int threads = omp_get_max_threads();
  auto gram = [&](int t, auto scalar, const MatF& W2) {
    omp_set_num_threads(t);
    return output_error_gram<decltype(scalar)>(p.W, W2, p.H);
  };
  const double d1 = gram(1, 0.0, Wr), d2 = gram(2, 0.0, Wr), f1 = gram(1, 0.0f, Wr), f2 = gram(2, 0.0f, Wr);
  const double g1 = gram(1, 0.0, Wq), g2 = gram(2, 0.0, Wq);
  omp_set_num_threads(threads);
  INFO("RTN " << def_rtn << ", relative differences from the definition: by tokens " << (by_tokens - def_rtn) / def_rtn << ", Gram fp64 "
              << (d1 - def_rtn) / def_rtn << ", fp32 " << (f1 - def_rtn) / def_rtn << "; GPTQ " << def_gptq << ", Gram fp64 "
              << (g1 - def_gptq) / def_gptq);
  CHECK(std::abs(def_rtn - by_tokens) <= 1e-4 * by_tokens);   // H's fp32 chunk sums
  CHECK(std::abs(d1 - def_rtn) <= 1e-12 * def_rtn);
  CHECK(std::abs(g1 - def_gptq) <= 1e-12 * def_gptq);
  CHECK(std::abs(f1 - def_rtn) <= 1e-5 * def_rtn);
  CHECK(std::memcmp(&d1, &d2, 8) == 0);
  CHECK(std::memcmp(&f1, &f2, 8) == 0);
  CHECK(std::memcmp(&g1, &g2, 8) == 0);
}

TEST_CASE("output error: GPTQ's from its column loop gives the fp64 definition's value (per channel, groups, act-order, dead columns, K-quant grids)") {
  struct Case { const char* name; int bits, group; bool sym, act_order, static_groups, dead; GridForm form; };
  for (const Case& c : {Case{"4-bit per channel", 4, 0, true, false, false, false, GridForm::integer_zero},
                        Case{"4-bit g32 act-order, a dead column", 4, 32, false, true, false, true, GridForm::integer_zero},
                        Case{"3-bit g48 static groups", 3, 48, false, true, true, false, GridForm::integer_zero},
                        Case{"8-bit per channel", 8, 0, false, false, false, true, GridForm::integer_zero},
                        Case{"Q4_K, a dead column", 4, 32, false, true, true, true, GridForm::k_min}}) {
    INFO(c.name);
    const QuantSpec s{.bits = c.bits, .group_size = c.group, .sym = c.sym, .act_order = c.act_order, .static_groups = c.static_groups, .form = c.form};
    Problem p = make_problem(48, 256, 1024, 45, c.dead);
    SolveStats st;
    const MatF Wq = gptq_quantize(p.W, p.H, s, &st).dequantize();
    REQUIRE(std::isfinite(st.err2));
    const double lambda = st.damp_percent * p.H.diagonal().unaryExpr([](double v) { return v == 0 ? 1.0 : v; }).mean();
    CHECK(std::abs(st.lambda - lambda) <= 1e-14 * lambda);   // the damping added (dead diagonals set to 1), summed in the permuted order
    const double def = output_error(p.W, Wq, p.H);
    const auto [loss, same] = host_output_errors(p.W, Wq, nullptr, p.H, true, st);
    INFO("definition " << def << ", from the loop " << loss << " (relative difference " << (loss - def) / def << "; sum err^2 " << st.err2
                       << ", lambda " << st.lambda << ")");
    CHECK(std::abs(loss - def) <= 1e-5 * def);
    CHECK(same == loss);
  }
  // the rule: the damping term's share of sum err^2 at most 90%, else NaN (the exact form is taken)
  CHECK(damped_output_error(1.0, 1.0, 0.5) == 0.25);
  CHECK(std::isnan(damped_output_error(1.0, 1.0, 0.95)));
  Problem p = make_problem(16, 64, 512, 46);
  const MatF Wr = rtn_quantize(p.W, QuantSpec{}).dequantize();
  SolveStats none;   // no loop's sums (a GPU solve): the fp64 Gram form; RTN's by the fp32 one
  const auto [g, r] = host_output_errors(p.W, Wr, &Wr, p.H, true, none);
  CHECK(g == output_error_gram<double>(p.W, Wr, p.H));
  CHECK(r == output_error_gram<float>(p.W, Wr, p.H));
}

TEST_CASE("GPTQ's factor U of H^-1: U^T U equals an fp64 inverse, U is upper triangular, the same bytes on one thread and on two") {
  Rng r{43};
  const int n = 301;   // column blocks of 64: four whole and a part; odd, so the in-place reversal has a middle element
  Eigen::MatrixXd A(n, 2 * n);
  for (int i = 0; i < A.size(); ++i) A.data()[i] = r.normal();
  const MatD H = A * A.transpose() / double(2 * n) + 0.01 * Eigen::MatrixXd::Identity(n, n);
  const Eigen::MatrixXd Hinv = Eigen::MatrixXd(H).fullPivLu().inverse();
  const int threads = omp_get_max_threads();
  MatD U1, U2;
  omp_set_num_threads(1);
  REQUIRE(inverse_cholesky_upper(H, U1));
  omp_set_num_threads(2);
  REQUIRE(inverse_cholesky_upper(H, U2));
  omp_set_num_threads(threads);
  CHECK((U1.transpose() * U1 - Hinv).cwiseAbs().maxCoeff() <= 1e-10 * Hinv.cwiseAbs().maxCoeff());
  CHECK(U1.triangularView<Eigen::StrictlyLower>().toDenseMatrix().cwiseAbs().maxCoeff() == 0.0);
  CHECK(std::memcmp(U1.data(), U2.data(), sizeof(double) * size_t(U1.size())) == 0);
  MatD notpd = H;
  notpd(7, 7) = -1;
  MatD U3;
  CHECK_FALSE(inverse_cholesky_upper(notpd, U3));
}

TEST_CASE("row_slice keeps each row's codes, grids and groups (what a stacked q/k/v solve is split by)") {
  Rng r{77};
  MatF W(10, 40);
  for (int i = 0; i < W.size(); ++i) W.data()[i] = float(r.normal());
  QuantSpec s;
  s.group_size = 16;   // 3 groups, the last ragged
  s.sym = false;
  const QuantizedLinear q = rtn_quantize(W, s), part = q.row_slice(3, 7);
  REQUIRE(part.rows == 4);
  REQUIRE(part.groups == 3);
  CHECK(part.dequantize() == q.dequantize().middleRows(3, 4));
  // the slice is the RTN of those rows alone: RTN is per row, so the codes and grids must agree
  const QuantizedLinear alone = rtn_quantize(MatF(W.middleRows(3, 4)), s);
  CHECK(part.packed == alone.packed);   // rows are separate bitstreams: a row slice is a slice of the words
  CHECK(part.scales == alone.scales);
  CHECK(part.zeros == alone.zeros);
  CHECK(part.g_idx == alone.g_idx);
}

TEST_CASE("layer store: codes are written bit-packed (P.qcodes), each row the documented bitstream, and read back exactly") {
  ptqtest::TempDir d;
  QuantStore store(d / "layers");
  std::vector<QuantizedLinear> mods;
  for (int bits : {3, 4}) {
    QuantSpec s;
    s.bits = bits;
    s.group_size = 32;
    QuantizedLinear q = QuantizedLinear::empty(5, 70, s);   // 70 columns: 3-bit rows end mid-word
    q.name = "model.layers.2.mlp.up_proj" + std::to_string(bits);
    Rng r{uint64_t(bits)};
    std::vector<uint8_t> codes(size_t(q.rows * q.cols));
    for (auto& c : codes) c = uint8_t(int(r.uniform() * (1 << bits)) & ((1 << bits) - 1));
    q.set_codes(codes.data());
    for (auto& x : q.scales) x = float(r.uniform());
    mods.push_back(q);
  }
  // the 4-bit module's words against the stream by hand: value k of a row at bits [4k, 4k + 4)
  const std::vector<uint8_t> codes1 = mods[1].unpacked_codes();
  QuantizedLinear packed = mods[1];
  packed.name += "p";
  packed.packed.assign(size_t(packed.rows * packed_words(packed.cols, 4)), 0);
  for (int64_t r = 0; r < packed.rows; ++r)
    for (int64_t c = 0; c < packed.cols; ++c)
      packed.packed[size_t(r * packed_words(packed.cols, 4) + c / 8)] |= uint32_t(codes1[size_t(r * packed.cols + c)]) << (4 * (c % 8));
  CHECK(packed.packed == mods[1].packed);
  CHECK(packed.dequantize() == mods[1].dequantize());
  mods.push_back(packed);
  store.save_layer(2, mods);
  SafetensorsFile f(store.layer_file(2));
  CHECK(f.get(mods[0].name + ".qcodes").shape == Shape{5, packed_words(70, 3)});   // 210 bits: 7 words
  CHECK(f.get(mods[0].name + ".qcodes").shape[1] == 7);
  CHECK(!f.has(mods[0].name + ".codes"));
  for (auto& m : mods) {
    const QuantizedLinear* q = store.get(m.name);
    REQUIRE(q);
    CHECK(q->rows == 5);
    CHECK(q->cols == 70);
    CHECK(q->packed == m.packed);
    CHECK(q->scales == m.scales);
    QuantStore::Info info;
    REQUIRE(store.info(m.name, &info));
    CHECK(info.rows == 5);
    CHECK(info.cols == 70);
    CHECK(info.groups == 3);
  }
  // A damaged layer file: metadata that is not the spec JSON ptqkit writes is an Error naming the
  // file and the entry (a missing key, a wrong type, not JSON at all).
  const std::string m3 = "model.layers.3.mlp.up_proj";
  for (const char* meta : {R"({"bits": 4})", R"({"method": "gptq", "bits": "4"})", "not json"}) {
    write_safetensors(store.layer_file(3), std::vector<NamedTensor>{}, {{"format", "pt"}, {m3, meta}});
    QuantStore::Info bad;
    CHECK_THROWS_WITH(store.info(m3, &bad), Catch::Contains("layer-00003.safetensors: __metadata__." + m3 + ": unexpected JSON"));
    CHECK_THROWS_WITH(store.get(m3), Catch::Contains("__metadata__." + m3 + ": unexpected JSON"));
  }
  // Damaged tensors: the layer-2 file's 4-bit module copied into layer 4 with one thing wrong each
  // (scales of rank 1, zeros of another shape, a g_idx naming a group past the last, a code width
  // the codes cannot have): an Error naming the file and the tensor, never a misread.
  const std::string src = mods[1].name, m4 = "model.layers.4.mlp.up_proj";
  auto copy_of = [&](const std::string& suffix) {
    const TensorView v = f.get(src + suffix);
    Tensor t(v.dtype, v.shape);
    std::memcpy(t.bytes.data(), v.data, v.nbytes);
    return t;
  };
  auto write4 = [&](const std::function<void(std::map<std::string, Tensor>&, std::string&)>& damage) {
    std::map<std::string, Tensor> ts;
    for (const char* sfx : {".qcodes", ".scales", ".zeros", ".g_idx"}) ts.emplace(sfx, copy_of(sfx));
    std::string meta = f.metadata().at(src);
    damage(ts, meta);
    std::vector<NamedTensor> named;
    for (auto& [sfx, t] : ts) named.push_back({m4 + sfx, t});
    write_safetensors(store.layer_file(4), named, {{"format", "pt"}, {m4, meta}});
  };
  write4([](auto&, std::string&) {});
  REQUIRE(store.get(m4));
  CHECK(store.get(m4)->packed == mods[1].packed);   // the copy as such reads back
  struct Damage {
    std::function<void(std::map<std::string, Tensor>&, std::string&)> apply;
    std::string message;
  };
  const Damage damages[] = {
      {[](auto& ts, std::string&) { ts.at(".scales").shape = {15}; }, m4 + ".scales: expected F32 of rank 2, got F32 [15]"},
      {[](auto& ts, std::string&) { ts.at(".zeros").shape = {5, 3}; }, m4 + ".zeros: expected I32 [3, 5], got I32 [5, 3]"},
      {[](auto& ts, std::string&) { reinterpret_cast<int32_t*>(ts.at(".g_idx").bytes.data())[69] = 7; }, m4 + ".g_idx: column 69 names group 7 of 3"},
      {[](auto&, std::string& meta) { meta.replace(meta.find("\"bits\":4"), 8, "\"bits\":12"); }, "__metadata__." + m4 + ".bits: must be 1..8, got 12"},
      {[&](auto& ts, std::string&) {   // an earlier version's byte per code, one of them 16 at 4 bits
         ts.erase(".qcodes");
         Tensor c(DType::U8, {5 * 70});
         std::memcpy(c.bytes.data(), codes1.data(), c.bytes.size());
         c.bytes[123] = 16;
         ts.emplace(".codes", c);
       },
       m4 + ".codes: a code of 16 does not fit 4 bits"},
  };
  for (const Damage& dmg : damages) {
    REQUIRE(store.get(mods[0].name));   // another layer in the cache: layer 4 is read again
    write4(dmg.apply);
    INFO(dmg.message);
    CHECK_THROWS_WITH(store.get(m4), Catch::Contains("layer-00004.safetensors: " + dmg.message));
  }
}

// llama.cpp's grids (quant/quantizer.h's GridForm), on hand-computed values: Q4_1's f16 min and
// scale, which need not include 0; the K-quants' sub-blocks rounded to integer multiples of the
// super-block's f16 d (and dmin); Q6_K's signed scale that puts the largest magnitude on code 0.
TEST_CASE("llama.cpp's grids: Q4_1's f16 min, the K-quants' super-blocks, Q6_K's signed scale") {
  QuantSpec s;
  s.bits = 4;
  s.sym = false;
  s.form = GridForm::f16_min;
  const float x[3] = {-1.0f, 0.5f, 2.0f};
  GridParams g = find_grid(x, 3, 1, s);
  CHECK(g.with_min);
  CHECK(g.min == -1.0f);
  CHECK(g.scale == round_to(DType::F16, 0.2f));
  CHECK(quantize_code(-1.0f, g, 15) == 0);
  CHECK(quantize_code(2.0f, g, 15) == 15);
  CHECK(dequantize_code(10, g) == g.scale * 10.0f - 1.0f);
  const float pos[2] = {0.3f, 0.9f};   // all positive: the min is the data's, not 0
  g = find_grid(pos, 2, 1, s);
  CHECK(g.min == round_to(DType::F16, 0.3f));
  CHECK(g.scale == round_to(DType::F16, (0.9f - round_to(DType::F16, 0.3f)) / 15.0f));

  // Q4_K: eight sub-blocks, scales 0.01 (j + 1) and mins -0.02 j: d = f16(0.08 / 63), each scale
  // the nearest multiple d sc (sc <= 63), each min -(dmin mc)
  s.form = GridForm::k_min;
  std::vector<GridParams> sb(8);
  for (int j = 0; j < 8; ++j) sb[size_t(j)] = {0.01f * float(j + 1), 0, -0.02f * float(j), true};
  const auto [d, dmin] = round_super_block(sb.data(), s);
  CHECK(d == round_to(DType::F16, 0.08f / 63.0f));
  CHECK(dmin == round_to(DType::F16, 0.14f / 63.0f));
  for (int j = 0; j < 8; ++j) {
    const double sc = std::nearbyint(0.01 * (j + 1) / d), mc = std::nearbyint(0.02 * j / dmin);
    CHECK(sc <= 63);
    CHECK(sb[size_t(j)].scale == d * float(sc));
    CHECK(sb[size_t(j)].min == -(dmin * float(mc)));
    CHECK(std::abs(sb[size_t(j)].scale - 0.01 * (j + 1)) <= 0.5 * d);
  }
  // Q6_K: the value of largest magnitude (-3) on code 0: scale -(-3) / 32, zero 32
  s.bits = 6;
  s.sym = true;
  s.group_size = 16;
  s.form = GridForm::k_sym;
  const float y[3] = {-3.0f, 1.0f, 2.0f};
  g = find_grid(y, 3, 1, s);
  CHECK(g.scale == 3.0f / 32.0f);
  CHECK(g.zero == 32);
  CHECK(quantize_code(-3.0f, g, 63) == 0);
  CHECK(quantize_code(2.0f, g, 63) == 53);   // 2 / (3/32) = 21.3
  std::vector<GridParams> sb6(16);
  for (int j = 0; j < 16; ++j) sb6[size_t(j)] = {(j % 2 ? -0.001f : 0.001f) * float(j + 1), 32};
  const float d6 = round_super_block(sb6.data(), s).first;
  CHECK(d6 == round_to(DType::F16, 0.016f / 127.0f));
  for (int j = 0; j < 16; ++j) {
    const double sc = std::nearbyint((j % 2 ? -0.001 : 0.001) * (j + 1) / d6);
    CHECK(sb6[size_t(j)].scale == d6 * float(sc));
    CHECK(std::abs(sc) <= 127);
  }
}

// GPTQ on the K-quants' and Q4_1's grids: every group's parameters are the block's representation
// exactly, the codes decode by the block's formula, and the solve beats round-to-nearest on the
// same grids.
TEST_CASE("GPTQ on llama.cpp's grids keeps every parameter representable and beats RTN") {
  struct Case { const char* name; int bits, group; bool sym; GridForm form; };
  for (const Case& c : {Case{"Q4_1", 4, 32, false, GridForm::f16_min}, Case{"Q4_K", 4, 32, false, GridForm::k_min},
                        Case{"Q5_K", 5, 32, false, GridForm::k_min}, Case{"Q6_K", 6, 16, true, GridForm::k_sym}}) {
    INFO(c.name);
    QuantSpec s;
    s.bits = c.bits;
    s.group_size = c.group;
    s.sym = c.sym;
    s.form = c.form;
    s.act_order = true;
    s.static_groups = true;
    Problem p = make_problem(24, 512, 2048, 5);
    const QuantizedLinear q = gptq_quantize(p.W, p.H, s);
    const int per = groups_per_super(c.form);
    REQUIRE(q.mins.size() == (has_min(c.form) ? q.scales.size() : 0));
    for (int64_t r = 0; r < q.rows; ++r)
      for (int64_t g = 0; g < q.groups; ++g) {
        const size_t k = size_t(g * q.rows + r);
        if (per) {
          const float d = q.super_d[size_t(g / per * q.rows + r)];
          CHECK(d == round_to(DType::F16, d));
          const double sc = std::nearbyint(q.scales[k] / d);
          CHECK(q.scales[k] == d * float(sc));
          CHECK(sc >= (c.form == GridForm::k_sym ? -128 : 0));
          CHECK(sc <= (c.form == GridForm::k_sym ? 127 : 63));
          if (c.form == GridForm::k_min) {
            const float dmin = q.super_dmin[size_t(g / per * q.rows + r)];
            const double mc = std::nearbyint(-q.mins[k] / dmin);
            CHECK(dmin == round_to(DType::F16, dmin));
            CHECK(q.mins[k] == -(dmin * float(mc)));
            CHECK(mc <= 63);
          }
        } else {
          CHECK(q.scales[k] == round_to(DType::F16, q.scales[k]));
          CHECK(q.mins[k] == round_to(DType::F16, q.mins[k]));
        }
      }
    const MatF Wq = q.dequantize();
    for (int64_t col : {int64_t(0), int64_t(200), int64_t(511)}) {
      const GridParams gp = q.grid(col / c.group, 3);
      const double v = has_min(c.form) ? double(gp.scale) * q.code(3, col) + gp.min : double(gp.scale) * (int(q.code(3, col)) - gp.zero);
      CHECK(std::abs(Wq(3, col) - v) <= 1e-6 * (std::abs(v) + std::abs(gp.min)));
    }
    const double loss = output_error(p.W, Wq, p.H), rtn = output_error(p.W, rtn_quantize(p.W, s).dequantize(), p.H);
    INFO("loss " << loss << ", RTN " << rtn);
    CHECK(loss < rtn);
  }
}
