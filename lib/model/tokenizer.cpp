#include "model/tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <clocale>
#include <cwctype>
#include <filesystem>
#include <locale.h>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <wctype.h>

#include "core/error.h"
#include "core/json_field.h"
#include "core/fsutil.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace ptq {

// ---------------------------------------------------------------- SentencePiece
namespace {
class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) {
    sentencepiece::util::Status st;
    try {   // some malformed models make the library throw instead of returning a status (found by fuzzing)
      st = sp_.Load(path);
    } catch (const std::exception& e) {
      fail(Errc::format, path, "", std::string("cannot load SentencePiece model: ") + e.what());
    }
    if (!st.ok()) fail(Errc::format, path, "", "cannot load SentencePiece model: " + st.ToString());
    bos_id = sp_.bos_id();
  }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    auto st = sp_.Encode(text, &ids);
    if (!st.ok()) fail(Errc::input, "", "", "SentencePiece encode failed: " + st.ToString());
    return {ids.begin(), ids.end()};
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    sp_.Decode(std::vector<int>(ids.begin(), ids.end()), &s);
    return s;
  }
  int vocab_size() const override { return sp_.GetPieceSize(); }
  std::string kind() const override { return "sentencepiece"; }
  VocabInfo vocab_info() const override {
    VocabInfo v;
    v.ggml_model = "llama";
    for (int i = 0; i < sp_.GetPieceSize(); ++i) {
      v.tokens.push_back(sp_.IdToPiece(i));
      v.scores.push_back(sp_.GetScore(i));
      v.types.push_back(sp_.IsUnknown(i) ? 2 : sp_.IsControl(i) ? 3 : sp_.IsByte(i) ? 6 : sp_.IsUnused(i) ? 5 : 1);
    }
    v.bos = sp_.bos_id();
    v.eos = sp_.eos_id();
    v.unk = sp_.unk_id();
    return v;
  }
 private:
  sentencepiece::SentencePieceProcessor sp_;
};

// ---------------------------------------------------------------- byte-level BPE
// UTF-8 helpers
void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) s += char(cp);
  else if (cp < 0x800) { s += char(0xC0 | (cp >> 6)); s += char(0x80 | (cp & 0x3F)); }
  else if (cp < 0x10000) { s += char(0xE0 | (cp >> 12)); s += char(0x80 | ((cp >> 6) & 0x3F)); s += char(0x80 | (cp & 0x3F)); }
  else { s += char(0xF0 | (cp >> 18)); s += char(0x80 | ((cp >> 12) & 0x3F)); s += char(0x80 | ((cp >> 6) & 0x3F)); s += char(0x80 | (cp & 0x3F)); }
}

// Decodes one code point at s[i]; sets len. Invalid bytes decode as U+FFFD of length 1.
uint32_t next_cp(std::string_view s, size_t i, size_t* len) {
  const unsigned char c = s[i];
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) { *len = 1; return 0xFFFD; }
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < n; ++k) {
    const unsigned char d = s[i + k];
    if ((d >> 6) != 2) { *len = 1; return 0xFFFD; }
    cp = (cp << 6) | (d & 0x3F);
  }
  *len = size_t(n);
  return cp;
}

// Unicode classes through glibc's C.UTF-8 tables: \p{L} ~ iswalpha, \p{N} ~ ASCII digits plus
// the non-letter alphanumerics, \s ~ iswspace. Exact for ASCII; close to the regex classes beyond.
locale_t utf8_locale() {
  static locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
  return loc;
}
bool is_digit(uint32_t c) { return (c >= '0' && c <= '9') || (c >= 0x80 && utf8_locale() && iswdigit_l(wint_t(c), utf8_locale())); }
bool is_letter(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  return utf8_locale() && iswalpha_l(wint_t(c), utf8_locale()) && !is_digit(c);
}
bool is_space(uint32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 9 && c <= 13);
  return utf8_locale() && iswspace_l(wint_t(c), utf8_locale());
}
bool is_nl(uint32_t c) { return c == '\r' || c == '\n'; }

struct Cps {  // the text as code points with their byte offsets
  std::vector<uint32_t> cp;
  std::vector<size_t> off;   // size cp.size()+1
  explicit Cps(std::string_view s) {
    for (size_t i = 0; i < s.size();) { size_t n; cp.push_back(next_cp(s, i, &n)); off.push_back(i); i += n; }
    off.push_back(s.size());
  }
  size_t size() const { return cp.size(); }
};

size_t match_contraction(const Cps& t, size_t i, bool ci) {
  if (t.cp[i] != '\'' || i + 1 >= t.size()) return 0;
  auto lc = [&](size_t k) -> uint32_t { uint32_t c = t.cp[k]; return ci && c >= 'A' && c <= 'Z' ? c + 32 : c; };
  uint32_t a = lc(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 < t.size()) {
    uint32_t b = lc(i + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  return 0;
}

// Length (in code points) of the whitespace token starting at i, per `\s+(?!\S)|\s+`.
size_t match_trailing_space(const Cps& t, size_t i) {
  size_t j = i;
  while (j < t.size() && is_space(t.cp[j])) ++j;
  if (j == t.size() || j - i == 1) return j - i;
  return j - i - 1;
}

size_t match_gpt2(const Cps& t, size_t i) {
  if (size_t n = match_contraction(t, i, false)) return n;
  size_t j = i;
  if (t.cp[j] == ' ' && j + 1 < t.size() && !is_space(t.cp[j + 1])) ++j;   // ' ?' before L, N or other
  const uint32_t c = t.cp[j];
  if (!is_space(c)) {
    auto run = [&](auto pred) { size_t k = j; while (k < t.size() && pred(t.cp[k])) ++k; return k - i; };
    if (is_letter(c)) return run(is_letter);
    if (is_digit(c)) return run(is_digit);
    return run([](uint32_t x) { return !is_space(x) && !is_letter(x) && !is_digit(x); });
  }
  return match_trailing_space(t, i);
}

// Llama-3 (max_digits 3) and Qwen2 (max_digits 1).
size_t match_llama3(const Cps& t, size_t i, size_t max_digits) {
  if (size_t n = match_contraction(t, i, true)) return n;
  const uint32_t c = t.cp[i];
  auto other = [](uint32_t x) { return !is_space(x) && !is_letter(x) && !is_digit(x); };
  // [^\r\n\p{L}\p{N}]?\p{L}+
  {
    size_t j = i;
    if (!is_nl(c) && !is_letter(c) && !is_digit(c) && j + 1 < t.size() && is_letter(t.cp[j + 1])) ++j;
    if (is_letter(t.cp[j])) { while (j < t.size() && is_letter(t.cp[j])) ++j; return j - i; }
  }
  if (is_digit(c)) { size_t j = i; while (j < t.size() && j - i < max_digits && is_digit(t.cp[j])) ++j; return j - i; }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  {
    size_t j = i;
    if (c == ' ' && j + 1 < t.size() && other(t.cp[j + 1])) ++j;
    if (other(t.cp[j])) {
      while (j < t.size() && other(t.cp[j])) ++j;
      while (j < t.size() && is_nl(t.cp[j])) ++j;
      return j - i;
    }
  }
  // '\s*[\r\n]+': the whitespace run up to its last newline
  {
    size_t j = i, last_nl = 0;
    bool nl = false;
    while (j < t.size() && is_space(t.cp[j])) { if (is_nl(t.cp[j])) { nl = true; last_nl = j; } ++j; }
    if (nl) return last_nl + 1 - i;
  }
  return match_trailing_space(t, i);
}

// GPT-2's reversible map from bytes to printable code points.
const std::array<uint32_t, 256>& byte_to_cp() {
  static const auto m = [] {
    std::array<uint32_t, 256> a{};
    std::array<bool, 256> direct{};
    for (int b = 33; b <= 126; ++b) direct[b] = true;
    for (int b = 161; b <= 172; ++b) direct[b] = true;
    for (int b = 174; b <= 255; ++b) direct[b] = true;
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) a[b] = direct[b] ? uint32_t(b) : 256 + n++;
    return a;
  }();
  return m;
}

class ByteLevelBPE final : public Tokenizer {
 public:
  ByteLevelBPE(const json& vocab, const std::vector<std::pair<std::string, std::string>>& merges, std::string pattern,
               bool ignore_merges, const std::string& file)
      : pattern_(std::move(pattern)), ignore_merges_(ignore_merges) {
    if (!vocab.is_object() || vocab.empty()) fail(Errc::format, file, "model.vocab", "missing or empty");
    for (auto& [k, v] : vocab.items()) {
      const int32_t id = json_field<int32_t>(vocab, k.c_str(), -1, Errc::format, file, "model.vocab." + k);
      if (id < 0) fail(Errc::format, file, "model.vocab." + k, "id must be a non-negative integer");
      vocab_[k] = id;
      max_id_ = std::max(max_id_, id);
    }
    for (size_t r = 0; r < merges.size(); ++r) ranks_[merges[r].first + '\x01' + merges[r].second] = int(r);
    for (auto& [k, v] : vocab_) inv_[v] = k;
    const auto& b2c = byte_to_cp();
    for (int b = 0; b < 256; ++b) { std::string s; append_utf8(s, b2c[b]); byte_sym_[b] = s; cp_to_byte_[b2c[b]] = uint8_t(b); }
  }
  void add_special(const std::string& content, int32_t id) {
    if (content.empty() || id < 0) return;   // an empty special token would match everywhere (found by fuzzing)
    specials_.emplace_back(content, id);
    inv_[id] = content;
    max_id_ = std::max(max_id_, id);
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    size_t i = 0;
    while (i < text.size()) {   // split on special tokens first
      size_t best = std::string_view::npos, blen = 0;
      int32_t bid = -1;
      for (auto& [s, id] : specials_) {
        size_t p = text.find(s, i);
        if (p != std::string_view::npos && (p < best || (p == best && s.size() > blen))) { best = p; blen = s.size(); bid = id; }
      }
      const size_t end = best == std::string_view::npos ? text.size() : best;
      encode_plain(text.substr(i, end - i), out);
      if (bid >= 0) out.push_back(bid);
      i = end + blen;
    }
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) {
      auto it = inv_.find(id);
      if (it == inv_.end()) continue;
      if (std::any_of(specials_.begin(), specials_.end(), [&](auto& s) { return s.second == id; })) { out += it->second; continue; }
      const std::string& sym = it->second;
      for (size_t k = 0; k < sym.size();) {
        size_t n;
        uint32_t cp = next_cp(sym, k, &n);
        auto b = cp_to_byte_.find(cp);
        if (b != cp_to_byte_.end()) out += char(b->second);
        k += n;
      }
    }
    return out;
  }
  int vocab_size() const override { return max_id_ + 1; }
  std::string kind() const override { return "byte-level-bpe/" + pattern_; }
  VocabInfo vocab_info() const override {
    VocabInfo v;
    v.ggml_model = "gpt2";
    for (int32_t i = 0; i <= max_id_; ++i) {
      auto it = inv_.find(i);
      v.tokens.push_back(it != inv_.end() ? it->second : "[PAD" + std::to_string(i) + "]");
      const bool special = std::any_of(specials_.begin(), specials_.end(), [&](auto& s) { return s.second == i; });
      v.types.push_back(it == inv_.end() ? 5 : special ? 3 : 1);
    }
    std::vector<std::pair<int, std::string>> ranked;
    for (auto& [k, r] : ranks_) ranked.emplace_back(r, k.substr(0, k.find('\x01')) + " " + k.substr(k.find('\x01') + 1));
    std::sort(ranked.begin(), ranked.end());
    for (auto& [r, m] : ranked) v.merges.push_back(m);
    v.bos = bos_id;
    for (auto& [s, id] : specials_) if (s == "</s>" || s == "<|endoftext|>" || s == "<|end_of_text|>") v.eos = id;
    return v;
  }

 private:
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const {
    for (const std::string& word : pretokenize(text, pattern_)) {
      std::string mapped;
      for (unsigned char b : word) mapped += byte_sym_[b];
      if (ignore_merges_) {
        auto it = vocab_.find(mapped);
        if (it != vocab_.end()) { out.push_back(it->second); continue; }
      }
      std::vector<std::string> parts;
      for (unsigned char b : word) parts.push_back(byte_sym_[b]);
      while (parts.size() > 1) {   // merge the lowest-ranked adjacent pair until none is mergeable
        int best = INT32_MAX;
        size_t at = 0;
        for (size_t k = 0; k + 1 < parts.size(); ++k) {
          auto it = ranks_.find(parts[k] + '\x01' + parts[k + 1]);
          if (it != ranks_.end() && it->second < best) { best = it->second; at = k; }
        }
        if (best == INT32_MAX) break;
        parts[at] += parts[at + 1];
        parts.erase(parts.begin() + long(at) + 1);
      }
      for (auto& p : parts) {
        auto it = vocab_.find(p);
        if (it == vocab_.end()) fail(Errc::format, "", p, "symbol not in the BPE vocabulary");
        out.push_back(it->second);
      }
    }
  }

  std::string pattern_;
  bool ignore_merges_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<int32_t, std::string> inv_;
  std::unordered_map<std::string, int> ranks_;
  std::vector<std::pair<std::string, int32_t>> specials_;
  std::array<std::string, 256> byte_sym_;
  std::unordered_map<uint32_t, uint8_t> cp_to_byte_;
  int32_t max_id_ = -1;
};

json parse_json_file(const std::string& path) {
  try { return json::parse(read_text_file(path)); } catch (const json::exception& e) {
    fail(Errc::format, path, "", std::string("malformed JSON: ") + e.what());
  }
}

std::pair<std::string, std::string> split_merge(const std::string& m, const std::string& file, size_t k) {
  auto sp = m.find(' ');
  if (sp == std::string::npos || sp == 0 || sp + 1 >= m.size()) fail(Errc::format, file, "merges[" + std::to_string(k) + "]", "not 'a b'");
  return {m.substr(0, sp), m.substr(sp + 1)};
}

// Which of the known pre-tokenizers a tokenizer.json describes.
std::string detect_pattern(const json& pre, const std::string& file) {
  std::string regex;
  bool byte_level_regex = false;
  std::function<void(const json&)> walk = [&](const json& p) {
    if (!p.is_object()) return;
    const std::string type = p.value("type", "");
    if (type == "Sequence" && p.contains("pretokenizers")) for (auto& q : p["pretokenizers"]) walk(q);
    if (type == "Split" && p.contains("pattern") && p["pattern"].contains("Regex")) regex = p["pattern"]["Regex"].get<std::string>();
    if (type == "ByteLevel" && p.value("use_regex", true)) byte_level_regex = true;
  };
  walk(pre);
  if (regex.empty()) {
    if (byte_level_regex) return "gpt2";
    fail(Errc::format, file, "pre_tokenizer", "no byte-level pre-tokenizer found");
  }
  if (regex.find("\\p{N}{1,3}") != std::string::npos) return "llama3";
  if (regex.find("(?i:") != std::string::npos) return "qwen2";
  if (regex.find("'s|'t|'re|'ve|'m|'ll|'d") != std::string::npos) return "gpt2";
  fail(Errc::format, file, "pre_tokenizer.pattern", "unsupported pre-tokenizer regex (supported: GPT-2, Llama-3, Qwen2)");
}
}  // namespace

std::vector<std::string> pretokenize(std::string_view text, const std::string& pattern) {
  Cps t(text);
  std::vector<std::string> out;
  for (size_t i = 0; i < t.size();) {
    size_t n = pattern == "gpt2" ? match_gpt2(t, i) : match_llama3(t, i, pattern == "llama3" ? 3 : 1);
    if (n == 0) n = 1;
    out.emplace_back(text.substr(t.off[i], t.off[i + n] - t.off[i]));
    i += n;
  }
  return out;
}

namespace {
std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& dir, const std::string& file, int bos_hint);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, int bos_hint) {
  std::string dir = path, file;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) { dir = fs::path(path).parent_path().string(); file = path; }
  auto exists = [&](const char* n) { return fs::exists(dir + "/" + n, ec); };
  if (file.empty()) {
    if (exists("tokenizer.model")) file = dir + "/tokenizer.model";
    else if (exists("tokenizer.json")) file = dir + "/tokenizer.json";
    else if (exists("vocab.json") && exists("merges.txt")) file = dir + "/vocab.json";
    else fail(Errc::io, dir, "tokenizer", "no tokenizer.model, tokenizer.json or vocab.json + merges.txt in this folder");
  }
  // A field of the wrong JSON type deep in a tokenizer file is a format error naming the file.
  return json_errors_named(Errc::format, file, "", [&] { return load_tokenizer_file(dir, file, bos_hint); });
}

namespace {
std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& dir, const std::string& file, int bos_hint) {
  const std::string name = fs::path(file).filename().string();
  if (name.size() > 6 && name.substr(name.size() - 6) == ".model") return std::make_unique<SentencePieceTokenizer>(file);
  if (name == "vocab.json") {
    json vocab = parse_json_file(file);
    std::vector<std::pair<std::string, std::string>> merges;
    const std::string mf = dir + "/merges.txt";
    std::string text = read_text_file(mf);
    size_t k = 0, pos = 0;
    while (pos < text.size()) {
      size_t e = text.find('\n', pos);
      if (e == std::string::npos) e = text.size();
      std::string line = text.substr(pos, e - pos);
      pos = e + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || line.rfind("#version", 0) == 0) continue;
      merges.push_back(split_merge(line, mf, k++));
    }
    auto t = std::make_unique<ByteLevelBPE>(vocab, merges, "gpt2", false, file);
    t->bos_id = bos_hint;
    return t;
  }
  json j = parse_json_file(file);
  if (!j.contains("model") || j["model"].value("type", "") != "BPE") fail(Errc::format, file, "model.type", "only BPE tokenizer.json files are supported");
  const json& m = j["model"];
  std::vector<std::pair<std::string, std::string>> merges;
  if (m.contains("merges")) {
    size_t k = 0;
    for (auto& x : m["merges"]) {
      if (x.is_string()) merges.push_back(split_merge(x.get<std::string>(), file, k));
      else if (x.is_array() && x.size() == 2) merges.emplace_back(x[0].get<std::string>(), x[1].get<std::string>());
      else fail(Errc::format, file, "model.merges[" + std::to_string(k) + "]", "neither 'a b' nor [a, b]");
      ++k;
    }
  }
  auto t = std::make_unique<ByteLevelBPE>(m.value("vocab", json()), merges, detect_pattern(j.value("pre_tokenizer", json()), file),
                                          m.value("ignore_merges", false), file);
  t->bos_id = bos_hint;
  if (j.contains("added_tokens")) {
    size_t i = 0;
    for (auto& a : j["added_tokens"]) {   // each field type- and range-checked (a float id was UB, found by fuzzing)
      const std::string at = "added_tokens[" + std::to_string(i++) + "].";
      if (json_field<bool>(a, "special", false, Errc::format, file, at + "special"))
        t->add_special(json_field<std::string>(a, "content", "", Errc::format, file, at + "content"),
                       json_field<int32_t>(a, "id", -1, Errc::format, file, at + "id"));
    }
  }
  return t;
}
}  // namespace

std::string byte_level_tokenizer_json() {
  json vocab = json::object();
  json added = json::array();
  const char* specials[] = {"<unk>", "<s>", "</s>"};
  for (int i = 0; i < 3; ++i) {
    vocab[specials[i]] = i;
    added.push_back({{"id", i}, {"content", specials[i]}, {"single_word", false}, {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  for (int b = 0; b < 256; ++b) { std::string s; append_utf8(s, byte_to_cp()[b]); vocab[s] = 3 + b; }
  json j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added}, {"normalizer", nullptr},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
            {"post_processor", nullptr}, {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
            {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                       {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab}, {"merges", json::array()}}}};
  return j.dump(1);
}

}  // namespace ptq
