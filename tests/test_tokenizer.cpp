// Known encodings: GPT-2's published ids, Llama-2's, and the golden input_ids that HF transformers
// produced from eval.txt.
#include "core/error.h"
#include "core/fsutil.h"
#include "core/safetensors.h"
#include "model/tokenizer.h"
#include "golden.h"
#include "testing.h"

using namespace ptq;
using V = std::vector<int32_t>;
using S = std::vector<std::string>;

TEST_CASE("pre-tokenization follows the GPT-2, Llama-3 and Qwen2 patterns") {
  CHECK(pretokenize("Hello 123456 world!!\n\n", "gpt2") == S{"Hello", " 123456", " world", "!!", "\n\n"});
  CHECK(pretokenize("Hello 123456 world!!\n\n", "llama3") == S{"Hello", " ", "123", "456", " world", "!!\n\n"});
  CHECK(pretokenize("a 12 b", "qwen2") == S{"a", " ", "1", "2", " b"});
  CHECK(pretokenize("I'll  go", "gpt2") == S{"I", "'ll", " ", " go"});
  CHECK(pretokenize("I'LL go", "llama3") == S{"I", "'LL", " go"});       // case-insensitive contractions
  CHECK(pretokenize("I'LL go", "gpt2") == S{"I", "'", "LL", " go"});
  CHECK(pretokenize("x  \n  y", "llama3") == S{"x", "  \n", " ", " y"});
  CHECK(pretokenize("héllo wörld", "gpt2") == S{"héllo", " wörld"});
}

TEST_CASE("GPT-2 byte-level BPE reproduces known ids") {
  PTQ_REQUIRE_ASSETS();
  auto t = load_tokenizer(ptqtest::assets() + "/tokenizers/gpt2");
  CHECK(t->encode("Hello world") == V{15496, 995});
  CHECK(t->encode("Hello, world!") == V{15496, 11, 995, 0});
  CHECK(t->encode("The") == V{464});
  CHECK(t->encode(" the") == V{262});
  const std::string s = "Ünïcödé — 日本語 text\twith\nlines  and   spaces 12345";
  CHECK(t->decode(t->encode(s)) == s);
}

TEST_CASE("Llama-2 SentencePiece reproduces known ids") {
  PTQ_REQUIRE_ASSETS();
  auto t = load_tokenizer(ptqtest::assets() + "/tokenizers/llama2");
  CHECK(t->bos_id == 1);
  CHECK(t->vocab_size() == 32000);
  CHECK(t->encode("Hello world") == V{15043, 3186});
}

TEST_CASE("SentencePiece encoding of eval.txt matches the golden input_ids from HF") {
  PTQ_REQUIRE_ASSETS();
  auto t = load_tokenizer(ptqtest::assets() + "/models/stories260k");
  std::string text = read_text_file(ptqtest::assets() + "/text/tinystories/eval.txt").substr(0, 4000);
  V ids{t->bos_id};
  auto body = t->encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  const std::vector<int32_t> want = ptqtest::golden("stories260k").ids;
  REQUIRE(want.size() == 128);
  for (int i = 0; i < 120; ++i) CHECK(ids[size_t(i)] == want[size_t(i)]);   // the last few may merge with text past the prefix
}

TEST_CASE("the synthetic byte-level tokenizer round-trips bytes") {
  ptqtest::TempDir d;
  write_file_atomic(d / "tokenizer.json", byte_level_tokenizer_json());
  auto t = load_tokenizer(d.path.string(), 1);
  CHECK(t->bos_id == 1);
  CHECK(t->encode("A") == V{3 + 'A'});
  CHECK(t->encode("<s>A") == V{1, 3 + 'A'});
  const std::string s = "héllo\n wörld";
  CHECK(t->encode(s).size() == s.size());
  CHECK(t->decode(t->encode(s)) == s);
}

TEST_CASE("a folder without a tokenizer is an error naming it") {
  ptqtest::TempDir d;
  try {
    load_tokenizer(d.path.string());
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code == Errc::io);
    CHECK(std::string(e.what()).find("no tokenizer.model, tokenizer.json") != std::string::npos);
  }
}
