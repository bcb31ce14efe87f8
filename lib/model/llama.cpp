#include "model/llama.h"

#include <omp.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/schedule.h"

namespace ptq {

const char* proj_name(Proj p) {
  static const char* n[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return n[int(p)];
}

std::string proj_tensor_prefix(int layer, Proj p) {
  const bool attn = p == Proj::q || p == Proj::k || p == Proj::v || p == Proj::o;
  return "model.layers." + std::to_string(layer) + (attn ? ".self_attn." : ".mlp.") + proj_name(p);
}

size_t LayerWeights::bytes() const {
  size_t s = size_t(input_layernorm.size() + post_attention_layernorm.size() + q_norm.size() + k_norm.size()) * 4;
  for (auto& l : proj) s += size_t(l.W.size() + l.b.size()) * 4;
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

Rope make_rope(const LlamaConfig& c, int max_len) {
  const int half = c.head_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv_freq[size_t(i)] = 1.0 / std::pow(c.rope_theta, double(2 * i) / c.head_dim);
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

void quantize_activations(const MatF& x, const ActQuant& a, MatI& q, VecF& scale) {
  q.resize(x.rows(), x.cols());
  scale.resize(x.rows());
#pragma omp parallel for schedule(static)
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    float s = a.static_scale;
    if (a.mode == ActQuant::per_token) s = x.row(r).cwiseAbs().maxCoeff() / 127.0f;
    if (!(s > 0)) s = 1.0f;
    scale[r] = s;
    for (Eigen::Index c = 0; c < x.cols(); ++c) q(r, c) = int32_t(std::min(127.0f, std::max(-128.0f, std::nearbyint(x(r, c) / s))));
  }
}

void linear(const MatF& x, const Linear& l, MatF& y) {
  if (l.act.mode == ActQuant::none) {
    y.noalias() = x * l.W.transpose();
  } else {
    MatI q;
    VecF sx;
    quantize_activations(x, l.act, q, sx);
    if (l.Wi.size()) {   // integer path: int32 accumulation of int8 x int8, then s_x * s_w
      MatI acc = q * l.Wi.transpose();
      y.resize(x.rows(), l.Wi.rows());
      for (Eigen::Index r = 0; r < y.rows(); ++r)
        for (Eigen::Index c = 0; c < y.cols(); ++c) y(r, c) = float(acc(r, c)) * sx[r] * l.w_scale[c];
    } else {             // fake-quant path: the same codes, float arithmetic
      MatF xq = q.cast<float>();
      for (Eigen::Index r = 0; r < xq.rows(); ++r) xq.row(r) *= sx[r];
      y.noalias() = xq * l.W.transpose();
    }
  }
  if (l.b.size()) y.rowwise() += l.b.transpose();
}

namespace {
// In-place rotary embedding of [S*T, nh*hd] (HF rotate_half layout).
void apply_rope(MatF& x, int nh, int hd, const Rope& rope, int S, int T) {
  const int half = hd / 2;
#pragma omp parallel for schedule(static)
  for (Eigen::Index r = 0; r < Eigen::Index(S) * T; ++r) {
    const int pos = int(r % T);
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
}  // namespace

void attention_core(const LayerWeights& w, const LlamaConfig& c, const Rope& rope, const MatF& xn, int S, int T, MatF& ctx) {
  MatF q, k, v;
  linear(xn, w[Proj::q], q);
  linear(xn, w[Proj::k], k);
  linear(xn, w[Proj::v], v);
  const int nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim, group = nh / nkv;
  if (c.qk_norm) {   // Qwen3: each head of q and k RMS-normalized over head_dim, then rotated
    head_rmsnorm(q, nh, hd, w.q_norm, float(c.rms_norm_eps));
    head_rmsnorm(k, nkv, hd, w.k_norm, float(c.rms_norm_eps));
  }
  apply_rope(q, nh, hd, rope, S, T);
  apply_rope(k, nkv, hd, rope, S, T);
  ctx.resize(Eigen::Index(S) * T, Eigen::Index(nh) * hd);
  const float scale = 1.0f / std::sqrt(float(hd));
  const int window = c.sliding_window;
#pragma omp parallel
  {
    MatF scores(T, T);
#pragma omp for schedule(dynamic)
    for (int sh = 0; sh < S * nh; ++sh) {
      const int s = sh / nh, h = sh % nh, kvh = h / group;
      auto Q = q.block(Eigen::Index(s) * T, Eigen::Index(h) * hd, T, hd);
      auto K = k.block(Eigen::Index(s) * T, Eigen::Index(kvh) * hd, T, hd);
      auto V = v.block(Eigen::Index(s) * T, Eigen::Index(kvh) * hd, T, hd);
      scores.noalias() = (Q * K.transpose()) * scale;
      for (int i = 0; i < T; ++i) {   // causal (and sliding-window) softmax over j <= i
        float* row = scores.row(i).data();
        const int j0 = window > 0 ? std::max(0, i - window + 1) : 0;
        float m = -std::numeric_limits<float>::infinity();
        for (int j = j0; j <= i; ++j) m = std::max(m, row[j]);
        float sum = 0;
        for (int j = 0; j < T; ++j) {
          const float e = (j >= j0 && j <= i) ? std::exp(row[j] - m) : 0.0f;
          row[j] = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
        for (int j = j0; j <= i; ++j) row[j] *= inv;
      }
      ctx.block(Eigen::Index(s) * T, Eigen::Index(h) * hd, T, hd).noalias() = scores * V;
    }
  }
}

void mlp_act(const LayerWeights& w, const MatF& xn, MatF& act) {
  MatF up;
  linear(xn, w[Proj::gate], act);
  linear(xn, w[Proj::up], up);
#pragma omp parallel for schedule(static)
  for (Eigen::Index r = 0; r < act.rows(); ++r) {
    float* g = act.row(r).data();
    const float* u = up.row(r).data();
    for (Eigen::Index j = 0; j < act.cols(); ++j) g[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
  }
}

void decoder_layer(const LayerWeights& w, const LlamaConfig& c, const Rope& rope, int S, int T, MatF& x) {
  MatF xn, ctx, y;
  rmsnorm(x, w.input_layernorm, float(c.rms_norm_eps), xn);
  attention_core(w, c, rope, xn, S, T, ctx);
  linear(ctx, w[Proj::o], y);
  x += y;
  rmsnorm(x, w.post_attention_layernorm, float(c.rms_norm_eps), xn);
  mlp_act(w, xn, ctx);
  linear(ctx, w[Proj::down], y);
  x += y;
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
  auto expect = [&](const std::string& name, Shape s) {
    const Shape got = src_->shape(name);
    if (got != s) fail(Errc::format, src_->file_of(name), name, "shape " + shape_str(got) + " does not match the config's " + shape_str(s));
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
    for (Proj pr : kAllProj) {
      const LinearShape sh = linear_shape(c, pr);
      expect(proj_tensor_prefix(i, pr) + ".weight", {sh.out, sh.in});
      if (linear_has_bias(c, pr)) expect(proj_tensor_prefix(i, pr) + ".bias", {sh.out});
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
  for (Proj pr : kAllProj) {
    const std::string n = proj_tensor_prefix(i, pr);
    const LinearShape sh = linear_shape(c, pr);
    w[pr].W = read_matrix(*src_, n + ".weight", sh.out, sh.in);
    src_->release(n + ".weight");
    if (src_->has(n + ".bias")) w[pr].b = read_vector(*src_, n + ".bias", sh.out);
    w[pr].act = src_->act_quant(n);
    if (w[pr].act.mode != ActQuant::none && integer_path_) src_->read_int8(n, &w[pr].Wi, &w[pr].w_scale);
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
