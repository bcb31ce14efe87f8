// The CLI end to end: synth -> inspect -> eval, and bad input giving a clear message, the right
// exit code and no damage.
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/fsutil.h"
#include "testing.h"

using ptqtest::run_ptqkit;
using nlohmann::json;

TEST_CASE("cli: synth, inspect, eval with JSON output") {
  ptqtest::TempDir d;
  auto r = run_ptqkit("synth --preset tiny --seed 1 --output " + d / "m");
  INFO(r.out);
  REQUIRE(r.code == 0);
  r = run_ptqkit("inspect " + d / "m");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("llama, 2 layers, hidden 128, ffn 384") != std::string::npos);
  CHECK(r.out.find("byte-level-bpe") != std::string::npos);
  std::string text;
  for (int i = 0; i < 200; ++i) text += "Once upon a time there was a quantized model. ";
  ptq::write_file_atomic(d / "t.txt", text);
  r = run_ptqkit("eval --model " + d / "m" + " --data " + d / "t.txt" + " --seq-len 128 --json " + d / "e.json" + " --reference " + d / "m");
  INFO(r.out);
  REQUIRE(r.code == 0);
  json j = json::parse(ptq::read_text_file(d / "e.json"));
  for (auto k : {"perplexity", "mean_nll", "scored_tokens", "windows", "seq_len", "model", "data"}) CHECK(j.contains(k));
  CHECK(j["windows"] == (9201 / 128));
  CHECK(j["kl"]["mean"].get<double>() == Approx(0.0).margin(1e-12));   // a model against itself
  CHECK(j["kl"]["top1_agreement"] == 1.0);
}

TEST_CASE("cli: errors name the file and field and exit non-zero with the kind's code") {
  ptqtest::TempDir d;
  REQUIRE(run_ptqkit("synth --output " + d / "m").code == 0);
  ptq::write_file_atomic(d / "t.txt", std::string(3000, 'a'));

  auto r = run_ptqkit("eval --model " + d / "nope" + " --data " + d / "t.txt");
  CHECK(r.code == 3);
  CHECK(r.out.find("nope") != std::string::npos);

  r = run_ptqkit("synth --output " + d / "m");        // exists, no --force
  CHECK(r.code == 8);
  CHECK(r.out.find("--force") != std::string::npos);

  ptq::write_file_atomic(d / "empty.txt", "");
  r = run_ptqkit("eval --model " + d / "m" + " --data " + d / "empty.txt");
  CHECK(r.code == 6);
  CHECK(r.out.find("empty.txt: data file is empty") != std::string::npos);

  r = run_ptqkit("eval --model " + d / "m" + " --data " + d / "t.txt --seq-len 4096");
  CHECK(r.code == 6);
  CHECK(r.out.find("exceeds the model's context") != std::string::npos);

  std::filesystem::copy(d / "m", d / "notok", std::filesystem::copy_options::recursive);
  std::filesystem::remove(d / "notok/tokenizer.json");
  r = run_ptqkit("eval --model " + d / "notok" + " --data " + d / "t.txt");
  CHECK(r.code == 3);
  CHECK(r.out.find("no tokenizer.model, tokenizer.json") != std::string::npos);

  ptq::write_file_atomic(d / "m/config.json", "{\"model_type\": \"llama\", ");
  r = run_ptqkit("inspect " + d / "m");
  CHECK(r.code == 4);
  CHECK(r.out.find("config.json: malformed JSON") != std::string::npos);

  std::filesystem::resize_file(d / "notok/model.safetensors", 5);
  r = run_ptqkit("inspect " + d / "notok");
  CHECK(r.code == 4);
  CHECK(r.out.find("model.safetensors: header: truncated") != std::string::npos);

  r = run_ptqkit("eval --model");
  CHECK(r.code != 0);
}
