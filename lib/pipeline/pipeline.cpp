// pipeline.cpp — run_quantize: setup -> layers -> export -> report (pipeline.h).
//
// The layer loop iterates the model's layer schedule (model/schedule.h): for each group of
// Linears, the backend's forward produces the group's input and Hessian, SmoothQuant folds its
// factors where the group has a norm, the backend's solver quantizes the group, W8A8 fixes the
// group's input scales, and the forward continues with the quantized weights. Which forward and
// solver run (CPU, GPU, a float pass, saved statistics) is decided once, in backend.cpp.
#include "pipeline/pipeline.h"

#include <omp.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <optional>

#include "calib/calibration.h"
#include "core/build_info.h"
#include "core/env.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/progress.h"
#include "formats/gguf.h"
#include "formats/packed.h"
#include "model/schedule.h"
#include "pipeline/backend.h"
#include "pipeline/distributed.h"
#include "pipeline/export.h"
#include "pipeline/stats.h"
#include "quant/qstore.h"
#include "report/report_html.h"
#include "smoothquant/smoothquant.h"

namespace ptq {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void check_finite(const MatF& m, const std::string& tensor, const WeightSource& ck) {
  // Exponent bits all ones = Inf or NaN; a vectorized pass (Eigen's allFinite took 1 s per 7B layer).
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(m.data());
  bool ok = true;
#pragma omp parallel for reduction(&& : ok) schedule(static)
  for (int64_t i = 0; i < int64_t(m.size()); ++i) ok = ok && (bits[i] & 0x7f800000u) != 0x7f800000u;
  if (ok) return;
  for (Eigen::Index r = 0; r < m.rows(); ++r)
    for (Eigen::Index c = 0; c < m.cols(); ++c)
      if (!std::isfinite(m(r, c)))
        fail(Errc::numeric, ck.file_of(tensor), tensor, "contains NaN/Inf (first at [" + std::to_string(r) + ", " + std::to_string(c) + "])");
}

VecF& norm_weights(LayerWeights& w, const std::string& norm) {
  if (norm == "input_layernorm") return w.input_layernorm;
  if (norm == "post_attention_layernorm") return w.post_attention_layernorm;
  fail(Errc::usage, "", "schedule", "no norm named " + norm);
}

std::string layer_prefix(int l) { return "model.layers." + std::to_string(l) + "."; }

// Everything one run shares between its steps.

struct Run {
  Recipe r;
  QuantizeOptions opt;
  Device dev;
  PhaseTimes t;
  std::unique_ptr<LlamaModel> model;
  std::vector<std::string> known;   // every module name (patterns must match one)
  std::vector<std::string> gguf_fallback;   // Linears a GGUF-only run keeps in float (input width not a multiple of 32)
  std::vector<std::string> ct_fallback;     // Linears compressed-tensors cannot group (input width not a multiple of the group size)
  json gguf_type_fallback = json::array();   // K types on Linears whose input width is not a multiple of 256
  std::map<std::string, QuantSpec> gguf_specs;   // each Linear's spec on its GGUF block type's grid
  DType scale_dtype = DType::F16;
  bool nf4 = false, w8a8 = false;
  std::unique_ptr<Tokenizer> tok;   // the model's tokenizer, loaded once where a text calibration or GGUF needs it
  VocabInfo vocab;                  // GGUF's vocabulary, from it (empty where no GGUF is written)
  std::vector<ModulePlan> plan;     // every decoder Linear: its shape, spec and whether it is quantized (the formats' checks)
  CalibData cd;
  MatF X;                           // the embeddings, until the backend takes them
  std::unique_ptr<StatsWriter> stats_out;
  std::unique_ptr<StatsReader> stats_in;
  json stats_info;
  int resume_from = 0;
  json modules = json::array(), layers = json::array(), smoothing = json::array();
  double prefetch_seconds = 0, save_seconds = 0, gguf_tables_seconds = 0;
  std::string forward_description;
  json disk;   // disk_need's lower bounds, in report.json
  const LlamaConfig& c() const { return model->config(); }
  QuantSpec spec_of(const std::string& module) const {
    if (auto it = gguf_specs.find(module); it != gguf_specs.end()) return it->second;
    QuantSpec s = r.spec_for(module);
    s.scale_dtype = scale_dtype;
    return s;
  }
};

// ---------------------------------------------------------------- setup

// A warning on stderr and in the event log.
void warn(const std::string& m) {
  std::fprintf(stderr, "ptqkit: warning: %s\n", m.c_str());
  log_event("warning", {{"message", m}});
}

// Keeps in the source dtype the Linears (not already ignored) that `reason` names a reason for:
// adds them to the effective recipe's ignore list (so the run is repeatable) and returns them;
// *example: the last one's reason.
std::vector<std::string> keep_in_float(Run& R, const std::function<std::string(const std::string& module, LinearId p)>& reason,
                                       std::string* example) {
  std::vector<std::string> kept;
  const LlamaConfig& c = R.c();
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (LinearId p : layer_schedule(c, l).linears()) {
      const std::string m = linear_name(c, l, p);
      if (R.r.ignored(m)) continue;
      if (const std::string why = reason(m, p); !why.empty()) {
        kept.push_back(m);
        *example = m + ": " + why;
      }
    }
  for (const std::string& m : kept) R.r.ignore.push_back(m);
  return kept;
}

// llama.cpp's use_more_bits: the layers its _M mixes give more bits (the first and last eighth, and
// every third between).
bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// A GGUF-only run solves asymmetric 4- or 5-bit groups of 32 on Q4_1's / Q5_1's grid.
void gguf_only_grid(QuantSpec& s) {
  if (s.form == GridForm::integer_zero && !s.sym && s.group_size == 32 && (s.bits == 4 || s.bits == 5)) apply_gguf_type(s.bits == 4 ? "Q4_1" : "Q5_1", s);
}

// The file's type, llama.cpp's "ftype" (the default type of its mix): export.gguf_type's (Q4_K for
// Q4_K_M), else the type the quantization settings map to (none where no type holds them).
std::optional<GgmlType> gguf_file_type(const Recipe& r, bool gguf_only) {
  std::string name = r.gguf_type;
  if (is_gguf_mix(name)) name.resize(4);
  QuantSpec s = r.quant;
  if (gguf_only) gguf_only_grid(s);
  GgmlType t;
  if (name.empty() ? gguf_type_of(s, &t) : parse_ggml_type(name.c_str(), &t)) return t;
  return std::nullopt;
}

// GGUF: the types of output.weight and token_embd.weight (export.gguf_output_type /
// gguf_embedding_type), "auto" resolved in the run's recipe as llama.cpp's quantizer chooses them
// (formats/gguf.h) for the file's type. Float where no Linear is quantized or no type holds the
// settings. With tied embeddings token_embd is the output and takes its type. An explicit type must
// hold the rows (hidden_size) in whole blocks.
void plan_gguf_beside(Run& R, bool gguf_only) {
  Recipe& r = R.r;
  const int64_t cols = R.c().hidden_size;
  const std::optional<GgmlType> base = R.gguf_specs.empty() ? std::nullopt : gguf_file_type(r, gguf_only);
  GgmlType t;
  auto resolve = [&](std::string& v, const char* field, bool output) {
    if (v == "float") return;
    if (v == "auto") {
      v = base && (output ? gguf_output_type(*base, cols, &t) : gguf_embedding_type(*base, cols, &t)) ? ggml_type_name(t) : "float";
      return;
    }
    if (!parse_ggml_type(v.c_str(), &t)) fail(Errc::usage, r.source, field, "unknown type '" + v + "'");
    if (cols % ggml_block_elems(t))
      fail(Errc::usage, r.source, field, v + "'s blocks of " + std::to_string(ggml_block_elems(t)) + " do not divide the model's rows of " + std::to_string(cols) +
                                             " (hidden_size): auto, float or another type");
  };
  resolve(r.gguf_output_type, "export.gguf_output_type", true);
  if (R.c().tie_word_embeddings && r.gguf_embedding_type == "auto") r.gguf_embedding_type = r.gguf_output_type;
  resolve(r.gguf_embedding_type, "export.gguf_embedding_type", false);
}

// GGUF: each Linear's block type, as its spec on that type's grid (R.gguf_specs). A Linear of the
// file's type takes the type llama.cpp's quantizer (src/llama-quant.cpp) gives its tensor; one an
// override gives another type keeps it.
// - every type: attn_k and attn_v (phi3's fused qkv is llama.cpp's attn_v too) of a model of 8
//   experts Q8_0; a Q4_K attn_v of a 70B model (llama.cpp's LLM_TYPE_70B: 80 layers of a llama
//   with grouped KV heads, or of a qwen2) Q5_K;
// - the mixes Q4_K_M / Q5_K_M: Q4_K / Q5_K, and Q6_K for attn_v and ffn_down in the layers
//   use_more_bits picks; Q4_K_S: Q4_K, and Q5_K for the first 4 attn_v and the first eighth's
//   ffn_down; Q5_K_S: Q5_K; attn_output of a model of 8 experts Q5_K in Q4_K_M and Q4_K_S;
// - a GGUF-only run's asymmetric 4- or 5-bit groups of 32 are solved on Q4_1's / Q5_1's grid;
// - a K type on a Linear whose input width is not a multiple of 256 falls back as llama.cpp's
//   quantizer does (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0): a warning, report.json's
//   gguf_type_fallback.
void plan_gguf_types(Run& R, bool gguf_only) {
  const Recipe& r = R.r;
  const LlamaConfig& c = R.c();
  const bool mix_m = r.gguf_type == "Q4_K_M" || r.gguf_type == "Q5_K_M";
  const std::optional<GgmlType> file = gguf_file_type(r, gguf_only);
  const bool eight = c.num_experts == 8;
  const std::string arch = gguf_arch(c);
  const bool b70 = c.num_hidden_layers == 80 && (arch == "qwen2" || (arch == "llama" && !eight && c.num_attention_heads != c.num_key_value_heads));
  int64_t fell = 0;
  std::string example;
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (LinearId p : layer_schedule(c, l).linears()) {
      const std::string m = linear_name(c, l, p);
      if (r.ignored(m)) continue;
      QuantSpec s = r.spec_for(m);
      s.scale_dtype = R.scale_dtype;
      if (gguf_only) gguf_only_grid(s);
      GgmlType t;
      if (file && gguf_type_of(s, &t) && t == *file) {   // llama_tensor_get_type_impl's branches, in its order
        const int n = c.num_hidden_layers;
        const bool more = use_more_bits(l, n);
        const char* to = nullptr;
        if (p.proj == Proj::v || p.proj == Proj::qkv) {   // attn_v (phi3's fused qkv is its attn_v too)
          if (mix_m && more) to = "Q6_K";
          else if (r.gguf_type == "Q4_K_S" && l < 4) to = "Q5_K";
          if (b70 && (to ? std::string(to) == "Q4_K" : *file == GgmlType::Q4_K)) to = "Q5_K";
          if (eight) to = "Q8_0";
        } else if (p.proj == Proj::k) {
          if (eight) to = "Q8_0";
        } else if (p.proj == Proj::down) {
          if (mix_m && more) to = "Q6_K";
          else if (r.gguf_type == "Q4_K_S" && l < n / 8) to = "Q5_K";
        } else if (p.proj == Proj::o) {
          if (eight && (r.gguf_type == "Q4_K_M" || r.gguf_type == "Q4_K_S")) to = "Q5_K";
        }
        if (to) apply_gguf_type(to, s);
      }
      const int64_t in = linear_shape(c, p).in;
      if (groups_per_super(s.form) && in % 256) {
        GgmlType from;
        gguf_type_of(s, &from);
        const char* to = ggml_type_name(gguf_fallback_type(from));
        R.gguf_type_fallback.push_back({{"module", m}, {"in_features", in}, {"type", ggml_type_name(from)}, {"written_as", to}});
        apply_gguf_type(to, s);
        ++fell;
        example = m + ": " + std::to_string(in) + " wide, " + ggml_type_name(from) + " -> " + to;
      }
      R.gguf_specs[m] = s;
    }
  if (fell)
    warn("gguf: " + std::to_string(fell) + " Linears have an input width that is not a multiple of the K-quants' 256 (e.g. " + example +
         "); they are written as llama.cpp's quantizer writes them (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; report.json's gguf_type_fallback)");
  plan_gguf_beside(R, gguf_only);
}

// The model, its module names, and every check that can refuse the recipe before calibrating.
void load_model(Run& R) {
  Recipe& r = R.r;
  {
    PhaseTimer t(R.t.phase["load"]);
    R.model = std::make_unique<LlamaModel>(r.model);
  }
  const LlamaConfig& c = R.c();
  if (r.calibration.seq_len == 0) r.calibration.seq_len = std::min(2048, c.max_position_embeddings);
  if (r.calibration.seq_len > c.max_position_embeddings)
    fail(Errc::input, r.source, "calibration.seq_len",
         std::to_string(r.calibration.seq_len) + " exceeds the model's max_position_embeddings " + std::to_string(c.max_position_embeddings));
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (LinearId p : layer_schedule(c, l).linears()) R.known.push_back(linear_name(c, l, p));
  for (const char* n : {"lm_head", "model.embed_tokens", "model.norm"}) R.known.push_back(n);
  auto check = [&](const std::string& pat, const std::string& field) {
    for (auto& m : R.known)
      if (pattern_matches(pat, m)) return;
    fail(Errc::usage, r.source, field, "pattern '" + pat + "' matches no module of this model (e.g. " + R.known[0] + ")");
  };
  for (auto& p : r.ignore) check(p, "quantization.ignore");
  for (auto& [p, n] : r.overrides) check(p, "quantization.overrides." + p);
  // Scales are rounded to what the export stores, so that GPTQ compensates that rounding: the
  // model's 16-bit type; f16 where GGUF is written (its blocks' d is f16), which the other packed
  // formats then cannot hold exactly for a bf16 model.
  const bool gguf = std::find(r.formats.begin(), r.formats.end(), "gguf") != r.formats.end();
  R.scale_dtype = c.dtype == DType::BF16 && !gguf ? DType::BF16 : DType::F16;
  if (gguf && c.dtype == DType::BF16)
    for (const std::string& f : r.formats)
      if (f != "gguf" && f != "fake")
        fail(Errc::usage, r.source, "export.format", "gguf stores f16 block scales, " + f + " this bf16 model's bf16 scales: write them from separate runs");
  R.nf4 = r.quant.method == "nf4";
  R.w8a8 = r.act_mode != ActQuant::none;
  // A GGUF-only run (fake beside it allowed) keeps in the source dtype the Linears whose input width
  // is not a multiple of the blocks' 32, as llama.cpp's own quantizer leaves tensors its type cannot
  // hold. They are added to the effective recipe's ignore list (so the run is repeatable) and
  // named in the report and a warning. Other formats need every Linear they are given: refused below.
  const bool gguf_only = gguf && std::all_of(r.formats.begin(), r.formats.end(), [](const std::string& f) { return f == "gguf" || f == "fake"; });
  if (gguf_only && !R.nf4) {
    std::string example;
    R.gguf_fallback = keep_in_float(R, [&](const std::string&, LinearId p) {
      const int64_t in = linear_shape(c, p).in;
      return in % 32 ? std::to_string(in) : std::string();
    }, &example);
    if (!R.gguf_fallback.empty())
      warn("gguf: " + std::to_string(R.gguf_fallback.size()) + " Linears have an input width that is not a multiple of 32 (e.g. " + example + "); they stay in " +
           std::string(dtype_name(c.dtype)) + " in the GGUF, as llama.cpp's quantizer leaves what its blocks cannot hold "
           "(listed in the report's gguf_float_fallback and the effective recipe's quantization.ignore)");
  }
  if (gguf && !R.nf4) plan_gguf_types(R, gguf_only);
  // compressed-tensors infers a Linear's group size as in_features / groups: a width the group size
  // does not divide is misread (or refused) by the library. A run whose packed formats all list
  // float Linears (compressed-tensors' ignore, GGUF's float tensors) keeps such Linears in the
  // source dtype, said as for GGUF; with another packed format they are refused below.
  const bool ct = std::find(r.formats.begin(), r.formats.end(), "compressed-tensors") != r.formats.end();
  const bool listable = std::all_of(r.formats.begin(), r.formats.end(), [](const std::string& f) { return f == "gguf" || f == "compressed-tensors" || f == "fake"; });
  if (ct && listable && !R.nf4) {
    std::string example;
    R.ct_fallback = keep_in_float(R, [&](const std::string& m, LinearId p) {
      const int gs = R.spec_of(m).group_size;
      const int64_t in = linear_shape(c, p).in;
      if (gs <= 0 || in <= gs || in % gs == 0) return std::string();   // (one group: the library's in / 1 is right)
      return std::to_string(in) + " wide, groups of " + std::to_string(gs);
    }, &example);
    if (!R.ct_fallback.empty())
      warn("compressed-tensors: " + std::to_string(R.ct_fallback.size()) + " Linears have an input width their group size does not divide (e.g. " + example +
           "); compressed-tensors would misread their groups, so they stay in " + std::string(dtype_name(c.dtype)) +
           " (in its ignore list, report.json's compressed_tensors_float_fallback and the effective recipe's quantization.ignore)");
  }
  // Every format must be able to hold what the recipe asks for: refuse before calibrating.
  std::vector<ModulePlan>& plan = R.plan;
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (LinearId p : layer_schedule(c, l).linears()) {
      const std::string m = linear_name(c, l, p);
      const LinearShape sh = linear_shape(c, p);
      plan.push_back({m, sh.out, sh.in, R.spec_of(m), !r.ignored(m)});
      if (const std::string why = plan.back().spec.output_clip ? output_clip_refusal(plan.back().spec) : ""; !why.empty() && plan.back().quantized)
        fail(Errc::usage, r.source, "quantization.awq.clip", m + ": " + why + " (its override sets it; or set awq.clip: false)");
    }
  for (auto& fmt : r.formats) check_format(fmt, c, plan, r.nf4_blocksize);
  if (gguf) {   // the file embeds the vocabulary: a folder without a tokenizer is refused now, not after the solve
    R.tok = gguf_tokenizer(r.model, c);
    R.vocab = R.tok->vocab_info();
  }
  // vLLM's GPTQ layers refuse an input width the group size does not divide: said once
  for (auto& fmt : r.formats)
    if (fmt == "gptq" || fmt == "gptq_v2")
      for (const ModulePlan& m : plan)
        if (m.quantized && m.spec.group_size > 0 && m.cols % m.spec.group_size) {
          warn(fmt + ": " + m.name + " is " + std::to_string(m.cols) + " wide, not a multiple of group_size " + std::to_string(m.spec.group_size) +
               ": transformers reads it, vLLM's GPTQ kernels refuse such a layer");
          break;
        }
}

// ---------------------------------------------------------------- disk space

// The least the run writes, in bytes: codes at their bits and float tensors at 16 bits (or the
// source's width where smaller), without scales, metadata or headers. The layer store
// (OUT.partial/.layers, held until the export has read it), each export format (fake: every
// Linear in the source dtype), and --save-stats' Hessians (fp64, in x in a group of Linears that
// share an input, per layer). A resumed run has already written part of its store and statistics:
// they are not counted.
struct DiskNeed {
  int64_t store = 0, exports = 0, stats = 0;
};
DiskNeed disk_need(const Run& R, bool saving_stats, bool resuming) {
  const LlamaConfig& c = R.c();
  const int64_t src = int64_t(dtype_size(c.dtype)), flt = std::min<int64_t>(src, 2);
  int64_t packed = 0, kept = 0, dense = 0, hessians = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerSchedule ls = layer_schedule(c, l, R.r.moe_calibrate_all_experts);
    for (const LinearGroup& g : ls.groups) {
      const int64_t in = linear_shape(c, g.linears.front()).in;
      hessians += in * in * 8;
      for (LinearId p : g.linears) {
        const std::string m = linear_name(c, l, p);
        const LinearShape sh = linear_shape(c, p);
        const int64_t n = sh.out * sh.in;
        dense += n * src;
        if (R.r.ignored(m)) kept += n * flt;
        else packed += (n * R.spec_of(m).bits + 7) / 8;
      }
    }
  }
  const int64_t table = int64_t(c.vocab_size) * c.hidden_size, embeddings = table * (c.tie_word_embeddings ? 1 : 2);
  auto gguf_table = [&](const std::string& type) {   // a GGUF's output or token embedding (plan_gguf_beside's type)
    QuantSpec s;
    return apply_gguf_type(type, s).empty() ? (table * s.bits + 7) / 8 : table * flt;
  };
  const int64_t gguf_embeddings = gguf_table(R.r.gguf_embedding_type) + (c.tie_word_embeddings ? 0 : gguf_table(R.r.gguf_output_type));
  DiskNeed d;
  if (!R.nf4 && !resuming) d.store = packed;   // (NF4 is written from the source at export)
  for (const std::string& f : R.r.formats)
    d.exports += f == "fake" ? dense + embeddings * src : packed + kept + (f == "gguf" ? gguf_embeddings : embeddings * flt);
  if (saving_stats && !resuming) d.stats = hessians;
  return d;
}

// The calibration windows (none for NF4: it is data-free) and their embeddings.
void calibrate(Run& R, bool embed = true) {
  PhaseTimer t(R.t.phase["calibration"]);
  Recipe& r = R.r;
  const LlamaConfig& c = R.c();
  if (R.nf4) {
    r.calibration = {"none", 0, 0, 0};
    return;
  }
  const Tokenizer* tok = nullptr;
  if (r.calibration.dataset != "random") {
    try {
      if (!R.tok) R.tok = load_tokenizer(r.model, c.bos_token_id);   // (GGUF's check may have loaded it)
    } catch (const Error& e) {   // a text dataset needs the model's tokenizer: say what else works
      if (e.code != Errc::io) throw;
      fail(e.code, e.file, e.field, e.message + " (the calibration text needs the model's tokenizer: add its tokenizer files, or calibrate with `--dataset random`)");
    }
    tok = R.tok.get();
  }
  R.cd = load_calibration(r.calibration, tok, c.vocab_size, tok ? tok->bos_id : c.bos_token_id);
  if (embed && R.opt.load_stats.empty()) R.X = R.model->embed(R.cd.tokens);
}

// Saved statistics: keyed by the model's files, the calibration windows and the collection settings.
void open_statistics(Run& R) {
  const QuantizeOptions& opt = R.opt;
  if (opt.save_stats.empty() && opt.load_stats.empty()) return;
  if (R.nf4) fail(Errc::usage, R.r.source, "quantization.method", "nf4 is data-free: there are no statistics to save or load");
  if (!opt.save_stats.empty() && !opt.load_stats.empty()) fail(Errc::usage, "", "--save-stats", "cannot be combined with --load-stats");
  PhaseTimer t(R.t.phase["calibration"]);
  const json key = stats_key(model_digest(R.r.model), R.cd.describe(R.r.calibration), R.r);
  if (!opt.save_stats.empty()) {
    R.stats_out = std::make_unique<StatsWriter>(opt.save_stats, opt.force, opt.resume, key);
    R.stats_info = {{"saved_to", opt.save_stats}, {"key_sha256", sha256_bytes(key.dump())}};
  } else {
    R.stats_in = std::make_unique<StatsReader>(opt.load_stats, key);
    R.stats_info = {{"loaded_from", opt.load_stats}, {"key_sha256", sha256_bytes(key.dump())}};
  }
}

// What a resumed run must share with the interrupted one: the effective recipe (less the output
// folder), the model's config, its weight files (model_sample: each one's size and the ends of its
// bytes, not a whole hash) and the calibration windows. Sets the first layer to quantize.
void resume_point(Run& R, const OutputDir& out) {
  Recipe fr = R.r;
  fr.output.clear();
  const json fingerprint = {{"recipe", yaml_to_json(fr.to_yaml())}, {"config_sha256", sha256_file(R.r.model + "/config.json")},
                            {"weights", model_sample(R.r.model)}, {"calibration", R.nf4 ? json() : R.cd.describe(R.r.calibration)}};
  const std::string fp_file = out.file(".resume.json");
  if (!(R.opt.resume && std::filesystem::exists(fp_file))) {
    std::filesystem::remove_all(out.path() + "/.layers");
    write_file_atomic(fp_file, fingerprint.dump() + "\n");
    return;
  }
  const json before = json::parse(read_text_file(fp_file));
  if (before != fingerprint) {
    std::string what = "recipe, model or calibration";   // a fingerprint of another layout (an older ptqkit's)
    if (before.is_object())
      for (const auto& [key, name] : {std::pair{"recipe", "recipe"}, {"config_sha256", "model config (config.json)"},
                                      {"weights", "model weights (the same config, other weight files)"}, {"calibration", "calibration"}})
        if (before.contains(key) && before[key] != fingerprint[key]) {
          what = name;
          break;
        }
    fail(Errc::usage, out.path(), "--resume", std::string("the interrupted run used another ") + what +
                                                  "; pass --force instead of --resume to start over");
  }
  QuantStore done(out.path() + "/.layers");
  const int n = R.c().num_hidden_layers;
  R.resume_from = done.finished_layers(n);
  if (R.resume_from == 0) std::fprintf(stderr, "ptqkit: resuming %s: no layer was finished, starting at layer 0\n", R.r.output.c_str());
  else std::fprintf(stderr, "ptqkit: resuming %s: layers 0..%d are done, continuing at layer %d\n", R.r.output.c_str(), R.resume_from - 1, R.resume_from);
  log_event("resume", {{"output", R.r.output}, {"first_layer", R.resume_from}});
}

// ---------------------------------------------------------------- one layer

// What one layer leaves behind: its layer-store file's contents and its statistics.
struct LayerResult {
  std::vector<QuantizedLinear> qs;
  std::vector<std::pair<std::string, VecF>> smoothed;   // tensors with smoothing factors folded in (replace)
  // Tensor `name` replaced by v from here on (a later fold into the same tensor replaces it again).
  void replace(const std::string& name, VecF v) {
    for (auto& [n, x] : smoothed)
      if (n == name) { x = std::move(v); return; }
    smoothed.emplace_back(name, std::move(v));
  }
  std::vector<std::pair<std::string, ActQuant>> acts;   // W8A8 input specs
  LayerStats stats;                                     // --save-stats
};

// expert >= 0: the MoE expert the Linear belongs to, `routed` the rows the router sent it and
// `hessian_tokens` the rows its Hessian saw (all of them under calibrate_all_experts).
struct ExpertInfo {
  int expert = -1;
  int64_t routed = -1, hessian_tokens = 0;
};

void record(Run& R, const std::string& name, const QuantSpec& spec, const SolvedLinear& s, const ExpertInfo& ex = {}) {
  if constexpr (kDebugChecks)
    if (spec.method == "gptq" && s.loss > s.rtn_loss * (1 + 1e-6) + 1e-12)
      fail(Errc::numeric, "", name, "GPTQ loss " + std::to_string(s.loss) + " exceeds RTN's " + std::to_string(s.rtn_loss) + " (debug check)");
  for (auto& line : s.stats.log) {
    std::fprintf(stderr, "ptqkit: %s: %s\n", name.c_str(), line.c_str());
    log_event("warning", {{"module", name}, {"message", line}});
  }
  const SolveStats& st = s.stats;
  R.modules.push_back({{"name", name}, {"method", spec.method}, {"bits", spec.bits}, {"group_size", spec.group_size},
                       {"sym", spec.sym}, {"act_order", spec.act_order}, {"static_groups", spec.static_groups},
                       {"rows", s.rows}, {"cols", s.cols}, {"damp_percent", spec.method == "gptq" ? st.damp_percent : 0.0},
                       {"damp_retries", st.retries}, {"dead_columns", st.dead_columns}, {"loss", s.loss}, {"rtn_loss", s.rtn_loss},
                       {"loss_ratio_vs_rtn", s.rtn_loss > 0 ? s.loss / s.rtn_loss : 1.0}, {"seconds", s.seconds}});
  if (spec.form != GridForm::integer_zero) R.modules.back()["grid"] = grid_form_name(spec.form);   // (absent: GPTQ's)
  if (st.clip_groups > 0) R.modules.back()["clipped_groups"] = double(st.clipped_groups) / double(st.clip_groups);   // AWQ's clipping (gptq/clip.h)
  if (ex.expert >= 0) {
    json& m = R.modules.back();
    m["expert"] = ex.expert;
    if (ex.routed >= 0) m["routed_tokens"] = ex.routed;
    m["hessian_tokens"] = ex.hessian_tokens;
  }
}

// A Linear of a smoothed group that the recipe keeps in float (quantization.ignore) reads the
// smoothed norm's output too: its weights with the factors folded in (W·diag(s)) replace the
// source's in every export, as the smoothed norm does (the quantized ones carry them in their codes).
void keep_folded(const Run& R, int l, const LinearGroup& g, const LayerWeights& w, LayerResult& out) {
  for (LinearId p : g.linears) {
    const std::string name = linear_name(R.c(), l, p);
    if (R.r.ignored(name)) out.replace(name + ".weight", Eigen::Map<const VecF>(w[p].W.data(), w[p].W.size()));
  }
}

// What a norm's factors fold into besides the norm: the group's Linears, and for the MoE experts'
// shared input (Stage::expert_in) the router's columns, which keeps the routing as it was.
std::vector<MatF*> norm_fold_targets(const LinearGroup& g, LayerWeights& w) {
  std::vector<MatF*> wm;
  for (LinearId p : g.linears) wm.push_back(&w[p].W);
  if (g.input == Stage::expert_in) wm.push_back(&w.router.W);
  return wm;
}
// A folded router is exported as folded (it stays float).
void keep_router(const Run& R, int l, const LinearGroup& g, const LayerWeights& w, LayerResult& out) {
  if (g.input == Stage::expert_in) out.replace(router_name(R.c(), l) + ".weight", Eigen::Map<const VecF>(w.router.W.data(), w.router.W.size()));
}

// The group's Linears AWQ searches over (those it quantizes) and their specs.
void awq_searched(const Run& R, int l, const LinearGroup& g, LayerWeights& w, std::vector<const MatF*>& ws, std::vector<QuantSpec>& specs) {
  for (LinearId p : g.linears) {
    const std::string name = linear_name(R.c(), l, p);
    if (R.r.ignored(name)) continue;
    ws.push_back(&w[p].W);
    specs.push_back(R.spec_of(name));
  }
}
// A search's entry in report.json's "awq" (outlier_ratio_after added where it folds).
json awq_entry(int l, const std::string& pair, const VecF& absmax, const AwqSearch& a) {
  return {{"layer", l}, {"pair", pair}, {"outlier_ratio_before", outlier_ratio(absmax)}, {"error", a.error},
          {"error_unscaled", a.error_unscaled}, {"ratio", a.ratio >= 0 ? json(a.ratio) : json(nullptr)}};
}

// AWQ on one norm -> group pair (smoothquant/awq.h): the ratio whose scales give the group's
// quantized Linears the least output error on (at most kSmoothRows of) its unscaled input rows,
// or none; the scales folded as SmoothQuant's are. Linears kept in float take the fold, not the search.
Smoother awq_smoother(Run& R, const Backend& B, int l, const LinearGroup& g, LayerWeights& w, LayerResult& out) {
  const Recipe& r = R.r;
  if (std::find(r.awq.pairs.begin(), r.awq.pairs.end(), g.smooth_norm) == r.awq.pairs.end()) return {};
  return [&R, &r, errors = B.awq_scorer, l, &g, &w, &out](const VecF& absmax, const MatF& rows) -> const VecF& {
    PhaseTimer t(R.t.phase["awq"]);
    VecF& norm = norm_weights(w, g.smooth_norm);
    std::vector<const MatF*> ws;
    std::vector<QuantSpec> specs;
    awq_searched(R, l, g, w, ws, specs);
    if (ws.empty()) return norm;
    const MatF x = rows.rows() > kSmoothRows ? subsample_rows(rows, kSmoothRows) : MatF();
    const AwqSearch a = search_awq(x.size() ? x : rows, ws, specs, r.awq.grid, r.awq.duo_scaling, errors);
    json entry = awq_entry(l, g.smooth_norm, absmax, a);
    if (a.ratio >= 0) {
      fold_smoothing(norm, norm_fold_targets(g, w), a.scales);
      entry["outlier_ratio_after"] = outlier_ratio(absmax.cwiseQuotient(a.scales));
      out.replace(layer_prefix(l) + g.smooth_norm + ".weight", norm);
      keep_folded(R, l, g, w, out);
      keep_router(R, l, g, w, out);
      if (R.stats_out) out.stats.smoothing[g.smooth_norm] = a.scales;
    }
    R.smoothing.push_back(entry);
    return norm;
  };
}

// SmoothQuant on one norm -> group pair: from the statistics of the group's unsmoothed input,
// alpha and the factors, folded into the norm and the group's weights (the forward then computes
// the input again, as the deployed and a resumed model compute it). The MoE experts' shared input
// (every expert's gate, up: one group) takes its factors from the experts' columns and folds them
// into the router's columns too, which stays float and routes as before.
Smoother smoother(Run& R, const Backend& B, int l, const LinearGroup& g, LayerWeights& w, LayerResult& out) {
  const Recipe& r = R.r;
  if (r.awq.enabled) return awq_smoother(R, B, l, g, w, out);
  if (!r.smooth.enabled || std::find(r.smooth.pairs.begin(), r.smooth.pairs.end(), g.smooth_norm) == r.smooth.pairs.end()) return {};
  return [&R, &r, errors = B.alpha_errors, l, &g, &w, &out](const VecF& absmax, const MatF& x) -> const VecF& {
    json entry = {{"layer", l}, {"pair", g.smooth_norm}, {"outlier_ratio_before", outlier_ratio(absmax)}};
    PhaseTimer t(R.t.phase["smoothquant"]);
    std::vector<const MatF*> ws;
    for (LinearId p : g.linears) ws.push_back(&w[p].W);
    const ActQuant act{r.act_mode, 0};
    AlphaSearch a = r.smooth.auto_alpha ? search_alpha(x, absmax, ws, act, kSmoothRows, errors)
                                        : evaluate_alpha(x, absmax, ws, act, r.smooth.alpha, kSmoothRows, errors);
    const VecF& sf = a.factors;
    VecF& norm = norm_weights(w, g.smooth_norm);
    fold_smoothing(norm, norm_fold_targets(g, w), sf);
    entry["alpha"] = a.alpha;
    entry["outlier_ratio_after"] = outlier_ratio(absmax.cwiseQuotient(sf));
    entry["w8a8_error"] = a.error;
    entry["w8a8_error_unsmoothed"] = a.error_unsmoothed;
    R.smoothing.push_back(entry);
    out.replace(layer_prefix(l) + g.smooth_norm + ".weight", norm);
    keep_folded(R, l, g, w, out);
    keep_router(R, l, g, w, out);
    if (R.stats_out) out.stats.smoothing[g.smooth_norm] = sf;
    return norm;
  };
}

// AWQ's Linear-to-Linear pair into group g (model/schedule.h's ScaleSource), before the source is
// quantized: s into the consumers' columns (W · diag(s)), 1 / s into the source's rows and bias,
// which leaves the float model's output unchanged. A float (ignored) consumer or source keeps its
// folded weights, and a source's bias its folded values, as the smoothed norms are kept.
void fold_into_source(const Run& R, int l, const LinearGroup& g, const ScaleSource& src, const VecF& s, LayerWeights& w, LayerResult& out) {
  std::vector<MatF*> consumers;
  for (LinearId p : g.linears) consumers.push_back(&w[p].W);
  Linear& S = w[src.id];
  fold_source(consumers, S, src.row, s);
  keep_folded(R, l, g, w, out);
  const std::string name = linear_name(R.c(), l, src.id);
  if (R.r.ignored(name)) out.replace(name + ".weight", Eigen::Map<const VecF>(S.W.data(), S.W.size()));
  if (S.b.size()) out.replace(name + ".bias", S.b);
}

// AWQ on a Linear-to-Linear pair: group g's input sampled from the forward with its source still in
// float (AutoAWQ's order: every search on the float layer's inputs), the ratio searched over g's
// quantized Linears with the source's tied columns, and the best (or none) folded.
void awq_source_pair(Run& R, Backend& B, int l, const LinearGroup& g, const ScaleSource& src, LayerWeights& w, LayerResult& out) {
  std::vector<const MatF*> ws;
  std::vector<QuantSpec> specs;
  awq_searched(R, l, g, w, ws, specs);
  if (ws.empty()) return;
  const auto [absmax, rows] = B.forward->sample(g);
  PhaseTimer t(R.t.phase["awq"]);
  const AwqSearch a = search_awq(rows, ws, specs, R.r.awq.grid, R.r.awq.duo_scaling, B.awq_scorer, src.row);
  json entry = awq_entry(l, src.key, absmax, a);
  if (a.ratio >= 0) {
    fold_into_source(R, l, g, src, a.scales, w, out);
    entry["outlier_ratio_after"] = outlier_ratio(absmax.cwiseQuotient(a.scales));
    if (R.stats_out) out.stats.smoothing[src.key] = a.scales;
    std::vector<LinearId> changed = g.linears;
    changed.push_back(src.id);
    B.forward->reload(changed, w);
  }
  R.smoothing.push_back(entry);
}

// The Linear-to-Linear pairs whose source is among the Linears of the group just collected (v_proj
// in q, k, v; up_proj in gate, up), searched or (--load-stats) folded as the saving run folded them,
// before that group is solved.
void source_pairs(Run& R, Backend& B, int l, const LayerSchedule& sched, const LinearGroup& collected, LayerWeights& w, LayerStats& saved,
                  LayerResult& out) {
  if (!R.r.awq.enabled && !R.stats_in) return;
  for (const LinearGroup& g : sched.groups) {
    const ScaleSource src = scale_source(R.c(), g);
    if (src.pair.empty() || std::find(collected.linears.begin(), collected.linears.end(), src.id) == collected.linears.end()) continue;
    if (R.stats_in) {
      if (auto it = saved.smoothing.find(src.key); it != saved.smoothing.end()) fold_into_source(R, l, g, src, it->second, w, out);
      continue;
    }
    if (std::find(R.r.awq.pairs.begin(), R.r.awq.pairs.end(), src.pair) != R.r.awq.pairs.end() && B.forward->sample_inputs())
      awq_source_pair(R, B, l, g, src, w, out);
  }
}

// --load-stats: the saving run's smoothing factors, folded as it folded them.
void smooth_saved(const Run& R, const LayerStats& saved, int l, const LinearGroup& g, LayerWeights& w, LayerResult& out) {
  auto it = saved.smoothing.find(g.smooth_norm);
  if (it == saved.smoothing.end()) return;
  VecF& norm = norm_weights(w, g.smooth_norm);
  fold_smoothing(norm, norm_fold_targets(g, w), it->second);
  out.replace(layer_prefix(l) + g.smooth_norm + ".weight", norm);
  keep_folded(R, l, g, w, out);
  keep_router(R, l, g, w, out);
}

// W8A8: the group's Linears take int8 inputs from here on (static scale: calibrated absmax / 127).
// The static scale from f's max |x| over the group's input as it computed it (-1: none, saved
// statistics).
void quantize_inputs(Run& R, int l, const LinearGroup& g, const LayerForward& f, const LayerStats& saved, LayerWeights& w, LayerResult& out) {
  if (!R.w8a8) return;
  float scale = 0;
  if (R.r.act_mode == ActQuant::per_tensor) {
    const float absmax = f.group_input_absmax();
    scale = absmax >= 0 ? absmax / 127.0f : saved.meta["act_scales"].value(g.name, 0.0f);
  }
  if (R.stats_out) out.stats.meta["act_scales"][g.name] = scale;
  const ActQuant a{R.r.act_mode, scale};
  for (LinearId p : g.linears) {
    const std::string name = linear_name(R.c(), l, p);
    if (R.r.ignored(name)) continue;
    w[p].act = a;
    out.acts.emplace_back(name, a);
  }
}

// Routed MoE calibration: an expert whose Hessian saw fewer rows than its input width has no
// usable second-order information; its Linears are rounded to nearest, with a warning.
void rtn_if_unseen(Run& R, int l, const LinearGroup& g, const ExpertInfo& ex, std::vector<LinearJob>& jobs) {
  if (jobs.empty() || ex.hessian_tokens >= linear_shape(R.c(), g.linears[0]).in) return;
  bool any = false;
  for (LinearJob& j : jobs)
    if (j.spec.method == "gptq") { j.spec.method = "rtn"; any = true; }
  if (!any) return;
  char m[256];
  std::snprintf(m, sizeof m, "layer %d expert %d: %lld calibration tokens routed, fewer than its input width %lld: rounded to nearest (RTN) instead of GPTQ",
                l, g.expert, (long long)ex.hessian_tokens, (long long)linear_shape(R.c(), g.linears[0]).in);
  std::fprintf(stderr, "ptqkit: %s\n", m);
  log_event("warning", {{"module", jobs[0].name}, {"message", m}});
}

// A group between its Hessian and its solve.
struct CollectedGroup {
  const LinearGroup* g = nullptr;
  std::unique_ptr<HessianSum> H;
  MatD H_host;   // saved statistics hold H exactly as the solve used it
  std::vector<LinearJob> jobs;
  bool experts = false;
  int64_t hessian_tokens = 0;
};

// Runs the forward to group g's input and takes its Hessian, SmoothQuant factors and (MoE) the
// routed and Hessian token counts; the jobs as the recipe quantizes them.
CollectedGroup collect_group(Run& R, Backend& B, int l, const LinearGroup& g, LayerWeights& w, LayerStats& saved, LayerResult& out,
                             std::map<int, int64_t>& routed) {
  const LlamaConfig& c = R.c();
  CollectedGroup cg;
  cg.g = &g;
  if (R.stats_in && !g.smooth_norm.empty()) smooth_saved(R, saved, l, g, w, out);
  const Smoother sm = B.forward->takes_smoother() && !g.smooth_norm.empty() ? smoother(R, B, l, g, w, out) : Smoother();
  cg.H = B.forward->collect(g, sm);
  if (R.stats_in || R.stats_out || (R.opt.dist && R.opt.dist->host_hessians)) {
    PhaseTimer t(R.t.phase["hessian"]);
    cg.H_host = cg.H->take_finalized();   // after this the group reads H_host (and cg.H's tokens, or a GPU sum)
  }
  for (LinearId p : g.linears) {
    const std::string name = linear_name(c, l, p);
    if (!R.r.ignored(name)) cg.jobs.push_back({p, name, R.spec_of(name)});
  }
  // MoE: the rows routed to each expert and the rows its Hessian saw (saved statistics keep
  // the counts their Hessians came from)
  cg.experts = g.input == Stage::expert_in || g.input == Stage::expert_act;
  if (cg.experts) {
    cg.hessian_tokens = R.stats_in ? saved.meta["expert_tokens"].value(g.name, int64_t(0)) : cg.H->tokens();
    if (R.stats_out) out.stats.meta["expert_tokens"][g.name] = cg.hessian_tokens;
    for (int e = 0; g.input == Stage::expert_in && e < c.num_experts; ++e) {   // each expert's routed count, at its input group
      if (g.expert >= 0 && e != g.expert) continue;
      const std::string k = std::to_string(e);
      routed[e] = R.stats_in ? saved.meta["expert_routed"].value(k, int64_t(-1)) : B.forward->routed_tokens(e);
      if (R.stats_out) out.stats.meta["expert_routed"][k] = routed[e];
    }
    if (g.expert >= 0) rtn_if_unseen(R, l, g, {g.expert, routed[g.expert], cg.hessian_tokens}, cg.jobs);
  }
  return cg;
}

// A 64-bit digest of n words, chained from h: FNV-1a over the digests of 64 Ki-word blocks, each
// hashed word by word on its own thread (a 70B layer's codes in a few tens of ms).
uint64_t digest(const uint32_t* w, size_t n, uint64_t h) {
  constexpr size_t kBlock = size_t(1) << 16;
  const size_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<uint64_t> part(blocks);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < blocks; ++b) {
    uint64_t x = 1469598103934665603ull;
    for (size_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) x = (x ^ w[i]) * 1099511628211ull;
    part[b] = x;
  }
  for (uint64_t x : part) h = (h ^ x) * 1099511628211ull;
  return (h ^ n) * 1099511628211ull;
}

// A solved group into the report, the layer store's list and (W8A8) its input specs.
void finish_group(Run& R, Backend& B, int l, CollectedGroup& cg, std::vector<SolvedLinear>& solved, LayerWeights& w, LayerStats& saved,
                  LayerResult& out, std::map<int, int64_t>& routed) {
  if (B.ranks_agree) {   // --gpus N: every rank must hold the same bytes of this group's codes
    uint64_t h = 0;
    for (const SolvedLinear& s : solved) {
      h = digest(s.q.packed.data(), s.q.packed.size(), h);
      h = digest(reinterpret_cast<const uint32_t*>(s.q.scales.data()), s.q.scales.size(), h);
      h = digest(reinterpret_cast<const uint32_t*>(s.q.zeros.data()), s.q.zeros.size(), h);
    }
    if (!B.ranks_agree(h))
      fail(Errc::numeric, "", linear_name(R.c(), l, solved.empty() ? LinearId{} : solved[0].id),
           "the GPUs of this --gpus run quantized it differently (their Hessians or weights differ); rerun with one GPU and report this");
  }
  std::vector<LinearId> done;
  for (SolvedLinear& s : solved) {
    const std::string name = linear_name(R.c(), l, s.id);
    const auto job = std::find_if(cg.jobs.begin(), cg.jobs.end(), [&](const LinearJob& j) { return j.id == s.id; });
    ExpertInfo ex;
    if (cg.experts && s.id.expert >= 0) ex = {s.id.expert, routed[s.id.expert], cg.hessian_tokens};
    record(R, name, job->spec, s, ex);
    s.q.name = name;
    out.qs.push_back(std::move(s.q));
    done.push_back(s.id);
  }
  if (R.stats_out) out.stats.hessians[cg.g->name] = std::move(cg.H_host);
  quantize_inputs(R, l, *cg.g, *B.forward, saved, w, out);
  B.forward->quantized(done, w);
}

// One decoder layer, group by group in the schedule's order. Each expert's down (all-experts
// calibration) reads only the layer's routing and its own expert's quantized gate and up, so a
// run of them is collected first and solved together (GroupSolver::solve_many), as many as the
// solver's batch_bytes of Hessians; the forward adds each expert's output at the end of the layer
// either way. (W8A8 reads each group's input as it is collected: one at a time there.)
LayerResult quantize_layer(Run& R, Backend& B, int l, LayerWeights& w, LayerStats& saved, Progress& bar) {
  LayerResult out;
  const LlamaConfig& c = R.c();
  const LayerSchedule sched = layer_schedule(c, l, R.r.moe_calibrate_all_experts);
  std::map<int, int64_t> routed;   // MoE: rows routed to each expert
  B.forward->begin_layer(l, w);
  if (R.stats_in)
    for (auto& e : saved.meta.value("smoothquant", json::array())) R.smoothing.push_back(e);
  auto hessian_bytes = [&](size_t gi) { const int64_t n = linear_shape(c, sched.groups[gi].linears[0]).in; return n * n * 8; };
  for (size_t gi = 0; gi < sched.groups.size();) {
    size_t gj = gi + 1;   // [gi, gj): the groups solved together
    if (sched.groups[gi].input == Stage::expert_act && !R.w8a8)
      for (int64_t bytes = hessian_bytes(gi); gj < sched.groups.size() && sched.groups[gj].input == Stage::expert_act &&
                                              (bytes += hessian_bytes(gj)) <= B.solver->batch_bytes();)
        ++gj;
    std::vector<CollectedGroup> run;
    for (size_t k = gi; k < gj; ++k) {
      const LinearGroup& g = sched.groups[k];
      const std::string first = linear_name(c, l, g.linears[0]);
      bar.update(l + double(k) / double(sched.groups.size()), "layer " + std::to_string(l) + ": " + first.substr(first.rfind('.') + 1));
      run.push_back(collect_group(R, B, l, g, w, saved, out, routed));
      source_pairs(R, B, l, sched, g, w, saved, out);
      if (gj - gi > 1) {   // accumulation is over: its scratch goes to the next group's
        PhaseTimer t(R.t.phase["hessian"]);
        run.back().H->device();
      }
    }
    std::vector<std::vector<SolvedLinear>> solved;
    if (run.size() == 1) {
      CollectedGroup& cg = run[0];
      solved.push_back(B.solver->solve(cg.jobs, w, *cg.H, cg.H_host.size() ? &cg.H_host : nullptr, R.t));
    } else {
      std::vector<GroupToSolve> gs;
      for (CollectedGroup& cg : run) gs.push_back({&cg.jobs, cg.H.get(), cg.H_host.size() ? &cg.H_host : nullptr});
      solved = B.solver->solve_many(gs, w, R.t);
    }
    for (size_t k = 0; k < run.size(); ++k) {
      run[k].H.reset();   // its memory goes to the next group
      finish_group(R, B, l, run[k], solved[k], w, saved, out, routed);
    }
    gi = gj;
  }
  B.forward->end_layer();
  return out;
}

// A layer the interrupted run finished: its quantized weights replayed for the next layer's input.
void replay_layer(Run& R, Backend& B, const QuantStore& store, int l, LayerWeights& w) {
  const LayerSchedule sched = layer_schedule(R.c(), l, R.r.moe_calibrate_all_experts);
  for (LinearId p : sched.linears()) {
    const std::string name = linear_name(R.c(), l, p);
    if (const QuantizedLinear* q = store.get(name)) w[p].W = q->dequantize();
    w[p].act = store.act_quant(name);
  }
  VecF v;
  for (const LinearGroup& g : sched.groups)   // norms SmoothQuant or AWQ folded factors into
    if (!g.smooth_norm.empty() && store.float_override(layer_prefix(l) + g.smooth_norm + ".weight", &v)) norm_weights(w, g.smooth_norm) = v;
  if (!w.experts.empty() && store.float_override(router_name(R.c(), l) + ".weight", &v))   // AWQ's fold into the router
    w.router.W = Eigen::Map<const MatF>(v.data(), w.router.W.rows(), w.router.W.cols());
  for (LinearId p : sched.linears()) {   // the float Linears with factors folded in, and the biases of AWQ's sources
    const std::string name = linear_name(R.c(), l, p);
    if (store.float_override(name + ".weight", &v)) w[p].W = Eigen::Map<const MatF>(v.data(), w[p].W.rows(), w[p].W.cols());
    if (store.float_override(name + ".bias", &v)) w[p].b = v;
  }
  json rep = json::parse(store.layer_report(l));
  for (auto& m : rep["modules"]) R.modules.push_back(m);
  for (auto& e : rep["smoothquant"]) R.smoothing.push_back(e);
  B.forward->replay_layer(w);
  R.layers.push_back({{"layer", l}, {"seconds", 0.0}, {"resumed", true}});
}

// ---------------------------------------------------------------- the layers

// Reads (and converts to fp32) layer l + 1 on a background thread while layer l computes.
class LayerLoader {
 public:
  LayerLoader(Run& R, LayerForward& fw) : R_(R), fw_(fw) {}
  ~LayerLoader() {
    if (next_.valid()) next_.wait();
  }
  LayerWeights get(int l) {
    PhaseTimer t(R_.t.phase["load"]);
    LayerWeights w = next_.valid() ? next_.get() : load(l);
    // Half of this process's threads (--threads, or cores / N under --gpus N): it overlaps the
    // layer's compute, while the main thread keeps the other half for its own host work (RTN,
    // dequantization, packing into the layer store) and its GPU launches. (Half the machine's
    // cores in every one of N processes starved the launching threads: each rank loads and
    // converts the whole layer, so two ranks' loaders filled all the cores; lab, 2026-11-28.)
    const int share = omp_get_max_threads();   // the calling thread's: a new thread starts from the default
    if (l + 1 < R_.c().num_hidden_layers)
      next_ = std::async(std::launch::async, [this, l, share] {
        omp_set_num_threads(std::max(1, share / 2));
        const auto t0 = Clock::now();
        LayerWeights lw = load(l + 1);
        R_.prefetch_seconds += seconds_since(t0);
        return lw;
      });
    return w;
  }

 private:
  Run& R_;
  LayerForward& fw_;
  std::future<LayerWeights> next_;
  LayerWeights load(int k) {
    LayerWeights lw = R_.model->load_layer(k);
    for (LinearId p : layer_schedule(R_.c(), k).linears()) check_finite(lw[p].W, linear_name(R_.c(), k, p) + ".weight", R_.model->weights());
    fw_.prepare(lw, k);
    return lw;
  }
};

// store: the layer store, where a resumed run replays its finished layers from and, where `writes`
// (every rank but 1..N-1 of a --gpus run), each finished layer is saved.
void quantize_layers(Run& R, const QuantStore& store, bool writes) {
  const int n = R.nf4 ? 0 : R.c().num_hidden_layers;
  LayerStats saved;
  CalibrationPass pass;
  pass.config = &R.c();
  pass.rope = &R.model->rope(R.cd.seq_len);
  pass.S = R.cd.samples;
  pass.T = R.cd.seq_len;
  pass.calibrate_all_experts = R.r.moe_calibrate_all_experts;
  if (R.stats_in) { pass.saved = &saved; pass.saved_path = R.opt.load_stats; }
  if (const DistRank* d = R.opt.dist) {   // this rank's share of the windows
    const int64_t T = R.cd.seq_len;
    const auto [lo, hi] = rank_windows(R.cd.samples, d->rank, d->size);
    MatF mine = R.X.middleRows(lo * T, (hi - lo) * T);
    R.X = std::move(mine);
    pass.S = int(hi - lo);
    pass.S_all = R.cd.samples;
    pass.comm = d->comm;
  }
  if (R.opt.dist && R.opt.dist->first_layer) R.resume_from = R.opt.dist->first_layer(R.resume_from);   // rank 0's resume point
  Backend B = make_backend(R.dev, R.r, pass, std::move(R.X), R.t);
  R.forward_description = B.forward_description;
  Progress bar("quantize", n, "layers");
  std::future<void> pending_save;   // the previous layer's file, written in the background
  {
    LayerLoader loader(R, *B.forward);
    for (int l = 0; l < n; ++l) {
      const auto t_layer = Clock::now();
      LayerWeights w = loader.get(l);
      if (l < R.resume_from) {
        replay_layer(R, B, store, l, w);
        bar.update(l + 1);
        continue;
      }
      const size_t modules_before = R.modules.size(), smoothing_before = R.smoothing.size();
      if (R.stats_in) saved = R.stats_in->load_layer(l);
      LayerResult res = quantize_layer(R, B, l, w, saved, bar);
      PhaseTimer t(R.t.phase["save"]);
      json rep = {{"modules", json::array()}, {"smoothquant", json::array()}};
      for (size_t i = modules_before; i < R.modules.size(); ++i) rep["modules"].push_back(R.modules[i]);
      for (size_t i = smoothing_before; i < R.smoothing.size(); ++i) rep["smoothquant"].push_back(R.smoothing[i]);
      if (R.stats_out) {
        res.stats.meta["smoothquant"] = rep["smoothquant"];
        R.stats_out->save_layer(l, res.stats);
      }
      // The layer file (the resume point, fsynced) is written while the next layer computes.
      if (pending_save.valid()) pending_save.get();
      if (writes)
        pending_save = std::async(std::launch::async, [&store, &R, l, res = std::move(res), rep = rep.dump()] {
          const auto t0 = Clock::now();
          store.save_layer(l, res.qs, res.smoothed, res.acts, rep);
          R.save_seconds += seconds_since(t0);
        });
      if (l == R.opt.stop_after_layer) {
        if (pending_save.valid()) pending_save.get();
        fail(Errc::usage, R.r.output, "stop_after_layer", "stopped after layer " + std::to_string(l) + ", as asked");
      }
      R.layers.push_back({{"layer", l}, {"seconds", seconds_since(t_layer)}});
      bar.update(l + 1);
    }
    if (pending_save.valid()) {
      PhaseTimer t(R.t.phase["save"]);
      pending_save.get();
    }
    bar.finish();
  }
  // No collective follows the layers: every rank closes its communicator here, so that rank 0
  // exports with the workers already gone (NCCL's teardown waits for every rank).
  if (R.opt.dist && R.opt.dist->layers_done) R.opt.dist->layers_done();
}

// ---------------------------------------------------------------- the report

}  // namespace

void check_room(const std::string& dir, const std::string& what, int64_t need, int64_t free) {
  const std::string sizes = "needs at least " + human_bytes(double(need)) + " for " + what + "; its file system has " + human_bytes(double(free)) + " free";
  if (need > free) fail(Errc::io, dir, "", sizes + " (free some, or write elsewhere)");
  if (need + need / 2 > free) warn(dir + ": " + sizes + ": it may not fit (scales, metadata and headers come on top)");
}

namespace {

// The least the run writes (disk_need) against the free space of the output's file system, and of
// --save-stats' (summed where it is the same one); the bounds go into the report. Returns the
// output's free bytes.
int64_t check_disk_space(Run& R, const std::string& staging) {
  const DiskNeed need = disk_need(R, !R.opt.save_stats.empty(), R.opt.resume);
  const FreeSpace at_out = free_space(staging);
  int64_t here = need.store + need.exports;
  std::string what = "the layer store and the exports";
  if (need.stats > 0) {
    const FreeSpace at_stats = free_space(R.opt.save_stats);
    if (at_stats.fs_id == at_out.fs_id) {
      here += need.stats;
      what += " and --save-stats' Hessians";
    } else {
      check_room(R.opt.save_stats, "--save-stats' Hessians", need.stats, at_stats.bytes);
    }
  }
  check_room(staging, what, here, at_out.bytes);
  R.disk = {{"store", need.store}, {"exports", need.exports}, {"stats", need.stats}};
  return at_out.bytes;
}

// ---------------------------------------------------------------- --dry-run

// A module's quantization in words: "gptq 4-bit, groups of 128, symmetric, act-order (static
// groups)"; GGUF's block type where the run writes GGUF.
std::string spec_words(const Run& R, const QuantSpec& s) {
  if (s.method == "nf4")
    return "nf4, blocks of " + std::to_string(R.r.nf4_blocksize) + (R.r.nf4_double_quant ? ", double-quantized absmax" : "");
  std::string w = s.method + " " + std::to_string(s.bits) + "-bit, " + (s.group_size > 0 ? "groups of " + std::to_string(s.group_size) : "per channel") + ", " +
                  (s.sym ? "symmetric" : "asymmetric");
  if (s.method == "gptq" && s.act_order) w += s.static_groups ? ", act-order (static groups)" : ", act-order";
  if (s.mse) w += ", MSE clipping";
  if (s.output_clip) w += ", AWQ clipping";
  if (std::find(R.r.formats.begin(), R.r.formats.end(), "gguf") != R.r.formats.end()) {
    GgmlType t;
    if (gguf_type_of(s, &t)) w += " (GGUF " + std::string(ggml_type_name(t)) + ")";
  }
  return w;
}

// Everything a run checks before it calibrates (the recipe against the model and its formats, the
// output folder, --gpus, the disk, the calibration text and its windows, --load-stats' key), and
// what it would do; nothing is written and no layer runs.
json plan_run(Run& R) {
  OutputDir::refuse_existing(R.r.output, R.opt.force);   // (with --resume too, as the run's OutputDir refuses it)
  if (R.r.gpus > 0 && R.opt.load_stats.empty()) check_gpus(R.r);
  load_model(R);
  const int64_t free = check_disk_space(R, OutputDir::staging_of(R.r.output));
  calibrate(R, /*embed=*/false);
  // --load-stats: the statistics' key against this model (its files hashed) and windows; read only.
  // (--save-stats' folder is made by the run; with --load-stats too, open_statistics refuses first.)
  if (!R.opt.load_stats.empty()) open_statistics(R);
  const LlamaConfig& c = R.c();
  // The Linears by what they get, in the order first met (load_model's plan, which the formats
  // checked); those kept in the source dtype.
  std::vector<std::pair<std::string, json>> groups;
  json kept = json::array();
  for (const ModulePlan& m : R.plan) {
    if (!m.quantized) {
      kept.push_back(m.name);
      continue;
    }
    const std::string w = spec_words(R, m.spec);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == w; });
    if (it == groups.end()) it = groups.insert(groups.end(), {w, {{"quantization", w}, {"modules", 0}, {"example", m.name}}});
    it->second["modules"] = it->second["modules"].get<int64_t>() + 1;
  }
  json quantized = json::array();
  for (auto& [w, g] : groups) quantized.push_back(g);
  json plan = {{"dry_run", true},
               {"model", {{"path", R.r.model}, {"model_type", c.model_type}, {"layers", c.num_hidden_layers}, {"hidden_size", c.hidden_size},
                          {"intermediate_size", c.intermediate_size}, {"dtype", dtype_name(c.dtype)}, {"tie_word_embeddings", c.tie_word_embeddings}}},
               {"output", R.r.output},
               {"device", R.dev.description},
               {"gpus", R.r.gpus},
               {"calibration", R.nf4 ? json{{"dataset", "none (NF4 is data-free)"}} : R.cd.describe(R.r.calibration)},
               {"linears", int64_t(R.plan.size())},
               {"quantized", quantized},
               {"kept_in_float", kept},
               {"formats", R.r.formats},
               {"disk_min_bytes", R.disk},
               {"free_bytes", free},
               {"recipe", yaml_to_json(R.r.to_yaml())}};
  if (R.r.awq.enabled)
    plan["awq"] = {{"grid", R.r.awq.grid}, {"duo_scaling", R.r.awq.duo_scaling}, {"pairs", R.r.awq.pairs}, {"clip", R.r.awq.clip}};
  if (R.r.smooth.enabled) plan["smoothquant"] = {{"alpha", R.r.smooth.auto_alpha ? json("auto") : json(R.r.smooth.alpha)}, {"pairs", R.r.smooth.pairs}};
  if (!R.gguf_type_fallback.empty()) plan["gguf_type_fallback"] = R.gguf_type_fallback;
  return plan;
}

json make_report(const Run& R, const json& outputs, double total) {
  const LlamaConfig& c = R.c();
  json report = {{"ptqkit_version", build_info().version},
                 {"build", build_json()},
                 {"recipe", yaml_to_json(R.r.to_yaml())},
                 {"device", R.dev.description},
                 {"forward", R.forward_description},
                 {"model", {{"path", R.r.model}, {"model_type", c.model_type}, {"layers", c.num_hidden_layers}, {"hidden_size", c.hidden_size},
                            {"intermediate_size", c.intermediate_size}, {"dtype", dtype_name(c.dtype)}}},
                 {"calibration", R.nf4 ? json{{"dataset", "none (NF4 is data-free)"}} : R.cd.describe(R.r.calibration)},
                 {"modules", R.modules},
                 {R.r.awq.enabled ? "awq" : "smoothquant", R.smoothing},
                 {"statistics", R.stats_info},
                 {"layers", R.layers},
                 {"phases_seconds", R.t.phase},
                 {"solve_phases_seconds", R.t.solve},
                 {"upload_phases_seconds", R.t.upload},
                 {"background_seconds", {{"load_next_layer", R.prefetch_seconds}, {"save_layer", R.save_seconds}, {"gguf_tables", R.gguf_tables_seconds}}},
                 {"total_seconds", total},
                 {"peak_rss_mb", peak_rss_mb()},
                 {"outputs", outputs}};
  if (!R.disk.is_null()) report["disk_min_bytes"] = R.disk;
  if (R.dev.cuda_built) report["peak_gpu_mb"] = R.dev.peak_gpu_mb();
  if (!R.gguf_fallback.empty()) report["gguf_float_fallback"] = R.gguf_fallback;
  if (!R.ct_fallback.empty()) report["compressed_tensors_float_fallback"] = R.ct_fallback;
  if (!R.gguf_type_fallback.empty()) report["gguf_type_fallback"] = R.gguf_type_fallback;
  return report;
}

}  // namespace

json run_quantize(const Recipe& recipe, const QuantizeOptions& opt) {
  const auto t_start = Clock::now();
  Run R;
  R.r = recipe;
  R.opt = opt;
  if (R.r.model.empty()) fail(Errc::usage, R.r.source, "model", "missing: set it in the recipe or with --model");
  if (R.r.output.empty()) fail(Errc::usage, R.r.source, "output", "missing: set it in the recipe or with --output");
  R.dev = select_device(R.r);
  // Finished layers of a run that did not complete are not thrown away unasked: --resume continues
  // them, --force starts over (a retried batch job would otherwise redo hours of calibration
  // without a word). Checked before any rank starts.
  if (!opt.resume && !opt.force && (!opt.dist || opt.dist->rank == 0)) {
    const std::string staging = OutputDir::staging_of(R.r.output);
    const int done = QuantStore(staging + "/.layers").finished_layers();
    if (done > 0)
      fail(Errc::exists, staging, "--resume",
           "holds " + std::to_string(done) + " finished layer(s) of a run that did not complete (interrupted, or still running): pass --resume to continue it, or --force to start over");
  }
  if (opt.dry_run) return plan_run(R);
  // --load-stats runs no calibration forward: nothing to spread over GPUs, so one GPU solves.
  if (R.r.gpus > 1 && !opt.dist && !opt.load_stats.empty())
    std::fprintf(stderr, "ptqkit: --load-stats runs no calibration forward: the solves run on one GPU (gpus: %d is not used)\n", R.r.gpus);
  if (R.r.gpus > 0 && !opt.dist && opt.load_stats.empty()) return run_quantize_gpus(R.r, opt);   // starts the other ranks; this process is rank 0
  if (opt.dist && opt.dist->rank > 0) {   // a worker: the same setup and layers on its windows; rank 0 writes
    load_model(R);
    calibrate(R);
    quantize_layers(R, QuantStore(OutputDir::staging_of(R.r.output) + "/.layers"), false);   // rank 0's, read to replay (--resume)
    if (env_switch("PTQKIT_DIST_TRACE", false)) {   // its phases, as rank 0's report has them
      std::string line;
      char v3[32];
      for (const auto* m : {&R.t.phase, &R.t.upload, &R.t.solve})
        for (const auto& [k, v] : *m) {
          std::snprintf(v3, sizeof v3, " %.3f", v);
          line += " " + k + v3;
        }
      std::fprintf(stderr, "ptqkit: rank %d phases (s):%s; total %.3f\n", opt.dist->rank, line.c_str(), seconds_since(t_start));
    }
    return json::object();
  }
  OutputDir out(R.r.output, opt.force, opt.resume, /*keep_on_failure=*/opt.resume);   // never destroy what --resume was asked to continue
  // setup
  load_model(R);
  check_disk_space(R, out.path());   // before any calibration: a full disk would end the run at its export
  GgufTablesAhead tables;            // with a GPU the host's cores are free while it calibrates
  if (R.dev.cuda) gguf_tables_ahead(R.r, *R.model, tables);
  calibrate(R);
  open_statistics(R);
  resume_point(R, out);
  // layers
  QuantStore store(out.path() + "/.layers");
  quantize_layers(R, store, true);
  // export
  json outputs;
  {
    PhaseTimer t(R.t.phase["export"]);
    const std::map<std::string, GgufTable> ahead = tables.tables.valid() ? tables.tables.get() : std::map<std::string, GgufTable>();
    R.gguf_tables_seconds = tables.seconds;
    outputs = export_formats(R.r, *R.model, store, out.path(), R.known, R.modules, R.vocab.tokens.empty() ? nullptr : &R.vocab, &ahead);
    std::filesystem::remove_all(out.path() + "/.layers");
    std::filesystem::remove(out.file(".resume.json"));
    if (R.stats_out) R.stats_out->commit(R.c().num_hidden_layers);
  }
  // report
  const json report = make_report(R, outputs, seconds_since(t_start));
  YAML::Emitter em;
  em << R.r.to_yaml();
  write_file_atomic(out.file("recipe.yaml"), std::string("# effective recipe written by ptqkit\n") + em.c_str() + "\n");
  write_file_atomic(out.file("report.json"), report.dump(2) + "\n");
  write_file_atomic(out.file("report.html"), report_html(report));
  out.commit();
  return report;
}

}  // namespace ptq
