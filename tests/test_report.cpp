// report.html and the JSON-lines log: content checked against a hand-written report, the page
// rendered by a real headless browser (Debian's chromium) and screenshotted, and the log of a real
// run parsed line by line.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/fsutil.h"
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
