#include "model/corpus.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fsutil.h"

namespace ptq {

bool is_jsonl(const std::string& path) { return path.size() >= 6 && path.substr(path.size() - 6) == ".jsonl"; }

std::vector<std::string> read_jsonl_texts(const std::string& path) {
  const std::string raw = read_text_file(path);
  std::vector<std::string> texts;
  size_t pos = 0, line = 0;
  while (pos < raw.size()) {
    size_t e = raw.find('\n', pos);
    if (e == std::string::npos) e = raw.size();
    std::string_view l(raw.data() + pos, e - pos);
    pos = e + 1;
    ++line;
    if (l.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    nlohmann::json j;
    try { j = nlohmann::json::parse(l); } catch (const nlohmann::json::exception& ex) {
      fail(Errc::format, path, "line " + std::to_string(line), std::string("malformed JSON: ") + ex.what());
    }
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      fail(Errc::format, path, "line " + std::to_string(line) + ".text", "missing or not a string");
    texts.push_back(j["text"].get<std::string>());
  }
  return texts;
}

std::string read_corpus(const std::string& path) {
  std::string text;
  if (!is_jsonl(path)) {
    text = read_text_file(path);
  } else {
    for (auto& t : read_jsonl_texts(path)) {
      if (!text.empty()) text += "\n\n";
      text += t;
    }
  }
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) fail(Errc::input, path, "", "data file is empty");
  return text;
}

std::vector<int32_t> encode_corpus(const Tokenizer& tok, const std::string& path) {
  std::vector<int32_t> ids;
  if (tok.bos_id >= 0) ids.push_back(tok.bos_id);
  auto body = tok.encode(read_corpus(path));
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

int64_t count_windows(size_t n_tokens, int L) { return L > 0 ? int64_t(n_tokens / size_t(L)) : 0; }

}  // namespace ptq
