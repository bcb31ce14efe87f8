// The quantization pipeline end to end, on synthetic and shared models.
#include <csignal>
#include <filesystem>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/progress.h"
#include "core/safetensors.h"
#include "model/synth.h"
#include "model/tokenizer.h"
#include "pipeline/pipeline.h"
#include "pipeline/stats.h"
#include "testing.h"

using namespace ptq;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {
std::string synth_tiny(const ptqtest::TempDir& d, const std::string& name = "m") {
  SynthOptions o;
  o.preset = "tiny";
  o.seed = 3;
  synth_model(o, d / name);
  return d / name;
}
Recipe tiny_recipe(const std::string& model, const std::string& out) {
  Recipe r = parse_recipe(YAML::Load("calibration: {dataset: random, samples: 16, seq_len: 64, seed: 1}\n"
                                     "quantization: {bits: 4, group_size: 32, act_order: true}\n"),
                          "test.yaml");
  r.model = model;
  r.output = out;
  return r;
}
std::string model_files_digest(const std::string& dir) {
  std::string all;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") all += e.path().filename().string() + sha256_file(e.path().string());
  return all;
}
}  // namespace

TEST_CASE("pipeline: same recipe and seed give byte-identical model files") {
  ptqtest::TempDir d;
  const std::string m = synth_tiny(d);
  json a = run_quantize(tiny_recipe(m, d / "a"), {});
  run_quantize(tiny_recipe(m, d / "b"), {});
  CHECK(model_files_digest(d / "a") == model_files_digest(d / "b"));
  CHECK(a["modules"].size() == 14);
  for (auto& mod : a["modules"]) {
    CHECK(mod["loss"].get<double>() <= mod["rtn_loss"].get<double>());
    CHECK(mod["damp_percent"].get<double>() == 0.01);
  }
  CHECK(a["calibration"]["offsets"].size() == 16);
  CHECK(fs::exists(d / "a/tokenizer.json"));
  CHECK(fs::exists(d / "a/config.json"));
  CHECK_FALSE(fs::exists(d / "a/.layers"));
}

TEST_CASE("pipeline: RTN export equals the min-max formula applied to the source weights") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  Recipe r = tiny_recipe(ptqtest::assets() + "/models/stories260k", d / "rtn");
  r.quant.method = "rtn";
  r.quant.sym = false;
  r.quant.act_order = false;
  run_quantize(r, {});
  Checkpoint src(r.model), out(r.output);
  const std::string name = "model.layers.2.mlp.down_proj.weight";   // [64, 172]: the last group has 12 columns
  auto W = tensor_to_f32(src.get(name)), Q = tensor_to_f32(out.get(name));
  double maxd = 0;
  for (int row = 0; row < 64; ++row)
    for (int g0 = 0; g0 < 172; g0 += 32) {
      const int n = std::min(32, 172 - g0);
      float lo = 0, hi = 0;
      for (int c = g0; c < g0 + n; ++c) { lo = std::min(lo, W[size_t(row * 172 + c)]); hi = std::max(hi, W[size_t(row * 172 + c)]); }
      const float scale = round_to(DType::F16, (hi - lo) / 15.0f);
      const float zero = std::nearbyint(-lo / scale);
      for (int c = g0; c < g0 + n; ++c) {
        const float q = std::min(15.0f, std::max(0.0f, std::nearbyint(W[size_t(row * 172 + c)] / scale) + zero));
        maxd = std::max(maxd, double(std::abs(scale * (q - zero) - Q[size_t(row * 172 + c)])));
      }
    }
  CHECK(maxd == 0.0);   // a float32 model: the dequantized value is stored exactly
  auto E = tensor_to_f32(src.get("model.embed_tokens.weight")), E2 = tensor_to_f32(out.get("model.embed_tokens.weight"));
  CHECK(E == E2);       // ignored by default: copied
}

TEST_CASE("pipeline: bad input is refused with a clear error and no output") {
  ptqtest::TempDir d;
  const std::string m = synth_tiny(d);
  Recipe r = tiny_recipe(m, d / "out");
  r.ignore.push_back("*.qkv_proj");
  CHECK_THROWS_WITH(run_quantize(r, {}), Catch::Contains("quantization.ignore: pattern '*.qkv_proj' matches no module"));
  CHECK_FALSE(fs::exists(d / "out"));

  r = tiny_recipe(m, d / "out");
  write_file_atomic(d / "short.txt", "too short");
  r.calibration.dataset = d / "short.txt";
  CHECK_THROWS_WITH(run_quantize(r, {}), Catch::Contains("calibration text is shorter than one window"));

  // A text dataset for a model folder without a tokenizer: the error says what would work.
  fs::remove(m + "/tokenizer.json");
  r = tiny_recipe(m, d / "out");
  r.calibration.dataset = d / "short.txt";
  CHECK_THROWS_WITH(run_quantize(r, {}), Catch::Contains("no tokenizer.model") && Catch::Contains("--dataset random"));
  CHECK_FALSE(fs::exists(d / "out"));
  write_file_atomic(m + "/tokenizer.json", byte_level_tokenizer_json());

  r = tiny_recipe(m, d / "out");
  r.calibration.seq_len = 100000;
  CHECK_THROWS_WITH(run_quantize(r, {}), Catch::Contains("exceeds the model's max_position_embeddings"));

  fs::create_directories(d / "exists");
  r = tiny_recipe(m, d / "exists");
  try {
    run_quantize(r, {});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code == Errc::exists);
  }
  CHECK(fs::is_empty(d / "exists"));
  QuantizeOptions force;
  force.force = true;
  run_quantize(r, force);
  CHECK(fs::exists(d / "exists/report.json"));
}

TEST_CASE("pipeline: a NaN in a weight is named") {
  ptqtest::TempDir d;
  const std::string m = synth_tiny(d);
  std::vector<NamedTensor> ts;
  {
    Checkpoint ck(m);
    for (auto& n : ck.names()) {
      TensorView t = ck.get(n);
      Tensor x(t.dtype, t.shape);
      std::memcpy(x.bytes.data(), t.data, t.nbytes);
      if (n == "model.layers.1.mlp.up_proj.weight") x.as<uint16_t>()[77] = 0x7E00;   // f16 NaN
      ts.push_back({n, std::move(x)});
    }
  }
  fs::remove(m + "/model.safetensors");
  write_safetensors(m + "/model.safetensors", ts);
  CHECK_THROWS_WITH(run_quantize(tiny_recipe(m, d / "out"), {}),
                    Catch::Contains("model.layers.1.mlp.up_proj.weight: contains NaN/Inf (first at [0, 77])"));
  CHECK_FALSE(fs::exists(d / "out"));
}

void check_resume(const std::string& preset, const std::string& calibration, size_t modules) {
  ptqtest::TempDir d;
  SynthOptions o;
  o.preset = preset;
  o.seed = 4;
  synth_model(o, d / "m");
  const std::string recipe = "model: " + d / "m" + "\ncalibration: " + calibration + "\n"
                             "quantization: {bits: 4, group_size: 32, act_order: true, static_groups: true}\n";
  write_file_atomic(d / "r.yaml", recipe);
  const std::string bin = std::string(PTQKIT_BIN) + " -q quantize " + d / "r.yaml";
  REQUIRE(std::system((bin + " --output " + d / "ref > /dev/null 2>&1").c_str()) == 0);
  // Kill -9 as soon as the first layer is on disk (and before the run ends).
  const std::string first = d / "out.partial/.layers/layer-00000.safetensors";
  const std::string kill = bin + " --output " + d / "out" + " > /dev/null 2>&1 & pid=$!; for i in $(seq 3000); do [ -f " + first +
                           " ] && break; sleep 0.01; done; kill -9 $pid; wait $pid";
  REQUIRE(std::system(kill.c_str()) != -1);
  REQUIRE_FALSE(fs::exists(d / "out"));
  REQUIRE(fs::exists(first));
  // Its finished layer is not thrown away unasked: without --resume or --force the run is refused,
  // naming both, and the layer stays.
  auto again = ptqtest::run_ptqkit("-q quantize " + d / "r.yaml" + " --output " + d / "out");
  CHECK(again.code == int(Errc::exists));
  CHECK(again.out.find("1 finished layer(s)") != std::string::npos);
  CHECK(again.out.find("--resume") != std::string::npos);
  CHECK(again.out.find("--force") != std::string::npos);
  REQUIRE(fs::exists(first));
  // A different recipe may not resume it.
  auto r = ptqtest::run_ptqkit("-q quantize " + d / "r.yaml" + " --output " + d / "out --resume --set quantization.bits=3");
  CHECK(r.code == 2);
  CHECK(r.out.find("the interrupted run used another recipe") != std::string::npos);
  // Nor another model under the same path: the same config (synth's, another seed), other weights.
  o.seed = 5;
  synth_model(o, d / "other");
  REQUIRE(read_text_file(d / "other/config.json") == read_text_file(d / "m/config.json"));
  fs::rename(d / "m", d / "m-kept");
  fs::rename(d / "other", d / "m");
  r = ptqtest::run_ptqkit("-q quantize " + d / "r.yaml" + " --output " + d / "out --resume");
  CHECK(r.code == 2);
  CHECK(r.out.find("the interrupted run used another model weights") != std::string::npos);
  fs::remove_all(d / "m");
  fs::rename(d / "m-kept", d / "m");
  REQUIRE(fs::exists(first));
  r = ptqtest::run_ptqkit("quantize " + d / "r.yaml" + " --output " + d / "out --resume");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resuming") != std::string::npos);
  CHECK(model_files_digest(d / "out") == model_files_digest(d / "ref"));
  CHECK_FALSE(fs::exists(d / "out.partial"));
  json rep = json::parse(read_text_file(d / "out/report.json"));
  CHECK(rep["modules"].size() == modules);   // resumed layers' entries come from their layer files
}

TEST_CASE("pipeline: a run killed midway resumes from its last finished layer, byte-identical to an uninterrupted run") {
  check_resume("small", "{dataset: random, samples: 64, seq_len: 256}", 28);
}
TEST_CASE("pipeline: a MoE run killed midway resumes byte-identical (the finished layer replayed through its routed experts)") {
  check_resume("tiny-moe", "{dataset: random, samples: 64, seq_len: 256}", 2 * (4 + 3 * 8));
}

// The tests' stop (stop_after_layer, what the GPU tests interrupt multi-GPU runs with) leaves what a
// killed run leaves, and --resume continues it to the uninterrupted bytes.
TEST_CASE("pipeline: a run stopped after its first layer (stop_after_layer) resumes byte-identical") {
  ptqtest::TempDir d;
  const std::string m = synth_tiny(d);
  Recipe r = tiny_recipe(m, d / "ref");
  run_quantize(r, {});
  r.output = d / "out";
  QuantizeOptions stop;
  stop.resume = true;
  stop.stop_after_layer = 0;
  CHECK_THROWS_WITH(run_quantize(r, stop), Catch::Contains("stopped after layer 0"));
  CHECK_FALSE(fs::exists(d / "out"));
  CHECK(fs::exists(d / "out.partial/.layers/layer-00000.safetensors"));
  QuantizeOptions resume;
  resume.resume = true;
  const json rep = run_quantize(r, resume);
  CHECK(rep["layers"][0].value("resumed", false));
  CHECK(model_files_digest(d / "out") == model_files_digest(d / "ref"));
}

TEST_CASE("pipeline: a killed run leaves no folder that looks complete") {
  ptqtest::TempDir d;
  SynthOptions o;
  o.preset = "small";
  synth_model(o, d / "m");
  write_file_atomic(d / "r.yaml", "model: " + d / "m" + "\noutput: " + d / "out" +
                                      "\ncalibration: {dataset: random, samples: 64, seq_len: 256}\nquantization: {bits: 4, group_size: 128}\n");
  const std::string cmd = std::string(PTQKIT_BIN) + " -q quantize " + d / "r.yaml" + " > /dev/null 2>&1 & pid=$!; sleep 1.5; kill -9 $pid; wait $pid";
  REQUIRE(std::system(cmd.c_str()) != -1);
  CHECK_FALSE(fs::exists(d / "out"));
  for (auto& e : fs::directory_iterator(d.path)) {
    const std::string n = e.path().filename().string();
    CHECK((n == "m" || n == "r.yaml" || n.rfind("out.partial", 0) == 0));
  }
}

TEST_CASE("pipeline: non-true-sequential runs too, and rejects nothing it should accept") {
  ptqtest::TempDir d;
  const std::string m = synth_tiny(d);
  Recipe r = tiny_recipe(m, d / "out");
  r.true_sequential = false;
  r.quant.bits = 3;
  r.quant.mse = true;
  r.quant.static_groups = true;
  json rep = run_quantize(r, {});
  CHECK(rep["modules"].size() == 14);
  for (auto& mod : rep["modules"]) CHECK(mod["loss"].get<double>() <= mod["rtn_loss"].get<double>() * 1.0001);
}

TEST_CASE("pipeline: --load-stats re-quantizes from saved statistics without the model's forward pass") {
  ptqtest::TempDir d;
  const std::string m = synth_tiny(d);
  SynthOptions one;
  one.preset = "tiny";
  one.layers = 1;
  synth_model(one, d / "m1");
  auto run = [&](const std::string& out, int bits, bool seq, const std::string& save, const std::string& load) {
    Recipe r = tiny_recipe(seq ? m : d / "m1", d / out);
    r.quant.bits = bits;
    r.true_sequential = seq;
    QuantizeOptions o;
    o.save_stats = save.empty() ? "" : d / save;
    o.load_stats = load.empty() ? "" : d / load;
    return run_quantize(r, o);
  };
  // One layer without true_sequential: its Hessians come from the float model and the embeddings
  // alone, so they do not depend on the bits, and 3-bit from 4-bit's statistics must equal a direct
  // 3-bit run byte for byte. (Deeper layers' inputs depend on the quantized layers before them.)
  run("q4", 4, false, "stats", "");
  REQUIRE(fs::exists(d / "stats/stats.json"));
  REQUIRE(fs::exists(d / "stats/layer-00000.safetensors"));
  run("q3_direct", 3, false, "", "");
  json rep = run("q3_loaded", 3, false, "", "stats");
  CHECK(model_files_digest(d / "q3_loaded") == model_files_digest(d / "q3_direct"));
  CHECK(rep["statistics"]["loaded_from"] == d / "stats");
  CHECK(rep["phases_seconds"].value("forward", 0.0) == 0.0);   // no forward pass ran
  // true_sequential: the same recipe from its own statistics reproduces the saving run.
  run("s4", 4, true, "stats_seq", "");
  run("s4_loaded", 4, true, "", "stats_seq");
  CHECK(model_files_digest(d / "s4_loaded") == model_files_digest(d / "s4"));
  // Refused: other calibration windows, another model, other collection settings, an existing folder.
  Recipe r = tiny_recipe(d / "m1", d / "x");
  r.true_sequential = false;
  r.calibration.seed = 99;
  QuantizeOptions o;
  o.load_stats = d / "stats";
  try {
    run_quantize(r, o);
    FAIL("accepted statistics of other calibration windows");
  } catch (const Error& e) {
    CHECK(e.code == Errc::input);
    CHECK(std::string(e.what()).find("other calibration data") != std::string::npos);
    CHECK(e.field.rfind("key.calibration", 0) == 0);
  }
  const std::string m2 = synth_tiny(d, "m2");
  fs::remove(m2 + "/model.safetensors");
  fs::copy_file(m + "/model.safetensors", m2 + "/model.safetensors");
  {   // one changed weight byte is another model
    std::string bytes = read_text_file(m2 + "/model.safetensors");
    bytes[bytes.size() - 3] ^= 1;
    write_file_atomic(m2 + "/model.safetensors", bytes);
  }
  o.load_stats = d / "stats_seq";
  r = tiny_recipe(m2, d / "y");
  try {
    run_quantize(r, o);
    FAIL("accepted statistics of another model");
  } catch (const Error& e) {
    CHECK(e.field == "key.model_sha256");
  }
  o.load_stats = d / "stats_seq";
  r = tiny_recipe(m, d / "z");   // true_sequential differs from the saving run's
  r.true_sequential = false;
  try {
    run_quantize(r, o);
    FAIL("accepted statistics collected otherwise");
  } catch (const Error& e) {
    CHECK(e.field == "key.collection.true_sequential");
  }
  CHECK_FALSE(fs::exists(d / "x"));
  CHECK_FALSE(fs::exists(d / "z"));
  QuantizeOptions so;
  so.save_stats = d / "stats";
  CHECK_THROWS_AS(run_quantize(tiny_recipe(m, d / "w"), so), Error);   // exists, no --force
}

// The statistics key names the model by the SHA-256 of config.json and of each weight file the
// loader reads (pipeline/stats.h: model_digest). Reference: coreutils' sha256sum over the same
// "name:hex" lines. A PyTorch .bin checkpoint's shards are in it (before 2026-12-04 only
// *.safetensors were, so two .bin models of one config shared a key), and a safetensors folder's
// digest is the one earlier runs recorded.
TEST_CASE("pipeline: the statistics key's model digest covers the weight files the loader reads, .bin shards too") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  auto sha256sum = [](const std::string& path) {
    const auto r = ptqtest::run_command("sha256sum '" + path + "'");
    REQUIRE(r.code == 0);
    return r.out.substr(0, 64);
  };
  auto reference = [&](const std::string& dir, const std::vector<std::string>& files) {
    std::string lines;
    for (auto& f : files) lines += f + ":" + sha256sum(dir + "/" + f) + "\n";
    write_file_atomic(d / "lines", lines);
    return sha256sum(d / "lines");
  };
  const std::string bin = ptqtest::assets() + "/models/llama2xs-bin";
  const std::vector<std::string> bin_files = {"config.json", "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"};
  CHECK(model_digest(bin) == reference(bin, bin_files));
  const std::string st = ptqtest::assets() + "/models/llama2xs";
  CHECK(model_digest(st) == reference(st, {"config.json", "model.safetensors"}));
  // One byte of the second shard changed (inside the zip's stored data): another model.
  fs::copy(bin, d / "tuned");
  for (auto& e : fs::directory_iterator(d / "tuned")) fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  std::string bytes = read_text_file(d / "tuned" + "/" + bin_files[2]);
  bytes[bytes.size() / 2] ^= 1;
  write_file_atomic(d / "tuned" + "/" + bin_files[2], bytes);
  CHECK(model_digest(d / "tuned") == reference(d / "tuned", bin_files));
  CHECK(model_digest(d / "tuned") != model_digest(bin));
}

TEST_CASE("pipeline: --load-stats reproduces SmoothQuant factors and static activation scales") {
  ptqtest::TempDir d;
  const std::string m = synth_tiny(d);
  auto run = [&](const std::string& out, const std::string& save, const std::string& load) {
    Recipe r = parse_recipe(YAML::Load("calibration: {dataset: random, samples: 16, seq_len: 64, seed: 1}\n"
                                       "quantization: {method: gptq, bits: 8, group_size: -1, smoothquant: {alpha: auto},"
                                       " activations: {strategy: tensor, dynamic: false}}\n"),
                            "sq.yaml");
    r.model = m;
    r.output = d / out;
    QuantizeOptions o;
    o.save_stats = save.empty() ? "" : d / save;
    o.load_stats = load.empty() ? "" : d / load;
    return run_quantize(r, o);
  };
  json a = run("a", "stats", ""), b = run("b", "", "stats");
  CHECK(model_files_digest(d / "b") == model_files_digest(d / "a"));
  CHECK(read_text_file(d / "b/config.json") == read_text_file(d / "a/config.json"));   // static input scales
  CHECK(a["smoothquant"] == b["smoothquant"]);
}

TEST_CASE("pipeline: --dry-run makes a run's checks and plan, writes nothing, and plans what the run then does") {
  ptqtest::TempDir d;
  const std::string m = synth_tiny(d);
  Recipe r = tiny_recipe(m, d / "runs/q");
  r.formats = {"fake"};
  r.ignore = {"lm_head", "model.embed_tokens", "model.layers.0.mlp.down_proj"};
  r.overrides = {{"*.v_proj", YAML::Load("{bits: 8}")}};
  QuantizeOptions o;
  o.dry_run = true;
  const json plan = run_quantize(r, o);
  CHECK(!fs::exists(d / "runs"));   // not even the output's parent
  CHECK(plan["dry_run"] == true);
  const LlamaModel model(m);
  const int64_t linears = int64_t(model.config().num_hidden_layers) * 7;
  CHECK(plan["linears"] == linears);
  REQUIRE(plan["quantized"].size() == 2);
  CHECK(plan["quantized"][0]["quantization"] == "gptq 4-bit, groups of 32, symmetric, act-order");
  CHECK(plan["quantized"][1]["quantization"] == "gptq 8-bit, groups of 32, symmetric, act-order");
  CHECK(plan["quantized"][1]["modules"] == model.config().num_hidden_layers);
  CHECK(plan["kept_in_float"] == json::array({"model.layers.0.mlp.down_proj"}));
  CHECK(plan["quantized"][0]["modules"].get<int64_t>() + plan["quantized"][1]["modules"].get<int64_t>() + 1 == linears);
  // the run itself: the windows, the modules and the disk bounds it planned
  o.dry_run = false;
  const json rep = run_quantize(r, o);
  CHECK(plan["calibration"] == rep["calibration"]);
  CHECK(plan["disk_min_bytes"] == rep["disk_min_bytes"]);
  CHECK(int64_t(rep["modules"].size()) == linears - 1);
  for (const json& mod : rep["modules"]) CHECK(mod["bits"] == (mod["name"].get<std::string>().find("v_proj") != std::string::npos ? 8 : 4));
  // --load-stats: the saved statistics' key checked, as the run checks it
  QuantizeOptions saving;
  saving.save_stats = d / "stats";
  r.output = d / "saving";
  run_quantize(r, saving);
  r.output = d / "runs/q";
  o.dry_run = true;
  o.load_stats = d / "stats";
  Recipe again = r;
  again.output = d / "from-stats";
  CHECK(run_quantize(again, o)["dry_run"] == true);
  again.calibration.seed = 2;
  CHECK_THROWS_WITH(run_quantize(again, o), Catch::Contains("key.calibration") && Catch::Contains("other calibration data"));
  CHECK(!fs::exists(d / "from-stats"));
  o.load_stats.clear();
  // refused as the run is: an output that exists; a format that cannot hold the recipe
  CHECK_THROWS_WITH(run_quantize(r, o), Catch::Contains("output exists; pass --force"));
  o.resume = true;   // a finished output: --resume refuses it too, as the run does
  CHECK_THROWS_WITH(run_quantize(r, o), Catch::Contains("output exists; pass --force"));
  o.resume = false;
  r.output = d / "other";
  r.formats = {"gptq_v2"};
  CHECK_THROWS_WITH(run_quantize(r, o), Catch::Contains("v_proj: gptq_v2: one quantization setting for the whole model is written"));
  r.formats = {"fake"};
  r.gpus = 2;   // what --gpus needs, before any process would start
  r.device = "cpu";
  CHECK_THROWS_WITH(run_quantize(r, o), Catch::Contains("test.yaml: device: --gpus 2: device: cpu runs no GPU"));
  CHECK(!fs::exists(d / "other"));
  // the command: exit 0, the plan on stdout, no folder
  const auto cli = ptqtest::run_ptqkit("quantize --model " + m + " --scheme W4A16 --dataset random -o " + d / "cli" + " --dry-run");
  INFO(cli.out);
  CHECK(cli.code == 0);
  CHECK(cli.out.find("nothing was written (--dry-run)") != std::string::npos);
  CHECK(cli.out.find("gptq 4-bit, groups of 128, symmetric, act-order (static groups)") != std::string::npos);
  CHECK(!fs::exists(d / "cli"));
  // --gpus with a scheme is the scheme's recipe with gpus set (it was dropped before), checked as a run checks it
  const auto gpus = ptqtest::run_ptqkit("quantize --model " + m + " --scheme W4A16 --dataset random -o " + d / "cli" + " --gpus 64 --dry-run");
  INFO(gpus.out);
  CHECK(gpus.code == 2);
  CHECK(gpus.out.find("--gpus 64: ") != std::string::npos);
}

TEST_CASE("pipeline: the least a run writes is checked against the free space before calibration, and the bound is below what it writes") {
  // the check itself: refused naming the folder and both sizes, or passed
  CHECK_THROWS_WITH(check_room("out.partial", "the layer store and the exports", int64_t(3) << 30, int64_t(1) << 30),
                    Catch::Contains("out.partial: needs at least 3.00 GiB for the layer store and the exports; its file system has 1.00 GiB free"));
  ptqtest::TempDir d;
  // passed; with less than half the need again to spare, passed with a warning (in the event log too)
  open_json_log(d / "events.jsonl");
  CHECK_NOTHROW(check_room("out.partial", "the exports", 100, 1000));
  CHECK(read_text_file(d / "events.jsonl").find("warning") == std::string::npos);
  CHECK_NOTHROW(check_room("out.partial", "the exports", 100, 149));
  const std::string events = read_text_file(d / "events.jsonl");
  CHECK(events.find(R"("event":"warning")") != std::string::npos);
  CHECK(events.find("out.partial: needs at least 100 B for the exports; its file system has 149 B free: it may not fit") != std::string::npos);
  CHECK_NOTHROW(check_room("out.partial", "the exports", 100, 150));   // half again to spare: no warning
  CHECK(read_text_file(d / "events.jsonl") == events);
  open_json_log("");
  // free_space: the nearest existing folder's file system
  const FreeSpace here = free_space(d.path.string()), below = free_space(d / "not/yet/made");
  CHECK(here.bytes > 0);
  CHECK(below.fs_id == here.fs_id);
  // a real run: the report's lower bounds against the bytes it wrote (every format, --save-stats)
  const std::string m = synth_tiny(d);
  Recipe r = tiny_recipe(m, d / "q");
  r.formats = {"fake", "gptq_v2", "compressed-tensors"};
  QuantizeOptions o;
  o.save_stats = d / "stats";
  const json rep = run_quantize(r, o);
  auto bytes_of = [](const std::string& dir) {
    int64_t n = 0;
    for (auto& e : fs::recursive_directory_iterator(dir))
      if (e.path().extension() == ".safetensors") n += int64_t(e.file_size());
    return n;
  };
  const json& need = rep["disk_min_bytes"];
  INFO(need.dump() << " against " << bytes_of(d / "q") << " and " << bytes_of(d / "stats"));
  CHECK(need["exports"].get<int64_t>() <= bytes_of(d / "q"));
  CHECK(need["exports"].get<int64_t>() >= bytes_of(d / "q") * 8 / 10);
  CHECK(need["stats"].get<int64_t>() <= bytes_of(d / "stats"));   // the fp64 Hessians, less their files' headers
  CHECK(need["stats"].get<int64_t>() >= bytes_of(d / "stats") * 95 / 100);
  CHECK(need["store"].get<int64_t>() > 0);
}
