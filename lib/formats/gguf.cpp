#include "formats/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/bits.h"
#include "core/error.h"
#include "core/json_field.h"
#include "core/parallel.h"
#include "core/progress.h"
#include "formats/fake.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "model/weights.h"

#include <unistd.h>

namespace ptq {

using nlohmann::json;

namespace {
enum : uint32_t { T_U8 = 0, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 };
constexpr uint64_t kAlign = 32;

struct Buf {
  std::string b;
  template <class T> void put(T v) { b.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void str(const std::string& s) { put<uint64_t>(s.size()); b += s; }
  void kv_u32(const std::string& k, uint32_t v) { str(k); put<uint32_t>(T_U32); put(v); }
  void kv_f32(const std::string& k, float v) { str(k); put<uint32_t>(T_F32); put(v); }
  void kv_bool(const std::string& k, bool v) { str(k); put<uint32_t>(T_BOOL); put<uint8_t>(v); }
  void kv_str(const std::string& k, const std::string& v) { str(k); put<uint32_t>(T_STR); str(v); }
  void kv_strs(const std::string& k, const std::vector<std::string>& v) {
    str(k); put<uint32_t>(T_ARR); put<uint32_t>(T_STR); put<uint64_t>(v.size());
    for (auto& s : v) str(s);
  }
  template <class T> void kv_arr(const std::string& k, uint32_t type, const std::vector<T>& v) {
    str(k); put<uint32_t>(T_ARR); put<uint32_t>(type); put<uint64_t>(v.size());
    for (auto& x : v) put(x);
  }
};

size_t type_size(GgmlType t, int64_t n) {
  switch (t) {
    case GgmlType::F32: return size_t(n) * 4;
    case GgmlType::F16:
    case GgmlType::BF16: return size_t(n) * 2;
    default: return size_t(n / ggml_block_elems(t)) * size_t(ggml_block_bytes(t));
  }
}
}  // namespace

int64_t gguf_permuted_row(int64_t r, int hd) {
  const int64_t h = r / hd, w = r % hd, j = w / (hd / 2), i = w % (hd / 2);
  return h * hd + 2 * i + j;
}

std::string gguf_arch(const LlamaConfig& c) {
  if (c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "mixtral") return "llama";
  if (c.model_type == "qwen3_moe") return "qwen3moe";
  return c.model_type;   // qwen2, qwen3, phi3: llama.cpp's names are the model types
}

namespace {
// Whether a Hugging Face tensor is one whose rows llama.cpp permutes for llama (q_proj, k_proj):
// the writer permutes them, and every reader of codes or weights puts them back.
bool qk_rows(const std::string& hf) { return hf.find("q_proj") != std::string::npos || hf.find("k_proj") != std::string::npos; }
// "model.layers.12.block_sparse_moe.experts.3.w1.weight" -> 3 (-1: not an expert's)
int expert_of(const std::string& n) {
  const size_t p = n.find(".experts.");
  return p == std::string::npos ? -1 : std::atoi(n.c_str() + p + 9);
}
}  // namespace

std::string hf_to_gguf_name(const std::string& n) {
  if (n == "model.embed_tokens.weight") return "token_embd.weight";
  if (n == "model.norm.weight") return "output_norm.weight";
  if (n == "lm_head.weight") return "output.weight";
  const int l = layer_of(n);
  if (l < 0) return "";
  const std::string prefix = "model.layers." + std::to_string(l) + ".";
  if (n.compare(0, prefix.size(), prefix) != 0) return "";
  std::string rest = n.substr(prefix.size());
  if (const int e = expert_of(n); e >= 0) {   // every expert's Linear goes into one stacked tensor per role
    const std::string role = rest.substr(rest.find(".experts.") + 9 + std::to_string(e).size() + 1);
    static const std::pair<const char*, const char*> ex[] = {{"gate_proj.weight", "ffn_gate_exps.weight"}, {"up_proj.weight", "ffn_up_exps.weight"},
                                                             {"down_proj.weight", "ffn_down_exps.weight"}, {"w1.weight", "ffn_gate_exps.weight"},
                                                             {"w3.weight", "ffn_up_exps.weight"},     {"w2.weight", "ffn_down_exps.weight"}};
    for (auto& [hf, gg] : ex)
      if (role == hf) return "blk." + std::to_string(l) + "." + gg;
    return "";
  }
  // llama.cpp's tensor names (src/llama-arch.cpp), by the Hugging Face name's tail
  static const std::pair<const char*, const char*> m[] = {
      {"input_layernorm.weight", "attn_norm.weight"},     {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},          {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},          {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"}, {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},       {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},       {"mlp.gate_up_proj.weight", "ffn_up.weight"},   // phi3: [gate; up]
      {"mlp.gate.weight", "ffn_gate_inp.weight"},        {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"}};
  for (auto& [hf, gg] : m)
    if (rest == hf) return "blk." + std::to_string(l) + "." + gg;
  return "";
}

std::string llama_ftype_name(int64_t t) {
  static const std::map<int64_t, const char*> names = {
      {0, "all F32"}, {1, "F16"},        {2, "Q4_0"},     {3, "Q4_1"},    {7, "Q8_0"},     {8, "Q5_0"},     {9, "Q5_1"},     {10, "Q2_K"},
      {11, "Q3_K_S"}, {12, "Q3_K_M"},    {13, "Q3_K_L"},  {14, "Q4_K_S"}, {15, "Q4_K_M"},  {16, "Q5_K_S"},  {17, "Q5_K_M"},  {18, "Q6_K"},
      {19, "IQ2_XXS"}, {20, "IQ2_XS"},   {21, "Q2_K_S"},  {22, "IQ3_XS"}, {23, "IQ3_XXS"}, {24, "IQ1_S"},   {25, "IQ4_NL"},  {26, "IQ3_S"},
      {27, "IQ3_M"},  {28, "IQ2_S"},     {29, "IQ2_M"},   {30, "IQ4_XS"}, {31, "IQ1_M"},   {32, "BF16"}};
  auto it = names.find(t);
  return it == names.end() ? "unknown" : it->second;
}

namespace {
// llama.cpp's general.file_type (llama_ftype) for the tensors' types: that of the most common
// block type, a K type with Q6_K beside it read as the _M mix.
uint32_t file_type(const std::map<GgmlType, int>& n, GgmlType ftype) {
  if (n.empty()) return ftype == GgmlType::F32 ? 0 : ftype == GgmlType::BF16 ? 32 : 1;
  GgmlType top = n.begin()->first;
  for (auto& [t, k] : n)
    if (k > n.at(top) || (k == n.at(top) && (t == GgmlType::Q4_K || t == GgmlType::Q5_K))) top = t;
  const bool q6 = n.count(GgmlType::Q6_K) > 0;
  switch (top) {
    case GgmlType::Q4_0: return 2;
    case GgmlType::Q4_1: return 3;
    case GgmlType::Q8_0: return 7;
    case GgmlType::Q5_0: return 8;
    case GgmlType::Q5_1: return 9;
    case GgmlType::Q4_K: return q6 ? 15 : 14;
    case GgmlType::Q5_K: return q6 ? 17 : 16;
    case GgmlType::Q6_K: return 18;
    default: return 1;
  }
}

uint16_t f16_exact(float v, const std::string& file, const std::string& tensor, const char* what) {
  const uint16_t h = f32_to_f16_bits(v);
  if (f16_bits_to_f32(h) != v) fail(Errc::numeric, file, tensor, std::string("gguf: a ") + what + " is not an f16 value (" + std::to_string(v) + ")");
  return h;
}
// sc (and mc) of a K-quant group: the integer its scale (min) is d (dmin) times, exactly, in [lo, hi].
int k_multiple(float v, float d, int lo, int hi, const std::string& file, const std::string& tensor) {
  const float k = d > 0.0f ? std::nearbyint(v / d) : 0.0f;
  if (d * k != v || k < float(lo) || k > float(hi))
    fail(Errc::numeric, file, tensor, "gguf: a sub-block scale " + std::to_string(v) + " is not an integer multiple in [" + std::to_string(lo) + ", " +
                                          std::to_string(hi) + "] of the super-block's " + std::to_string(d));
  return int(k);
}

// Block b of row r of q: its grid's parameters as the block stores them, each checked to be exact.
BlockParams block_params(const QuantizedLinear& q, GgmlType t, int64_t r, int64_t b, const std::string& file, const std::string& tensor) {
  BlockParams p;
  const int be = ggml_block_elems(t);
  if (be == kQK) {
    const int64_t g = q.g_idx[size_t(b * kQK)];
    p.d = f16_exact(q.scales[size_t(g * q.rows + r)], file, tensor, "scale");
    if (t == GgmlType::Q4_1 || t == GgmlType::Q5_1) p.m = f16_exact(q.mins[size_t(g * q.rows + r)], file, tensor, "min");
    return p;
  }
  const float d = q.super_d[size_t(b * q.rows + r)];
  p.d = f16_exact(d, file, tensor, "super-block d");
  const int n = t == GgmlType::Q6_K ? 16 : 8, gs = be / n;
  float dmin = 0.0f;
  if (t != GgmlType::Q6_K) {
    dmin = q.super_dmin[size_t(b * q.rows + r)];
    p.dmin = f16_exact(dmin, file, tensor, "super-block dmin");
  }
  for (int j = 0; j < n; ++j) {
    const size_t k = size_t(int64_t(q.g_idx[size_t(b * be + j * gs)]) * q.rows + r);
    if (t == GgmlType::Q6_K) {
      p.sc[j] = k_multiple(q.scales[k], d, -128, 127, file, tensor);
    } else {
      p.sc[j] = k_multiple(q.scales[k], d, 0, 63, file, tensor);
      p.mc[j] = k_multiple(-q.mins[k], dmin, 0, 63, file, tensor);
    }
  }
  return p;
}
}  // namespace

std::unique_ptr<Tokenizer> gguf_tokenizer(const std::string& model_dir, const LlamaConfig& c) {
  try {
    return load_tokenizer(model_dir, c.bos_token_id);
  } catch (const Error& e) {
    fail(e.code, e.file, e.field, e.message + " (a GGUF file embeds the model's vocabulary: add the tokenizer files, or export another format)");
  }
}
VocabInfo gguf_vocab(const std::string& model_dir, const LlamaConfig& c) { return gguf_tokenizer(model_dir, c)->vocab_info(); }

namespace {
// The rows of a float tensor with no Hessian (output, token_embd) as f32, chunk by chunk: each row's
// blocks depend on that row alone, so the chunks give the bytes of the whole at once.
template <class Encode>
void by_row_chunks(const LlamaModel& model, const std::string& hf, int64_t rows, int64_t cols, Encode&& encode) {
  constexpr int64_t kChunk = 1024;
  std::vector<int32_t> idx;
  MatF W;
  for (int64_t r0 = 0; r0 < rows; r0 += kChunk) {
    const int64_t n = std::min(kChunk, rows - r0);
    idx.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) idx[size_t(i)] = int32_t(r0 + i);
    W.resize(n, cols);
    model.weights().read_rows_f32(hf, idx, W.data());
    encode(W, r0, n);
  }
}
}  // namespace

std::string gguf_table_bytes(const LlamaModel& model, const std::string& hf, GgmlType type) {
  const Shape s = model.weights().shape(hf);
  if (s.size() != 2 || s[1] % ggml_block_elems(type)) fail(Errc::usage, model.weights().file_of(hf), hf, std::string("gguf: not rows of whole ") + ggml_type_name(type) + " blocks");
  const int64_t rows = s[0], cols = s[1];
  const size_t row_bytes = size_t(type_size(type, cols));
  std::string b(size_t(rows) * row_bytes, '\0');
  by_row_chunks(model, hf, rows, cols, [&](const MatF& W, int64_t r0, int64_t n) {
    parallel_for(n, [&](int64_t i) { quantize_row_ggml(type, &W(i, 0), cols, b.data() + size_t(r0 + i) * row_bytes); });
  });
  return b;
}

std::pair<std::string, std::string> gguf_table_names(const Checkpoint& ck) {
  std::pair<std::string, std::string> n;
  for (const std::string& hf : ordered_tensor_names(ck)) {
    const std::string gg = hf_to_gguf_name(hf);
    if (gg == "output.weight") n.first = hf;
    if (gg == "token_embd.weight") n.second = hf;
  }
  return n;
}

std::vector<std::string> export_gguf(const ExportJob& job) {
  const LlamaConfig& c = job.model->config();
  const std::string out = job.out_dir + "/model.gguf", arch = gguf_arch(c);
  check_format("gguf", c, {});
  const VocabInfo voc = job.vocab ? *job.vocab : gguf_vocab(job.model->dir(), c);
  // llama.cpp rotates llama's q/k rows as interleaved pairs (its converter permutes them); the
  // other families rotate halves, as Hugging Face stores them.
  const bool permute_qk = arch == "llama";

  // Tensor plan: GGUF name, type, ne (ne[0] contiguous), the Hugging Face tensors it holds (one,
  // or every expert's in expert order), and the module each part is quantized as.
  struct T {
    std::string gg;
    GgmlType type;
    std::vector<int64_t> ne;
    std::vector<std::string> parts;
    int64_t rows = 0, cols = 0;   // of one part
    std::vector<float> values;    // a tensor the writer computes (rope_freqs), f32
    bool rounded = false;         // output / token_embd in a block type: rounded to nearest here
  };
  std::vector<T> plan;
  std::map<std::string, size_t> at;   // GGUF name -> plan index
  const Checkpoint& src = job.model->checkpoint();
  const GgmlType ftype = c.dtype == DType::F32 ? GgmlType::F32 : c.dtype == DType::BF16 ? GgmlType::BF16 : GgmlType::F16;
  std::map<GgmlType, int> n_quant;   // tensors of each block type (general.file_type)
  for (auto& n : ordered_tensor_names(src)) {
    const std::string gg = hf_to_gguf_name(n);
    if (gg.empty()) fail(Errc::usage, src.file_of(n), n, "gguf: llama.cpp has no tensor for this");
    const Shape s = src.get(n).shape;
    const bool vec = s.size() == 1;
    const bool router = gg.find("ffn_gate_inp") != std::string::npos;   // kept in f32: it picks the experts
    GgmlType type = vec || router ? GgmlType::F32 : ftype;
    QuantStore::Info info;
    const std::string m = n.substr(0, n.rfind('.'));
    const std::optional<GgmlType> beside = gg == "output.weight" ? job.gguf_output : gg == "token_embd.weight" ? job.gguf_embedding : std::nullopt;
    if (beside) {
      if (s.back() % ggml_block_elems(*beside))
        fail(Errc::usage, src.file_of(n), n, std::string("gguf: ") + ggml_type_name(*beside) + " blocks do not divide its rows of " + std::to_string(s.back()));
      type = *beside;
    } else if (!vec && job.store && n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0 && job.store->info(m, &info)) {
      check_format("gguf", c, {{m, info.rows, info.cols, info.spec, true}});
      gguf_type_of(info.spec, &type);
      n_quant[type]++;
    }
    if (auto it = at.find(gg); it != at.end()) {   // the next expert of a stacked tensor
      T& t = plan[it->second];
      if (t.type != type || t.rows != s[0] || t.cols != s.back())
        fail(Errc::usage, src.file_of(n), n, "gguf: every expert of " + gg + " must have the same shape and quantization");
      t.parts.push_back(n);
      t.ne[2] = int64_t(t.parts.size());
      continue;
    }
    T t{gg, type, {}, {n}, vec ? 1 : s[0], s.back(), {}, beside.has_value()};
    t.ne = vec ? std::vector<int64_t>{s[0]} : std::vector<int64_t>{s.back(), s[0]};
    if (expert_of(n) >= 0) {
      if (expert_of(n) != 0) fail(Errc::usage, src.file_of(n), n, "gguf: the experts of " + gg + " must start at expert 0");
      t.ne.push_back(1);
    }
    at[gg] = plan.size();
    plan.push_back(t);
  }
  // Llama 3.1+ rope scaling: llama.cpp divides each rotary frequency by rope_freqs[i], the
  // unscaled frequency over the scaled one (model/llama.h: rope_inv_freq, as the model scales it).
  if (c.rope_scaling) {
    LlamaConfig plain = c;
    plain.rope_scaling.reset();
    const std::vector<double> f0 = rope_inv_freq(plain), f = rope_inv_freq(c);
    T t{"rope_freqs.weight", GgmlType::F32, {int64_t(f.size())}, {}, 1, int64_t(f.size()), {}};
    for (size_t i = 0; i < f.size(); ++i) t.values.push_back(float(f0[i] / f[i]));
    plan.insert(plan.begin(), t);
  }
  Buf h;
  h.b = "GGUF";
  h.put<uint32_t>(3);
  h.put<uint64_t>(plan.size());
  Buf kv;
  uint64_t n_kv = 0;
  auto count = [&](auto&& f) { f(); ++n_kv; };
  const std::string a = arch + ".";
  count([&] { kv.kv_str("general.architecture", arch); });
  count([&] { kv.kv_str("general.name", std::filesystem::path(job.model->dir()).filename().string()); });
  // the file type asked for (export.gguf_type), as llama.cpp's quantizer writes its ftype; else the
  // one the Linears' types read as
  const int asked = llama_ftype_of(job.gguf_type);
  count([&] { kv.kv_u32("general.file_type", asked >= 0 && !n_quant.empty() ? uint32_t(asked) : file_type(n_quant, ftype)); });
  count([&] { kv.kv_u32("general.quantization_version", 2); });
  count([&] { kv.kv_u32("general.alignment", uint32_t(kAlign)); });
  count([&] { kv.kv_str("general.quantized_by", "ptqkit (GPTQ codes written as blocks)"); });
  count([&] { kv.kv_u32(a + "context_length", uint32_t(c.max_position_embeddings)); });
  count([&] { kv.kv_u32(a + "embedding_length", uint32_t(c.hidden_size)); });
  count([&] { kv.kv_u32(a + "block_count", uint32_t(c.num_hidden_layers)); });
  count([&] { kv.kv_u32(a + "feed_forward_length", uint32_t(c.intermediate_size)); });
  count([&] { kv.kv_u32(a + "rope.dimension_count", uint32_t(c.rotary_dim())); });
  count([&] { kv.kv_u32(a + "attention.head_count", uint32_t(c.num_attention_heads)); });
  count([&] { kv.kv_u32(a + "attention.head_count_kv", uint32_t(c.num_key_value_heads)); });
  count([&] { kv.kv_u32(a + "attention.key_length", uint32_t(c.head_dim)); });
  count([&] { kv.kv_u32(a + "attention.value_length", uint32_t(c.head_dim)); });
  count([&] { kv.kv_f32(a + "attention.layer_norm_rms_epsilon", float(c.rms_norm_eps)); });
  count([&] { kv.kv_f32(a + "rope.freq_base", float(c.rope_theta)); });
  count([&] { kv.kv_u32(a + "vocab_size", uint32_t(c.vocab_size)); });
  if (c.moe != MoeRouting::none) {
    count([&] { kv.kv_u32(a + "expert_count", uint32_t(c.num_experts)); });
    count([&] { kv.kv_u32(a + "expert_used_count", uint32_t(c.experts_per_token)); });
    if (arch == "qwen3moe") count([&] { kv.kv_u32(a + "expert_feed_forward_length", uint32_t(c.moe_intermediate_size)); });
  }
  count([&] { kv.kv_str("tokenizer.ggml.model", voc.ggml_model); });
  // The pre-tokenizer llama.cpp splits byte-level BPE text with: Qwen's regex for the Qwen
  // families (what llama.cpp's converter names "qwen2" for Qwen2 and Qwen3 alike), else GPT-2's.
  if (voc.ggml_model == "gpt2") count([&] { kv.kv_str("tokenizer.ggml.pre", arch.rfind("qwen", 0) == 0 ? "qwen2" : "default"); });
  std::vector<std::string> tokens = voc.tokens;
  std::vector<float> scores = voc.scores;
  std::vector<int32_t> types = voc.types;
  while (int(tokens.size()) < c.vocab_size) {   // the model's embedding may be larger than the vocabulary
    tokens.push_back("[PAD" + std::to_string(tokens.size()) + "]");
    if (!scores.empty()) scores.push_back(0.0f);
    types.push_back(5);
  }
  count([&] { kv.kv_strs("tokenizer.ggml.tokens", tokens); });
  if (!scores.empty()) count([&] { kv.kv_arr("tokenizer.ggml.scores", T_F32, scores); });
  count([&] { kv.kv_arr("tokenizer.ggml.token_type", T_I32, types); });
  if (voc.ggml_model == "gpt2") count([&] { kv.kv_strs("tokenizer.ggml.merges", voc.merges); });   // (llama.cpp requires the key)
  if (voc.bos >= 0) count([&] { kv.kv_u32("tokenizer.ggml.bos_token_id", uint32_t(voc.bos)); });
  if (voc.eos >= 0) count([&] { kv.kv_u32("tokenizer.ggml.eos_token_id", uint32_t(voc.eos)); });
  if (voc.unk >= 0) count([&] { kv.kv_u32("tokenizer.ggml.unknown_token_id", uint32_t(voc.unk)); });
  count([&] { kv.kv_bool("tokenizer.ggml.add_bos_token", voc.bos >= 0); });
  count([&] { kv.kv_bool("tokenizer.ggml.add_eos_token", false); });
  h.put<uint64_t>(n_kv);
  h.b += kv.b;
  uint64_t off = 0;
  for (auto& t : plan) {
    h.str(t.gg);
    h.put<uint32_t>(uint32_t(t.ne.size()));
    int64_t n = 1;
    for (int64_t d : t.ne) { h.put<uint64_t>(uint64_t(d)); n *= d; }
    h.put<uint32_t>(uint32_t(t.type));
    h.put<uint64_t>(off);
    off += (type_size(t.type, n) + kAlign - 1) / kAlign * kAlign;
  }
  while (h.b.size() % kAlign) h.b += '\0';

  const std::string tmp = out + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) fail(Errc::io, out, "", "cannot create");
    f.write(h.b.data(), std::streamsize(h.b.size()));
    std::string data;
    Progress bar("write gguf", double(plan.size()), "tensors");
    for (auto& t : plan) {
      bar.update(double(&t - plan.data()), t.gg);
      data.clear();
      data.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * 4);
      for (const std::string& hf : t.parts) {
        const bool perm = permute_qk && qk_rows(hf);
        auto row_of = [&](int64_t gg_row) -> int64_t {   // GGUF row -> HF row
          if (!perm) return gg_row;
          const int hd = c.head_dim;
          const int64_t h = gg_row / hd, w = gg_row % hd, i = w / 2, j = w % 2;
          return h * hd + j * (hd / 2) + i;
        };
        // Each GGUF row is formed apart, on the threads, into its place in `data` (the bytes do not
        // depend on the thread count; an error names the first row a serial loop would meet).
        const size_t at = data.size(), row_bytes = size_t(type_size(t.type, t.cols));
        data.resize(at + size_t(t.rows) * row_bytes);
        char* dst = data.data() + at;
        // GGUF rows [first, first + n) as blocks of q's rows q_row(i), i < n.
        auto encode_rows = [&](const QuantizedLinear& q, int64_t first, int64_t n, auto&& q_row) {
          const int be = ggml_block_elems(t.type), bb = ggml_block_bytes(t.type);
          if (q.cols != t.cols) fail(Errc::usage, out, hf, "gguf: the quantized module's width is not the tensor's");
          parallel_for(n, [&](int64_t i) {
            thread_local std::vector<uint8_t> code;   // the row's codes, one byte each
            code.resize(size_t(t.cols));
            const int64_t r = q_row(i);
            q.row_codes(r, code.data());
            for (int64_t b = 0; b < t.cols / be; ++b)
              encode_block(t.type, block_params(q, t.type, r, b, out, hf), code.data() + b * be, dst + size_t(first + i) * row_bytes + size_t(b * bb));
          });
        };
        if (t.rounded && !job.gguf_mse) {
          // llama.cpp's own quantizer of the type: the bytes llama_model_quantize writes (ggml_quantize.cpp)
          const GgufTable* ready = nullptr;
          if (job.gguf_tables)
            if (auto it = job.gguf_tables->find(hf); it != job.gguf_tables->end() && it->second.type == t.type) ready = &it->second;
          const std::string formed = ready ? std::string() : gguf_table_bytes(*job.model, hf, t.type);
          const std::string& b = ready ? ready->bytes : formed;
          if (b.size() != size_t(t.rows) * row_bytes) fail(Errc::usage, out, hf, "gguf: the blocks formed ahead do not fill the tensor");
          std::memcpy(dst, b.data(), b.size());
        } else if (t.rounded) {
          // with gguf_mse: rounded to nearest on the type's grid with the MSE clipping search
          QuantSpec spec;
          spec.method = "rtn";
          spec.mse = job.gguf_mse;
          spec.scale_dtype = DType::F16;
          apply_gguf_type(ggml_type_name(t.type), spec);
          by_row_chunks(*job.model, hf, t.rows, t.cols,
                        [&](const MatF& W, int64_t r0, int64_t n) { encode_rows(rtn_quantize(W, spec), r0, n, [](int64_t i) { return i; }); });
        } else if (ggml_block_elems(t.type) > 1) {
          encode_rows(*job.store->get(hf.substr(0, hf.size() - 7)), 0, t.rows, row_of);
        } else {
          // A float tensor stored as the GGUF type (f16 or bf16 into the same, f32 into F32) is
          // copied row by row; any other is converted through f32, as the type's rounding. A tensor
          // the run replaced (a smoothed norm, a float Linear it feeds) is converted from the run's.
          const TensorView v = src.get(hf);
          const DType as = t.type == GgmlType::F32 ? DType::F32 : t.type == GgmlType::BF16 ? DType::BF16 : DType::F16;
          std::vector<float> w;
          if (VecF o; job.store && job.store->float_override(hf, &o)) {
            if (o.size() != t.rows * t.cols) fail(Errc::format, out, hf, "the run's replacement holds " + std::to_string(o.size()) + " values, not the tensor's");
            w.assign(o.data(), o.data() + o.size());
          } else if (v.dtype != as) {
            w.resize(size_t(t.rows * t.cols));
            job.model->weights().read_f32(hf, w.data());
          }
          parallel_for(t.rows, [&](int64_t gr) {
            const int64_t r = row_of(gr);
            if (w.empty()) std::memcpy(dst + size_t(gr) * row_bytes, v.data + size_t(r) * row_bytes, row_bytes);
            else convert_from_f32(as, &w[size_t(r * t.cols)], dst + size_t(gr) * row_bytes, size_t(t.cols));
          });
        }
      }
      while (data.size() % kAlign) data += '\0';
      f.write(data.data(), std::streamsize(data.size()));
    }
    bar.update(double(plan.size()));
    f.flush();
    if (!f) { std::filesystem::remove(tmp); fail(Errc::io, out, "", "write failed (disk full?)"); }
  }
  std::filesystem::rename(tmp, out);
  std::vector<std::string> files{"model.gguf"};
  for (auto& s : copy_side_files(job.model->dir(), job.out_dir)) files.push_back(s);
  return files;
}

// ------------------------------------------------------------------ reading

namespace {
struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  const std::string& file;
  template <class T> T get(const char* what) {
    if (size_t(end - p) < sizeof(T)) fail(Errc::format, file, what, "truncated");
    T v;
    std::memcpy(&v, p, sizeof v);
    p += sizeof v;
    return v;
  }
  std::string str(const char* what) {
    const uint64_t n = get<uint64_t>(what);
    if (n > uint64_t(end - p)) fail(Errc::format, file, what, "string length " + std::to_string(n) + " runs past the end of the file");
    std::string s(reinterpret_cast<const char*>(p), size_t(n));
    p += n;
    return s;
  }
  json value(uint32_t type, const std::string& key, int depth = 0) {
    switch (type) {
      case T_U8: return get<uint8_t>(key.c_str());
      case T_I8: return get<int8_t>(key.c_str());
      case T_U16: return get<uint16_t>(key.c_str());
      case T_I16: return get<int16_t>(key.c_str());
      case T_U32: return get<uint32_t>(key.c_str());
      case T_I32: return get<int32_t>(key.c_str());
      case T_F32: return get<float>(key.c_str());
      case T_BOOL: return get<uint8_t>(key.c_str()) != 0;
      case T_STR: return str(key.c_str());
      case T_U64: return get<uint64_t>(key.c_str());
      case T_I64: return get<int64_t>(key.c_str());
      case T_F64: return get<double>(key.c_str());
      case T_ARR: {
        if (depth > 0) fail(Errc::format, file, key, "nested arrays are not supported");
        const uint32_t et = get<uint32_t>(key.c_str());
        const uint64_t n = get<uint64_t>(key.c_str());
        if (n > uint64_t(end - p)) fail(Errc::format, file, key, "array length " + std::to_string(n) + " runs past the end of the file");
        json a = json::array();
        for (uint64_t i = 0; i < n; ++i) {
          json v = value(et, key, 1);
          if (i < 64) a.push_back(v);
        }
        if (n > 64) return json{{"array_length", n}, {"first", a}};
        return a;
      }
    }
    fail(Errc::format, file, key, "unknown metadata value type " + std::to_string(type));
  }
};
}  // namespace

GgufFile::GgufFile(const std::string& path) : map_(path) {
  Reader r{map_.data(), map_.data() + map_.size(), path};
  if (map_.size() < 24 || std::memcmp(map_.data(), "GGUF", 4) != 0) fail(Errc::format, path, "magic", "not a GGUF file");
  r.p += 4;
  const uint32_t version = r.get<uint32_t>("version");
  if (version != 3 && version != 2) fail(Errc::format, path, "version", "unsupported GGUF version " + std::to_string(version));
  const uint64_t nt = r.get<uint64_t>("tensor_count"), nkv = r.get<uint64_t>("kv_count");
  if (nt > map_.size() || nkv > map_.size()) fail(Errc::format, path, "header", "counts exceed the file size");
  meta_ = json::object();
  for (uint64_t i = 0; i < nkv; ++i) {
    const std::string key = r.str("metadata key");
    const uint32_t type = r.get<uint32_t>(key.c_str());
    meta_[key] = r.value(type, key);
  }
  for (uint64_t i = 0; i < nt; ++i) {
    TensorInfo t;
    t.name = r.str("tensor name");
    const uint32_t nd = r.get<uint32_t>(t.name.c_str());
    if (nd < 1 || nd > 4) fail(Errc::format, path, t.name, "n_dims must be 1..4");
    int64_t n = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      t.ne.push_back(int64_t(r.get<uint64_t>(t.name.c_str())));
      if (t.ne.back() < 0 || t.ne.back() > (int64_t(1) << 40)) fail(Errc::format, path, t.name, "dimension out of range");
      if (__builtin_mul_overflow(n, t.ne.back(), &n) || n > (int64_t(1) << 48)) fail(Errc::format, path, t.name, "too many elements");
    }
    const uint32_t ty = r.get<uint32_t>(t.name.c_str());
    t.type = GgmlType(ty);
    if (ty > 30 || std::string(ggml_type_name(t.type)) == "?")
      fail(Errc::format, path, t.name, "ggml type " + std::to_string(ty) + " is not read (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K are)");
    if (t.ne[0] % ggml_block_elems(t.type))
      fail(Errc::format, path, t.name, "ne[0] " + std::to_string(t.ne[0]) + " is not a multiple of " + ggml_type_name(t.type) + "'s block of " + std::to_string(ggml_block_elems(t.type)));
    t.offset = r.get<uint64_t>(t.name.c_str());
    t.nbytes = type_size(t.type, n);
    by_name_[t.name] = tensors_.size();
    tensors_.push_back(t);
  }
  uint64_t align = kAlign;
  if (meta_.contains("general.alignment")) {
    const json& a = meta_["general.alignment"];
    if (!a.is_number_unsigned()) fail(Errc::format, path, "general.alignment", "must be an unsigned integer");
    align = a.get<uint64_t>();
  }
  if (align == 0 || (align & (align - 1)) || align > map_.size()) fail(Errc::format, path, "general.alignment", "must be a power of two no larger than the file");
  // Every sum below is bounded by the file size before it is formed: offsets come from the file and may be anything.
  const uint64_t size = map_.size(), data_start = (uint64_t(r.p - map_.data()) + align - 1) / align * align;
  for (auto& t : tensors_) {
    if (data_start > size || t.offset > size - data_start || t.nbytes > size - data_start - t.offset)
      fail(Errc::format, path, t.name, "data lies outside the file (offset " + std::to_string(t.offset) + ", " + std::to_string(t.nbytes) + " bytes)");
    t.data = map_.data() + data_start + t.offset;
  }
}

const GgufFile::TensorInfo* GgufFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

namespace {
// Elements [first, first + n) of t, dequantized (first and n multiples of the type's block).
void decode(const GgufFile::TensorInfo& t, int64_t first, int64_t n, float* out) {
  switch (t.type) {
    case GgmlType::F32: std::memcpy(out, reinterpret_cast<const float*>(t.data) + first, size_t(n) * 4); break;
    case GgmlType::F16: convert_to_f32(DType::F16, t.data + size_t(first) * 2, out, size_t(n)); break;
    case GgmlType::BF16: convert_to_f32(DType::BF16, t.data + size_t(first) * 2, out, size_t(n)); break;
    default: dequantize_row(t.type, t.data + size_t(first / ggml_block_elems(t.type)) * size_t(ggml_block_bytes(t.type)), out, n);
  }
}
}  // namespace

void GgufFile::read_f32(const TensorInfo& t, float* out) const {
  int64_t n = 1;
  for (auto d : t.ne) n *= d;
  // by rows on the threads (a row holds whole blocks): a 7B model's Q6_K output alone is 131 M values
  const int64_t cols = t.ne.empty() ? 1 : t.ne[0], rows = cols ? n / cols : 0, per = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(cols, 1));
  parallel_for((rows + per - 1) / per, [&](int64_t i) {
    const int64_t r0 = i * per, r1 = std::min(rows, r0 + per);
    decode(t, r0 * cols, (r1 - r0) * cols, out + r0 * cols);
  });
}

void GgufFile::read_rows_f32(const TensorInfo& t, const std::vector<int32_t>& rows, float* out) const {
  if (t.ne.size() != 2) fail(Errc::format, path(), t.name, "rows read from a tensor that is not 2-D");
  const int64_t cols = t.ne[0];   // a row holds whole blocks: ne0 is a multiple of the block for the quantized types
  check_rows(rows, t.ne[1], path(), t.name);
#pragma omp parallel for schedule(static) if (rows.size() > 1024)
  for (int64_t i = 0; i < int64_t(rows.size()); ++i) decode(t, int64_t(rows[size_t(i)]) * cols, cols, out + i * cols);
}

json gguf_config_json(const GgufFile& f) {
  const json& m = f.metadata();
  // Each key's type checked: a GGUF of another architecture's conventions is refused naming the key.
  auto num = [&](const char* k, const json& def = nullptr) -> json {   // def null: required
    if (!m.contains(k)) {
      if (def.is_null()) fail(Errc::format, f.path(), k, "missing");
      return def;
    }
    if (!m[k].is_number()) fail(Errc::format, f.path(), k, "must be a number");
    return m[k];
  };
  if (json_field<std::string>(m, "general.architecture", "", Errc::format, f.path()) != "llama")
    fail(Errc::format, f.path(), "general.architecture", "only llama is read (the other families are written for llama.cpp, not read back)");
  if (f.find("rope_freqs.weight")) fail(Errc::format, f.path(), "rope_freqs.weight", "rope-scaled (Llama 3.1) GGUF files are written, not read back");
  const json heads = num("llama.attention.head_count");
  json c = {{"model_type", "llama"},
            {"hidden_size", num("llama.embedding_length")},
            {"intermediate_size", num("llama.feed_forward_length")},
            {"num_hidden_layers", num("llama.block_count")},
            {"num_attention_heads", heads},
            {"num_key_value_heads", m.contains("llama.attention.head_count_kv") ? num("llama.attention.head_count_kv") : heads},
            {"max_position_embeddings", num("llama.context_length")},
            {"rms_norm_eps", num("llama.attention.layer_norm_rms_epsilon")},
            {"rope_theta", num("llama.rope.freq_base", 10000.0)},
            {"tie_word_embeddings", f.find("output.weight") == nullptr},
            {"bos_token_id", num("tokenizer.ggml.bos_token_id", 1)},
            {"torch_dtype", "float16"}};
  const auto* emb = f.find("token_embd.weight");
  if (!emb || emb->ne.size() != 2) fail(Errc::format, f.path(), "token_embd.weight", "missing");
  c["vocab_size"] = emb->ne[1];
  if (m.contains("llama.rope.dimension_count")) c["head_dim"] = num("llama.rope.dimension_count");
  return c;
}

namespace {
class GgufSource final : public WeightSource {
 public:
  GgufSource(const std::string& path, const LlamaConfig& c) : f_(path), hd_(c.head_dim) {}
  const GgufFile::TensorInfo& info(const std::string& n) const {
    const std::string gg = hf_to_gguf_name(n);
    const auto* t = gg.empty() ? nullptr : f_.find(gg);
    if (!t) fail(Errc::format, f_.path(), n, "tensor missing (GGUF name '" + gg + "')");
    return *t;
  }
  bool has(const std::string& n) const override {
    const std::string gg = hf_to_gguf_name(n);
    return !gg.empty() && f_.find(gg);
  }
  Shape shape(const std::string& n) const override {
    const auto& t = info(n);
    return t.ne.size() == 1 ? Shape{t.ne[0]} : Shape{t.ne[1], t.ne[0]};
  }
  std::string file_of(const std::string&) const override { return f_.path(); }
  void read_f32(const std::string& n, float* out) const override {
    const auto& t = info(n);
    if (!qk_rows(n)) return f_.read_f32(t, out);
    const int64_t rows = t.ne[1], cols = t.ne[0];
    std::vector<float> g(static_cast<size_t>(rows * cols));
    f_.read_f32(t, g.data());
    for (int64_t r = 0; r < rows; ++r) std::memcpy(out + r * cols, &g[size_t(gguf_permuted_row(r, hd_) * cols)], size_t(cols) * 4);
  }
  void read_rows_f32(const std::string& n, const std::vector<int32_t>& rows, float* out) const override {
    if (qk_rows(n)) return WeightSource::read_rows_f32(n, rows, out);   // rows stored in llama.cpp's rotary order
    f_.read_rows_f32(info(n), rows, out);
  }
 private:
  GgufFile f_;
  int hd_;
};
}  // namespace

std::unique_ptr<WeightSource> gguf_source(const std::string& path, const LlamaConfig& c) { return std::make_unique<GgufSource>(path, c); }

bool gguf_quantized(const GgufFile& f, const std::string& n, int hd, QuantizedLinear* out) {
  const std::string gg = hf_to_gguf_name(n);
  const GgufFile::TensorInfo* t = gg.empty() ? nullptr : f.find(gg);
  if (!t || t->ne.size() != 2 || ggml_block_elems(t->type) == 1) return false;
  if (!out) return true;
  const GgmlType type = t->type;
  const int64_t rows = t->ne[1], cols = t->ne[0], be = ggml_block_elems(type), blocks = cols / be, gb = ggml_block_group(type), gpb = be / gb;
  const size_t bb = size_t(ggml_block_bytes(type));
  QuantSpec spec;
  const std::string why = apply_gguf_type(ggml_type_name(type), spec);   // bits and grid form of the type
  if (!why.empty()) fail(Errc::format, "", gg, why);
  QuantizedLinear q = formats::unpacked_shape(spec.bits, spec.sym, rows, cols, blocks * gpb);
  q.name = n;
  q.spec = spec;
  q.spec.group_size = int(gb);
  const int64_t G = q.groups;
  const bool min = has_min(spec.form);
  q.scales.resize(size_t(G * rows));
  q.zeros.assign(size_t(G * rows), 0);
  if (min) q.mins.resize(size_t(G * rows));
  q.g_idx.resize(size_t(cols));
  for (int64_t c = 0; c < cols; ++c) q.g_idx[size_t(c)] = int32_t(c / gb);
  // Row by row on the threads: the row's blocks decoded to one byte a code, then packed into its
  // stream (no buffer of the whole matrix's bytes: 6.5 GB for a 7B model's Linears).
  const bool perm = qk_rows(n);
  const int64_t nw = packed_words(cols, spec.bits);
  q.packed.resize(size_t(rows * nw));
#pragma omp parallel for schedule(static) if (rows * cols > (int64_t(1) << 20))
  for (int64_t r = 0; r < rows; ++r) {
    thread_local std::vector<uint8_t> codes;
    codes.resize(size_t(cols));
    const uint8_t* src = t->data + size_t(perm ? gguf_permuted_row(r, hd) : r) * size_t(blocks) * bb;
    BlockGrid grid[16];
    for (int64_t b = 0; b < blocks; ++b) {
      decode_block(type, src + size_t(b) * bb, codes.data() + b * be, grid);
      for (int64_t j = 0; j < gpb; ++j) {
        const size_t k = size_t((b * gpb + j) * rows + r);
        q.scales[k] = grid[j].scale;
        q.zeros[k] = grid[j].zero;
        if (min) q.mins[k] = grid[j].min;
      }
    }
    pack_stream(codes.data(), cols, spec.bits, q.packed.data() + r * nw);
  }
  *out = std::move(q);
  return true;
}

int llama_ftype_of(const std::string& name) {
  static const std::map<std::string, int> n = {{"Q4_0", 2}, {"Q4_1", 3}, {"Q8_0", 7}, {"Q5_0", 8}, {"Q5_1", 9}, {"Q4_K_S", 14},
                                               {"Q4_K_M", 15}, {"Q5_K_S", 16}, {"Q5_K_M", 17}, {"Q6_K", 18}};
  auto it = n.find(name);
  return it == n.end() ? -1 : it->second;
}

GgmlType gguf_fallback_type(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_K: return GgmlType::Q5_0;
    case GgmlType::Q5_K: return GgmlType::Q5_1;
    case GgmlType::Q6_K: return GgmlType::Q8_0;
    default: return t;
  }
}

namespace {
bool fitted(GgmlType want, int64_t cols, GgmlType* t) {
  if (cols % ggml_block_elems(want)) want = gguf_fallback_type(want);
  if (cols % ggml_block_elems(want)) return false;
  *t = want;
  return true;
}
}  // namespace

bool gguf_output_type(GgmlType base, int64_t cols, GgmlType* t) {
  return fitted(base == GgmlType::Q8_0 || cols % ggml_block_elems(base) ? GgmlType::Q8_0 : GgmlType::Q6_K, cols, t);
}
bool gguf_embedding_type(GgmlType base, int64_t cols, GgmlType* t) { return fitted(base, cols, t); }

bool gguf_type_of(const QuantSpec& s, GgmlType* t, std::string* why) {
  auto no = [&](const std::string& w) { if (why) *why = w; return false; };
  if (s.act_order && !s.static_groups) return no("act-order permutes the groups, which blocks cannot: use static_groups");
  if (s.method == "nf4") return no("NF4 is not a GGUF block type");
  const int b = s.bits;
  switch (s.form) {
    case GridForm::integer_zero:
      if (s.group_size == kQK && s.sym && (b == 4 || b == 5 || b == 8)) { *t = b == 4 ? GgmlType::Q4_0 : b == 5 ? GgmlType::Q5_0 : GgmlType::Q8_0; return true; }
      return no("GPTQ's integer-zero grid is a block type's when symmetric 4-, 5- or 8-bit with group_size 32 (Q4_0, Q5_0, Q8_0); for the "
                "others set export.gguf_type (Q4_1, Q5_1, Q4_K, Q5_K, Q6_K), which solves on that type's grid");
    case GridForm::f16_min:
      if (s.group_size == kQK && (b == 4 || b == 5)) { *t = b == 4 ? GgmlType::Q4_1 : GgmlType::Q5_1; return true; }
      break;
    case GridForm::k_min:
      if (s.group_size == kQK && (b == 4 || b == 5)) { *t = b == 4 ? GgmlType::Q4_K : GgmlType::Q5_K; return true; }
      break;
    case GridForm::k_sym:
      if (s.group_size == 16 && b == 6) { *t = GgmlType::Q6_K; return true; }
      break;
  }
  return no(std::string("no block type holds the ") + grid_form_name(s.form) + " grid with " + std::to_string(b) + " bits and group_size " + std::to_string(s.group_size));
}

std::string apply_gguf_type(const std::string& name, QuantSpec& s) {
  GgmlType t;
  if (!parse_ggml_type(name.c_str(), &t))
    return "unknown GGUF type '" + name + "' (llama.cpp's names: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; the mixes Q4_K_M, Q5_K_M, Q4_K_S and Q5_K_S)";
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: s.form = GridForm::integer_zero; s.sym = true; break;
    case GgmlType::Q4_1: case GgmlType::Q5_1: s.form = GridForm::f16_min; s.sym = false; break;
    case GgmlType::Q4_K: case GgmlType::Q5_K: s.form = GridForm::k_min; s.sym = false; s.static_groups = true; break;
    case GgmlType::Q6_K: s.form = GridForm::k_sym; s.sym = true; s.static_groups = true; break;
    default: break;
  }
  s.bits = t == GgmlType::Q8_0 ? 8 : t == GgmlType::Q6_K ? 6 : (t == GgmlType::Q5_0 || t == GgmlType::Q5_1 || t == GgmlType::Q5_K) ? 5 : 4;
  s.group_size = t == GgmlType::Q6_K ? 16 : kQK;
  if (s.act_order) s.static_groups = true;   // blocks hold groups in column order
  return "";
}

void check_gguf_module(const ModulePlan& m) {
  GgmlType t;
  std::string why;
  if (!gguf_type_of(m.spec, &t, &why)) fail(Errc::usage, "", m.name, "gguf: " + why);
  const int n = ggml_block_elems(t);
  if (m.cols % n)
    fail(Errc::usage, "", m.name, std::string("gguf: ") + ggml_type_name(t) + " blocks of " + std::to_string(n) + " need in_features divisible by " + std::to_string(n) +
                                      ", got " + std::to_string(m.cols));
}

void check_gguf_model(const LlamaConfig& c) {
  auto refuse = [](const std::string& why) { fail(Errc::usage, "", "export.format", "gguf: " + why); };
  if (c.o_bias || c.mlp_bias || (c.qkv_bias && gguf_arch(c) == "llama"))
    refuse("llama.cpp reads q/k/v biases (qwen2) but not o_proj or MLP biases, nor q/k biases of a permuted llama");
  if (c.sliding_window && c.sliding_window < c.max_position_embeddings) refuse("sliding-window attention is not written yet");
  for (int l = 0; l < c.num_hidden_layers; ++l)
    if (c.moe != MoeRouting::none && !c.moe_layer(l))
      refuse("llama.cpp's " + gguf_arch(c) + " has experts in every layer; layer " + std::to_string(l) + " is dense (mlp_only_layers / decoder_sparse_step)");
  if (c.moe == MoeRouting::softmax_topk && !c.norm_topk_prob) refuse("llama.cpp's qwen3moe renormalizes the chosen experts' weights; this config has norm_topk_prob false");
}

}  // namespace ptq
