// tokenizer.h — text to token ids. SentencePiece models (tokenizer.model) through
// libsentencepiece; Hugging Face byte-level BPE (tokenizer.json, or vocab.json + merges.txt)
// with the GPT-2, Llama-3 and Qwen2 pre-tokenization patterns.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ptq {

// The vocabulary as llama.cpp's GGUF metadata wants it (tokenizer.ggml.*).
struct VocabInfo {
  std::string ggml_model;            // "llama" (SentencePiece) or "gpt2" (byte-level BPE)
  std::vector<std::string> tokens;
  std::vector<float> scores;         // SentencePiece only
  std::vector<int32_t> types;        // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
  std::vector<std::string> merges;   // BPE only, "a b"
  int bos = -1, eos = -1, unk = -1;
};

class Tokenizer {
 public:
  virtual VocabInfo vocab_info() const = 0;
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;   // no BOS added
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int vocab_size() const = 0;
  virtual std::string kind() const = 0;
  int bos_id = -1;   // -1: the tokenizer has none
};

// `path`: a model folder (tokenizer.model, else tokenizer.json, else vocab.json + merges.txt) or
// one of those files. Errc::io when none exists, Errc::format when it cannot be parsed.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, int bos_hint = -1);

// Byte-level pre-tokenization, exposed for tests. pattern: "gpt2" | "llama3" | "qwen2".
std::vector<std::string> pretokenize(std::string_view text, const std::string& pattern);

// A byte-level tokenizer.json with the 256 byte symbols and <unk>, <s>, </s>: what `ptqkit synth`
// writes beside synthetic models so that they can be evaluated on text.
std::string byte_level_tokenizer_json();

}  // namespace ptq
