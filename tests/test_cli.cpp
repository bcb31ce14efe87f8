// The CLI end to end: synth -> inspect -> eval, and bad input giving a clear message, the right
// exit code and no damage.
#include <dlfcn.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
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

// `ptqkit --version` against what it can be checked by: the version in CMakeLists.txt's project(),
// the source tree's HEAD by git itself, and this CPU's flags in /proc/cpuinfo (the binary runs
// here, so every extension it was compiled for is one this CPU has; for -march=native, every one
// of the listed extensions this CPU has is one it was compiled for). report.json and the
// --log-json command line record the same build.
TEST_CASE("cli: --version gives the project's version, the source's git commit and an instruction set this CPU has, and report.json records it") {
  ptqtest::TempDir d;
  const std::string src = PTQKIT_SOURCE_DIR;
  auto r = run_ptqkit("--version");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const std::string printed = r.out;
  const std::string cmake = ptq::read_text_file(src + "/CMakeLists.txt");
  const size_t at = cmake.find("project(ptqkit VERSION ");
  REQUIRE(at != std::string::npos);
  const std::string version = cmake.substr(at + 23, cmake.find(' ', at + 23) - at - 23);
  CHECK(r.out.rfind("ptqkit " + version + " (git ", 0) == 0);
  const auto head = ptqtest::run_command("git -C '" + src + "' rev-parse --short=12 HEAD");
  if (head.code == 0) CHECK(r.out.find("(git " + head.out.substr(0, 12)) != std::string::npos);
  // the extensions, between "(x86-64" and ")" on the build line
  const size_t b = r.out.find("(x86-64");
  REQUIRE(b != std::string::npos);
  std::istringstream isa(r.out.substr(b + 7, r.out.find(')', b) - b - 7));
  std::set<std::string> built;
  for (std::string f; isa >> f;) built.insert(f);
  std::set<std::string> cpu;
  std::istringstream info(ptq::read_text_file("/proc/cpuinfo"));
  for (std::string line; std::getline(info, line);)
    if (line.rfind("flags", 0) == 0) {
      std::istringstream fl(line.substr(line.find(':') + 1));
      for (std::string f; fl >> f;) cpu.insert(f);
      break;
    }
  for (const std::string& f : built) {
    INFO(f);
    CHECK(cpu.count(f) == 1);
  }
  if (r.out.find("-march=native") != std::string::npos)
    for (const char* f : {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"}) {
      INFO(f);
      CHECK(built.count(f) == cpu.count(f));
    }
  // report.json and the JSON log carry the same build
  REQUIRE(run_ptqkit("synth --preset tiny --seed 1 --output " + d / "m").code == 0);
  r = run_ptqkit("-q --log-json " + d / "log.jsonl" + " quantize --model " + d / "m" +
                 " --scheme W8A16 --dataset random --set calibration.samples=2 --set device=cpu -o " + d / "q");
  REQUIRE(r.code == 0);
  const json rep = json::parse(ptq::read_text_file(d / "q/report.json"));
  const std::string log = ptq::read_text_file(d / "log.jsonl");
  const json cmd = json::parse(log.substr(0, log.find('\n')));   // the command line, first
  for (const json* j : {&rep["build"], &cmd["build"]}) {
    CHECK((*j)["version"] == version);
    CHECK(printed.find("(git " + (*j)["commit"].get<std::string>() + ")") != std::string::npos);
    CHECK(printed.find("(" + (*j)["isa"].get<std::string>() + ")") != std::string::npos);
  }
  CHECK(rep["ptqkit_version"] == version);
  // Where the build has NCCL, --version says whether this machine's libnccl opens, and which
  // version it is, as the dynamic loader and the library itself answer here (NCCL's version code
  // is major * 10000 + minor * 100 + patch).
  if (printed.find("NCCL: yes") != std::string::npos) {
    if (void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL)) {
      int v = 0;
      reinterpret_cast<int (*)(int*)>(dlsym(h, "ncclGetVersion"))(&v);
      CHECK(printed.find("(libnccl " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
                         " opens here)") != std::string::npos);
    } else {
      CHECK((printed.find(" opens here)") != std::string::npos || printed.find("libnccl cannot be opened here") != std::string::npos));
    }
  }
}

// A CUDA build links cudart only: cuBLAS and cuSOLVER (whose libcublasLt spends about 0.3 s of
// CPU starting up) and NCCL are opened at their first call (lib/cuda/libs.cpp). The dynamic
// loader's own log (LD_DEBUG=files: every object it opens, linked or dlopen'd) of CPU runs lists
// none of them.
TEST_CASE("cli: a command that does not use the GPU's BLAS does not load cuBLAS, cuSOLVER or NCCL (the dynamic loader's log)") {
  ptqtest::TempDir d;
  auto r = run_ptqkit("synth --preset tiny --seed 1 --output " + d / "m");
  REQUIRE(r.code == 0);
  r = ptqtest::run_command("LD_DEBUG=files " + ptqtest::ptqkit_bin() + " schemes");
  REQUIRE(r.code == 0);
  if (r.out.find("file=libcudart") == std::string::npos) PTQ_SKIP("this ptqkit is built without CUDA");
  std::string text;
  for (int i = 0; i < 100; ++i) text += "Once upon a time there was a quantized model. ";
  ptq::write_file_atomic(d / "t.txt", text);
  for (const std::string& args : std::vector<std::string>{"schemes", "inspect " + d / "m",
                                 "-q quantize --model " + d / "m" + " --scheme W4A16 --dataset random --set device=cpu --set calibration.samples=2 -o " + d / "q",
                                 "eval --model " + d / "q" + " --data " + d / "t.txt" + " --seq-len 64 --device cpu"}) {
    INFO(args);
    r = ptqtest::run_command("LD_DEBUG=files " + ptqtest::ptqkit_bin() + " " + args);
    INFO(r.out.substr(0, 4000));
    REQUIRE(r.code == 0);
    CHECK(r.out.find("file=libcudart") != std::string::npos);
    CHECK(r.out.find("libcublas") == std::string::npos);
    CHECK(r.out.find("libcusolver") == std::string::npos);
    CHECK(r.out.find("libnccl") == std::string::npos);   // opened by --gpus alone, in a build that has it
  }
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
  CHECK(r.out.find("give one with --tokenizer") != std::string::npos);   // and the way out

  // a folder of a run's formats (one subfolder each) given as the model: the error names them
  std::filesystem::create_directories(d / "run");
  std::filesystem::copy(d / "m", d / "run/gptq", std::filesystem::copy_options::recursive);
  std::filesystem::copy(d / "m", d / "run/fake", std::filesystem::copy_options::recursive);
  for (const std::string& cmd : {"eval --model " + d / "run" + " --data " + d / "t.txt", "inspect " + d / "run"}) {
    r = run_ptqkit(cmd);
    INFO(r.out);
    CHECK(r.code == 3);
    CHECK(r.out.find("its subfolders fake/, gptq/ hold models (a run's formats): give one of them") != std::string::npos);
  }

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

TEST_CASE("cli: the regression gate passes a run at its baseline and fails a regression with exit code 10") {
  ptqtest::TempDir d;
  REQUIRE(run_ptqkit("synth --seed 2 --output " + d / "m").code == 0);
  REQUIRE(run_ptqkit("synth --seed 3 --output " + d / "other").code == 0);
  std::string text;
  for (int i = 0; i < 300; ++i) text += "The gate keeps quantized models honest, run after run. ";
  ptq::write_file_atomic(d / "t.txt", text);
  const std::string evalm = "eval --data " + d / "t.txt" + " --seq-len 128 --model ";
  auto r = run_ptqkit(evalm + d / "m" + " --write-baseline " + d / "base.json");
  REQUIRE(r.code == 0);
  r = run_ptqkit(evalm + d / "m" + " --baseline " + d / "base.json" + " --max-ppl-delta 0.001 --relative");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("gate passed") != std::string::npos);
  // another model against this baseline: a different perplexity, made a "regression" by a zero tolerance in the
  // direction it moved
  auto b = json::parse(ptq::read_text_file(d / "base.json"));
  b["perplexity"] = b["perplexity"].get<double>() * 0.9;   // the baseline was 10% better
  ptq::write_file_atomic(d / "better.json", b.dump());
  r = run_ptqkit(evalm + d / "m" + " --baseline " + d / "better.json" + " --max-ppl-delta 0.05 --relative");
  CHECK(r.code == 10);
  CHECK(r.out.find("gate failed: perplexity") != std::string::npos);
  CHECK(r.out.find("> --max-ppl-delta 5%") != std::string::npos);
  CHECK(r.out.find("the baseline was written by") == std::string::npos);   // by this very build
  // the baseline records the build that wrote it (`ptqkit --version`'s commit); a failure against
  // one from another build says which two builds differ
  const std::string version = run_ptqkit("--version").out;
  CHECK(version.find("(git " + b["build"]["commit"].get<std::string>() + ")") != std::string::npos);
  b["build"]["commit"] = "000000000000";
  ptq::write_file_atomic(d / "older.json", b.dump());
  r = run_ptqkit(evalm + d / "m" + " --baseline " + d / "older.json" + " --max-ppl-delta 0.05 --relative");
  CHECK(r.code == 10);
  CHECK(r.out.find("; the baseline was written by ptqkit " + b["build"]["version"].get<std::string>() + " (git 000000000000, " +
                   b["build"]["isa"].get<std::string>() + "), this run by ptqkit") != std::string::npos);
  r = run_ptqkit(evalm + d / "m" + " --reference " + d / "other" + " --max-kl 0.000001");
  CHECK(r.code == 10);
  CHECK(r.out.find("mean KL divergence") != std::string::npos);
  r = run_ptqkit(evalm + d / "m" + " --reference " + d / "m" + " --min-top1 0.999");
  CHECK(r.code == 0);
  r = run_ptqkit("eval --data " + d / "t.txt" + " --seq-len 64 --model " + d / "m" + " --baseline " + d / "base.json" + " --max-ppl-delta 1");
  CHECK(r.code == 6);   // a baseline of other windows is refused, not compared
  CHECK(r.out.find("seq_len: differs from this run") != std::string::npos);
}

// The one-line run: a named scheme, its deployable format, the calibration named or explicitly
// random; Linears the format cannot group correctly kept in float and said.
TEST_CASE("cli: quantize --scheme writes the scheme's deployable format and calibrates on random tokens only when asked (and says so)") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string A = ptqtest::assets(), m = A + "/models/llama2xs";
  auto q = run_ptqkit("quantize --model " + m + " --scheme W4A16 --dataset " + A + "/text/tinystories/calib.txt --set calibration.samples=4 --set calibration.seq_len=64 -o " + d / "w4");
  INFO(q.out);
  REQUIRE(q.code == 0);
  CHECK(q.out.find("wrote compressed-tensors in " + d / "w4") != std::string::npos);
  CHECK(q.out.find("5 Linears have an input width their group size does not divide (e.g. model.layers.4.mlp.down_proj: 192 wide, groups of 128)") != std::string::npos);
  const json rep = json::parse(ptq::read_text_file(d / "w4/report.json"));
  CHECK(rep["compressed_tensors_float_fallback"].size() == 5);
  const json ct = json::parse(ptq::read_text_file(d / "w4/config.json"))["quantization_config"];
  CHECK(ct["quant_method"] == "compressed-tensors");
  CHECK(ct["ignore"].size() == 6);   // lm_head and the five down_proj
  CHECK(ptq::read_text_file(d / "w4/recipe.yaml").find("model.layers.0.mlp.down_proj") != std::string::npos);
  // no dataset: refused, saying how to ask for random tokens; asked: said in the summary and the report
  auto none = run_ptqkit("quantize --model " + m + " --scheme W8A16 -o " + d / "w8");
  CHECK(none.code == 2);
  CHECK(none.out.find("--dataset random") != std::string::npos);
  // nor does a recipe that names no dataset calibrate on random tokens silently
  ptq::write_file_atomic(d / "r.yaml", "quantization: {bits: 4, group_size: 32}\n");
  auto bare = run_ptqkit("quantize " + d / "r.yaml" + " --model " + m + " -o " + d / "r");
  CHECK(bare.code == 2);
  CHECK(bare.out.find("r.yaml: calibration.dataset: missing") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(d / "r"));
  auto rnd = run_ptqkit("quantize --model " + m + " --scheme W8A16 --dataset random --set calibration.samples=4 --set calibration.seq_len=64 -o " + d / "w8");
  INFO(rnd.out);
  REQUIRE(rnd.code == 0);
  CHECK(rnd.out.find("RANDOM tokens") != std::string::npos);
  CHECK(json::parse(ptq::read_text_file(d / "w8/report.json"))["calibration"]["warning"] == "calibrated on random tokens, not text: the quantization is tuned to no real input");
  auto typo = run_ptqkit("quantize --model " + m + " --scheme q4_k_n --dataset random -o " + d / "x");
  CHECK(typo.code == 2);
  CHECK(typo.out.find("did you mean Q4_K_M?") != std::string::npos);
  auto list = run_ptqkit("schemes");
  CHECK(list.out.find("W4A16-ASYM") != std::string::npos);
  CHECK(run_ptqkit("formats").out.find("compressed-tensors") != std::string::npos);
}

// --save-logits keeps the float model's top logits; --kl-base computes the KL statistics from them
// later. With every token kept (k = the vocabulary) they equal --reference's up to the fp32 storage;
// with fewer, the KL is a lower bound and top-1 agreement and the reference perplexity are exact.
TEST_CASE("cli: eval --save-logits then --kl-base gives --reference's KL statistics without the reference model") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string A = ptqtest::assets(), f = A + "/models/stories260k", text = A + "/text/tinystories/eval.txt";
  auto q = run_ptqkit("-q quantize --model " + f + " --scheme W4A16 --dataset " + A + "/text/tinystories/calib.txt --set calibration.samples=4 --set calibration.seq_len=64 -o " + d / "q");
  REQUIRE(q.code == 0);
  const std::string common = " --data " + text + " --seq-len 128 --max-windows 24 --json ";
  auto ev = [&](const std::string& args, const std::string& out) {
    auto r = run_ptqkit("eval " + args + common + d / out);
    INFO(r.out);
    REQUIRE(r.code == 0);
    return json::parse(ptq::read_text_file(d / out));
  };
  const json ref = ev("--model " + d / "q" + " --reference " + f, "ref.json");
  ev("--model " + f + " --save-logits " + d / "all.top" + " --save-logits-k 512", "f1.json");
  ev("--model " + f + " --save-logits " + d / "k8.top" + " --save-logits-k 8", "f2.json");
  const json all = ev("--model " + d / "q" + " --kl-base " + d / "all.top", "all.json"), k8 = ev("--model " + d / "q" + " --kl-base " + d / "k8.top", "k8.json");
  const double kl = ref["kl"]["mean"];
  CHECK(std::abs(all["kl"]["mean"].get<double>() - kl) <= 1e-3 * kl + 1e-5);   // (log-probabilities stored in fp32)
  CHECK(all["kl"]["top1_agreement"] == ref["kl"]["top1_agreement"]);
  CHECK(std::abs(all["kl"]["reference_perplexity"].get<double>() - ref["kl"]["reference_perplexity"].get<double>()) <= 1e-5);
  CHECK(k8["kl"]["mean"].get<double>() <= kl * (1 + 1e-3));   // a lower bound
  CHECK(k8["kl"]["mean"].get<double>() >= 0.5 * kl);
  CHECK(k8["kl"]["top1_agreement"] == ref["kl"]["top1_agreement"]);
  CHECK(k8["kl_base"]["k"] == 8);
  // other windows are refused; an existing file is not overwritten
  auto other = run_ptqkit("eval --model " + d / "q" + " --data " + text + " --seq-len 64 --max-windows 24 --kl-base " + d / "k8.top");
  CHECK(other.code == 6);
  CHECK(other.out.find("--kl-base: the saved logits are of other windows") != std::string::npos);
  auto again = run_ptqkit("eval --model " + f + common + d / "x.json" + " --save-logits " + d / "k8.top");
  CHECK(again.code == 8);
}

TEST_CASE("cli: eval of several texts gives each the result of its own eval, in one {\"evals\"} file that compare reads") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string A = ptqtest::assets(), f = A + "/models/stories260k";
  const std::vector<std::string> texts = {A + "/text/tinystories/eval.txt", A + "/text/ptb/ptb.test.txt"};
  auto q = run_ptqkit("-q quantize --model " + f + " --scheme W4A16 --dataset " + A + "/text/tinystories/calib.txt --set calibration.samples=4 --set calibration.seq_len=64 -o " + d / "q");
  REQUIRE(q.code == 0);
  const std::string common = " --model " + d / "q" + " --reference " + f + " --seq-len 128 --max-windows 6";
  auto both = run_ptqkit("eval" + common + " --data " + texts[0] + " " + texts[1] + " --json " + d / "both.json");
  INFO(both.out);
  REQUIRE(both.code == 0);
  const json evals = json::parse(ptq::read_text_file(d / "both.json"))["evals"];
  REQUIRE(evals.size() == 2);
  for (size_t i = 0; i < 2; ++i) {   // the same numbers as the text's own eval (a model loaded once changes nothing)
    REQUIRE(run_ptqkit("-q eval" + common + " --data " + texts[i] + " --json " + d / ("one" + std::to_string(i) + ".json")).code == 0);
    const json one = json::parse(ptq::read_text_file(d / ("one" + std::to_string(i) + ".json")));
    CHECK(evals[i]["data"] == texts[i]);
    CHECK(evals[i]["data_sha256"] == one["data_sha256"]);
    for (const char* k : {"perplexity", "mean_nll", "scored_tokens", "windows"}) CHECK(evals[i][k] == one[k]);
    CHECK(evals[i]["kl"]["mean"] == one["kl"]["mean"]);
    CHECK(evals[i]["kl"]["reference_perplexity"] == one["kl"]["reference_perplexity"]);
  }
  CHECK(evals[0]["perplexity"] != evals[1]["perplexity"]);
  // compare: one dataset a text, the float perplexities from the KL references
  auto c = run_ptqkit("compare " + d / "q" + " --eval " + d / "both.json" + " --json " + d / "c.json");
  INFO(c.out);
  REQUIRE(c.code == 0);
  const json cmp = json::parse(ptq::read_text_file(d / "c.json"));
  REQUIRE(cmp["datasets"].size() == 2);
  CHECK(cmp["datasets"][1]["label"] == "ptb.test.txt");
  CHECK(cmp["runs"][0]["evals"][1]["perplexity"] == evals[1]["perplexity"]);
  CHECK(cmp["float"]["perplexities"][1]["perplexity"] == evals[1]["kl"]["reference_perplexity"]);
  // what is one text's (a gate, a baseline, saved logits) is refused with several
  for (const std::string& flag : std::vector<std::string>{"--write-baseline " + d / "b.json", "--max-kl 1", "--save-logits " + d / "s.top"}) {
    auto r = run_ptqkit("eval" + common + " --data " + texts[0] + " " + texts[1] + " " + flag);
    CHECK(r.code == 2);
    CHECK(r.out.find("takes one --data text") != std::string::npos);
  }
  CHECK(!std::filesystem::exists(d / "b.json"));
}

// inspect's, compare's and report.json's sizes against the layouts' own arithmetic: AutoGPTQ's
// 4-bit g128 tensors of each Linear (qweight in/8 x out int32, qzeros and fp16 scales per group,
// g_idx in int32), the float source's parameter count, and GGUF Q8_0's published 34 bytes a block
// of 32 (8.5 bits a weight).
TEST_CASE("cli: inspect, compare and report.json give the Linears' bits per weight from the files' bytes, inspect the quantization in words") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string m = ptqtest::assets() + "/models/distilled-13m";
  const std::string quick = " --dataset random --set calibration.samples=4 --set calibration.seq_len=64 --set quantization.method=rtn";
  REQUIRE(run_ptqkit("-q quantize --model " + m + " --scheme W4A16 --format gptq" + quick + " -o " + d / "gptq").code == 0);
  REQUIRE(run_ptqkit("-q quantize --model " + m + " --scheme Q8_0" + quick + " -o " + d / "q8").code == 0);

  auto inspect_json = [&](const std::string& path) {
    const auto r = run_ptqkit("inspect --json " + path);
    INFO(r.out);
    REQUIRE(r.code == 0);
    return json::parse(r.out.substr(r.out.find('{')));
  };
  const json src = inspect_json(m);
  int64_t float_params = 0;   // the float checkpoint's parameters: its tensors' values
  for (const json& t : src["tensors"]) {
    int64_t n = 1;
    for (const auto& e : t["shape"]) n *= e.get<int64_t>();
    float_params += n;
  }
  CHECK(src["weights"]["parameters"] == float_params);
  CHECK(src["weights"]["linear_bits_per_weight"].get<double>() == 16.0);

  // distilled-13m: hidden 384, 6 heads and 2 KV heads of 64, ffn 1024, 8 layers
  const std::vector<std::pair<int64_t, int64_t>> linears = {{384, 384}, {128, 384}, {128, 384}, {384, 384}, {1024, 384}, {1024, 384}, {384, 1024}};
  int64_t weights = 0, bytes = 0;
  for (auto [out, in] : linears) {
    const int64_t groups = (in + 127) / 128;
    weights += 8 * out * in;
    bytes += 8 * (in / 8 * out * 4 + groups * (out / 8) * 4 + groups * out * 2 + in * 4);
  }
  const json q = inspect_json(d / "gptq");
  CHECK(q["weights"]["parameters"] == float_params);
  CHECK(q["weights"]["linear_weights"] == weights);
  CHECK(q["weights"]["linear_bytes"] == bytes);
  CHECK(q["quantization"] == "GPTQ (gptq): 4-bit weights, groups of 128, symmetric, act-order yes");
  // report.json says the same of each output: the tensors' bytes (the Linears' and the f16 rest's)
  const json out0 = json::parse(ptq::read_text_file(d / "gptq/report.json"))["outputs"][0];
  CHECK(out0["tensor_bytes"] == bytes + 2 * (float_params - weights));
  CHECK(out0["linear_bits_per_weight"].get<double>() == Approx(8.0 * double(bytes) / double(weights)).epsilon(1e-12));
  char line[64];
  std::snprintf(line, sizeof line, "weights at %.2f bits each", 8.0 * double(bytes) / double(weights));   // 4.22
  CHECK(run_ptqkit("inspect " + d / "gptq").out.find(line) != std::string::npos);

  const json g = inspect_json(d / "q8/model.gguf");
  CHECK(g["parameters"] == float_params);
  const auto gt = run_ptqkit("inspect " + d / "q8/model.gguf");
  INFO(gt.out);
  CHECK(gt.out.find("Q8_0") != std::string::npos);
  CHECK(gt.out.find("8.50 bits per weight") != std::string::npos);
  CHECK(gt.out.find("llama.cpp file type Q8_0 (general.file_type 7)") != std::string::npos);
  CHECK(g["weights"]["linear_weights"] == weights);   // every Linear a Q8_0 matrix: 34 bytes a block of 32
  CHECK(g["weights"]["linear_bits_per_weight"].get<double>() == 8.5);

  // compare: the same bits per weight beside each run's size, the float source's 16
  const auto c = run_ptqkit("compare " + d / "gptq" + " " + d / "q8" + " --json " + d / "c.json");
  INFO(c.out);
  REQUIRE(c.code == 0);
  CHECK(c.out.find("bits/w") != std::string::npos);
  const json cj = json::parse(ptq::read_text_file(d / "c.json"));
  CHECK(cj["float"]["bits_per_weight"].get<double>() == 16.0);
  CHECK(cj["runs"][0]["outputs"][0]["bits_per_weight"].get<double>() == Approx(8.0 * double(bytes) / double(weights)).epsilon(1e-12));
  CHECK(cj["runs"][1]["outputs"][0]["format"] == "gguf");
  CHECK(cj["runs"][1]["outputs"][0]["bits_per_weight"].get<double>() == 8.5);
}
