// report.html and the JSON-lines log: content checked against a hand-written report, the page
// rendered by a real headless browser (Debian's chromium) and screenshotted, and the log of a real
// run parsed line by line. `ptqkit compare`: hand-written runs against their arithmetic in fp64,
// real runs against their own report.json and evaluation files.
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/fsutil.h"
#include "report/compare.h"
#include "report/report_html.h"
#include "testing.h"

using nlohmann::json;
using ptqtest::run_ptqkit;

namespace {
size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}
// A report as pipeline.cpp writes it, by hand: 2 layers x 2 modules, smoothing on layer 0.
json hand_report() {
  json mods = json::array();
  for (int l = 0; l < 2; ++l)
    for (const char* k : {"self_attn.q_proj", "mlp.down_proj"})
      mods.push_back({{"name", "model.layers." + std::to_string(l) + "." + k}, {"method", "gptq"}, {"bits", 4}, {"group_size", 128},
                      {"loss", 0.5 + l}, {"rtn_loss", 1.0 + l}, {"loss_ratio_vs_rtn", (0.5 + l) / (1.0 + l)}, {"damp_percent", 0.01},
                      {"damp_retries", l}, {"dead_columns", 0}, {"seconds", 0.25}});
  mods[3]["name"] = "model.layers.1.<b>evil</b>";
  return {{"ptqkit_version", "0.1.0"},
          {"recipe", {{"output", "out"}, {"quantization", {{"method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"sym", true}}}}},
          {"device", "cpu"},
          {"model", {{"path", "m"}, {"model_type", "llama"}, {"layers", 2}, {"hidden_size", 64}, {"intermediate_size", 128}, {"dtype", "F16"}}},
          {"calibration", {{"dataset", "random"}, {"samples", 8}, {"seq_len", 32}, {"seed", 1}, {"offsets", {1, 2, 3}}}},
          {"modules", mods},
          {"smoothquant", {{{"layer", 0}, {"pair", "input_layernorm"}, {"outlier_ratio_before", 20.0}, {"outlier_ratio_after", 4.0}}}},
          {"layers", {{{"layer", 0}, {"seconds", 1.5}}, {{"layer", 1}, {"seconds", 2.5}}}},
          {"phases_seconds", {{"forward", 1.0}, {"solve", 3.0}}},
          {"total_seconds", 4.0},
          {"peak_rss_mb", 100.0},
          {"outputs", {{{"format", "gptq"}, {"dir", "."}, {"files", {"model.safetensors"}}}}}};
}
std::string chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"})
    if (std::filesystem::exists(p)) return p;
  return "";
}
// Width and height from a PNG's IHDR chunk (bytes 16..23, big-endian).
std::pair<int, int> png_size(const std::string& png) {
  auto be32 = [&](size_t o) { return int((uint8_t(png[o]) << 24) | (uint8_t(png[o + 1]) << 16) | (uint8_t(png[o + 2]) << 8) | uint8_t(png[o + 3])); };
  return {be32(16), be32(20)};
}
int screenshot(const std::string& url, const std::string& png, const std::string& profile) {
  const std::string cmd = "timeout 120 " + chromium() +
                          " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking"
                          " --disable-component-update --disable-sync --hide-scrollbars --user-data-dir=" + profile +
                          " --window-size=1200,1400 --screenshot=" + png + " " + url + " >/dev/null 2>&1";
  return std::system(cmd.c_str());
}
}  // namespace

TEST_CASE("report.html: summary, one plot per view, escaped names, nothing fetched from the network") {
  const std::string h = ptq::report_html(hand_report());
  // the summary a user looks for first: mean GPTQ/RTN ratio (0.5/1, 0.5/1, 1.5/2, 1.5/2: 0.625), worst, time
  CHECK(h.find("0.625x") != std::string::npos);
  CHECK(h.find("worst 0.750") != std::string::npos);
  CHECK(h.find("4.0 s") != std::string::npos);
  CHECK(h.find("2.00 s/layer") != std::string::npos);
  for (const char* id : {"plot-loss", "plot-ratio", "plot-damp", "plot-time", "plot-outliers"}) CHECK(count(h, "id=\"" + std::string(id) + "\"") == 1);
  CHECK(count(h, "<svg") == 5);
  CHECK(count(h, "<tr") == 5);   // header + 4 modules
  CHECK(h.find("<b>evil</b>") == std::string::npos);
  CHECK(h.find("&lt;b&gt;evil&lt;/b&gt;") != std::string::npos);
  // self-contained: no script, stylesheet, image or font from anywhere; the only URL is SVG's namespace
  CHECK(h.find("<script") == std::string::npos);
  CHECK(h.find("<link") == std::string::npos);
  CHECK(h.find("<img") == std::string::npos);
  CHECK(count(h, "http") == count(h, "xmlns=\"http://www.w3.org/2000/svg\""));
  CHECK(h.find("&quot;offsets&quot;") == std::string::npos);   // the calibration offsets are left out of the page
  // the build that wrote it, where the report has one (escaped like every string), and none before
  CHECK(h.find("ptqkit 0.1.0 &middot;") != std::string::npos);
  json with_build = hand_report();
  with_build["build"] = {{"commit", "0123456789ab-dirty"}, {"isa", "x86-64 <avx2>"}};
  CHECK(ptq::report_html(with_build).find("ptqkit 0.1.0 (git 0123456789ab-dirty, x86-64 &lt;avx2&gt;) &middot;") != std::string::npos);
}

TEST_CASE("report.html: a real run's report renders in headless chromium (screenshot)") {
  if (chromium().empty()) PTQ_SKIP("chromium is not installed (scripts/setup.sh installs it)");
  ptqtest::TempDir d;
  REQUIRE(run_ptqkit("synth --preset tiny --seed 2 --output " + d / "m").code == 0);
  ptq::write_file_atomic(d / "r.yaml",
                         "calibration: {dataset: random, samples: 16, seq_len: 64, seed: 1}\n"
                         "quantization: {method: gptq, bits: 8, group_size: -1, smoothquant: {alpha: 0.5}, activations: {strategy: token}}\n");
  auto r = run_ptqkit("quantize " + d / "r.yaml" + " --model " + d / "m" + " --output " + d / "q");
  INFO(r.out);
  REQUIRE(r.code == 0);
  REQUIRE(std::filesystem::exists(d / "q/report.html"));
  const std::string page = ptq::read_text_file(d / "q/report.html");
  CHECK(count(page, "<svg") == 5);
  // The blank page and the report, same browser, same window: the report must be a picture, not a blank page.
  ptq::write_file_atomic(d / "blank.html", "<!DOCTYPE html><html><body></body></html>");
  REQUIRE(screenshot("file://" + d / "blank.html", d / "blank.png", d / "profile") == 0);
  REQUIRE(screenshot("file://" + d / "q/report.html", d / "report.png", d / "profile") == 0);
  const std::string png = ptq::read_text_file(d / "report.png"), blank = ptq::read_text_file(d / "blank.png");
  REQUIRE(png.size() > 24);
  CHECK(png.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  CHECK(png_size(png) == std::make_pair(1200, 1400));
  INFO("report.png " << png.size() << " bytes, blank.png " << blank.size() << " bytes");
  CHECK(png.size() > 10 * blank.size());
  if (const char* keep = std::getenv("PTQKIT_KEEP_SCREENSHOT")) std::filesystem::copy_file(d / "report.png", keep, std::filesystem::copy_options::overwrite_existing);
}

TEST_CASE("log-json: one JSON object per line: start, progress to 100%, done, result, errors are logged with their exit code") {
  ptqtest::TempDir d;
  REQUIRE(run_ptqkit("synth --preset tiny --seed 2 --output " + d / "m").code == 0);
  ptq::write_file_atomic(d / "r.yaml", "calibration: {dataset: random, samples: 8, seq_len: 64, seed: 1}\nquantization: {bits: 4, group_size: 32}\n");
  auto r = run_ptqkit("--quiet --log-json " + d / "log.jsonl" + " quantize " + d / "r.yaml" + " --model " + d / "m" + " --output " + d / "q");
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::ifstream f(d / "log.jsonl");
  std::string line;
  std::vector<json> ev;
  while (std::getline(f, line)) ev.push_back(json::parse(line));   // throws (fails) on a malformed line
  REQUIRE(ev.size() >= 5);
  CHECK(ev.front()["event"] == "command");
  bool started = false, finished = false, result = false;
  double last_done = -1;
  for (auto& e : ev) {
    CHECK(e.contains("ts"));
    if (e.value("task", "") != "quantize") { result |= e["event"] == "result"; continue; }
    if (e["event"] == "start") { started = true; CHECK(e["total"] == 2.0); }
    if (e["event"] == "progress") { CHECK(e["done"].get<double>() >= last_done); last_done = e["done"]; CHECK(e.contains("eta_s")); }
    if (e["event"] == "done") finished = true;
  }
  CHECK(started);
  CHECK(finished);
  CHECK(last_done == 2.0);
  CHECK(result);
  CHECK(ev.back()["event"] == "result");
  CHECK(ev.back()["report"] == d / "q" + "/report.json");

  r = run_ptqkit("--log-json " + d / "err.jsonl" + " quantize " + d / "r.yaml" + " --model " + d / "m" + " --output " + d / "q");
  CHECK(r.code == 8);   // exists
  std::ifstream g(d / "err.jsonl");
  std::getline(g, line);
  std::getline(g, line);
  json e = json::parse(line);
  CHECK(e["event"] == "error");
  CHECK(e["exit_code"] == 8);
  CHECK(e["file"] == d / "q");
}

// ---- ptqkit compare ----
namespace {
// A run folder holding the hand report (each module's loss scaled by `scale`, calibration seed
// `seed`) and a model.safetensors of `bytes` bytes.
std::string hand_run(const ptqtest::TempDir& d, const std::string& name, double scale, int seed, size_t bytes) {
  const std::string dir = d / name;
  std::filesystem::create_directories(dir);
  json r = hand_report();
  for (json& m : r["modules"]) m["loss"] = m["loss"].get<double>() * scale;
  r["model"]["path"] = d / "source";
  r["calibration"]["seed"] = seed;
  r["recipe"]["output"] = dir;
  ptq::write_file_atomic(dir + "/report.json", r.dump());
  ptq::write_file_atomic(dir + "/model.safetensors", std::string(bytes, 'x'));
  return dir;
}
// An evaluation of `model` as `ptqkit eval --json` writes it, with a KL reference of the source.
// Its text is text-SHA.txt, scored in `windows` windows of 32.
std::string hand_eval(const ptqtest::TempDir& d, const std::string& name, const std::string& model, double ppl, const std::string& sha = "abc", int windows = 2) {
  json e = {{"model", model}, {"perplexity", ppl}, {"data", d / ("text-" + sha + ".txt")}, {"data_sha256", sha}, {"seq_len", 32}, {"windows", windows}, {"scored_tokens", 31 * windows},
            {"kl", {{"mean", 0.01 * ppl}, {"top1_agreement", 0.9}, {"reference_perplexity", 4.0}}}, {"reference", d / "source"}};
  ptq::write_file_atomic(d / name, e.dump());
  return d / name;
}
}  // namespace

TEST_CASE("compare: runs side by side from their report.json and evaluations, the modules against the first run, bad inputs refused naming the file and field") {
  ptqtest::TempDir d;
  std::filesystem::create_directories(d / "source");
  ptq::write_file_atomic(d / "source/model.safetensors", std::string(4000, 'f'));
  const std::string a = hand_run(d, "a", 1.0, 1, 1000), b = hand_run(d, "b", 2.0, 1, 1500), c = hand_run(d, "c", 1.0, 7, 1000);
  const json cmp = ptq::compare_runs({{a, b + "/report.json"}, {hand_eval(d, "ea.json", a, 5.0), hand_eval(d, "eb.json", b + "/", 6.0)}});
  const json& ra = cmp["runs"][0];
  const json& rb = cmp["runs"][1];
  CHECK(ra["label"] == "a");
  CHECK(rb["label"] == "b");
  CHECK(ra["method"] == "gptq");
  CHECK(ra["bits"] == "4");
  CHECK(ra["group_size"] == "128");
  // the hand report's losses 0.5, 0.5, 1.5, 1.5 over RTN's 1, 1, 2, 2
  CHECK(ra["loss_total"].get<double>() == Approx(4.0).epsilon(1e-15));
  CHECK(ra["rtn_loss_total"].get<double>() == Approx(6.0).epsilon(1e-15));
  CHECK(ra["loss_vs_rtn_geomean"].get<double>() == Approx(std::sqrt(0.5 * 0.75)).epsilon(1e-14));
  CHECK(rb["loss_total"].get<double>() == Approx(8.0).epsilon(1e-15));
  CHECK(rb["loss_vs_rtn_geomean"].get<double>() == Approx(std::sqrt(1.0 * 1.5)).epsilon(1e-14));
  CHECK(ra["outputs"][0]["bytes"] == 1000);
  CHECK(rb["outputs"][0]["bytes"] == 1500);
  CHECK(ra["seconds"] == 4.0);
  CHECK(ra["eval"]["perplexity"] == 5.0);
  CHECK(rb["eval"]["perplexity"] == 6.0);   // matched through "b/": one spelling of a path
  // the float row: the source's weight bytes, its perplexity from the runs' KL reference
  CHECK(cmp["float"]["bytes"] == 4000);
  CHECK(cmp["float"]["perplexity"] == 4.0);
  REQUIRE(cmp["modules"].size() == 4);
  for (const json& m : cmp["modules"]) {
    CHECK(m["vs_first"][0] == 1.0);
    CHECK(m["vs_first"][1] == 2.0);
  }
  const std::string text = ptq::compare_text(cmp, 2, false);
  INFO(text);
  CHECK(text.find("float (source)") != std::string::npos);
  CHECK(text.find("+25.00%") != std::string::npos);   // 5.0 against the float 4.0
  CHECK(text.find("+50.00%") != std::string::npos);
  CHECK(text.find("the 2 of 4 modules where the runs' output errors differ most (x: against a)") != std::string::npos);
  CHECK(text.find("(2x)") != std::string::npos);
  const std::string md = ptq::compare_text(cmp, -1, true);
  CHECK(count(md, "| model.layers.") == 4);
  CHECK(count(md, "|---|---:|") == 2);

  // a report under another name is labelled by it
  std::filesystem::copy_file(a + "/report.json", d / "saved.json");
  CHECK(ptq::compare_runs({{a, d / "saved.json"}, {}})["runs"][1]["label"] == "saved");
  // another calibration seed: said, not refused; a source evaluation makes the float row
  const json cmp2 = ptq::compare_runs({{a, c}, {hand_eval(d, "es.json", d / "source", 3.9)}});
  CHECK(cmp2["float"]["perplexity"] == 3.9);
  CHECK(cmp2["notes"].dump().find("c was calibrated on other windows than a (calibration.seed differs): its output errors are measured on other inputs") !=
        std::string::npos);

  // another build (report.json's "build"): said; runs of one build, or reports without one, are not
  for (const auto& [dir, commit] : {std::pair<std::string, std::string>{a, "0123456789ab"}, {c, "ba9876543210"}}) {
    json rep = json::parse(ptq::read_text_file(dir + "/report.json"));
    rep["build"] = {{"version", "0.1.0"}, {"commit", commit}, {"isa", "x86-64 avx2"}};
    ptq::write_file_atomic(dir + "/report.json", rep.dump());
  }
  const json cmp4 = ptq::compare_runs({{a, c, b}, {}});
  CHECK(cmp4["runs"][0]["build"]["commit"] == "0123456789ab");
  CHECK(cmp4["runs"][2]["build"].is_null());
  CHECK(cmp4["notes"].dump().find("c was written by another build than a (git ba9876543210, x86-64 avx2 against git 0123456789ab, x86-64 avx2): the code differs as well as the recipe") !=
        std::string::npos);
  CHECK(cmp4["notes"].dump().find("b was written by another build") == std::string::npos);
  CHECK(ptq::compare_runs({{a, a}, {}})["notes"].dump().find("another build") == std::string::npos);

  // evaluations on another text: a second dataset, its perplexities against its own float model's
  const json cmp3 = ptq::compare_runs({{a, b}, {d / "ea.json", d / "eb.json", hand_eval(d, "ea2.json", a, 12.0, "wiki"), hand_eval(d, "es2.json", d / "source", 10.0, "wiki")}});
  REQUIRE(cmp3["datasets"].size() == 2);
  CHECK(cmp3["datasets"][0]["label"] == "text-abc.txt");
  CHECK(cmp3["datasets"][1]["label"] == "text-wiki.txt");
  CHECK(cmp3["runs"][0]["eval"]["perplexity"] == 5.0);   // the first text's, as with one
  CHECK(cmp3["runs"][0]["evals"][1]["perplexity"] == 12.0);
  CHECK(cmp3["runs"][1]["evals"][1].is_null());
  CHECK(cmp3["float"]["perplexity"] == 4.0);             // the first text's: the runs' KL reference
  CHECK(cmp3["float"]["perplexities"][1]["perplexity"] == 10.0);
  const std::string text3 = ptq::compare_text(cmp3, 0, false);
  INFO(text3);
  CHECK(text3.find("perplexity on each evaluated text") != std::string::npos);
  CHECK(text3.find("+20.00%") != std::string::npos);   // a's 12.0 against the float 10.0 on text-wiki.txt
  CHECK(text3.find("+25.00%") != std::string::npos);   // and 5.0 against 4.0 on text-abc.txt
  CHECK(text3.find("perplexities on text-wiki.txt: 62 scored tokens") != std::string::npos);

  // refused: not a report, an evaluation of no run, a text scored on other tokens, two of one run
  ptq::write_file_atomic(d / "not.json", R"({"perplexity": 3})");
  CHECK_THROWS_WITH(ptq::compare_runs({{d / "not.json"}, {}}), Catch::Contains("not.json: modules: missing: not a ptqkit report.json"));
  CHECK_THROWS_WITH(ptq::compare_runs({{a}, {hand_eval(d, "ex.json", d / "elsewhere", 5.0)}}), Catch::Contains("ex.json: model: '") && Catch::Contains("is none of the compared runs' folders"));
  CHECK_THROWS_WITH(ptq::compare_runs({{a, b}, {d / "ea.json", hand_eval(d, "eo.json", b, 6.0, "abc", 3)}}),
                    Catch::Contains("eo.json: windows: the same text scored on other tokens than") && Catch::Contains("(3 against 2)"));
  CHECK_THROWS_WITH(ptq::compare_runs({{a}, {d / "ea.json", d / "ea.json"}}), Catch::Contains("ea.json: model: a second evaluation of"));
  ptq::write_file_atomic(d / "none.json", R"({"evals": []})");
  CHECK_THROWS_WITH(ptq::compare_runs({{a}, {d / "none.json"}}), Catch::Contains("none.json: evals: must be a non-empty list"));
  ptq::write_file_atomic(d / "half.json", json{{"evals", {json::parse(ptq::read_text_file(d / "ea.json")), {{"model", a}}}}}.dump());
  CHECK_THROWS_WITH(ptq::compare_runs({{a}, {d / "half.json"}}), Catch::Contains("half.json: evals[1].perplexity: missing"));
  CHECK_THROWS_WITH(ptq::compare_runs({{d / "missing"}, {}}), Catch::Contains("missing: no such folder or file"));
  std::filesystem::create_directories(d / "empty");
  CHECK_THROWS_WITH(ptq::compare_runs({{d / "empty"}, {}}), Catch::Contains("empty/report.json: cannot open"));
  // a run lacking a module the others list: said
  json lacking = json::parse(ptq::read_text_file(c + "/report.json"));
  lacking["modules"].erase(0);
  ptq::write_file_atomic(c + "/report.json", lacking.dump());
  CHECK(ptq::compare_runs({{a, c}, {}})["notes"].dump().find("c did not quantize 1 of the 4 modules the runs list") != std::string::npos);
}

TEST_CASE("compare: ptqkit compare of two real runs and their evaluations prints their table and writes its JSON") {
  PTQ_REQUIRE_ASSETS();
  ptqtest::TempDir d;
  const std::string A = ptqtest::assets(), model = A + "/models/stories260k", text = A + "/text/tinystories/eval.txt";
  for (const char* m : {"gptq", "rtn"}) {
    auto q = run_ptqkit("-q quantize --model " + model + " --scheme W4A16 --dataset " + A + "/text/tinystories/calib.txt --set calibration.samples=8 --set calibration.seq_len=128"
                        " --set quantization.method=" + m + " -o " + d / m);
    INFO(q.out);
    REQUIRE(q.code == 0);
    REQUIRE(run_ptqkit("-q eval --model " + d / m + " --data " + text + " --max-windows 2 --reference " + model + " --json " + d / m + ".json").code == 0);
  }
  auto r = run_ptqkit("compare " + d / "gptq" + " " + d / "rtn" + " --eval " + d / "gptq.json" + " " + d / "rtn.json" + " --json " + d / "c.json");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("float (source)") != std::string::npos);
  CHECK(r.out.find("compressed-tensors") != std::string::npos);
  const json c = json::parse(ptq::read_text_file(d / "c.json"));
  for (size_t i = 0; i < 2; ++i) {   // the sums and ratios of each report's modules, and each evaluation's numbers
    const json rep = json::parse(ptq::read_text_file(d / (i ? "rtn" : "gptq") + "/report.json"));
    const json ev = json::parse(ptq::read_text_file(d / (i ? "rtn" : "gptq") + ".json"));
    double loss = 0, log_ratio = 0;
    for (const json& m : rep["modules"]) {
      loss += m["loss"].get<double>();
      log_ratio += std::log(m["loss"].get<double>() / m["rtn_loss"].get<double>());
    }
    CHECK(c["runs"][i]["loss_total"].get<double>() == Approx(loss).epsilon(1e-12));
    CHECK(c["runs"][i]["loss_vs_rtn_geomean"].get<double>() == Approx(std::exp(log_ratio / double(rep["modules"].size()))).epsilon(1e-12));
    CHECK(c["runs"][i]["eval"]["perplexity"] == ev["perplexity"]);
    CHECK(c["runs"][i]["eval"]["kl_mean"] == ev["kl"]["mean"]);
  }
  CHECK(c["runs"][0]["loss_total"].get<double>() < c["runs"][1]["loss_total"].get<double>());   // GPTQ beats RTN on the same inputs
  CHECK(c["runs"][1]["loss_vs_rtn_geomean"].get<double>() == Approx(1.0).epsilon(1e-12));
  CHECK(c["notes"].size() == 1);   // the tokens scored (both runs keep the same downs, 172 wide, in float)
  // an unknown run folder: exit 3 (I/O), naming it
  const auto missing = run_ptqkit("compare " + d / "nothing");
  CHECK(missing.code == 3);
  CHECK(missing.out.find("nothing: no such folder or file") != std::string::npos);
}
