// A real llama.cpp reads what ptqkit writes: node-llama-cpp's prebuilt llama.cpp library (npm,
// installed by scripts/setup.sh into .client/) loads each GGUF variant ptqkit writes for the shared
// models, tokenizes the evaluation text with the file's own vocabulary and scores it under
// ptqkit's protocol (tests/client/gguf_perplexity.mjs). Its token ids must equal ptqkit's, and its
// perplexity must agree with `ptqkit eval` of the same file within 1%: llama.cpp's CPU path rounds
// activations to 8 bits for its quantized dot products, ptqkit's reference path keeps them in fp32,
// so the two are close, not bit-equal. The reference here is llama.cpp, code we did not write.
//
// One known difference is llama.cpp's, not ours. SentencePiece's normalizer collapses runs of
// spaces (remove_extra_whitespaces, which the TinyStories tokenizer sets, as transformers' slow
// LlamaTokenizer and ptqkit apply it); llama.cpp's SPM tokenizer does not. So on text with a
// double space llama.cpp emits one extra "▁" token. The scored text has its space runs collapsed,
// and the raw text's difference is checked to be exactly one token per run.
#include <dlfcn.h>

#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <tuple>
#include <nlohmann/json.hpp>

#include "core/fsutil.h"
#include "core/safetensors.h"
#include "model/corpus.h"
#include "formats/gguf.h"
#include "quant/qstore.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "golden.h"
#include "testing.h"

using nlohmann::json;
using ptqtest::run_ptqkit;

namespace {

std::string client_dir() {
  const char* e = std::getenv("NODE_LLAMA_CPP_DIR");
  return e && *e ? e : std::string(PTQKIT_SOURCE_DIR) + "/.client";
}
// Why the client cannot run here, or "".
std::string client_missing() {
  if (std::system("command -v node >/dev/null 2>&1") != 0) return "node is not installed (apt-get install nodejs)";
  const std::string d = client_dir();
  for (const char* f : {"/node_modules/node-llama-cpp/dist/index.js", "/node_modules/@node-llama-cpp/linux-x64/package.json"})
    if (!std::filesystem::exists(d + f))
      return "node-llama-cpp is not installed in " + d + " (scripts/setup.sh installs it where npm is present; or set NODE_LLAMA_CPP_DIR)";
  return "";
}
#define PTQ_REQUIRE_CLIENT()                                   \
  PTQ_REQUIRE_ASSETS();                                        \
  if (const std::string why = client_missing(); !why.empty()) PTQ_SKIP(why)

// tests/client/gguf_perplexity.mjs --jobs: every job in one node process (node and llama.cpp start
// once, each file is loaded once); each job's JSON line, in order.
std::vector<json> run_client_jobs(const json& jobs, const ptqtest::TempDir& d) {
  ptq::write_file_atomic(d / "client-jobs.json", jobs.dump(1));
  const auto r = ptqtest::run_command("NODE_LLAMA_CPP_DIR='" + client_dir() + "' node '" + std::string(PTQKIT_SOURCE_DIR) +
                                      "/tests/client/gguf_perplexity.mjs' --jobs '" + d / "client-jobs.json" + "'");
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::vector<json> out;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') out.push_back(json::parse(line));
  REQUIRE(out.size() == jobs.size());
  return out;
}
std::vector<int32_t> read_ids(const std::string& file) {
  std::vector<int32_t> ids;
  std::ifstream f(file);
  for (int32_t id; f >> id;) ids.push_back(id);
  return ids;
}

// A model folder in d / "m": `files` linked from `src`, the rest written by the caller.
void link_model(const ptqtest::TempDir& d, const std::string& src, std::initializer_list<const char*> files) {
  std::filesystem::create_directories(d / "m");
  for (const char* f : files) std::filesystem::create_symlink(src + "/" + f, d / "m/" + f);
}

// `ptqkit quantize` of `model` into d / out: 8 (or `samples`) windows of seq_len calibration
// tokens, the quantization section's lines `quant`, the given export formats.
void quantize(const ptqtest::TempDir& d, const std::string& out, const std::string& model, int seq_len, const std::string& quant,
              const std::string& formats, int samples = 8) {
  ptq::write_file_atomic(d / (out + ".yaml"), "model: " + model + "\noutput: " + d / out + "\ncalibration:\n  dataset: " + ptqtest::assets() +
                                                  "/text/tinystories/calib.txt\n  samples: " + std::to_string(samples) + "\n  seq_len: " +
                                                  std::to_string(seq_len) + "\n  seed: 0\nquantization:\n" + quant + "export:\n  format: " + formats + "\n");
  const auto q = run_ptqkit("-q quantize " + d / (out + ".yaml"));
  INFO(q.out);
  REQUIRE(q.code == 0);
}
const std::string kFloatLayers = "  method: rtn\n  ignore: ['model.layers.*']\n";   // every Linear kept as stored
std::string gptq_g32(int bits) {
  return "  method: gptq\n  bits: " + std::to_string(bits) + "\n  group_size: 32\n  sym: true\n  act_order: true\n  static_groups: true\n";
}

// llama.cpp's perplexity of `gguf` on `text` under `protocol` (gptq: ptqkit's; llama.cpp:
// llama-perplexity's), the whole text's token ids written to `ids_file`: a job for run_client_jobs.
json perplexity_job(const std::string& gguf, const std::string& text, int ctx, int windows, const std::string& ids_file,
                    const std::string& protocol = "gptq") {
  return {{"perplexity", {{"model", gguf}, {"text", text}, {"ctx", ctx}, {"windows", windows}, {"ids_out", ids_file}, {"protocol", protocol}}}};
}

struct Variant {
  const char* model;   // under assets/models
  int ctx, windows;
  const char* gguf_type;   // export.gguf_type, or what symmetric groups of 32 of `bits` map to (bits > 0)
  int bits;
  bool llama_cpp_protocol = false;   // also compare under llama-perplexity's protocol
};

void check_variant(const Variant& v) {
  ptqtest::TempDir d;
  const std::string A = ptqtest::assets(), model = A + "/models/" + v.model, raw = A + "/text/tinystories/eval.txt";
  std::string t = ptq::read_text_file(raw), collapsed;
  int64_t runs = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == ' ' && i > 0 && t[i - 1] == ' ') {
      if (i < 2 || t[i - 2] != ' ') ++runs;
      continue;
    }
    collapsed += t[i];
  }
  ptq::write_file_atomic(d / "eval.txt", collapsed);
  const std::string text = d / "eval.txt";
  if (v.bits) quantize(d, "q", model, v.ctx, gptq_g32(v.bits), "gguf", 16);
  else quantize(d, "q", model, v.ctx, "  method: gptq\n  act_order: true\n", std::string("gguf\n  gguf_type: ") + v.gguf_type, 16);
  const std::string gguf = d / "q/model.gguf";
  // llama.cpp's three readings of the file in one process: the scored text under ptqkit's
  // protocol, under llama-perplexity's (where asked), and the raw text's tokenization
  json jobs = {perplexity_job(gguf, text, v.ctx, v.windows, d / "ids.txt")};
  if (v.llama_cpp_protocol) jobs.push_back(perplexity_job(gguf, text, v.ctx, v.windows, d / "ids-p.txt", "llama.cpp"));
  jobs.push_back(perplexity_job(gguf, raw, v.ctx, 0, d / "ids-raw.txt"));
  const std::vector<json> c = run_client_jobs(jobs, d);
  const std::vector<int32_t> c_ids = read_ids(d / "ids.txt");
  auto e = run_ptqkit("eval --model " + gguf + " --data " + text + " --seq-len " + std::to_string(v.ctx) + " --max-windows " +
                      std::to_string(v.windows) + " --json " + d / "e.json");
  INFO(e.out);
  REQUIRE(e.code == 0);
  const json ours = json::parse(ptq::read_text_file(d / "e.json"));
  // ptqkit's tokenization of the same text (the tokenizer beside the GGUF) against llama.cpp's
  auto tok = ptq::load_tokenizer(d / "q", 1);
  const std::vector<int32_t> ids = ptq::encode_corpus(*tok, text);
  const double theirs = c[0]["perplexity"].get<double>(), mine = ours["perplexity"].get<double>();
  std::cout << v.model << " " << v.gguf_type << " (ctx " << v.ctx << ", " << v.windows << " windows): llama.cpp " << theirs << ", ptqkit "
            << mine << " (" << 100.0 * (theirs - mine) / mine << "%), tokens " << c_ids.size() << " / " << ids.size() << "\n";
  size_t first = 0;   // the first position where the two tokenizations part
  while (first < ids.size() && first < c_ids.size() && ids[first] == c_ids[first]) ++first;
  if (first < std::max(ids.size(), c_ids.size())) {
    std::cout << "  tokenizations part at " << first << ":";
    for (size_t i = first; i < first + 8 && i < ids.size(); ++i) std::cout << " " << ids[i] << " '" << tok->decode({ids[i]}) << "'";
    std::cout << "  | llama.cpp:";
    for (size_t i = first; i < first + 8 && i < c_ids.size(); ++i) std::cout << " " << c_ids[i] << " '" << tok->decode({c_ids[i]}) << "'";
    std::cout << "\n";
  }
  CHECK(c_ids.size() == ids.size());
  CHECK(c_ids == ids);
  CHECK(c[0]["scored"].get<int64_t>() == ours["scored_tokens"].get<int64_t>());
  CHECK(std::abs(theirs - mine) <= 0.01 * mine);
  // llama-perplexity's protocol (BOS first, second halves scored) on both sides
  if (v.llama_cpp_protocol) {
    const json& cp = c[1];
    auto ep = run_ptqkit("eval --model " + gguf + " --data " + text + " --seq-len " + std::to_string(v.ctx) + " --max-windows " +
                         std::to_string(v.windows) + " --protocol llama.cpp --json " + d / "ep.json");
    INFO(ep.out);
    REQUIRE(ep.code == 0);
    const json op = json::parse(ptq::read_text_file(d / "ep.json"));
    const double tp = cp["perplexity"].get<double>(), mp = op["perplexity"].get<double>();
    std::cout << "  llama.cpp's protocol: llama.cpp " << tp << ", ptqkit " << mp << " (" << 100.0 * (tp - mp) / mp << "%), scored "
              << cp["scored"] << " / " << op["scored_tokens"] << "\n";
    CHECK(cp["scored"].get<int64_t>() == op["scored_tokens"].get<int64_t>());
    CHECK(op["protocol"] == "llama.cpp");
    CHECK(std::abs(tp - mp) <= 0.01 * mp);
  }
  // the raw text: one extra token per run of spaces on llama.cpp's side, nothing else
  const std::vector<int32_t> ids_raw = ptq::encode_corpus(*tok, raw);
  CHECK(int64_t(read_ids(d / "ids-raw.txt").size()) - int64_t(ids_raw.size()) == runs);
}

}  // namespace

TEST_CASE("client: llama.cpp reads ptqkit's Q8_0 and Q4_0 GGUF of llama2xs: same tokens, perplexity within 1% of ptqkit's eval") {
  PTQ_REQUIRE_CLIENT();
  check_variant({"llama2xs", 256, 8, "Q8_0", 8});
  check_variant({"llama2xs", 256, 8, "Q4_0", 4, true});
}

TEST_CASE("client: llama.cpp reads ptqkit's Q8_0 and Q4_0 GGUF of distilled-13m (f16 checkpoint, ctx 512)") {
  PTQ_REQUIRE_CLIENT();
  check_variant({"distilled-13m", 512, 4, "Q8_0", 8});
  check_variant({"distilled-13m", 512, 4, "Q4_0", 4});
}

// Q4_1 on llama2xs; the K mixes on distilled-13m, whose down_proj (1024 wide) takes K-quants and
// whose 384-wide Linears fall back as llama.cpp's quantizer does: Q4_K_M writes Q4_K, Q6_K, Q5_0
// and Q8_0 blocks, Q5_K_M Q5_K, Q6_K, Q5_1 and Q8_0: every block type ptqkit writes.
TEST_CASE("client: llama.cpp reads ptqkit's Q4_1 GGUF of llama2xs and its Q4_K_M and Q5_K_M GGUF of distilled-13m") {
  PTQ_REQUIRE_CLIENT();
  check_variant({"llama2xs", 256, 8, "Q4_1", 0, true});
  check_variant({"distilled-13m", 512, 4, "Q4_K_M", 0, true});
  check_variant({"distilled-13m", 512, 4, "Q5_K_M", 0});
}

// ---- llama.cpp's own decoders and quantizer, called in its libraries ----
namespace {
std::string client_lib(const char* name) { return client_dir() + "/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/" + name; }
void* open_lib(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  INFO(path << ": " << (h ? "" : dlerror()));
  REQUIRE(h != nullptr);
  return h;
}
}  // namespace

// Random blocks of every type ptqkit writes, encoded from codes and parameters by ptqkit's
// encoder, decoded by libggml-base's dequantize_row_* (llama.cpp's) and by ptqkit's reference
// decoder: every float equal; and each value equal to the type's formula in float64 within one
// float rounding.
TEST_CASE("client: llama.cpp's dequantize_row_* decodes ptqkit's blocks of every type exactly as ptqkit's reference decoder") {
  PTQ_REQUIRE_CLIENT();
  void* lib = open_lib(client_lib("libggml-base.so"));
  using Dequant = void (*)(const void*, float*, int64_t);
  std::mt19937 rng(7);
  for (ptq::GgmlType t : {ptq::GgmlType::Q4_0, ptq::GgmlType::Q4_1, ptq::GgmlType::Q5_0, ptq::GgmlType::Q5_1, ptq::GgmlType::Q8_0,
                          ptq::GgmlType::Q4_K, ptq::GgmlType::Q5_K, ptq::GgmlType::Q6_K}) {
    std::string sym = std::string("dequantize_row_") + ptq::ggml_type_name(t);
    sym[sym.size() - 4] = 'q';   // dequantize_row_q4_0, ..._q4_K: ggml's names keep the K upper case
    const auto theirs = reinterpret_cast<Dequant>(dlsym(lib, sym.c_str()));
    INFO(sym);
    REQUIRE(theirs != nullptr);
    const int n = ptq::ggml_block_elems(t), nb = 64;
    const int bits = t == ptq::GgmlType::Q8_0 ? 8 : t == ptq::GgmlType::Q6_K ? 6 : (t == ptq::GgmlType::Q5_0 || t == ptq::GgmlType::Q5_1 || t == ptq::GgmlType::Q5_K) ? 5 : 4;
    std::vector<char> blocks(size_t(nb * ptq::ggml_block_bytes(t)));
    std::vector<double> expect(size_t(nb * n)), mag(size_t(nb * n));   // the value, and the sum of its terms' magnitudes
    for (int b = 0; b < nb; ++b) {
      ptq::BlockParams p;
      auto f16 = [&](double lo, double hi) { return ptq::f32_to_f16_bits(float(std::uniform_real_distribution<double>(lo, hi)(rng))); };
      p.d = f16(1e-4, 0.05);
      p.m = f16(-0.5, 0.5);
      p.dmin = f16(1e-4, 0.02);
      for (int j = 0; j < 16; ++j) p.sc[j] = t == ptq::GgmlType::Q6_K ? int(rng() % 256) - 128 : int(rng() % 64);
      for (int j = 0; j < 8; ++j) p.mc[j] = int(rng() % 64);
      std::vector<uint8_t> q(static_cast<size_t>(n));
      for (auto& c : q) c = uint8_t(rng() % (1u << bits));
      ptq::encode_block(t, p, q.data(), blocks.data() + size_t(b * ptq::ggml_block_bytes(t)));
      const double d = ptq::f16_bits_to_f32(p.d), m = ptq::f16_bits_to_f32(p.m), dmin = ptq::f16_bits_to_f32(p.dmin);
      for (int e = 0; e < n; ++e) {
        double v, w = 0;
        const int c = q[size_t(e)];
        switch (t) {
          case ptq::GgmlType::Q4_0: v = d * (c - 8); break;
          case ptq::GgmlType::Q5_0: v = d * (c - 16); break;
          case ptq::GgmlType::Q8_0: v = d * (c - 128); break;
          case ptq::GgmlType::Q4_1: case ptq::GgmlType::Q5_1: v = d * c + m; w = std::abs(d * c) + std::abs(m); break;
          case ptq::GgmlType::Q6_K: v = d * p.sc[e / 16] * (c - 32); break;
          default: v = d * p.sc[e / 32] * c - dmin * p.mc[e / 32]; w = std::abs(d * p.sc[e / 32] * c) + dmin * p.mc[e / 32]; break;
        }
        expect[size_t(b * n + e)] = v;
        mag[size_t(b * n + e)] = std::max(w, std::abs(v));
      }
    }
    std::vector<float> ours(expect.size()), ref(expect.size());
    ptq::dequantize_row(t, blocks.data(), ours.data(), int64_t(expect.size()));
    theirs(blocks.data(), ref.data(), int64_t(expect.size()));
    int64_t differ = 0, off = 0;
    for (size_t i = 0; i < expect.size(); ++i) {
      differ += std::memcmp(&ours[i], &ref[i], 4) != 0;
      // two float roundings at most (a product, then a sum or a second product)
      off += std::abs(double(ours[i]) - expect[i]) > 2.5e-7 * mag[i];
    }
    std::cout << ptq::ggml_type_name(t) << ": " << expect.size() << " values, " << differ << " differ from llama.cpp's decoder\n";
    CHECK(differ == 0);
    CHECK(off == 0);
  }
  dlclose(lib);
}

// ---- the other families: logits on transformers' golden input ids ----
//
// The tiny checkpoints (bf16, written by transformers) carry no tokenizer: each is linked into a
// folder with ptqkit's byte-level tokenizer (259 tokens, the rest of the 320 padded), which only
// fills the GGUF's vocabulary; the sequences fed are the golden files' token ids.
namespace {

struct Logits {
  std::vector<float> v;
  int64_t rows = 0, vocab = 0;
};
// llama.cpp's logits of each file in `ggufs` on the sequences `seqs`, one node process for all.
std::vector<Logits> llama_cpp_logits(const std::vector<std::string>& ggufs, const std::vector<std::vector<int32_t>>& seqs,
                                     const ptqtest::TempDir& d) {
  std::string ids;
  for (auto& s : seqs) {
    for (int32_t t : s) ids += std::to_string(t) + " ";
    ids += "\n";
  }
  ptq::write_file_atomic(d / "seqs.txt", ids);
  json jobs = json::array();
  for (size_t i = 0; i < ggufs.size(); ++i)
    jobs.push_back({{"logits", {{"model", ggufs[i]}, {"ids", d / "seqs.txt"}, {"out", d / ("logits-" + std::to_string(i) + ".f32")}}}});
  const std::vector<json> res = run_client_jobs(jobs, d);
  std::vector<Logits> out(ggufs.size());
  for (size_t i = 0; i < ggufs.size(); ++i) {
    Logits& l = out[i];
    l.rows = res[i]["rows"].get<int64_t>();
    l.vocab = res[i]["vocab"].get<int64_t>();
    const std::string raw = ptq::read_text_file(d / ("logits-" + std::to_string(i) + ".f32"));
    REQUIRE(raw.size() == size_t(l.rows * l.vocab) * 4);
    l.v.resize(size_t(l.rows * l.vocab));
    std::memcpy(l.v.data(), raw.data(), raw.size());
  }
  return out;
}
// ||a - b|| / ||b|| over all logits (Frobenius)
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) { num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]); den += double(b[i]) * b[i]; }
  return std::sqrt(num / den);
}
// The median over positions of each position's relative error: robust to the few tokens whose
// near-tied router choice (MoE) flips under llama.cpp's 8-bit activations.
double median_row_error(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  std::vector<double> e;
  for (size_t r = 0; r * size_t(vocab) < b.size(); ++r)
    e.push_back(relative_error(std::vector<float>(a.begin() + long(r) * vocab, a.begin() + long(r + 1) * vocab),
                               std::vector<float>(b.begin() + long(r) * vocab, b.begin() + long(r + 1) * vocab)));
  std::nth_element(e.begin(), e.begin() + long(e.size() / 2), e.end());
  return e[e.size() / 2];
}

void check_family(const std::string& family) {
  ptqtest::TempDir d;
  const std::string A = ptqtest::assets(), src = A + "/models/tiny-" + family;
  link_model(d, src, {"config.json", "generation_config.json", "model.safetensors"});
  ptq::write_file_atomic(d / "m/tokenizer.json", ptq::byte_level_tokenizer_json());
  // the golden input ids [S, T] and transformers' fp32 logits [S * T, vocab]
  const ptqtest::Golden g = ptqtest::golden("tiny-" + family);
  const int64_t S = g.S, T = g.T;
  std::vector<std::vector<int32_t>> seqs(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) seqs[size_t(s)].assign(g.ids.begin() + s * T, g.ids.begin() + (s + 1) * T);
  const std::vector<float>& golden = g.logits;
  // bf16 weights as stored (every Linear ignored): llama.cpp against transformers itself; GPTQ as
  // Q8_0, Q4_0, Q4_1 and llama.cpp's Q4_K_M mix (on these 64-wide Linears its fallbacks: Q5_0 and
  // Q8_0; phi3's fused qkv, llama.cpp's attn_v, Q5_0 and Q8_0): llama.cpp's logits of the GGUF against ptqkit's forward of the
  // fake export of the same run (the same codes, dequantized and rounded to bf16; the GGUF's output
  // and token embedding kept float, as the fake export keeps them). Every file is written first,
  // then llama.cpp reads them all in one process.
  quantize(d, "float", d / "m", 64, kFloatLayers, "[gguf, fake]");
  const std::string by_type = "  method: gptq\n  act_order: true\n", both = "[gguf, fake]\n  gguf_output_type: float\n  gguf_embedding_type: float";
  const std::vector<std::tuple<std::string, std::string, std::string>> runs = {{"q8", gptq_g32(8), both},
                                                                               {"q4", gptq_g32(4), both},
                                                                               {"q4_1", by_type, both + "\n  gguf_type: Q4_1"},
                                                                               {"q4_k_m", by_type, both + "\n  gguf_type: Q4_K_M"}};
  std::vector<std::string> ggufs = {d / "float/gguf/model.gguf"};
  for (const auto& [out, quant, formats] : runs) {
    INFO(out);
    quantize(d, out, d / "m", 64, quant, formats);
    // tiny-qwen3-moe's experts are 48 wide: their downs cannot be blocks of 32 and stay bf16, said
    // in the report (and, as the exact names, in the effective recipe's ignore list)
    const json rep = json::parse(ptq::read_text_file(d / (out + "/report.json")));
    if (out == "q4_k_m") CHECK(rep.contains("gguf_type_fallback"));
    if (family == "qwen3-moe") {
      REQUIRE(rep.contains("gguf_float_fallback"));
      CHECK(rep["gguf_float_fallback"].size() == 16);   // 2 layers x 8 experts
      CHECK(rep["gguf_float_fallback"][0] == "model.layers.0.mlp.experts.0.down_proj");
    } else {
      CHECK_FALSE(rep.contains("gguf_float_fallback"));
    }
    ggufs.push_back(d / (out + "/gguf/model.gguf"));
  }
  const std::vector<Logits> theirs = llama_cpp_logits(ggufs, seqs, d);
  const Logits& lf = theirs[0];
  // inspect reads every family's file: llama.cpp's architecture and its per-architecture keys
  const auto in = run_ptqkit("inspect " + d / "float/gguf/model.gguf");
  INFO(in.out);
  CHECK(in.code == 0);
  const ptq::LlamaConfig cfg = ptq::load_config(d / "m");
  CHECK(in.out.find("GGUF v3, " + ptq::gguf_arch(cfg)) != std::string::npos);
  CHECK(in.out.find(std::to_string(cfg.num_hidden_layers) + " layers, hidden " + std::to_string(cfg.hidden_size)) != std::string::npos);
  if (cfg.num_experts) CHECK(in.out.find(std::to_string(cfg.num_experts) + " experts") != std::string::npos);
  REQUIRE(lf.rows == S * T);
  REQUIRE(size_t(lf.rows * lf.vocab) == golden.size());
  const double e_float = relative_error(lf.v, golden), m_float = median_row_error(lf.v, golden, lf.vocab);
  double e_q[4], m_q[4];
  std::vector<int32_t> flat;
  for (auto& s : seqs) flat.insert(flat.end(), s.begin(), s.end());
  for (int k = 0; k < 4; ++k) {
    const Logits& lq = theirs[size_t(k) + 1];
    ptq::LlamaModel fake(d / (std::get<0>(runs[size_t(k)]) + "/fake"));
    const ptq::MatF ours = fake.forward(flat, int(S), int(T));
    std::vector<float> ov(ours.data(), ours.data() + ours.size());
    REQUIRE(ov.size() == lq.v.size());
    e_q[k] = relative_error(lq.v, ov);
    m_q[k] = median_row_error(lq.v, ov, lq.vocab);
  }
  std::cout << "tiny-" << family << " GGUF (" << S << " x " << T << " golden ids): llama.cpp's logits vs transformers' (bf16 weights) " << 100 * e_float
            << "% (median position " << 100 * m_float << "%); Q8_0 vs ptqkit's forward of the same codes " << 100 * e_q[0] << "% (median position " << 100 * m_q[0] << "%), Q4_0 "
            << 100 * e_q[1] << "% (median " << 100 * m_q[1] << "%), Q4_1 " << 100 * e_q[2] << "% (median " << 100 * m_q[2] << "%), Q4_K_M " << 100 * e_q[3]
            << "% (median " << 100 * m_q[3] << "%)\n";
  // llama.cpp's CPU path: bf16 weights meet activations rounded to bf16 (0.4-0.5% measured on the
  // dense families); Q8_0 / Q4_0 weights meet activations quantized to 8 bits per block of 32,
  // and ptqkit's fake export holds the dequantized weights rounded to bf16 (medians 1.2-2.5%).
  // Over all positions the MoE models add the tokens whose near-tied router choice flips (tiny-
  // qwen3-moe: 8 random experts; 2.1% float, 6.6-9.5% quantized): bounded loosely, the medians
  // carry the check.
  CHECK(m_float <= 0.01);
  CHECK(e_float <= 0.03);
  for (int i = 0; i < 4; ++i) {
    CHECK(m_q[i] <= 0.03);
    CHECK(e_q[i] <= 0.10);
  }
}

}  // namespace

TEST_CASE("client: llama.cpp reads ptqkit's GGUF of Qwen3 (q/k norms), Mixtral (llama with experts), Qwen3-MoE and Phi-3 (fused)") {
  PTQ_REQUIRE_CLIENT();
  for (const char* f : {"qwen3", "mixtral", "qwen3-moe", "phi3"}) {
    INFO(f);
    check_family(f);
  }
}

TEST_CASE("client: Llama 3.1 rope scaling (rope_freqs): llama.cpp's logits of ptqkit's GGUF equal ptqkit's forward of the checkpoint") {
  PTQ_REQUIRE_CLIENT();
  // llama2xs (f32, head_dim 8) with a Llama 3.1 rope: theta 500000 and rope_scaling llama3 (factor
  // 8, original context 512): of its 4 rotary frequencies (wavelengths 6, 167, 4443 and 118,000
  // positions) the first is kept, the second blended (between 128 and 512) and the others divided by 8.
  ptqtest::TempDir d;
  const std::string A = ptqtest::assets(), src = A + "/models/llama2xs";
  link_model(d, src, {"generation_config.json", "model.safetensors", "tokenizer.model", "tokenizer_config.json"});
  json cfg = json::parse(ptq::read_text_file(src + "/config.json"));
  cfg["rope_theta"] = 500000.0;
  cfg["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 512}};
  ptq::write_file_atomic(d / "m/config.json", cfg.dump(2));
  quantize(d, "q", d / "m", 256, kFloatLayers, "gguf");
  ptq::LlamaModel m(d / "m");
  auto tok = ptq::load_tokenizer(d / "m", 1);
  std::vector<int32_t> ids = ptq::encode_corpus(*tok, A + "/text/tinystories/eval.txt");
  ids.resize(256);
  const ptq::MatF ours = m.forward(ids, 1, 256);
  const std::vector<float> ov(ours.data(), ours.data() + ours.size());
  // the same model without the scaling, to show that the scaling is what is compared
  json plain = cfg;
  plain.erase("rope_scaling");
  ptq::write_file_atomic(d / "m/config.json", plain.dump(2));
  const ptq::MatF unscaled = ptq::LlamaModel(d / "m").forward(ids, 1, 256);
  const std::vector<float> uv(unscaled.data(), unscaled.data() + unscaled.size());
  // and llama.cpp's own difference from ptqkit on that unscaled model (its f16 KV cache and
  // float32 rotary tables): the floor the scaled comparison is held to
  quantize(d, "q2", d / "m", 256, kFloatLayers, "gguf");
  const std::vector<Logits> theirs = llama_cpp_logits({d / "q/model.gguf", d / "q2/model.gguf"}, {ids}, d);
  const Logits &l = theirs[0], &l2 = theirs[1];
  REQUIRE(ov.size() == l.v.size());
  const double e = relative_error(l.v, ov), e_unscaled = relative_error(l.v, uv), floor = relative_error(l2.v, uv);
  std::cout << "llama2xs with Llama 3.1 rope scaling: llama.cpp vs ptqkit " << 100 * e << "% (without the scaling on both sides " << 100 * floor
            << "%); llama.cpp's scaled logits vs ptqkit without the scaling " << 100 * e_unscaled << "%\n";
  CHECK(e <= 1.5 * floor + 1e-4);
  CHECK(e_unscaled >= 10 * e);
}

TEST_CASE("client: Qwen2 (q/k/v biases): llama.cpp's logits of ptqkit's GGUF, float and Q8_0, equal ptqkit's forward") {
  PTQ_REQUIRE_CLIENT();
  // llama2xs's weights (f32) as a qwen2 checkpoint with random q/k/v biases
  ptqtest::TempDir d;
  const std::string A = ptqtest::assets(), src = A + "/models/llama2xs";
  link_model(d, src, {"generation_config.json", "tokenizer.model", "tokenizer_config.json"});
  json cfg = json::parse(ptq::read_text_file(src + "/config.json"));
  cfg["model_type"] = "qwen2";
  cfg["architectures"] = {"Qwen2ForCausalLM"};
  ptq::write_file_atomic(d / "m/config.json", cfg.dump(2));
  ptq::SafetensorsFile in(src + "/model.safetensors");
  std::vector<ptq::NamedTensor> ts;
  for (const std::string& n : in.names()) {
    const auto v = in.get(n);
    ts.push_back({n, ptq::tensor_from_f32(ptq::tensor_to_f32(v).data(), v.shape, ptq::DType::F32)});
  }
  uint64_t seed = 1;
  for (int l = 0; l < cfg["num_hidden_layers"].get<int>(); ++l)
    for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
      const std::string w = "model.layers." + std::to_string(l) + ".self_attn." + p + ".weight";
      const int64_t rows = in.get(w).shape[0];
      std::vector<float> b(static_cast<size_t>(rows));
      for (auto& x : b) { seed = seed * 6364136223846793005ULL + 1442695040888963407ULL; x = float(int64_t(seed >> 40) % 1000) / 2000.0f; }
      ts.push_back({w.substr(0, w.size() - 7) + ".bias", ptq::tensor_from_f32(b.data(), {rows}, ptq::DType::F32)});
    }
  ptq::write_safetensors(d / "m/model.safetensors", ts);
  auto tok = ptq::load_tokenizer(d / "m", 1);
  std::vector<int32_t> ids = ptq::encode_corpus(*tok, A + "/text/tinystories/eval.txt");
  ids.resize(128);
  for (int bits : {0, 8}) quantize(d, "q" + std::to_string(bits), d / "m", 128, bits ? gptq_g32(8) : kFloatLayers, "[gguf, fake]");
  const std::vector<Logits> theirs = llama_cpp_logits({d / "q0/gguf/model.gguf", d / "q8/gguf/model.gguf"}, {ids}, d);
  for (int bits : {0, 8}) {
    const std::string out = "q" + std::to_string(bits);
    const Logits& l = theirs[bits ? 1 : 0];
    const ptq::MatF ours = ptq::LlamaModel(d / (out + "/fake")).forward(ids, 1, 128);
    const double e = relative_error(l.v, std::vector<float>(ours.data(), ours.data() + ours.size()));
    std::cout << "qwen2 (llama2xs with q/k/v biases) " << (bits ? "Q8_0" : "F32") << ": llama.cpp vs ptqkit " << 100 * e << "%\n";
    // F32 weights: llama.cpp's f16 KV cache only (0.07% measured); Q8_0: its activations quantized
    // to 8 bits per block of 32 against the same dequantized weights in f32 (1.3% measured)
    CHECK(e <= (bits ? 0.02 : 0.005));
  }
}

namespace {
// The leading fields of llama.cpp's llama_model_quantize_params (llama.h; their order has held since
// the output and embedding types were added); the rest is kept as llama_model_quantize_default_params
// returns it.
struct QuantizeParams {
  int32_t nthread, ftype, output_tensor_type, token_embedding_type;
  char rest[240];
};
// llama.cpp's llama_model_quantize of `in` into `out` as llama_ftype `ftype`; output.weight and
// token_embd as ggml types `output` and `embedding`, or (-1) as its defaults choose them.
void llama_cpp_quantize_tables(const std::string& in, const std::string& out, int ftype, int output, int embedding) {
  void* lib = open_lib(client_lib("libllama.v0.5.0.so"));
  const auto defaults = reinterpret_cast<QuantizeParams (*)()>(dlsym(lib, "llama_model_quantize_default_params"));
  const auto quantize_model = reinterpret_cast<uint32_t (*)(const char*, const char*, const QuantizeParams*)>(dlsym(lib, "llama_model_quantize"));
  REQUIRE(defaults != nullptr);
  REQUIRE(quantize_model != nullptr);
  QuantizeParams p = defaults();
  p.nthread = 2;
  p.ftype = ftype;
  if (output >= 0) p.output_tensor_type = output;
  if (embedding >= 0) p.token_embedding_type = embedding;
  REQUIRE(quantize_model(in.c_str(), out.c_str(), &p) == 0);
  dlclose(lib);
}
// The same with both as its defaults choose them, or kept F16 (ggml type 1) with `beside_f16`.
void llama_cpp_quantize(const std::string& in, const std::string& out, int ftype, bool beside_f16) {
  llama_cpp_quantize_tables(in, out, ftype, beside_f16 ? 1 : -1, beside_f16 ? 1 : -1);
}
// The tensors of each block type in a GGUF file.
std::map<std::string, int> gguf_types(const std::string& path) {
  std::map<std::string, int> n;
  ptq::GgufFile f(path);
  for (auto& t : f.tensors()) n[ptq::ggml_type_name(t.type)]++;
  return n;
}
// Each tensor's type.
std::map<std::string, std::string> gguf_tensor_types(const std::string& path) {
  std::map<std::string, std::string> n;
  ptq::GgufFile f(path);
  for (auto& t : f.tensors()) n[t.name] = ptq::ggml_type_name(t.type);
  return n;
}
double eval_llama_protocol(const std::string& gguf, const std::string& text, int ctx, int windows, const std::string& json_out) {
  auto e = run_ptqkit("eval --model " + gguf + " --data " + text + " --seq-len " + std::to_string(ctx) + " --max-windows " + std::to_string(windows) +
                      " --protocol llama.cpp --json " + json_out);
  INFO(e.out);
  REQUIRE(e.code == 0);
  return json::parse(ptq::read_text_file(json_out))["perplexity"].get<double>();
}
}  // namespace

namespace {
// distilled-13m with every ffn_down (blk.N.ffn_down.weight: the Linears K-quants can hold, 1024
// wide) taken from a GGUF file, the rest as stored: an F32 checkpoint in folder `out`.
void with_ffn_down_of(const std::string& gguf, const std::string& model, const std::string& out) {
  std::filesystem::create_directories(out);
  for (auto& e : std::filesystem::directory_iterator(model))
    if (e.path().filename().string().find(".safetensors") == std::string::npos)   // (shards and their index: written below as one file)
      std::filesystem::copy(e.path(), out + "/" + e.path().filename().string());
  ptq::Checkpoint ck(model);
  ptq::GgufFile g(gguf);
  std::vector<ptq::NamedTensor> ts;
  for (const std::string& n : ck.names()) {
    const ptq::TensorView t = ck.get(n);
    std::vector<float> v = ptq::tensor_to_f32(t);
    const std::string key = ".mlp.down_proj.weight";
    if (n.size() > key.size() && n.compare(n.size() - key.size(), key.size(), key) == 0) {
      const auto* gt = g.find("blk." + std::to_string(ptq::layer_of(n)) + ".ffn_down.weight");
      REQUIRE(gt != nullptr);
      g.read_f32(*gt, v.data());
    }
    ts.push_back({n, ptq::tensor_from_f32(v.data(), t.shape, ptq::DType::F32)});
  }
  ptq::write_safetensors(out + "/model.safetensors", ts, {{"format", "pt"}});
  json cfg = json::parse(ptq::read_text_file(model + "/config.json"));
  cfg["torch_dtype"] = "float32";
  ptq::write_file_atomic(out + "/config.json", cfg.dump(2));
}
}  // namespace

// llama.cpp's own Q4_K_M of distilled-13m (llama_model_quantize from ptqkit's f16 GGUF of it: its
// round-to-nearest K-quant search, no importance matrix) against ptqkit's (GPTQ on the same block
// types, 32 calibration windows, the other Linears left in float so that the calibration sees the
// float model's inputs). The two files hold the same type tensor for tensor, llama.cpp's output and
// token embedding types included. Compared where K-quants apply:
// the float model with its ffn_down taken from each file (Q4_K in four layers, Q6_K in four).
TEST_CASE("client: on distilled-13m's ffn_down (the Linears K-quants hold) ptqkit's Q4_K_M blocks beat llama.cpp's own Q4_K_M") {
  PTQ_REQUIRE_CLIENT();
  ptqtest::TempDir d;
  const std::string A = ptqtest::assets(), model = A + "/models/distilled-13m", text = A + "/text/tinystories/eval.txt";
  quantize(d, "float", model, 512, kFloatLayers, "gguf");
  std::filesystem::create_directories(d / "llama");   // the tokenizer and config beside llama.cpp's file, as beside ours
  for (auto& e : std::filesystem::directory_iterator(d / "float"))
    if (e.path().extension() != ".gguf") std::filesystem::copy(e.path(), d / "llama" / e.path().filename());
  llama_cpp_quantize(d / "float/model.gguf", d / "llama/model.gguf", 15, false);   // LLAMA_FTYPE_MOSTLY_Q4_K_M, its default output and embedding types
  quantize(d, "mix", model, 512, "  method: gptq\n  act_order: true\n", "gguf\n  gguf_type: Q4_K_M", 32);
  CHECK(gguf_tensor_types(d / "mix/model.gguf") == gguf_tensor_types(d / "llama/model.gguf"));
  // rows of 384 hold no K-quant block: output.weight Q8_0, token_embd.weight Q4_K's fallback Q5_0
  CHECK(gguf_tensor_types(d / "mix/model.gguf")["output.weight"] == "Q8_0");
  CHECK(gguf_tensor_types(d / "mix/model.gguf")["token_embd.weight"] == "Q5_0");
  for (auto& [t, n] : gguf_types(d / "mix/model.gguf")) std::cout << t << " " << n << "  ";
  std::cout << "(ptqkit's Q4_K_M and llama.cpp's alike)\n";
  quantize(d, "down", model, 512, "  method: gptq\n  act_order: true\n  ignore: [lm_head, model.embed_tokens, 're:.*self_attn.*', gate_proj, up_proj]\n",
           "gguf\n  gguf_type: Q4_K_M", 32);
  with_ffn_down_of(d / "llama/model.gguf", model, d / "h-llama");
  with_ffn_down_of(d / "down/model.gguf", model, d / "h-ptqkit");
  // 80 windows of the 460 (PTQKIT_CLIENT_WINDOWS=-1: all, for docs/benchmarks.md)
  const char* w = std::getenv("PTQKIT_CLIENT_WINDOWS");
  const int windows = w && *w ? std::atoi(w) : 80;
  const double f = eval_llama_protocol(model, text, 512, windows, d / "f.json");
  const double theirs = eval_llama_protocol(d / "h-llama", text, 512, windows, d / "l.json");
  const double ours = eval_llama_protocol(d / "h-ptqkit", text, 512, windows, d / "o.json");
  std::cout << "distilled-13m, ffn_down from each Q4_K_M file, " << (windows > 0 ? std::to_string(windows) : "all") << " windows of 512, llama-perplexity's protocol: float " << f
            << ", llama.cpp " << theirs << " (+" << 100 * (theirs / f - 1) << "%), ptqkit " << ours << " (+" << 100 * (ours / f - 1) << "%)\n";
  CHECK(ours < theirs);
}

// The two tensors a GGUF run rounds without a Hessian, output.weight and token_embd.weight, are
// llama.cpp's quantizer's own blocks (formats/ggml_quantize.cpp): ptqkit's GGUF with both in type T
// against llama_model_quantize of ptqkit's float GGUF with both set to T, byte for byte, in every
// block type ptqkit writes: the 32-element types on distilled-13m (f16, 384 wide, real weights),
// the K types (and two others) on a synthetic checkpoint 512 wide.
TEST_CASE("client: ptqkit's output.weight and token_embd.weight are llama.cpp's quantizer's blocks, byte for byte, in every block type") {
  PTQ_REQUIRE_CLIENT();
  ptqtest::TempDir d;
  const std::string A = ptqtest::assets();
  {
    const auto r = run_ptqkit("-q synth --preset small --layers 1 --output " + d / "small");
    INFO(r.out);
    REQUIRE(r.code == 0);
  }
  const std::vector<std::tuple<std::string, std::string, std::vector<std::string>>> cases = {
      {"distilled-13m", A + "/models/distilled-13m", {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}},
      {"small", d / "small", {"Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_1"}}};
  for (const auto& [name, model, types] : cases) {
    quantize(d, name + "-float", model, 32, kFloatLayers, "gguf", 2);
    for (const std::string& T : types) {
      INFO(name << " " << T);
      ptq::GgmlType t;
      REQUIRE(ptq::parse_ggml_type(T.c_str(), &t));
      const std::string ours = name + "-" + T, theirs = d / (name + "-llama-" + T + ".gguf");
      quantize(d, ours, model, 32, kFloatLayers, "gguf\n  gguf_output_type: " + T + "\n  gguf_embedding_type: " + T, 2);
      llama_cpp_quantize_tables(d / (name + "-float/model.gguf"), theirs, 7, int(t), int(t));   // LLAMA_FTYPE_MOSTLY_Q8_0 for the rest
      const ptq::GgufFile a(d / (ours + "/model.gguf")), b(theirs);
      for (const char* tensor : {"output.weight", "token_embd.weight"}) {
        INFO(tensor);
        const auto* x = a.find(tensor);
        const auto* y = b.find(tensor);
        REQUIRE(x != nullptr);
        REQUIRE(y != nullptr);
        REQUIRE(x->type == t);
        REQUIRE(y->type == t);
        REQUIRE(x->nbytes == y->nbytes);
        const size_t bb = size_t(ptq::ggml_block_bytes(t));
        size_t differ = 0;
        for (size_t o = 0; o < x->nbytes; o += bb) differ += std::memcmp(x->data + o, y->data + o, bb) != 0;
        INFO(differ << " of " << x->nbytes / bb << " blocks differ");
        CHECK(differ == 0);
      }
    }
  }
}

// llama.cpp's quantizer picks each tensor's type of a mix by its role, layer, width, expert count
// and model size (src/llama-quant.cpp). ptqkit's Q4_K_M and Q5_K_M (round to nearest, the types
// its plan picks) against llama_model_quantize of ptqkit's float GGUF of the same model, with its
// defaults, tensor for tensor: every shared family (tied and untied embeddings, GQA, phi3's fused
// Linears, MoE), an 8-expert MoE (llama.cpp's rules for 8 experts) and an 80-layer GQA llama
// (its 70B rule). Rows of 64 and 128 fall back from K types as llama.cpp's quantizer does. The
// mixes Q4_K_M, Q5_K_M, Q4_K_S and Q5_K_S, and Q4_0 (llama.cpp's Q4_0 file type: the output Q6_K,
// its 8-expert rule); general.file_type as llama.cpp writes it. One difference is
// allowed: a Linear no block holds (tiny-qwen3-moe's 48-wide expert downs) llama.cpp converts to
// F16, ptqkit keeps in the model's float type (bf16 there: no range lost).
TEST_CASE("client: ptqkit's K mixes and Q4_0 hold llama.cpp's quantizer's type for every tensor: every family, 8 experts, 80 layers") {
  PTQ_REQUIRE_CLIENT();
  ptqtest::TempDir d;
  const std::string A = ptqtest::assets();
  std::vector<std::pair<std::string, std::string>> models;   // name, folder (with a tokenizer)
  for (const char* f : {"qwen3", "mixtral", "qwen3-moe", "phi3"}) {
    const std::string m = d / (std::string("tiny-") + f);
    std::filesystem::create_directories(m);
    for (const char* x : {"config.json", "generation_config.json", "model.safetensors"})
      std::filesystem::create_symlink(A + "/models/tiny-" + f + "/" + x, m + "/" + x);
    ptq::write_file_atomic(m + "/tokenizer.json", ptq::byte_level_tokenizer_json());
    models.push_back({std::string("tiny-") + f, m});
  }
  models.push_back({"llama2xs", A + "/models/llama2xs"});
  models.push_back({"distilled-13m", A + "/models/distilled-13m"});
  for (auto [name, synth] : {std::pair<const char*, const char*>{"moe-8-experts", "--preset tiny-moe"}, {"llama-80-layers", "--preset tiny --layers 80"}}) {
    const auto r = run_ptqkit(std::string("-q synth ") + synth + " --output " + d / name);
    INFO(r.out);
    REQUIRE(r.code == 0);
    models.push_back({name, d / name});
  }
  for (const auto& [name, model] : models) {
    quantize(d, name + "-float", model, 32, kFloatLayers, "gguf", 2);
    for (auto [mix, ftype] : {std::pair<const char*, int>{"Q4_K_M", 15}, {"Q5_K_M", 17}, {"Q4_K_S", 14}, {"Q5_K_S", 16}, {"Q4_0", 2}}) {
      INFO(name << " " << mix);
      const std::string theirs = d / (name + "-llama-" + mix + ".gguf"), ours = name + "-" + mix;
      llama_cpp_quantize(d / (name + "-float/model.gguf"), theirs, ftype, false);
      quantize(d, ours, model, 32, "  method: rtn\n", std::string("gguf\n  gguf_type: ") + mix, 2);
      const auto a = gguf_tensor_types(d / (ours + "/model.gguf")), b = gguf_tensor_types(theirs);
      std::string differ;
      auto is_float = [](const std::string& ty) { return ty == "F16" || ty == "BF16" || ty == "F32"; };
      for (const auto& [t, ty] : b)
        if (!a.count(t) || (a.at(t) != ty && !(is_float(ty) && is_float(a.at(t)))))
          differ += "  " + t + ": llama.cpp " + ty + ", ptqkit " + (a.count(t) ? a.at(t) : "none") + "\n";
      INFO("tensors whose types differ:\n" << differ);
      CHECK(a.size() == b.size());
      CHECK(differ.empty());
      CHECK(ptq::GgufFile(d / (ours + "/model.gguf")).metadata()["general.file_type"] == ptq::GgufFile(theirs).metadata()["general.file_type"]);
    }
  }
}

// The GGUF quality table of docs/benchmarks.md, on the whole evaluation text under llama-
// perplexity's protocol (every file evaluated by `ptqkit eval --protocol llama.cpp`; llama.cpp's
// own quantizations made by its llama_model_quantize from ptqkit's float GGUF, without an
// importance matrix). Hidden: `test_client "[.quality]"`, about 15 minutes on 2 cores.
TEST_CASE("client: the GGUF quality table on the whole evaluation text", "[.quality]") {
  PTQ_REQUIRE_CLIENT();
  ptqtest::TempDir d;
  const std::string A = ptqtest::assets(), text = A + "/text/tinystories/eval.txt";
  struct Model { const char* name; int ctx; };
  for (const Model& m : {Model{"llama2xs", 256}, Model{"distilled-13m", 512}}) {
    const std::string model = A + "/models/" + m.name, dir = d / m.name;
    std::filesystem::create_directories(dir);
    const ptqtest::TempDir& root = d;
    (void)root;
    auto ppl = [&](const std::string& gguf) { return eval_llama_protocol(gguf, text, m.ctx, -1, dir + "/e.json"); };
    quantize(d, std::string(m.name) + "/float", model, m.ctx, kFloatLayers, "gguf");
    std::cout << "| " << m.name << " | float " << ppl(dir + "/float/model.gguf");
    for (auto [name, ftype] : {std::pair<const char*, int>{"Q4_1", 3}, {"Q4_K_M", 15}, {"Q5_K_M", 17}}) {
      const std::string out = dir + "/llama-" + name;
      std::filesystem::create_directories(out);
      for (auto& e : std::filesystem::directory_iterator(dir + "/float"))
        if (e.path().extension() != ".gguf") std::filesystem::copy(e.path(), out + "/" + e.path().filename().string());
      llama_cpp_quantize(dir + "/float/model.gguf", out + "/model.gguf", ftype, true);
      std::cout << " | llama.cpp " << name << " " << ppl(out + "/model.gguf") << std::flush;
    }
    for (auto [name, quant] : {std::pair<const char*, const char*>{"Q4_1", "  method: gptq\n  act_order: true\n"},
                               {"Q4_1", "  method: gptq\n  act_order: true\n  mse: true\n"},
                               {"Q4_K_M", "  method: gptq\n  act_order: true\n"},
                               {"Q4_K_M", "  method: gptq\n  act_order: true\n  mse: true\n"},
                               {"Q5_K_M", "  method: gptq\n  act_order: true\n"}}) {
      const std::string out = std::string(m.name) + "/ptqkit-" + name + (std::string(quant).find("mse") != std::string::npos ? "-mse" : "");
      quantize(d, out, model, m.ctx, quant, std::string("gguf\n  gguf_output_type: float\n  gguf_embedding_type: float\n  gguf_type: ") + name, 128);
      std::cout << " | ptqkit " << out.substr(out.find('/') + 1) << " " << ppl(d / out + "/model.gguf") << std::flush;
    }
    std::cout << " |\n";
  }
}
