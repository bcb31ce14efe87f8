// Generation (model/generate.h) against HF transformers' golden logits: the golden input ids fed
// through the KV cache (a prefill chunk, then one token at a time) must give transformers' logits
// at every position, so the greedy token after any prefix is transformers' argmax there. The
// sampler against exact probabilities; `ptqkit generate` end to end.
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/safetensors.h"
#include "formats/open.h"
#include "model/generate.h"
#include "model/tokenizer.h"
#include "golden.h"
#include "testing.h"

using namespace ptq;

namespace {
int32_t argmax(const float* x, int n) { return int32_t(std::max_element(x, x + n) - x); }

// Feeds each golden sequence: its first `prefill` tokens at once, then one by one; every logits
// vector feed returns (the last position's) is compared with transformers'.
void check_cached_decode(const std::string& model_dir, const std::string& golden, int prefill) {
  auto m = open_model(ptqtest::assets() + "/models/" + model_dir);
  const ptqtest::Golden g = ptqtest::golden(golden);
  const int V = m->config().vocab_size;
  Generator gen(*m);
  double maxd = 0;
  int argmax_equal = 0, compared = 0;
  for (int s = 0; s < g.S; ++s) {
    gen.reset();
    const int32_t* ids = g.ids.data() + size_t(s) * size_t(g.T);
    for (int t = 0; t < g.T;) {
      const int n = t == 0 ? prefill : 1;
      const VecF got = gen.feed(std::vector<int32_t>(ids + t, ids + t + n));
      t += n;
      const float* want = g.logits.data() + (size_t(s) * size_t(g.T) + size_t(t - 1)) * size_t(V);
      for (int j = 0; j < V; ++j) maxd = std::max(maxd, double(std::abs(got[j] - want[j])));
      argmax_equal += argmax(got.data(), V) == argmax(want, V);
      ++compared;
    }
    CHECK(gen.position() == g.T);
  }
  INFO(model_dir << ": max |logit - transformers'| over " << compared << " decode steps = " << maxd);
  CHECK(maxd < 1e-3);
  CHECK(argmax_equal == compared);
}
}  // namespace

TEST_CASE("generate: KV-cache decode gives transformers' logits at every step (stories260k, llama2xs, distilled-13m)") {
  PTQ_REQUIRE_ASSETS();
  check_cached_decode("stories260k", "stories260k", 16);
  check_cached_decode("llama2xs-bin", "llama2xs", 1);   // read from the PyTorch .bin shards
  check_cached_decode("distilled-13m", "distilled-13m", 64);
}

TEST_CASE("generate: KV-cache decode gives transformers' logits for every family (qwen3, mixtral, qwen3-moe, phi3)") {
  PTQ_REQUIRE_ASSETS();
  for (const char* f : {"qwen3", "mixtral", "qwen3-moe", "phi3"}) check_cached_decode(std::string("tiny-") + f, std::string("tiny-") + f, 8);
}

TEST_CASE("generate: greedy is the argmax (lowest id on ties), sampling follows softmax(logits / T) cut at top_p") {
  VecF l(4);
  l << 1.0f, 3.0f, 3.0f, -1.0f;
  Rng rng(1);
  CHECK(sample_token(l, {}, rng) == 1);
  // p = (0.5, 0.25, 0.25, 0): exact frequencies, and top_p = 0.5 keeps only the first token.
  VecF p(4);
  p << std::log(0.5f), std::log(0.25f), std::log(0.25f), -1e30f;
  int count[4] = {0, 0, 0, 0};
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++count[sample_token(p, {1.0, 1.0}, rng)];
  CHECK(std::abs(count[0] / double(n) - 0.5) < 0.01);
  CHECK(std::abs(count[1] / double(n) - 0.25) < 0.01);
  CHECK(count[3] == 0);
  for (int i = 0; i < 100; ++i) CHECK(sample_token(p, {1.0, 0.5}, rng) == 0);
  // Temperature 0.5 squares the odds: p ∝ (0.25, 0.0625, 0.0625) -> 2/3, 1/6, 1/6.
  int c0 = 0;
  for (int i = 0; i < n; ++i) c0 += sample_token(p, {0.5, 1.0}, rng) == 0;
  CHECK(std::abs(c0 / double(n) - 2.0 / 3.0) < 0.01);
}

TEST_CASE("cli: generate streams transformers' greedy token, is deterministic for a seed, and reads packed checkpoints") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string A = ptqtest::assets();
  const ptqtest::Golden g = ptqtest::golden("stories260k");
  // After the golden prefix of 40 tokens, greedy's first token is transformers' argmax at position 39.
  std::string ids;
  for (int i = 0; i < 40; ++i) ids += (i ? "," : "") + std::to_string(g.ids[size_t(i)]);
  auto r = ptqtest::run_ptqkit("generate --model " + A + "/models/stories260k --prompt-ids " + ids + " --max-tokens 8 --json " + d / "g.json");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(read_text_file(d / "g.json"));
  CHECK(j["tokens"][0].get<int32_t>() == argmax(g.logits.data() + 39 * 512, 512));
  CHECK(j["tokens"].size() == 8);
  // Text in, text out; sampling with a seed gives the same text twice.
  auto t1 = ptqtest::run_ptqkit("generate --model " + A + "/models/stories260k --prompt 'Once upon a time' --max-tokens 20 --temperature 0.8 --top-p 0.9 --seed 7");
  auto t2 = ptqtest::run_ptqkit("generate --model " + A + "/models/stories260k --prompt 'Once upon a time' --max-tokens 20 --temperature 0.8 --top-p 0.9 --seed 7");
  REQUIRE(t1.code == 0);
  CHECK(t1.out.rfind("Once upon a time", 0) == 0);
  CHECK(t1.out.substr(0, t1.out.find("ptqkit:")) == t2.out.substr(0, t2.out.find("ptqkit:")));
  // The printed text is the tokenizer's text of the whole sequence: the first new token keeps its
  // leading space ("Once" + "▁upon" is "Once upon", where decoding the new tokens alone drops it).
  auto o = ptqtest::run_ptqkit("generate --model " + A + "/models/stories260k --prompt Once --max-tokens 8 --json " + d / "o.json");
  REQUIRE(o.code == 0);
  const auto jo = nlohmann::json::parse(read_text_file(d / "o.json"));
  std::vector<int32_t> whole = jo["prompt_tokens"].get<std::vector<int32_t>>();
  for (const auto& t : jo["tokens"]) whole.push_back(t.get<int32_t>());
  const std::string want = load_tokenizer(A + "/models/stories260k")->decode(whole);
  INFO(o.out);
  CHECK(want.rfind("Once ", 0) == 0);
  CHECK(o.out.substr(0, o.out.find('\n')) == want);
  CHECK("Once" + jo["text"].get<std::string>() == want);
  // A packed checkpoint (GGUF Q8_0): its greedy text starts like the float model's.
  auto q = ptqtest::run_ptqkit("-q quantize --model " + A + "/models/stories260k --scheme Q8_0 --dataset " + A +
                               "/text/tinystories/calib.txt --set calibration.samples=4 --set calibration.seq_len=64 -o " + d / "q8");
  REQUIRE(q.code == 0);
  auto f = ptqtest::run_ptqkit("generate --model " + A + "/models/stories260k --prompt 'Once upon a time' --max-tokens 6");
  auto p = ptqtest::run_ptqkit("generate --model " + d / "q8" + " --prompt 'Once upon a time' --max-tokens 6");
  INFO(f.out << "\n" << p.out);
  REQUIRE(p.code == 0);
  CHECK(p.out.substr(0, p.out.find('\n')) == f.out.substr(0, f.out.find('\n')));
  // Bad input: both prompts, a bad id.
  CHECK(ptqtest::run_ptqkit("generate --model " + A + "/models/stories260k --prompt x --prompt-ids 1").code == 2);
  auto bad = ptqtest::run_ptqkit("generate --model " + A + "/models/stories260k --prompt-ids 1,99999");
  CHECK(bad.code == int(Errc::input));
  CHECK(bad.out.find("outside the vocabulary") != std::string::npos);
  // A checkpoint without a tokenizer (the tiny Qwen3): text in is refused, naming the folder and
  // the ways out; ids in work.
  auto none = ptqtest::run_ptqkit("generate --model " + A + "/models/tiny-qwen3 --prompt x");
  INFO(none.out);
  CHECK(none.code == int(Errc::io));
  CHECK(none.out.find("tiny-qwen3") != std::string::npos);
  CHECK(none.out.find("--prompt-ids") != std::string::npos);
  CHECK(ptqtest::run_ptqkit("generate --model " + A + "/models/tiny-qwen3 --prompt-ids 1,5 --max-tokens 2").code == 0);
}
