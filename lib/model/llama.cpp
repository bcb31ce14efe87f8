#include "model/llama.h"

#include <omp.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/product.h"
#include "model/schedule.h"

namespace ptq {

const char* proj_name(Proj p) {
  static const char* n[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj", "gate_up_proj"};
  return n[int(p)];
}

std::string proj_tensor_prefix(int layer, Proj p) {
  const bool attn = p == Proj::q || p == Proj::k || p == Proj::v || p == Proj::o || p == Proj::qkv;
  return "model.layers." + std::to_string(layer) + (attn ? ".self_attn." : ".mlp.") + proj_name(p);
}

int expert_slot(Proj p) {
  if (p == Proj::gate) return 0;
  if (p == Proj::up) return 1;
  if (p == Proj::down) return 2;
  fail(Errc::usage, "", "LinearId", std::string("an expert has no ") + proj_name(p));
}

std::string linear_name(const LlamaConfig& c, int layer, LinearId id) {
  if (id.expert < 0) return proj_tensor_prefix(layer, id.proj);
  const std::string l = "model.layers." + std::to_string(layer), e = std::to_string(id.expert);
  if (c.moe == MoeRouting::topk_softmax) {   // mixtral: w1 = gate, w3 = up, w2 = down
    static const char* w[] = {"w1", "w3", "w2"};
    return l + ".block_sparse_moe.experts." + e + "." + w[expert_slot(id.proj)];
  }
  return l + ".mlp.experts." + e + "." + proj_name(id.proj);
}

std::string router_name(const LlamaConfig& c, int layer) {
  return "model.layers." + std::to_string(layer) + (c.moe == MoeRouting::topk_softmax ? ".block_sparse_moe.gate" : ".mlp.gate");
}

Linear& LayerWeights::operator[](LinearId id) {
  if (id.expert < 0) return proj[size_t(id.proj)];
  if (size_t(id.expert) >= experts.size()) fail(Errc::usage, "", "LinearId", "expert " + std::to_string(id.expert) + " outside the layer's experts");
  return experts[size_t(id.expert)][size_t(expert_slot(id.proj))];
}
const Linear& LayerWeights::operator[](LinearId id) const { return const_cast<LayerWeights&>(*this)[id]; }

size_t LayerWeights::bytes() const {
  size_t s = size_t(input_layernorm.size() + post_attention_layernorm.size() + q_norm.size() + k_norm.size()) * 4;
  auto add = [&](const Linear& l) { s += size_t(l.W.size() + l.Wi.size() + l.b.size()) * 4; };
  for (auto& l : proj) add(l);
  add(router);
  for (auto& e : experts)
    for (auto& l : e) add(l);
  return s;
}

MatF read_matrix(const WeightSource& w, const std::string& name, int64_t rows, int64_t cols) {
  const Shape s = w.shape(name);
  if (s != Shape{rows, cols})
    fail(Errc::format, w.file_of(name), name, "shape " + shape_str(s) + " does not match the config's " + shape_str({rows, cols}));
  MatF m(rows, cols);
  w.read_f32(name, m.data());
  return m;
}

VecF read_vector(const WeightSource& w, const std::string& name, int64_t n) {
  const Shape s = w.shape(name);
  if (s != Shape{n}) fail(Errc::format, w.file_of(name), name, "shape " + shape_str(s) + " does not match the config's " + shape_str({n}));
  VecF v(n);
  w.read_f32(name, v.data());
  return v;
}

std::vector<double> rope_inv_freq(const LlamaConfig& c) {
  const int rd = c.rotary_dim(), half = rd / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv_freq[size_t(i)] = 1.0 / std::pow(c.rope_theta, double(2 * i) / rd);
  if (c.rope_scaling) {   // Llama 3.1 frequency-dependent scaling
    const auto& r = *c.rope_scaling;
    const double old_len = r.original_max_position_embeddings;
    const double low_wavelen = old_len / r.low_freq_factor, high_wavelen = old_len / r.high_freq_factor;
    for (auto& f : inv_freq) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) { f /= r.factor; continue; }
      const double smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      f = (1 - smooth) * f / r.factor + smooth * f;
    }
  }
  return inv_freq;
}

Rope make_rope(const LlamaConfig& c, int max_len) {
  const std::vector<double> inv_freq = rope_inv_freq(c);
  const int half = int(inv_freq.size());
  Rope rope{MatF(max_len, half), MatF(max_len, half)};
  for (int p = 0; p < max_len; ++p)
    for (int i = 0; i < half; ++i) {
      const double a = double(p) * inv_freq[size_t(i)];
      rope.cos(p, i) = float(std::cos(a));
      rope.sin(p, i) = float(std::sin(a));
    }
  return rope;
}

void rmsnorm(const MatF& x, const VecF& w, float eps, MatF& out) {
  out.resize(x.rows(), x.cols());
#pragma omp parallel for schedule(static)
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    const float ms = x.row(r).squaredNorm() / float(x.cols());
    const float inv = 1.0f / std::sqrt(ms + eps);
    out.row(r) = (x.row(r) * inv).cwiseProduct(w.transpose());
  }
}

void head_rmsnorm(MatF& y, int heads, int hd, const VecF& w, float eps) {
#pragma omp parallel for schedule(static)
  for (Eigen::Index r = 0; r < y.rows(); ++r)
    for (int h = 0; h < heads; ++h) {
      auto seg = y.row(r).segment(Eigen::Index(h) * hd, hd);
      const float inv = 1.0f / std::sqrt(seg.squaredNorm() / float(hd) + eps);
      seg = (seg * inv).cwiseProduct(w.transpose());
    }
}

namespace {
// x -> int8 codes and per-row scales, into int32 (MatI) or, for the GEMMs, floats (MatF: every
// code is an integer in [-128, 127], exact in fp32; the same value the int32 cast would give).
template <class Codes>
void quantize_rows(const MatF& x, const ActQuant& a, Codes& q, VecF& scale) {
  using T = typename Codes::Scalar;
  q.resize(x.rows(), x.cols());
  scale.resize(x.rows());
#pragma omp parallel for schedule(static)
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    float s = a.static_scale;
    if (a.mode == ActQuant::per_token) s = x.row(r).cwiseAbs().maxCoeff() / 127.0f;
    if (!(s > 0)) s = 1.0f;
    scale[r] = s;
    for (Eigen::Index c = 0; c < x.cols(); ++c) q(r, c) = T(std::min(127.0f, std::max(-128.0f, std::nearbyint(x(r, c) / s))));
  }
}
}  // namespace

void quantize_activations(const MatF& x, const ActQuant& a, MatI& q, VecF& scale) { quantize_rows(x, a, q, scale); }

// The int32 sums Σ_k q[m, k] · w[n, k] of int8 codes (held as floats), exact, through float GEMMs:
// every product is an integer of magnitude at most 128 · 128 = 2^14, so any partial sum over at
// most kExactK = 1024 of them is an integer of magnitude at most 2^24, exact in fp32 in whatever
// order the GEMM adds; each K-chunk's sums are then added in int32 (|Σ| < 2^31 for K < 2^17).
// Eigen's int32 GEMM, which this replaces, ran W8A8 evaluation ~9x slower than the float path.
constexpr Eigen::Index kExactK = 1024;
MatI int8_dot(const MatF& q, const MatF& w) {
  if (q.cols() >= (Eigen::Index(1) << 17)) fail(Errc::usage, "", "int8_dot", "K must be below 2^17 for int32 sums, not " + std::to_string(q.cols()));
  MatI acc = MatI::Zero(q.rows(), w.rows());
  MatF part;
  for (Eigen::Index k0 = 0; k0 < q.cols(); k0 += kExactK) {
    const Eigen::Index kn = std::min(kExactK, q.cols() - k0);
    part.noalias() = q.middleCols(k0, kn) * w.middleCols(k0, kn).transpose();
    acc += part.cast<int32_t>();
  }
  return acc;
}

void linear(const MatF& x, const Linear& l, MatF& y) {
  if (l.act.mode == ActQuant::none) {
    fixed_depth_product(x, l.W.transpose(), y);
  } else {
    MatF q;   // the int8 codes, held as floats
    VecF sx;
    quantize_rows(x, l.act, q, sx);
    if (l.Wi.size()) {   // integer path: exact int32 accumulation of int8 x int8, then s_x * s_w
      // K <= kExactK: one float GEMM is already the exact integer sum (no int32 round trip);
      // longer K: int8_dot's exact chunks added in int32.
      if (q.cols() <= kExactK) y.noalias() = q * l.Wi.transpose();   // exact integers: any order
      else y = int8_dot(q, l.Wi).cast<float>();
      y = (y.array().colwise() * sx.array()).rowwise() * l.w_scale.transpose().array();   // (Σ · s_x) · s_w, as before
    } else {             // fake-quant path: the same codes, float arithmetic
      for (Eigen::Index r = 0; r < q.rows(); ++r) q.row(r) *= sx[r];
      fixed_depth_product(q, l.W.transpose(), y);
    }
  }
  if (l.b.size()) y.rowwise() += l.b.transpose();
}

namespace {
// In-place rotary embedding of [S*T, nh*hd] (HF rotate_half layout) over the first 2 * half dims
// of each head (the table's width: partial rotary leaves the rest as they are).
// Rows r of S sequences of T tokens sit at positions pos0 + r % T.
void apply_rope(MatF& x, int nh, int hd, const Rope& rope, int S, int T, int pos0) {
  const int half = int(rope.cos.cols());
#pragma omp parallel for schedule(static)
  for (Eigen::Index r = 0; r < Eigen::Index(S) * T; ++r) {
    const int pos = pos0 + int(r % T);
    float* row = x.row(r).data();
    const float* cs = rope.cos.row(pos).data();
    const float* sn = rope.sin.row(pos).data();
    for (int h = 0; h < nh; ++h) {
      float* v = row + h * hd;
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
      }
    }
  }
}

// q, k, v of xn (S sequences of T tokens at positions pos0 ...), head-normed and rotated.
void rotated_qkv(const LayerWeights& w, const LlamaConfig& c, const Rope& rope, const MatF& xn, int S, int T, int pos0, MatF& q, MatF& k, MatF& v) {
  if (c.fused) {   // Phi-3: one GEMM, then the q, k, v column blocks
    MatF qkv;
    linear(xn, w[Proj::qkv], qkv);
    q = qkv.leftCols(c.q_dim());
    k = qkv.middleCols(c.q_dim(), c.kv_dim());
    v = qkv.rightCols(c.kv_dim());
  } else {
    linear(xn, w[Proj::q], q);
    linear(xn, w[Proj::k], k);
    linear(xn, w[Proj::v], v);
  }
  const int nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  if (c.qk_norm) {   // Qwen3: each head of q and k RMS-normalized over head_dim, then rotated
    head_rmsnorm(q, nh, hd, w.q_norm, float(c.rms_norm_eps));
    head_rmsnorm(k, nkv, hd, w.k_norm, float(c.rms_norm_eps));
  }
  apply_rope(q, nh, hd, rope, S, T, pos0);
  apply_rope(k, nkv, hd, rope, S, T, pos0);
}

// x [n] <- softmax(x * scale) in fp32, by Eigen's vectorized array operations: the max, e_j =
// exp(x_j * scale - max) (Eigen's SIMD exp, within a few ulp of the C library's: the C library's,
// one call an element, was half of stories260k's evaluation), their sum (a SIMD reduction, the
// same order every run on one instruction set), each e_j times 1 / sum.
void row_softmax(float* x, int n, float scale) {
  Eigen::Map<Eigen::ArrayXf> a(x, n);
  a *= scale;
  a = (a - a.maxCoeff()).exp();
  a *= 1.0f / a.sum();
}

// Causal (and sliding-window) softmax attention of head h of one sequence (GQA: its kv head is
// h / group): queries q [Tq, nh*hd] at positions Tk - Tq ... Tk - 1 over keys/values k, v
// [Tk, nkv*hd] at positions 0 ... Tk - 1; writes ctx's columns of head h. scores: [Tq, Tk] scratch.
// The scores are q K^T in fp32, written row-major by the GEMM, then each visible one times
// 1 / sqrt(head_dim) in the softmax. ((q K^T) * scale had Eigen evaluate the product into a
// column-major temporary and copy it into the scores element by element: 35% of stories260k's
// evaluation.)
template <class Q, class KV, class Out>
void attend_head(const LlamaConfig& c, int h, const Q& q, const KV& k, const KV& v, Out ctx, MatF& scores) {
  const int hd = c.head_dim, kvh = h / (c.num_attention_heads / c.num_key_value_heads);
  const int Tq = int(q.rows()), Tk = int(k.rows()), off = Tk - Tq;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int window = c.sliding_window;
  {
    auto K = k.middleCols(Eigen::Index(kvh) * hd, hd);
    auto V = v.middleCols(Eigen::Index(kvh) * hd, hd);
    scores.resize(Tq, Tk);
    fixed_depth_product(q.middleCols(Eigen::Index(h) * hd, hd), K.transpose(), scores);
    for (int i = 0; i < Tq; ++i) {   // query i (position off + i) sees keys j0 ... off + i
      float* row = scores.row(i).data();
      const int last = off + i, j0 = window > 0 ? std::max(0, last - window + 1) : 0;
      row_softmax(row + j0, last - j0 + 1, scale);
      std::fill(row, row + j0, 0.0f);
      std::fill(row + last + 1, row + Tk, 0.0f);
    }
    fixed_depth_product(scores, V, ctx.middleCols(Eigen::Index(h) * hd, hd));
  }
}
}  // namespace

void attention_core(const LayerWeights& w, const LlamaConfig& c, const Rope& rope, const MatF& xn, int S, int T, MatF& ctx) {
  MatF q, k, v;
  rotated_qkv(w, c, rope, xn, S, T, 0, q, k, v);
  ctx.resize(Eigen::Index(S) * T, Eigen::Index(c.q_dim()));
  const int nh = c.num_attention_heads;
#pragma omp parallel
  {
    MatF scores(T, T);
#pragma omp for schedule(dynamic)
    for (int sh = 0; sh < S * nh; ++sh) {
      const Eigen::Index r0 = Eigen::Index(sh / nh) * T;
      attend_head(c, sh % nh, q.middleRows(r0, T), k.middleRows(r0, T), v.middleRows(r0, T), ctx.middleRows(r0, T), scores);
    }
  }
}

void attention_cached(const LayerWeights& w, const LlamaConfig& c, const Rope& rope, const MatF& xn, MatF& K, MatF& V, MatF& ctx) {
  const int T = int(xn.rows()), pos0 = int(K.rows());
  MatF q, k, v;
  rotated_qkv(w, c, rope, xn, 1, T, pos0, q, k, v);
  K.conservativeResize(pos0 + T, Eigen::NoChange);
  V.conservativeResize(pos0 + T, Eigen::NoChange);
  if (K.cols() == 0) K.resize(pos0 + T, k.cols()), V.resize(pos0 + T, v.cols());
  K.bottomRows(T) = k;
  V.bottomRows(T) = v;
  ctx.resize(T, Eigen::Index(c.q_dim()));
#pragma omp parallel
  {
    MatF scores;
#pragma omp for schedule(static)
    for (int h = 0; h < c.num_attention_heads; ++h) attend_head(c, h, q, K, V, ctx.middleRows(0, T), scores);
  }
}

namespace {
// act <- silu(act) * up, row by row.
void silu_mul(MatF& act, const MatF& up) {
#pragma omp parallel for schedule(static)
  for (Eigen::Index r = 0; r < act.rows(); ++r) {
    float* g = act.row(r).data();
    const float* u = up.row(r).data();
    for (Eigen::Index j = 0; j < act.cols(); ++j) g[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
  }
}
}  // namespace

void swiglu(const Linear& gate, const Linear& up, const MatF& x, MatF& act) {
  MatF u;
  linear(x, gate, act);
  linear(x, up, u);
  silu_mul(act, u);
}

void mlp_act(const LayerWeights& w, const MatF& xn, MatF& act) {
  if (w[Proj::gate_up].W.size() == 0 && w[Proj::gate_up].Wi.size() == 0) return swiglu(w[Proj::gate], w[Proj::up], xn, act);
  MatF gu;   // Phi-3: gate rows, then up rows, of one Linear
  linear(xn, w[Proj::gate_up], gu);
  const Eigen::Index f = gu.cols() / 2;
  act = gu.leftCols(f);
  silu_mul(act, gu.rightCols(f));
}

Routing route(const LlamaConfig& c, const Linear& router, const MatF& xn) {
  MatF logits;
  linear(xn, router, logits);
  const int E = c.num_experts, k = c.experts_per_token;
  const bool renorm = c.renormalize_topk();
  std::vector<int32_t> pick(size_t(logits.rows()) * k);
  std::vector<float> pw(pick.size());
#pragma omp parallel for schedule(static)
  for (Eigen::Index r = 0; r < logits.rows(); ++r) {
    const float* l = logits.row(r).data();
    // softmax over all experts (fp32, max subtracted), then the k largest, earlier expert first on ties
    const float m = logits.row(r).maxCoeff();
    std::vector<float> p(size_t(E), 0.0f);
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += (p[size_t(e)] = std::exp(l[e] - m));
    std::vector<int32_t> idx(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) idx[size_t(e)] = e;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    float chosen = 0;
    for (int i = 0; i < k; ++i) chosen += p[size_t(idx[size_t(i)])] / sum;
    for (int i = 0; i < k; ++i) {
      pick[size_t(r) * k + i] = idx[size_t(i)];
      const float pi = p[size_t(idx[size_t(i)])] / sum;
      pw[size_t(r) * k + i] = renorm ? pi / chosen : pi;
    }
  }
  Routing out;
  out.rows.resize(size_t(E));
  out.weights.resize(size_t(E));
  for (Eigen::Index r = 0; r < logits.rows(); ++r)
    for (int i = 0; i < k; ++i) {
      const size_t at = size_t(r) * k + i;
      out.rows[size_t(pick[at])].push_back(int32_t(r));
      out.weights[size_t(pick[at])].push_back(pw[at]);
    }
  return out;
}

void gather_rows(const MatF& x, const std::vector<int32_t>& rows, MatF& out) {
  out.resize(Eigen::Index(rows.size()), x.cols());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(rows.size()); ++i) out.row(i) = x.row(rows[size_t(i)]);
}

void scatter_add(const MatF& part, const std::vector<int32_t>& rows, const std::vector<float>& weights, MatF& y) {
  // rows are distinct within one expert: the rows update in parallel
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(rows.size()); ++i) y.row(rows[size_t(i)]) += weights[size_t(i)] * part.row(i);
}

void moe_mlp(const LayerWeights& w, const LlamaConfig& c, const MatF& xn, MatF& y) {
  const Routing rt = route(c, w.router, xn);
  y.setZero(xn.rows(), xn.cols());
  MatF xe, act, part;
  for (size_t e = 0; e < w.experts.size(); ++e) {   // in expert order, as transformers adds them
    if (rt.rows[e].empty()) continue;
    gather_rows(xn, rt.rows[e], xe);
    swiglu(w.experts[e][0], w.experts[e][1], xe, act);
    linear(act, w.experts[e][2], part);
    scatter_add(part, rt.rows[e], rt.weights[e], y);
  }
}

namespace {
// The layer with its attention given: x <- x + o(attn(norm(x))); x <- x + down(mlp(norm(x))).
template <class Attn>
void decoder_layer_with(const LayerWeights& w, const LlamaConfig& c, MatF& x, Attn&& attn) {
  MatF xn, ctx, y;
  rmsnorm(x, w.input_layernorm, float(c.rms_norm_eps), xn);
  attn(xn, ctx);
  linear(ctx, w[Proj::o], y);
  x += y;
  rmsnorm(x, w.post_attention_layernorm, float(c.rms_norm_eps), xn);
  if (!w.experts.empty()) {
    moe_mlp(w, c, xn, y);
  } else {
    mlp_act(w, xn, ctx);
    linear(ctx, w[Proj::down], y);
  }
  x += y;
}
}  // namespace

void decoder_layer(const LayerWeights& w, const LlamaConfig& c, const Rope& rope, int S, int T, MatF& x) {
  decoder_layer_with(w, c, x, [&](const MatF& xn, MatF& ctx) { attention_core(w, c, rope, xn, S, T, ctx); });
}

void decoder_layer_cached(const LayerWeights& w, const LlamaConfig& c, const Rope& rope, MatF& K, MatF& V, MatF& x) {
  decoder_layer_with(w, c, x, [&](const MatF& xn, MatF& ctx) { attention_cached(w, c, rope, xn, K, V, ctx); });
}

LlamaModel::LlamaModel(const std::string& dir)
    : dir_(dir), cfg_(load_config(dir)), src_(std::make_unique<SafetensorsSource>(dir)) {
  validate();
}

LlamaModel::LlamaModel(std::string dir, LlamaConfig cfg, std::unique_ptr<WeightSource> src)
    : dir_(std::move(dir)), cfg_(std::move(cfg)), src_(std::move(src)) {
  validate();
}

const Checkpoint& LlamaModel::checkpoint() const {
  if (!src_->checkpoint()) fail(Errc::input, dir_, "", "this is a packed (quantized) checkpoint; a float checkpoint is needed here");
  return *src_->checkpoint();
}

void LlamaModel::validate() const {
  const auto& c = cfg_;
  auto expect = [&](const std::string& name, Shape s, const std::string& why = "") {
    const Shape got = src_->shape(name);
    if (got != s) fail(Errc::format, src_->file_of(name), name, "shape " + shape_str(got) + " does not match the config's " + shape_str(s) + why);
  };
  const int64_t d = c.hidden_size;
  expect("model.embed_tokens.weight", {c.vocab_size, d});
  expect("model.norm.weight", {d});
  if (!c.tie_word_embeddings) expect("lm_head.weight", {c.vocab_size, d});
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    expect(p + ".input_layernorm.weight", {d});
    expect(p + ".post_attention_layernorm.weight", {d});
    if (c.qk_norm) {
      expect(p + ".self_attn.q_norm.weight", {c.head_dim});
      expect(p + ".self_attn.k_norm.weight", {c.head_dim});
    }
    if (c.moe_layer(i))
      expect(router_name(c, i) + ".weight", {c.num_experts, d},
             " (the router: one row per expert, num_experts " + std::to_string(c.num_experts) + ", hidden_size " + std::to_string(d) + ")");
    for (LinearId id : layer_schedule(c, i).linears()) {
      const LinearShape sh = linear_shape(c, id);
      std::string why;
      if (id.proj == Proj::qkv)
        why = " (q, k, v rows: " + std::to_string(c.q_dim()) + " + " + std::to_string(c.kv_dim()) + " + " + std::to_string(c.kv_dim()) + " from the heads and head_dim)";
      if (id.proj == Proj::gate_up) why = " (gate rows, then up rows: 2 x intermediate_size " + std::to_string(c.intermediate_size) + ")";
      expect(linear_name(c, i, id) + ".weight", {sh.out, sh.in}, why);
      if (linear_has_bias(c, id)) expect(linear_name(c, i, id) + ".bias", {sh.out});
    }
  }
}

const Rope& LlamaModel::rope(int T) const {
  if (rope_.cos.rows() < T) rope_ = make_rope(cfg_, std::max(T, 1));
  return rope_;
}

MatF LlamaModel::embed(const std::vector<int32_t>& tokens) const {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg_.vocab_size)
      fail(Errc::input, dir_, "token " + std::to_string(i), "id " + std::to_string(tokens[i]) + " outside the vocabulary [0, " + std::to_string(cfg_.vocab_size) + ")");
  MatF x(Eigen::Index(tokens.size()), cfg_.hidden_size);
  src_->read_rows_f32("model.embed_tokens.weight", tokens, x.data());
  return x;
}

LayerWeights LlamaModel::load_layer(int i) const {
  const auto& c = cfg_;
  const std::string p = "model.layers." + std::to_string(i);
  LayerWeights w;
  w.input_layernorm = read_vector(*src_, p + ".input_layernorm.weight", c.hidden_size);
  w.post_attention_layernorm = read_vector(*src_, p + ".post_attention_layernorm.weight", c.hidden_size);
  if (c.qk_norm) {
    w.q_norm = read_vector(*src_, p + ".self_attn.q_norm.weight", c.head_dim);
    w.k_norm = read_vector(*src_, p + ".self_attn.k_norm.weight", c.head_dim);
  }
  if (c.moe_layer(i)) {
    w.router.W = read_matrix(*src_, router_name(c, i) + ".weight", c.num_experts, c.hidden_size);
    w.experts.resize(size_t(c.num_experts));
  }
  for (LinearId id : layer_schedule(c, i).linears()) {
    const std::string n = linear_name(c, i, id);
    const LinearShape sh = linear_shape(c, id);
    Linear& l = w[id];
    l.act = src_->act_quant(n);
    MatI codes;
    if (l.act.mode != ActQuant::none && integer_path_ && src_->read_int8(n, &codes, &l.w_scale)) {
      // The integer path holds the int8 codes alone: no dequantized float copy beside them.
      if (codes.rows() != sh.out || codes.cols() != sh.in)   // (validate() checked the tensor's shape; this, what read_int8 gave)
        fail(Errc::format, src_->file_of(n + ".weight"), n + ".weight",
             "int8 codes of shape " + shape_str({codes.rows(), codes.cols()}) + " do not match the config's " + shape_str({sh.out, sh.in}));
      l.Wi = codes.cast<float>();
    } else {
      l.W = read_matrix(*src_, n + ".weight", sh.out, sh.in);
    }
    src_->release(n + ".weight");
    if (src_->has(n + ".bias")) l.b = read_vector(*src_, n + ".bias", sh.out);
  }
  return w;
}

void LlamaModel::logits(const MatF& x, MatF& out) const {
  MatF xn;
  rmsnorm(x, read_vector(*src_, "model.norm.weight", cfg_.hidden_size), float(cfg_.rms_norm_eps), xn);
  const std::string head = cfg_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  Linear l;
  l.W = read_matrix(*src_, head, cfg_.vocab_size, cfg_.hidden_size);
  linear(xn, l, out);
}

MatF LlamaModel::forward(const std::vector<int32_t>& tokens, int S, int T) const {
  if (size_t(S) * size_t(T) != tokens.size()) fail(Errc::input, dir_, "tokens", "expected S*T tokens");
  if (T > cfg_.max_position_embeddings)
    fail(Errc::input, dir_, "seq_len", "window of " + std::to_string(T) + " tokens exceeds max_position_embeddings " + std::to_string(cfg_.max_position_embeddings));
  MatF x = embed(tokens);
  const Rope& r = rope(T);
  for (int i = 0; i < cfg_.num_hidden_layers; ++i) decoder_layer(load_layer(i), cfg_, r, S, T, x);
  MatF out;
  logits(x, out);
  return out;
}

}  // namespace ptq
