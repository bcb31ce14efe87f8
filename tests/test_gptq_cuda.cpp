// GPU Hessians, the GPU solve and its losses (lib/gptq/*_cuda.cu) against their CPU references:
// an fp64 accumulation, lib/gptq on fresh random problems (identical-code share, loss), fp64 losses.
#include <cmath>
#include <cstring>
#include <numeric>
#include <map>

#include "core/bits.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/attention_cuda.h"
#include "model/forward_cuda.h"
#include "gptq/clip_cuda.h"
#include "gptq/gptq_cuda.h"
#include "cuda/random.h"
#include "kernels/act_quant.h"
#include "kernels/reference.h"
#include "kernels/nf4.h"
#include "kernels/w4a16.h"
#include "kernels/w8a8.h"
#include "cuda/runtime.h"
#include "model/corpus.h"
#include "eval/perplexity.h"
#include "eval/nll_cuda.h"
#include "eval/perplexity_cuda.h"
#include "formats/gguf.h"
#include "formats/open.h"
#include "model/synth.h"
#include "pipeline/pipeline.h"
#include "testing.h"
#include "testing_cuda.h"
#include "testing_gptq.h"

using namespace ptq;
using nlohmann::json;

namespace {
using ptqtest::Problem;
Problem problem(int rows, int cols, int tokens, uint64_t seed) {
  ptqtest::ProblemShape sh;
  sh.outlier_every = 29;
  sh.outlier_at = 5;
  sh.outlier_scale = 10.0;
  sh.f16_inputs = true;   // 16-bit activations
  return ptqtest::correlated_problem(rows, cols, tokens, seed, sh);
}
}  // namespace

TEST_CASE("gpu: the tensor-core Hessian matches an fp64 accumulation (1e-5 relative)") {
  PTQ_REQUIRE_GPU();
  Problem p = problem(8, 384, 10000, 1);
  cuda::HessianCuda h(384, DType::F16);
  h.add(p.X);
  MatD got = h.finalize();
  Eigen::MatrixXd X = p.X.cast<double>();
  Eigen::MatrixXd ref = 2.0 / 10000.0 * X.transpose() * X;
  const double err = (got - ref).norm() / ref.norm();
  std::cout << "Hessian relative error (Frobenius) " << err << "; max element error " << (got - ref).cwiseAbs().maxCoeff() / ref.cwiseAbs().maxCoeff() << "\n";
  CHECK(err <= 1e-5);
}

TEST_CASE("gpu: the GPTQ solve reproduces the CPU solve (codes, loss) across specs") {
  PTQ_REQUIRE_GPU();
  struct Case { int bits, group; bool sym, act_order, static_groups, mse; };
  const Case cases[] = {{4, -1, true, false, false, false}, {4, 32, false, false, false, false}, {4, 128, true, true, true, false},
                        {4, 64, true, true, false, false},  {3, 128, false, true, false, true},  {8, 128, true, false, false, false},
                        {2, 32, false, true, true, false}};
  int k = 0;
  for (const Case& c : cases) {
    Problem p = problem(192, 640, 4096, uint64_t(10 + k++));
    QuantSpec s;
    s.bits = c.bits;
    s.group_size = c.group;
    s.sym = c.sym;
    s.act_order = c.act_order;
    s.static_groups = c.static_groups;
    s.mse = c.mse;
    REQUIRE(cuda::gptq_supported(s, nullptr));
    QuantizedLinear cpu = gptq_quantize(p.W, p.H, s), gpu = ptqtest::gpu_gptq(p.W, p.H, s);
    int64_t same = 0;
    const std::vector<uint8_t> cc = cpu.unpacked_codes(), gc = gpu.unpacked_codes();
    for (size_t i = 0; i < cc.size(); ++i) same += cc[i] == gc[i];
    const double share = double(same) / double(cc.size());
    const double lc = output_error(p.W, cpu.dequantize(), p.H), lg = output_error(p.W, gpu.dequantize(), p.H);
    std::cout << c.bits << "-bit group " << c.group << " sym " << c.sym << " act_order " << c.act_order << " static " << c.static_groups << " mse " << c.mse
              << ": identical codes " << 100 * share << "%, loss GPU " << lg << " CPU " << lc << "\n";
    CHECK(share >= 0.99);
    CHECK(std::abs(lg - lc) <= 0.01 * lc);
    CHECK(gpu.g_idx == cpu.g_idx);
  }
}

TEST_CASE("gpu: GPTQ on llama.cpp's grids (Q4_1, Q5_1, Q4_K, Q5_K, Q6_K): the host's static grids, the CPU solve's codes and loss, Wq and RTN") {
  // Their grids are formed on the host (static_grids: each super-block's groups rounded together)
  // from the weights the solve reads, so they must be gptq_quantize's to the bit; the column loop is
  // the CPU's in fp32 (the first case's bounds); Wq and RTN's Wr are the host's dequantization of the
  // codes and rtn_quantize's. A dead column makes RTN's grids (the weights as given) differ from the
  // solve's (that column zeroed).
  PTQ_REQUIRE_GPU();
  Problem p = problem(160, 512, 4096, 23);   // 512 columns: two K super-blocks of 256
  p.H.row(9).setZero();
  p.H.col(9).setZero();
  cuda::DeviceBuffer<double> dH(size_t(p.H.size()), "test Hessian");
  cuda::copy_to_device(dH.get(), p.H.data(), size_t(p.H.size()) * 8);
  for (const char* type : {"Q4_1", "Q5_1", "Q4_K", "Q5_K", "Q6_K"}) {
    INFO(type);
    QuantSpec s;
    s.act_order = true;
    s.static_groups = true;
    REQUIRE(apply_gguf_type(type, s).empty());
    std::string why;
    REQUIRE(cuda::gptq_supported(s, &why));
    SolveStats st;
    const QuantizedLinear cpu = gptq_quantize(p.W, p.H, s), gpu = ptqtest::gpu_gptq(p.W, p.H, s, &st);
    CHECK(st.dead_columns == 1);
    CHECK(gpu.scales == cpu.scales);
    CHECK(gpu.zeros == cpu.zeros);
    CHECK(gpu.mins == cpu.mins);
    CHECK(gpu.super_d == cpu.super_d);
    CHECK(gpu.super_dmin == cpu.super_dmin);
    CHECK(gpu.g_idx == cpu.g_idx);
    int64_t same = 0;
    const std::vector<uint8_t> cc = cpu.unpacked_codes(), gc = gpu.unpacked_codes();
    for (size_t i = 0; i < cc.size(); ++i) same += cc[i] == gc[i];
    const double share = double(same) / double(cc.size());
    const double lc = output_error(p.W, cpu.dequantize(), p.H), lg = output_error(p.W, gpu.dequantize(), p.H),
                 lr = output_error(p.W, rtn_quantize(p.W, s).dequantize(), p.H);
    std::cout << type << ": identical codes " << 100 * share << "%, loss GPU " << lg << " CPU " << lc << " (RTN " << lr << ")\n";
    CHECK(share >= 0.99);
    CHECK(std::abs(lg - lc) <= 0.01 * lc);
    CHECK(lg < lr);
    // the resident form: Wq the codes' weights, RTN's from the weights as given
    cuda::WeightRows rows;
    rows.rows = p.W.rows();
    rows.host = &p.W;
    const cuda::ResidentSolve rs = cuda::gptq_solve_cuda({rows}, p.W.cols(), HessianRef{dH.get(), 1.0}, s, cuda::SolveKeep::weights_and_rtn);
    MatF Wq(p.W.rows(), p.W.cols()), Wr(p.W.rows(), p.W.cols());
    cuda::copy_to_host(Wq.data(), rs.Wq.get(), size_t(Wq.size()) * 4);
    cuda::copy_to_host(Wr.data(), rs.Wr.get(), size_t(Wr.size()) * 4);
    const MatF want_q = rs.parts[0].dequantize(), want_r = rtn_quantize(p.W, s).dequantize();
    CHECK((Wq - want_q).cwiseAbs().maxCoeff() <= 1e-6f * want_q.cwiseAbs().maxCoeff());
    CHECK((Wr - want_r).cwiseAbs().maxCoeff() <= 1e-6f * want_r.cwiseAbs().maxCoeff());
  }
}

TEST_CASE("the GPU's spec checks: which grids the device solve and RTN take, the rest left to the host (no GPU needed)") {
  // GPTQ: GPTQ's integer grid (groups dividing 128, static groups up to 128, one a row) and
  // llama.cpp's grids with static groups; RTN: the integer grid in groups of up to 128 or one a row.
  std::string why;
  for (const char* type : {"Q4_0", "Q5_0", "Q8_0", "Q4_1", "Q5_1", "Q4_K", "Q5_K", "Q6_K"}) {
    INFO(type);
    QuantSpec s;
    s.act_order = true;   // every GGUF scheme's: act-order takes static groups
    REQUIRE(apply_gguf_type(type, s).empty());
    CHECK(cuda::gptq_supported(s, &why));
    s.method = "rtn";
    CHECK(cuda::rtn_supported(s));
  }
  QuantSpec dynamic;   // Q4_1's grid without static groups: formed during the solve, on the CPU only
  dynamic.form = GridForm::f16_min;
  dynamic.group_size = 32;
  dynamic.sym = false;
  CHECK_FALSE(cuda::gptq_supported(dynamic, &why));
  CHECK(why.find("static groups") != std::string::npos);
  QuantSpec odd;
  odd.group_size = 48;
  CHECK_FALSE(cuda::gptq_supported(odd, nullptr));
  odd.static_groups = true;
  CHECK(cuda::gptq_supported(odd, nullptr));
  QuantSpec k4;   // llama.cpp's grids with the MSE search: formed by the host, rounded on the device
  k4.method = "rtn";
  k4.form = GridForm::k_min;
  k4.group_size = 32;
  k4.mse = true;
  CHECK(cuda::rtn_supported(k4));
  QuantSpec wide;
  wide.method = "rtn";
  wide.group_size = 256;
  CHECK_FALSE(cuda::rtn_supported(wide));
  CHECK_FALSE(cuda::gptq_supported(wide, nullptr));   // dynamic groups must divide the 128-column block
  QuantSpec row;
  row.method = "rtn";
  row.group_size = -1;
  CHECK(cuda::rtn_supported(row));
  row.output_clip = true;   // AWQ's clipping limits are per group
  CHECK_FALSE(cuda::rtn_supported(row));
}

TEST_CASE("gpu: one resident solve of stacked q/k/v equals the CPU solve of each, with Wq, RTN and the loss on the device") {
  PTQ_REQUIRE_GPU();
  const int64_t cols = 384, parts_rows[3] = {96, 64, 64};
  Problem p = problem(224, int(cols), 4096, 40);
  p.X.col(7).setZero();   // a dead column: RTN's grids see its weights, GPTQ zeroes them
  for (int i = 0; i < p.W.size(); ++i) p.W.data()[i] = round_to(DType::F16, p.W.data()[i]);   // the model's f16 weights
  cuda::HessianCuda hc(cols, DType::F16);
  hc.add(p.X);
  const HessianRef dsum = hc.device();
  const MatD H = hc.finalize();
  QuantSpec s;
  s.act_order = true;
  s.static_groups = true;
  // part 0 from f16 device memory (as the GPU forward holds it), parts 1-2 from the host
  std::vector<MatF> W(3);
  for (int k = 0, r0 = 0; k < 3; r0 += int(parts_rows[k]), ++k) W[size_t(k)] = p.W.middleRows(r0, parts_rows[k]);
  std::vector<uint16_t> w16(size_t(W[0].size()));
  for (size_t i = 0; i < w16.size(); ++i) w16[i] = f32_to_f16_bits(W[0].data()[i]);
  cuda::DeviceBuffer<uint16_t> d16(w16.size(), "test f16 weights");
  cuda::copy_to_device(d16.get(), w16.data(), w16.size() * 2);
  std::vector<cuda::WeightRows> parts(3);
  parts[0] = {parts_rows[0], nullptr, d16.get(), DType::F16};
  for (int k = 1; k < 3; ++k) parts[size_t(k)] = {parts_rows[k], &W[size_t(k)], nullptr, DType::F32};
  SolveStats st;
  cuda::ResidentSolve rs = cuda::gptq_solve_cuda(parts, cols, dsum, s, cuda::SolveKeep::weights_and_rtn, &st);
  CHECK(st.dead_columns == 1);
  for (int k = 0, r0 = 0; k < 3; r0 += int(parts_rows[k]), ++k) {
    const MatF& Wk = W[size_t(k)];
    const int64_t n = Wk.size();
    const QuantizedLinear &gq = rs.parts[size_t(k)], cq = gptq_quantize(Wk, H, s);
    // the codes come packed on the device; unpacked here by the host's core/bits.h
    REQUIRE(int64_t(gq.packed.size()) == Wk.rows() * packed_words(cols, s.bits));
    std::vector<uint8_t> gcodes(static_cast<size_t>(n));
    unpack_rows(gq.packed.data(), Wk.rows(), cols, s.bits, gcodes.data());
    const std::vector<uint8_t> ccodes = cq.unpacked_codes();
    int64_t same = 0;
    for (size_t i = 0; i < ccodes.size(); ++i) same += ccodes[i] == gcodes[i];
    const MatF Wq = gq.dequantize(), Wr = rtn_quantize(Wk, s).dequantize();
    MatF dev_Wq(Wk.rows(), cols), dev_Wr(Wk.rows(), cols), dev_W(Wk.rows(), cols);
    cuda::copy_to_host(dev_Wq.data(), rs.Wq.get() + r0 * cols, size_t(n) * 4);
    cuda::copy_to_host(dev_Wr.data(), rs.Wr.get() + r0 * cols, size_t(n) * 4);
    cuda::copy_to_host(dev_W.data(), rs.W.get() + r0 * cols, size_t(n) * 4);
    const auto [loss, rtn_loss] = cuda::output_errors(rs.W.get() + r0 * cols, rs.Wq.get() + r0 * cols, rs.Wr.get() + r0 * cols, Wk.rows(), cols, dsum);
    const double ref_loss = output_error(Wk, Wq, H), ref_rtn = output_error(Wk, Wr, H), cpu_loss = output_error(Wk, cq.dequantize(), H);
    std::cout << "part " << k << ": identical codes with the CPU's separate solve " << 100.0 * double(same) / double(ccodes.size())
              << "%, loss " << loss << " (fp64 CPU of the same Wq " << ref_loss << ", CPU solve " << cpu_loss << "), RTN " << rtn_loss << " (CPU "
              << ref_rtn << ")\n";
    CHECK(double(same) / double(ccodes.size()) >= 0.99);
    CHECK(dev_W == Wk);              // 16-bit rows widened exactly
    CHECK(dev_Wq == Wq);             // the device's dequantized weights are the codes' (host dequantize)
    CHECK(dev_Wr == Wr);             // RTN on the device equals lib/gptq's rtn_quantize
    CHECK(std::abs(loss - ref_loss) <= 1e-9 * ref_loss);
    CHECK(std::abs(rtn_loss - ref_rtn) <= 1e-9 * ref_rtn);
    CHECK(std::abs(loss - cpu_loss) <= 0.01 * cpu_loss);
    CHECK(loss < rtn_loss);
    // GPTQ's loss from its own column loop (|err|^2 - lambda |e|^2) / 2 against the fp64 form
    const double damped = rs.damped.loss(r0, r0 + parts_rows[k]);
    std::cout << "  loss from the column loop " << damped << " (relative to the fp64 form " << (damped - ref_loss) / ref_loss << ")\n";
    CHECK(std::abs(damped - ref_loss) <= 1e-4 * ref_loss);
    // RTN's loss on TF32 tensor cores (the report's baseline)
    const double rtn_tf32 = cuda::output_error_tf32(rs.W.get() + r0 * cols, rs.Wr.get() + r0 * cols, Wk.rows(), cols, dsum);
    std::cout << "  RTN loss on TF32 " << rtn_tf32 << " (relative to the fp64 form " << (rtn_tf32 - ref_rtn) / ref_rtn << ")\n";
    CHECK(std::abs(rtn_tf32 - ref_rtn) <= 1e-3 * ref_rtn);
  }
}

TEST_CASE("gpu: a batch of solves, each with its own Hessian (an MoE layer's expert downs), equals the CPU solve of each") {
  PTQ_REQUIRE_GPU();
  // 6 problems of 80 rows (not a multiple of the kernel's 16 rows per CTA) x 384 columns: problem 2
  // has a dead column, problem 4 a Hessian that is not positive definite (damping retries).
  const int E = 6;
  const int64_t rows = 80, cols = 384;
  std::vector<Problem> ps;
  for (int e = 0; e < E; ++e) ps.push_back(problem(int(rows), int(cols), 4096, uint64_t(60 + e)));
  ps[2].H.row(11).setZero();
  ps[2].H.col(11).setZero();
  ps[4].H = MatD::Identity(cols, cols);
  ps[4].H(0, 1) = ps[4].H(1, 0) = 5.0;
  std::vector<cuda::DeviceBuffer<double>> dH;
  std::vector<cuda::SolveProblem> sp;
  for (int e = 0; e < E; ++e) {
    dH.emplace_back(size_t(cols * cols), "test Hessian");
    cuda::copy_to_device(dH.back().get(), ps[size_t(e)].H.data(), size_t(cols * cols) * 8);
    sp.push_back({{cuda::WeightRows{rows, &ps[size_t(e)].W, nullptr, DType::F32}}, HessianRef{dH.back().get(), 1.0}});
  }
  QuantSpec act_static, act_dynamic;
  act_static.act_order = act_static.static_groups = true;
  act_dynamic.act_order = true;
  act_dynamic.group_size = 64;
  for (const QuantSpec& s : {act_static, act_dynamic}) {
    std::vector<SolveStats> st;
    cuda::ResidentSolve rs = cuda::gptq_solve_cuda(sp, cols, s, cuda::SolveKeep::weights_and_rtn, &st);
    REQUIRE(rs.parts.size() == size_t(E));
    REQUIRE(st.size() == size_t(E));
    CHECK(st[2].dead_columns == 1);
    CHECK(st[4].retries > 0);
    CHECK(st[0].retries == 0);
    for (int e = 0; e < E; ++e) {
      const Problem& p = ps[size_t(e)];
      SolveStats cst;
      const QuantizedLinear& gq = rs.parts[size_t(e)];
      const QuantizedLinear cq = gptq_quantize(p.W, p.H, s, &cst);
      const std::vector<uint8_t> gc = gq.unpacked_codes(), cc = cq.unpacked_codes();
      int64_t same = 0;
      for (size_t i = 0; i < cc.size(); ++i) same += cc[i] == gc[i];
      const double share = double(same) / double(cc.size());
      const MatF Wq = gq.dequantize();
      MatF dev_Wq(rows, cols);
      cuda::copy_to_host(dev_Wq.data(), rs.Wq.get() + e * rows * cols, size_t(rows * cols) * 4);
      const double lg = output_error(p.W, Wq, p.H), lc = output_error(p.W, cq.dequantize(), p.H);
      const double damped = rs.damped.loss(e * rows, (e + 1) * rows);
      std::cout << "group " << s.group_size << " problem " << e << ": identical codes with the CPU's solve " << 100 * share << "%, loss " << lg
                << " (CPU " << lc << "), from the column loop " << damped << ", damping " << st[size_t(e)].damp_percent << " (CPU "
                << cst.damp_percent << ")\n";
      CHECK(share >= 0.99);
      CHECK(gq.g_idx == cq.g_idx);   // each problem's own act-order
      CHECK(dev_Wq == Wq);
      CHECK(st[size_t(e)].damp_percent == cst.damp_percent);
      if (e == 4) continue;   // (an indefinite H: its "loss" is no error measure)
      CHECK(std::abs(lg - lc) <= 0.01 * lc);
      REQUIRE_FALSE(std::isnan(damped));
      CHECK(std::abs(damped - lg) <= 1e-4 * lg);
    }
  }
}

TEST_CASE("gpu: codes packed on the device equal the host's bitstream packing (2, 3, 4, 8 bits, odd widths)") {
  PTQ_REQUIRE_GPU();
  for (int bits : {2, 3, 4, 8})
    for (int64_t cols : {int64_t(1), int64_t(31), int64_t(1001), int64_t(4096)}) {
      const int64_t rows = 37, nw = packed_words(cols, bits);
      std::vector<uint8_t> codes(size_t(rows * cols));
      Rng r{uint64_t(bits * 7919 + cols)};
      for (auto& c : codes) c = uint8_t(int(r.uniform() * (1 << bits)) & ((1 << bits) - 1));
      std::vector<uint32_t> host(size_t(rows * nw)), dev(size_t(rows * nw));
      pack_rows(codes.data(), rows, cols, bits, host.data());
      cuda::DeviceBuffer<uint8_t> dc(codes.size(), "test codes");
      cuda::DeviceBuffer<uint32_t> dw(dev.size(), "test words");
      cuda::copy_to_device(dc.get(), codes.data(), codes.size());
      cuda::pack_rows_device(dc.get(), rows, cols, bits, dw.get());
      cuda::copy_to_host(dev.data(), dw.get(), dev.size() * 4);
      INFO("bits " << bits << ", cols " << cols);
      CHECK(dev == host);
      // and the stream reads back: value k of row r at bits [k*bits, (k+1)*bits)
      CHECK(unpack_bit(dev.data() + (rows - 1) * nw, cols - 1, bits) == codes.back());
    }
}

TEST_CASE("gpu: AWQ's clipping search on the device's Hessian picks the host's limits but for near-ties, and RTN with them has the host's output error") {
  PTQ_REQUIRE_GPU();
  const Problem p = problem(300, 320, 3000, 12);   // groups of 128: two and a last of 64
  cuda::DeviceBuffer<double> dH(size_t(p.H.size()), "test Hessian");
  cuda::copy_to_device(dH.get(), p.H.data(), size_t(p.H.size()) * 8);
  struct Case {
    int bits, gs;
    bool sym;
    DType scale;
  };
  for (const Case& k : {Case{4, 128, false, DType::F16}, Case{3, 64, true, DType::BF16}, Case{8, 32, false, DType::F32}}) {
    QuantSpec s;
    s.method = "rtn";
    s.bits = k.bits, s.group_size = k.gs, s.sym = k.sym, s.scale_dtype = k.scale, s.output_clip = true;
    REQUIRE(cuda::clip_supported(s));
    const ClipSearch host = output_clip_limits(p.W, p.H, s), gpu = cuda::output_clip_limits(p.W, HessianRef{dH.get(), 1.0}, s);
    REQUIRE(gpu.limits.size() == host.limits.size());
    size_t same = 0;
    for (size_t i = 0; i < host.limits.size(); ++i) same += gpu.limits[i] == host.limits[i];
    auto error = [&](const ClipSearch& c) {   // tr(E H Eᵀ) in fp64, E = Wq − W
      const Eigen::MatrixXd E = (rtn_quantize(p.W, s, &c.limits).dequantize() - p.W).cast<double>();
      return (E * Eigen::Map<const Eigen::MatrixXd>(p.H.data(), p.H.rows(), p.H.cols()) * E.transpose()).trace();
    };
    const double eh = error(host), eg = error(gpu);
    INFO(k.bits << "-bit g" << k.gs << ": " << same << " of " << host.limits.size() << " limits equal, clipped host " << host.clipped << " gpu "
                << gpu.clipped << "; output error host " << eh << " gpu " << eg);
    CHECK(double(same) >= 0.99 * double(host.limits.size()));
    if (k.bits < 8) CHECK(host.clipped > 0);   // (at 8 bits a clamp seldom pays)
    CHECK(std::abs(double(gpu.clipped - host.clipped)) <= 0.01 * double(host.clipped) + 1);
    CHECK(std::abs(eg / eh - 1) <= 1e-4);
    CHECK(cuda::output_clip_limits(p.W, HessianRef{dH.get(), 1.0}, s).limits == gpu.limits);   // the same every run
  }
  QuantSpec big;
  big.group_size = 256;
  CHECK_FALSE(cuda::clip_supported(big));
}

TEST_CASE("gpu: GPTQ with AWQ's clipping limits: the GPU solve fixes the host's static grids from them, and its codes and loss are the host's") {
  // The limits (here the host's search, as the hybrid path takes them) clamp each static group's
  // range before the solve: the grids must equal gptq_quantize's with the same limits bit for bit
  // (the same float operations), the codes and the output error as the unclipped GPU solve matches
  // the CPU's (the first test's bounds); a resident solve with RTN kept has the host's clipped RTN.
  PTQ_REQUIRE_GPU();
  const Problem p = problem(256, 384, 3000, 13);
  cuda::DeviceBuffer<double> dH(size_t(p.H.size()), "test Hessian");
  cuda::copy_to_device(dH.get(), p.H.data(), size_t(p.H.size()) * 8);
  for (int bits : {3, 4}) {
    QuantSpec s;
    s.bits = bits, s.group_size = 128, s.sym = false, s.act_order = true, s.static_groups = true, s.output_clip = true;
    REQUIRE(cuda::gptq_supported(s, nullptr));
    const ClipSearch clip = output_clip_limits(p.W, p.H, s);
    REQUIRE(clip.clipped > 0);
    const QuantizedLinear cpu = gptq_quantize(p.W, p.H, s, nullptr, &clip.limits), gpu = ptqtest::gpu_gptq(p.W, p.H, s, nullptr, &clip.limits);
    const QuantizedLinear unclipped = ptqtest::gpu_gptq(p.W, p.H, s);
    CHECK(gpu.scales == cpu.scales);
    CHECK(gpu.zeros == cpu.zeros);
    CHECK(gpu.scales != unclipped.scales);   // the limits were applied
    int64_t same = 0;
    const std::vector<uint8_t> cc = cpu.unpacked_codes(), gc = gpu.unpacked_codes();
    for (size_t i = 0; i < cc.size(); ++i) same += cc[i] == gc[i];
    const double share = double(same) / double(cc.size());
    const double lc = output_error(p.W, cpu.dequantize(), p.H), lg = output_error(p.W, gpu.dequantize(), p.H),
                 lu = output_error(p.W, unclipped.dequantize(), p.H);
    std::cout << bits << "-bit g128 act-order, " << clip.clipped << " of " << clip.groups << " groups clipped: identical codes " << 100 * share
              << "%, loss GPU " << lg << " CPU " << lc << " (unclipped GPU " << lu << ")\n";
    CHECK(share >= 0.99);
    CHECK(std::abs(lg - lc) <= 0.01 * lc);
    // the resident form's RTN baseline, clipped as the host's rtn_quantize clips it
    cuda::WeightRows rows;
    rows.rows = p.W.rows();
    rows.host = &p.W;
    const cuda::ResidentSolve rs = cuda::gptq_solve_cuda({rows}, p.W.cols(), HessianRef{dH.get(), 1.0}, s, cuda::SolveKeep::weights_and_rtn, nullptr, &clip.limits);
    MatF Wr(p.W.rows(), p.W.cols());
    cuda::copy_to_host(Wr.data(), rs.Wr.get(), size_t(Wr.size()) * 4);
    const MatF want = rtn_quantize(p.W, s, &clip.limits).dequantize();
    CHECK((Wr - want).cwiseAbs().maxCoeff() <= 1e-6f * want.cwiseAbs().maxCoeff());
  }
  QuantSpec dynamic;
  dynamic.group_size = 128;
  const std::vector<float> none(size_t(3 * 256), INFINITY);
  CHECK_THROWS_WITH(ptqtest::gpu_gptq(p.W, p.H, dynamic, nullptr, &none), Catch::Contains("static groups"));
}

TEST_CASE("gpu: RTN on the device is rtn_quantize to the bit (grids, packed codes, dequantized weights), with AWQ's clipping limits too") {
  // The same float operations as the host's static_grids and quantize_code (quant/grid.cuh), so
  // every scale, zero and code word must be the host's, and Wq its QuantizedLinear::dequantize.
  PTQ_REQUIRE_GPU();
  const Problem p = problem(300, 424, 2000, 17);   // 424 columns: a last group of 40 (g128), 8 (g32), 40 (g64)
  cuda::DeviceBuffer<float> dW(size_t(p.W.size()), "test W");
  cuda::copy_to_device(dW.get(), p.W.data(), size_t(p.W.size()) * 4);
  struct Arm {
    const char* name;
    int bits, group_size;
    bool sym, mse, clip;
    DType scale_dtype;
  };
  for (const Arm& a : {Arm{"4-bit g128 asym (W4A16-AWQ's)", 4, 128, false, false, false, DType::F16},
                       Arm{"4-bit g128 asym, AWQ's clipping", 4, 128, false, false, true, DType::F16},
                       Arm{"3-bit g64 sym, bf16 scales, clipping", 3, 64, true, false, true, DType::BF16},
                       Arm{"8-bit one group a row (SmoothQuant's)", 8, -1, true, false, false, DType::F16},
                       Arm{"2-bit g32 asym, MSE grids, fp32 scales", 2, 32, false, true, false, DType::F32},
                       Arm{"5-bit one group a row, MSE grids", 5, -1, false, true, false, DType::F16}}) {
    INFO(a.name);
    QuantSpec s;
    s.method = "rtn";
    s.bits = a.bits, s.group_size = a.group_size, s.sym = a.sym, s.mse = a.mse, s.output_clip = a.clip, s.scale_dtype = a.scale_dtype;
    REQUIRE(cuda::rtn_supported(s));
    ClipSearch clip;
    if (a.clip) {
      clip = output_clip_limits(p.W, p.H, s);
      REQUIRE(clip.clipped > 0);
    }
    const std::vector<float>* limits = a.clip ? &clip.limits : nullptr;
    const QuantizedLinear cpu = rtn_quantize(p.W, s, limits);
    const cuda::ResidentRtn gpu = cuda::rtn_quantize_cuda(dW.get(), p.W.rows(), p.W.cols(), s, limits);
    CHECK(gpu.q.scales == cpu.scales);
    CHECK(gpu.q.zeros == cpu.zeros);
    CHECK(gpu.q.g_idx == cpu.g_idx);
    CHECK(gpu.q.packed == cpu.packed);
    MatF Wq(p.W.rows(), p.W.cols());
    cuda::copy_to_host(Wq.data(), gpu.Wq.get(), size_t(Wq.size()) * 4);
    CHECK(Wq == cpu.dequantize());
    if (a.clip) CHECK(cpu.scales != rtn_quantize(p.W, s).scales);   // the limits were applied
  }
  QuantSpec wide;   // (the spec checks alone: the next case, without a GPU)
  wide.group_size = 256;
  CHECK_THROWS_WITH(cuda::rtn_quantize_cuda(dW.get(), p.W.rows(), p.W.cols(), wide), Catch::Contains("at most 128 columns"));
}

TEST_CASE("gpu: llama.cpp's grids formed on the device are static_grids' to the bit (Q4_1 Q5_1 Q4_K Q5_K Q6_K with zeros' signs and ties and clipping)") {
  // grid.cuh's form_grid_kernel and super_block_kernel against the host's find_grid and
  // round_super_block, through RTN (the same grids the GPTQ solve takes): every scale, zero, min,
  // super-block d and dmin, packed code word and dequantized weight. The weights hold the cases a
  // reduction can get wrong: a row of zeros (every scale 0: quant_form's zero-scale code), a group
  // whose least value is +0 before -0 and one with -0 before +0 (find_grid keeps the first: Q4_1
  // stores the sign in its f16 min), a group of one value repeated, all-positive and all-negative
  // groups, and a super-block with one dominant group (its others' scales round to few levels).
  PTQ_REQUIRE_GPU();
  Problem p = problem(96, 512, 2000, 29);   // 512 columns: two K super-blocks of 256
  MatF& W = p.W;
  W.row(3).setZero();
  for (int c = 0; c < 32; ++c) W(5, c) = std::abs(W(5, c)) + 0.01f;
  W(5, 4) = 0.0f, W(5, 9) = -0.0f;                                                  // +0 first (group 0 of row 5)
  for (int c = 32; c < 64; ++c) W(5, c) = std::abs(W(5, c)) + 0.01f;
  W(5, 40) = -0.0f, W(5, 41) = 0.0f;                                                // -0 first (group 1)
  for (int c = 64; c < 96; ++c) W(6, c) = 0.25f;                                    // one value repeated
  for (int c = 96; c < 128; ++c) W(6, c) = -std::abs(W(6, c)) - 0.01f;              // all negative
  for (int c = 256; c < 288; ++c) W(7, c) *= 40.0f;                                 // one dominant group
  cuda::DeviceBuffer<float> dW(size_t(W.size()), "test W");
  cuda::copy_to_device(dW.get(), W.data(), size_t(W.size()) * 4);
  for (const char* type : {"Q4_1", "Q5_1", "Q4_K", "Q5_K", "Q6_K"})
    for (bool clip : {false, true}) {
      INFO(type << (clip ? ", AWQ's clipping" : ""));
      QuantSpec s;
      s.method = "rtn";
      s.static_groups = true;
      REQUIRE(apply_gguf_type(type, s).empty());
      s.output_clip = clip;
      REQUIRE(cuda::rtn_supported(s));
      ClipSearch cs;
      if (clip) {
        cs = output_clip_limits(W, p.H, s);
        REQUIRE(cs.clipped > 0);
      }
      const std::vector<float>* limits = clip ? &cs.limits : nullptr;
      const QuantizedLinear cpu = rtn_quantize(W, s, limits);
      const cuda::ResidentRtn gpu = cuda::rtn_quantize_cuda(dW.get(), W.rows(), W.cols(), s, limits);
      auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {   // == with zeros' signs
        return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
      };
      CHECK(same_bits(gpu.q.scales, cpu.scales));
      CHECK(gpu.q.zeros == cpu.zeros);
      CHECK(same_bits(gpu.q.mins, cpu.mins));
      CHECK(same_bits(gpu.q.super_d, cpu.super_d));
      CHECK(same_bits(gpu.q.super_dmin, cpu.super_dmin));
      CHECK(gpu.q.packed == cpu.packed);
      MatF Wq(W.rows(), W.cols());
      cuda::copy_to_host(Wq.data(), gpu.Wq.get(), size_t(Wq.size()) * 4);
      CHECK(Wq == cpu.dequantize());
      if (s.form == GridForm::f16_min && !clip) {   // the zeros' signs reached the f16 mins
        CHECK(!std::signbit(cpu.mins[size_t(0 * W.rows() + 5)]));
        CHECK(std::signbit(cpu.mins[size_t(1 * W.rows() + 5)]));
      }
    }
}

TEST_CASE("gpu: the TF32 output error equals the fp64 one within 1e-3 across row chunks and H blocks") {
  PTQ_REQUIRE_GPU();
  const int64_t rows = 2100, cols = 2200;   // two row chunks and two H blocks of 2048
  Problem p = problem(int(rows), int(cols), 3000, 41);
  MatF Wr = p.W;
  Rng r(3);
  for (int i = 0; i < Wr.size(); ++i) Wr.data()[i] += float(0.004 * (r.uniform() - 0.5));   // RTN-like errors
  cuda::HessianCuda hc(cols, DType::F16);
  hc.add(p.X);
  const HessianRef dsum = hc.device();
  cuda::DeviceBuffer<float> dW(size_t(rows * cols), "W"), dWr(size_t(rows * cols), "Wr");
  cuda::copy_to_device(dW.get(), p.W.data(), size_t(rows * cols) * 4);
  cuda::copy_to_device(dWr.get(), Wr.data(), size_t(rows * cols) * 4);
  const double exact = cuda::output_errors(dW.get(), dWr.get(), nullptr, rows, cols, dsum).first;
  const double tf32 = cuda::output_error_tf32(dW.get(), dWr.get(), rows, cols, dsum);
  std::cout << "output error fp64 " << exact << ", TF32 " << tf32 << " (relative " << (tf32 - exact) / exact << ")\n";
  CHECK(std::abs(tf32 - exact) <= 1e-3 * exact);
}

TEST_CASE("gpu: dead columns and damping retries on the GPU") {
  PTQ_REQUIRE_GPU();
  Problem p = problem(64, 256, 2048, 30);
  p.H.row(7).setZero();
  p.H.col(7).setZero();
  QuantSpec s;
  s.group_size = 32;
  SolveStats st;
  QuantizedLinear q = ptqtest::gpu_gptq(p.W, p.H, s, &st);
  CHECK(st.dead_columns == 1);
  CHECK(q.dequantize().col(7).cwiseAbs().maxCoeff() == 0.0f);
  MatD bad = MatD::Identity(256, 256);
  bad(0, 1) = bad(1, 0) = 5.0;
  SolveStats st2;
  ptqtest::gpu_gptq(p.W, bad, s, &st2);
  CHECK(st2.retries > 0);
}

TEST_CASE("gpu: the layer-0 Hessian of distilled-13m matches the CPU's (fp32) and gives the same codes") {
  PTQ_REQUIRE_GPU();
  PTQ_REQUIRE_ASSETS();
  LlamaModel m(ptqtest::assets() + "/models/distilled-13m");
  auto tok = load_tokenizer(m.dir(), 1);
  auto ids = encode_corpus(*tok, ptqtest::assets() + "/text/tinystories/calib.txt");
  ids.resize(32 * 512);
  MatF x = m.embed(ids), xn;
  LayerWeights w = m.load_layer(0);
  rmsnorm(x, w.input_layernorm, 1e-5f, xn);
  Hessian hc(384);
  hc.add(xn);
  const MatD Hc = hc.finalize();
  for (DType dt : {DType::F32, DType::F16}) {
    cuda::HessianCuda hg(384, dt);
    hg.add(xn);
    const MatD Hg = hg.finalize();
    QuantSpec s;
    s.group_size = 128;
    s.act_order = true;
    s.static_groups = true;
    auto a = gptq_quantize(w[Proj::q].W, Hc, s), b = ptqtest::gpu_gptq(w[Proj::q].W, Hg, s), c = ptqtest::gpu_gptq(w[Proj::q].W, Hc, s);
    int64_t same_b = 0, same_c = 0;
    const std::vector<uint8_t> ac = a.unpacked_codes(), bc = b.unpacked_codes(), cc = c.unpacked_codes();
    for (size_t i = 0; i < ac.size(); ++i) { same_b += ac[i] == bc[i]; same_c += ac[i] == cc[i]; }
    std::cout << "layer 0 H, GPU " << dtype_name(dt) << " vs CPU: relative difference " << (Hg - Hc).norm() / Hc.norm()
              << "; codes CPU(H_cpu) vs GPU(H_gpu) " << 100.0 * same_b / ac.size() << "%, vs GPU(H_cpu) " << 100.0 * same_c / ac.size() << "%\n";
    if (dt == DType::F32) CHECK((Hg - Hc).norm() <= 1e-6 * Hc.norm());
    CHECK(same_c == int64_t(ac.size()));   // the same H: the same codes
  }
}
