#include <cmath>
#include <fstream>

#include "core/error.h"
#include "core/fsutil.h"
#include "eval/perplexity.h"
#include "model/corpus.h"
#include "testing.h"

using namespace ptq;
using nlohmann::json;

namespace {
void check_golden_ppl(const std::string& model) {
  const std::string a = ptqtest::assets();
  json g = json::parse(read_text_file(a + "/golden/golden.json"))["models"][model];
  LlamaModel m(a + "/models/" + model);
  auto tok = load_tokenizer(m.dir(), m.config().bos_token_id);
  auto ids = encode_corpus(*tok, a + "/text/tinystories/eval.txt");
  CHECK(int64_t(ids.size()) == g["tinystories_eval"]["total_tokens"].get<int64_t>());
  EvalOptions o;
  o.seq_len = g["window_L"];
  EvalResult r = evaluate(m, ids, o);
  CHECK(r.scored_tokens == g["tinystories_eval"]["scored_tokens"].get<int64_t>());
  const double want = g["tinystories_eval"]["perplexity"];
  INFO(model << ": perplexity " << r.perplexity << ", golden " << want);
  CHECK(std::abs(r.perplexity - want) / want < 1e-4);
}
}  // namespace

TEST_CASE("perplexity matches golden.json: stories260k") { PTQ_REQUIRE_ASSETS(); check_golden_ppl("stories260k"); }
TEST_CASE("perplexity matches golden.json: llama2xs") { PTQ_REQUIRE_ASSETS(); check_golden_ppl("llama2xs"); }
TEST_CASE("perplexity matches golden.json: distilled-13m") { PTQ_REQUIRE_ASSETS(); check_golden_ppl("distilled-13m"); }

TEST_CASE("NLL and KL statistics on hand-computed distributions") {
  // model: uniform over 2 tokens -> NLL ln 2, perplexity 2.
  // reference: p = (3/4, 1/4) -> KL(ref || model) = 3/4 ln(3/2) + 1/4 ln(1/2) = 0.130812...
  LogitsFn model = [](const std::vector<int32_t>& t, int S, int T) { return MatF(MatF::Zero(S * T, 2)); };
  LogitsFn ref = [](const std::vector<int32_t>& t, int S, int T) {
    MatF m = MatF::Zero(S * T, 2);
    m.col(0).setConstant(float(std::log(3.0)));
    return m;
  };
  std::vector<int32_t> ids(40, 0);
  for (size_t i = 0; i < ids.size(); i += 3) ids[i] = 1;
  EvalOptions o;
  o.seq_len = 8;
  o.batch_tokens = 16;   // several chunks
  EvalResult r = evaluate(model, 100, ids, o, &ref);
  CHECK(r.windows == 5);
  CHECK(r.scored_tokens == 35);
  CHECK(r.perplexity == Approx(2.0).epsilon(1e-12));
  REQUIRE(r.kl);
  const double kl = 0.75 * std::log(1.5) + 0.25 * std::log(0.5);
  CHECK(r.kl->mean == Approx(kl).epsilon(1e-6));
  CHECK(r.kl->p99 == Approx(kl).epsilon(1e-6));
  CHECK(r.kl->top1_agreement == 1.0);
  // reference NLL: -ln(3/4) for target 0, -ln(1/4) for target 1
  int n0 = 0, n1 = 0;
  for (int w = 0; w < 5; ++w)
    for (int t = 1; t < 8; ++t) (ids[size_t(w * 8 + t)] ? n1 : n0)++;
  const double ref_nll = (n0 * -std::log(0.75) + n1 * -std::log(0.25)) / 35.0;
  CHECK(std::log(r.kl->reference_perplexity) == Approx(ref_nll).epsilon(1e-6));
}

TEST_CASE("KL of the f16 copy of stories260k against the f32 original is small but not zero") {
  PTQ_REQUIRE_ASSETS();
  const std::string a = ptqtest::assets();
  LlamaModel m16(a + "/models/stories260k-f16"), m32(a + "/models/stories260k");
  auto tok = load_tokenizer(m32.dir(), 1);
  auto ids = encode_corpus(*tok, a + "/text/tinystories/eval.txt");
  EvalOptions o;
  o.seq_len = 512;
  o.max_windows = 8;
  EvalResult r = evaluate(m16, ids, o, &m32);
  REQUIRE(r.kl);
  CHECK(r.kl->mean > 0);
  CHECK(r.kl->mean < 1e-4);
  CHECK(r.kl->top1_agreement > 0.99);
}

TEST_CASE("bad evaluation input: short data, too long a window") {
  LogitsFn model = [](const std::vector<int32_t>& t, int S, int T) { return MatF(MatF::Zero(S * T, 2)); };
  EvalOptions o;
  o.seq_len = 64;
  CHECK_THROWS_WITH(evaluate(model, 128, std::vector<int32_t>(10, 0), o), Catch::Contains("shorter than one window"));
  o.seq_len = 256;
  CHECK_THROWS_WITH(evaluate(model, 128, std::vector<int32_t>(1000, 0), o), Catch::Contains("exceeds the model's context"));
  ptqtest::TempDir d;
  write_file_atomic(d / "empty.txt", "\n  \n");
  CHECK_THROWS_WITH(read_corpus(d / "empty.txt"), Catch::Contains("data file is empty"));
  write_file_atomic(d / "x.jsonl", "{\"text\": \"a\"}\n{\"txt\": 1}\n");
  CHECK_THROWS_WITH(read_corpus(d / "x.jsonl"), Catch::Contains("line 2.text"));
  write_file_atomic(d / "y.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n");
  CHECK(read_corpus(d / "y.jsonl") == "a\n\nb");
}

TEST_CASE("llama.cpp's protocol: each window starts with BOS and its second half is scored, the standard error by hand") {
  // A model that predicts token 1 with p = 3/4 after token 1 and p = 1/4 otherwise (2 tokens).
  // Windows of 8: llama-perplexity scores the predictions at positions 4..6 of each window
  // (targets 5..7), 3 per window, after putting BOS (id 1) at position 0.
  LogitsFn model = [](const std::vector<int32_t>& t, int S, int T) {
    MatF m = MatF::Zero(S * T, 2);
    for (int i = 0; i < S * T; ++i) m(i, 1) = float(t[size_t(i)] == 1 ? std::log(3.0) : -std::log(3.0));
    return m;
  };
  std::vector<int32_t> ids = {0, 0, 0, 0, 1, 1, 0, 1, /* window 2 */ 0, 0, 0, 0, 0, 1, 1, 0};
  EvalOptions o;
  o.seq_len = 8;
  o.protocol = "llama.cpp";
  o.bos = 1;
  EvalResult r = evaluate(model, 100, ids, o);
  CHECK(r.scored_tokens == 6);
  // window 1, positions 4, 5, 6 (inputs 1, 1, 0) -> targets 1, 0, 1: p = 3/4, 1/4, 1/4
  // window 2, positions 4, 5, 6 (inputs 0, 1, 1) -> targets 1, 1, 0: p = 1/4, 3/4, 1/4
  const double nll[6] = {-std::log(0.75), -std::log(0.25), -std::log(0.25), -std::log(0.25), -std::log(0.75), -std::log(0.25)};
  double mean = 0, sq = 0;
  for (double x : nll) { mean += x / 6; sq += x * x / 6; }
  CHECK(r.mean_nll == Approx(mean).epsilon(1e-7));   // (float logits)
  CHECK(r.perplexity_std_error == Approx(std::exp(mean) * std::sqrt((sq - mean * mean) / 5)).epsilon(1e-7));
  CHECK(r.to_json()["protocol"] == "llama.cpp");
  // the GPTQ protocol: 7 per window, window 2's first token kept (0)
  o.protocol = "gptq";
  CHECK(evaluate(model, 100, ids, o).scored_tokens == 14);
  o.protocol = "other";
  CHECK_THROWS_WITH(evaluate(model, 100, ids, o), Catch::Contains("must be gptq or llama.cpp"));
}
