#include "report/report_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <vector>

namespace ptq {

using nlohmann::json;

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += ch;
    }
  }
  return o;
}

std::string num(double v, const char* fmt = "%.4g") {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

std::string str(const json& j, const char* key, const std::string& dflt = "") {
  if (!j.contains(key)) return dflt;
  const json& v = j[key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// " (git 7045926abcde, x86-64 avx2 ...)": the build that wrote the report (reports before it: "")
std::string build_line(const json& rep) {
  if (!rep.contains("build") || !rep["build"].is_object()) return "";
  const json& b = rep["build"];
  return " (git " + esc(str(b, "commit", "?")) + ", " + esc(str(b, "isa", "?")) + ")";
}

struct Series {
  std::string name, color;
  bool dashed = false, bars = false;
  std::vector<std::pair<double, double>> pts;   // (x, y)
  Series() = default;
  Series(std::string n, std::string c, bool dash = false, bool bar = false) : name(std::move(n)), color(std::move(c)), dashed(dash), bars(bar) {}
};

const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

// One chart as inline SVG: lines (or bars) over x, linear or log10 y, axes with ticks, a legend.
std::string svg_chart(const std::string& title, const std::string& xlabel, const std::string& ylabel, const std::vector<Series>& series,
                      bool log_y, const std::string& id) {
  const double W = 540, H = 280, L = 60, R = 130, T = 30, B = 45;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  bool any = false;
  for (auto& s : series)
    for (auto [x, y] : s.pts) {
      if (!std::isfinite(y) || (log_y && y <= 0)) continue;
      const double yy = log_y ? std::log10(y) : y;
      x0 = std::min(x0, x); x1 = std::max(x1, x); y0 = std::min(y0, yy); y1 = std::max(y1, yy);
      any = true;
    }
  std::string o = "<figure id=\"" + id + "\"><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W) + "\" height=\"" + num(H) +
                  "\" viewBox=\"0 0 " + num(W) + " " + num(H) + "\" role=\"img\" aria-label=\"" + esc(title) + "\">";
  o += "<text x=\"" + num(L) + "\" y=\"18\" class=\"t\">" + esc(title) + "</text>";
  if (!any) return o + "<text x=\"" + num(L) + "\" y=\"" + num(H / 2) + "\">no data</text></svg></figure>";
  bool has_bars = false;
  for (auto& s : series) has_bars |= s.bars;
  if (has_bars) { x0 -= 0.5; x1 += 0.5; }
  if (!log_y && y0 > 0) y0 = 0;   // linear charts start at zero
  if (y1 - y0 < 1e-12) { y1 += 0.5; y0 -= log_y ? 0.5 : 0; }
  if (x1 - x0 < 1e-12) { x1 += 0.5; x0 -= 0.5; }
  // y ticks: decades on log charts; 1-2-5 steps otherwise, the top rounded up to a step
  double ystep = 1;
  if (log_y) {
    y0 = std::floor(y0); y1 = std::ceil(y1);
  } else {
    const double raw = (y1 - y0) / 5, mag = std::pow(10.0, std::floor(std::log10(raw)));
    ystep = raw / mag <= 1 ? mag : raw / mag <= 2 ? 2 * mag : raw / mag <= 5 ? 5 * mag : 10 * mag;
    y0 = std::floor(y0 / ystep) * ystep;
    y1 = std::ceil(y1 / ystep - 1e-9) * ystep;
  }
  const double pw = W - L - R, ph = H - T - B;
  auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) { return T + ph - ((log_y ? std::log10(y) : y) - y0) / (y1 - y0) * ph; };
  o += "<rect x=\"" + num(L) + "\" y=\"" + num(T) + "\" width=\"" + num(pw) + "\" height=\"" + num(ph) + "\" class=\"pa\"/>";
  for (double v = y0; v <= y1 + ystep * 1e-6; v += ystep) {
    const double yv = log_y ? std::pow(10.0, v) : v, py = T + ph - (v - y0) / (y1 - y0) * ph;
    o += "<line x1=\"" + num(L) + "\" x2=\"" + num(L + pw) + "\" y1=\"" + num(py) + "\" y2=\"" + num(py) + "\" class=\"g\"/>";
    o += "<text x=\"" + num(L - 6) + "\" y=\"" + num(py + 4) + "\" text-anchor=\"end\">" + num(std::abs(yv) < 1e-12 ? 0.0 : yv, log_y ? "%.0e" : "%.4g") + "</text>";
  }
  // x ticks on integers (layers), at most about 12
  const double xstep = std::max(1.0, std::ceil((x1 - x0) / 12));
  for (double v = std::ceil(x0); v <= x1; v += xstep)
    o += "<text x=\"" + num(X(v)) + "\" y=\"" + num(T + ph + 16) + "\" text-anchor=\"middle\">" + num(v + 0.0, "%.0f") + "</text>";
  o += "<text x=\"" + num(L + pw / 2) + "\" y=\"" + num(H - 8) + "\" text-anchor=\"middle\">" + esc(xlabel) + "</text>";
  o += "<text transform=\"translate(14," + num(T + ph / 2) + ") rotate(-90)\" text-anchor=\"middle\">" + esc(ylabel) + "</text>";
  int nbars = 0, bar_i = 0;
  for (auto& s : series) nbars += s.bars;
  for (size_t k = 0; k < series.size(); ++k) {
    const Series& s = series[k];
    if (s.bars) {
      const double slot = pw / (x1 - x0) * 0.8, bw = slot / std::max(1, nbars);
      for (auto [x, y] : s.pts) {
        if (!std::isfinite(y)) continue;
        const double top = Y(log_y ? std::max(y, std::pow(10.0, y0)) : y), base = log_y ? T + ph : Y(0);
        o += "<rect x=\"" + num(X(x) - slot / 2 + bar_i * bw) + "\" y=\"" + num(std::min(top, base)) + "\" width=\"" + num(bw) +
             "\" height=\"" + num(std::abs(base - top)) + "\" fill=\"" + s.color + "\"><title>" + esc(s.name) + " " + num(x, "%.0f") + ": " +
             num(y) + "</title></rect>";
      }
      ++bar_i;
    } else {
      std::string d;
      for (auto [x, y] : s.pts) {
        if (!std::isfinite(y) || (log_y && y <= 0)) continue;
        d += (d.empty() ? "M" : "L") + num(X(x), "%.1f") + "," + num(Y(y), "%.1f");
      }
      o += "<path d=\"" + d + "\" fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"2\"" + (s.dashed ? " stroke-dasharray=\"5,4\"" : "") + "/>";
      for (auto [x, y] : s.pts)
        if (std::isfinite(y) && (!log_y || y > 0))
          o += "<circle cx=\"" + num(X(x), "%.1f") + "\" cy=\"" + num(Y(y), "%.1f") + "\" r=\"2.5\" fill=\"" + s.color + "\"><title>" + esc(s.name) +
               " " + num(x, "%.0f") + ": " + num(y) + "</title></circle>";
    }
    const double ly = T + 10 + 18 * double(k);
    o += "<line x1=\"" + num(L + pw + 12) + "\" x2=\"" + num(L + pw + 36) + "\" y1=\"" + num(ly) + "\" y2=\"" + num(ly) + "\" stroke=\"" + s.color +
         "\" stroke-width=\"" + (s.bars ? "8" : "2") + "\"" + (s.dashed ? " stroke-dasharray=\"5,4\"" : "") + "/>";
    o += "<text x=\"" + num(L + pw + 42) + "\" y=\"" + num(ly + 4) + "\">" + esc(s.name) + "</text>";
  }
  return o + "</svg></figure>";
}

// A smoothing pair's series: each MoE expert's up_proj -> down_proj pair in one.
std::string pair_series(const std::string& pair) { return pair.starts_with("experts.") ? "experts.up_proj" : pair; }
// Its label: by the input it smooths (inputs) or by the Linears it scales.
std::string pair_label(const std::string& p, bool inputs) {
  if (p == "input_layernorm") return inputs ? "attn in" : "q/k/v";
  if (p == "post_attention_layernorm") return inputs ? "mlp in" : "gate/up";
  if (p == "v_proj") return inputs ? "o in" : "o (v_proj)";
  if (p == "up_proj") return inputs ? "down in" : "down (up_proj)";
  if (p == "experts.up_proj") return inputs ? "experts' down in" : "experts' down (up_proj)";
  return p;
}

// "model.layers.12.mlp.up_proj" -> "up_proj"
std::string kind_of(const std::string& module) { return module.substr(module.rfind('.') + 1); }
int layer_num(const std::string& module) {
  const auto p = module.find("layers.");
  return p == std::string::npos ? -1 : std::atoi(module.c_str() + p + 7);
}

}  // namespace

std::string report_html(const json& rep) {
  const json& mods = rep.value("modules", json::array());
  const json& recipe = rep.value("recipe", json::object());
  const json& model = rep.value("model", json::object());
  const json& calib = rep.value("calibration", json::object());
  const json quant = recipe.value("quantization", json::object());

  // Summary numbers
  double ratio_sum = 0, worst = 0, loss_sum = 0, rtn_sum = 0;
  int n_ratio = 0, retries = 0, dead = 0;
  std::string worst_name;
  for (auto& m : mods) {
    if (m.contains("loss_ratio_vs_rtn")) {
      const double r = m["loss_ratio_vs_rtn"];
      ratio_sum += r; ++n_ratio;
      if (r > worst) { worst = r; worst_name = m["name"]; }
      loss_sum += m.value("loss", 0.0); rtn_sum += m.value("rtn_loss", 0.0);
    }
    retries += m.value("damp_retries", 0);
    dead += m.value("dead_columns", 0);
  }
  std::string h = R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ptqkit report</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px auto;max-width:1100px;color:#1d1d1f;padding:0 16px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(200px,1fr));gap:10px;margin:14px 0}
.card{border:1px solid #ddd;border-radius:8px;padding:10px 12px;background:#fafafa}
.card .k{font-size:12px;color:#666;text-transform:uppercase;letter-spacing:.04em}.card .v{font-size:20px;font-weight:600}
.card .s{font-size:12px;color:#444}
.ok{color:#1a7f37}.warn{color:#b35900}
table{border-collapse:collapse;width:100%;font-size:12.5px}th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#f3f3f3;position:sticky;top:0}
tr.bad td{background:#fff3e0}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(540px,1fr));gap:8px}figure{margin:6px 0}svg text{font-size:11px;fill:#333}svg text.t{font-size:13px;font-weight:600}
svg .pa{fill:#fff;stroke:#bbb}svg .g{stroke:#eee}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:0}dt{color:#666}dd{margin:0;font-family:ui-monospace,Menlo,monospace;font-size:12.5px;word-break:break-all}
pre{background:#f6f6f6;padding:10px;overflow:auto;font-size:12px}
</style></head><body>
)";
  h += "<h1>ptqkit quantization report</h1>\n<div class=\"s\">" + esc(str(model, "path")) + " &rarr; " + esc(str(recipe, "output")) +
       " &middot; ptqkit " + esc(str(rep, "ptqkit_version")) + build_line(rep) + " &middot; " + esc(str(rep, "device", "cpu")) + "</div>\n";
  // Cards: what a user looks for first
  auto card = [&](const std::string& k, const std::string& v, const std::string& s, const std::string& cls = "") {
    h += "<div class=\"card\"><div class=\"k\">" + esc(k) + "</div><div class=\"v " + cls + "\">" + esc(v) + "</div><div class=\"s\">" + esc(s) + "</div></div>\n";
  };
  h += "<section id=\"summary\"><div class=\"cards\">\n";
  std::string scheme = str(quant, "method", "?");
  if (quant.contains("bits")) scheme += " " + str(quant, "bits") + "-bit";
  if (quant.contains("group_size")) scheme += quant["group_size"].get<int>() > 0 ? " g" + str(quant, "group_size") : " per-channel";
  std::string scheme_s = std::string(quant.value("sym", true) ? "symmetric" : "asymmetric") + (quant.value("act_order", false) && str(quant, "method", "gptq") == "gptq" ? ", act-order" : "");   // (RTN has no column order)
  if (quant.contains("activations") && quant["activations"].is_object())
    scheme_s += "; int8 activations per " + str(quant["activations"], "strategy", "token") +
                (quant["activations"].value("dynamic", true) ? ", dynamic" : ", static");
  if (quant.contains("smoothquant")) scheme_s += "; SmoothQuant alpha " + str(quant["smoothquant"], "alpha", "0.5");
  if (quant.contains("awq")) {
    const bool scales = !quant["awq"].contains("pairs") || !quant["awq"]["pairs"].empty(), clip = quant["awq"].value("clip", false);
    scheme_s += scales ? "; AWQ scales (" + str(quant["awq"], "grid", "20") + " ratios" + (clip ? ", groups clipped)" : ")") : "; AWQ's clipping alone";
  }
  card("scheme", scheme, scheme_s);
  std::string formats;
  for (auto& o : rep.value("outputs", json::array())) formats += (formats.empty() ? "" : ", ") + str(o, "format");
  card("formats", formats.empty() ? "-" : formats, std::to_string(mods.size()) + " modules");
  if (n_ratio)
    card("output error vs RTN", num(ratio_sum / n_ratio, "%.3f") + "x", "mean GPTQ/RTN loss ratio; worst " + num(worst, "%.3f") + " (" + worst_name + ")",
         ratio_sum / n_ratio <= 1.0 ? "ok" : "warn");
  card("total time", num(rep.value("total_seconds", 0.0), "%.1f") + " s",
       std::to_string(model.value("layers", 0)) + " layers, " + num(rep.value("total_seconds", 0.0) / std::max(1, model.value("layers", 1)), "%.2f") + " s/layer");
  std::string mem = num(rep.value("peak_rss_mb", 0.0), "%.0f") + " MiB";
  card("peak memory", mem, rep.value("peak_gpu_mb", 0.0) > 0 ? "GPU " + num(rep["peak_gpu_mb"].get<double>(), "%.0f") + " MiB" : "host resident set");
  card("damping retries", std::to_string(retries), std::to_string(dead) + " dead columns", retries ? "warn" : "ok");
  if (calib.contains("samples"))
    card("calibration", str(calib, "samples") + " x " + str(calib, "seq_len"), str(calib, "dataset") + " (seed " + str(calib, "seed") + ")");
  else
    card("calibration", "none", str(calib, "dataset"));
  h += "</div>\n<dl>";
  auto row = [&](const std::string& k, const std::string& v) { h += "<dt>" + esc(k) + "</dt><dd>" + esc(v) + "</dd>"; };
  row("model", str(model, "model_type") + ", " + str(model, "layers") + " layers, hidden " + str(model, "hidden_size") + ", ffn " +
                   str(model, "intermediate_size") + ", " + str(model, "dtype"));
  std::string phases;
  const json phase_times = rep.value("phases_seconds", json::object());
  for (auto& [k, v] : phase_times.items()) phases += k + " " + num(v.get<double>(), "%.2f") + " s  ";
  row("phases", phases);
  if (calib.contains("sha256")) row("calibration sha256", str(calib, "sha256"));
  for (auto& o : rep.value("outputs", json::array())) {
    std::string files;
    for (auto& f : o.value("files", json::array())) files += f.get<std::string>() + " ";
    std::string size;
    if (o.contains("tensor_bytes") && o["tensor_bytes"].is_number())
      size = " (" + num(o["tensor_bytes"].get<double>() / 1048576.0, "%.2f") + " MiB, the Linears at " + num(o.value("linear_bits_per_weight", 0.0), "%.2f") + " bits a weight)";
    row("output " + str(o, "format"), str(o, "dir") + "/: " + files + size);
  }
  h += "</dl></section>\n";

  // Per-layer plots
  std::map<std::string, Series> ratio_by_kind;
  std::map<int, double> gptq_by_layer, rtn_by_layer, damp_by_layer;
  for (auto& m : mods) {
    const std::string name = m.value("name", "");
    const int l = layer_num(name);
    if (l < 0 || !m.contains("loss")) continue;
    gptq_by_layer[l] += m["loss"].get<double>();
    rtn_by_layer[l] += m.value("rtn_loss", 0.0);
    damp_by_layer[l] = std::max(damp_by_layer[l], m.value("damp_percent", 0.0));
    Series& s = ratio_by_kind[kind_of(name)];
    s.name = kind_of(name);
    s.pts.emplace_back(l, m.value("loss_ratio_vs_rtn", 1.0));
  }
  const bool gptq = str(quant, "method") == "gptq";
  h += "<h2>Per layer</h2>\n<div class=\"plots\">\n";
  if (!gptq_by_layer.empty()) {
    Series g{gptq ? "GPTQ loss" : str(quant, "method") + " loss", kPalette[0]}, r{"RTN loss", kPalette[3], true};
    for (auto [l, v] : gptq_by_layer) g.pts.emplace_back(l, v);
    for (auto [l, v] : rtn_by_layer) r.pts.emplace_back(l, v);
    h += svg_chart("Output error per layer (sum over modules of ||WX - QX||^2)", "layer", "loss (log)", {g, r}, true, "plot-loss");
    if (gptq) {
      std::vector<Series> rs;
      int k = 0;
      for (auto& [kind, s] : ratio_by_kind) { s.color = kPalette[k++ % 8]; rs.push_back(s); }
      h += svg_chart("Loss ratio GPTQ / RTN per module (below 1: GPTQ helps)", "layer", "ratio", rs, false, "plot-ratio");
      Series d{"max damping %", kPalette[4], false, true};
      for (auto [l, v] : damp_by_layer) d.pts.emplace_back(l, 100 * v);
      h += svg_chart("Damping used, % of the mean diagonal (retries raise it)", "layer", "damp %", {d}, false, "plot-damp");
    }
  }
  Series t{"seconds", kPalette[2], false, true};
  for (auto& l : rep.value("layers", json::array())) t.pts.emplace_back(l.value("layer", 0), l.value("seconds", 0.0));
  h += svg_chart("Time per layer (resumed layers: 0)", "layer", "seconds", {t}, false, "plot-time");
  const json& sm = rep.contains("awq") ? rep["awq"] : rep.value("smoothquant", json::array());
  if (!sm.empty()) {
    std::map<std::string, std::pair<Series, Series>> by_pair;
    int k = 0;
    for (auto& e : sm) {
      const std::string p = pair_series(str(e, "pair"));
      auto& [before, after] = by_pair[p];
      if (before.name.empty()) {
        const std::string short_name = pair_label(p, true);
        before = {short_name + " before", kPalette[(2 * k) % 8], true};
        after = {short_name + " after", kPalette[(2 * k) % 8]};
        ++k;
      }
      before.pts.emplace_back(e.value("layer", 0), e.value("outlier_ratio_before", 0.0));
      if (e.contains("outlier_ratio_after")) after.pts.emplace_back(e.value("layer", 0), e["outlier_ratio_after"].get<double>());
    }
    std::vector<Series> ss;
    for (auto& [p, ba] : by_pair) { ss.push_back(ba.first); if (!ba.second.pts.empty()) ss.push_back(ba.second); }
    h += svg_chart("Activation outlier ratio, before and after smoothing", "layer", "max / median channel absmax", ss, false, "plot-outliers");
  }
  if (rep.contains("awq") && !rep["awq"].empty()) {   // each pair's rounded output error with its scales over without (1: none chosen)
    std::map<std::string, Series> by_pair;
    for (auto& e : rep["awq"]) {
      const std::string p = pair_series(str(e, "pair"));
      Series& s = by_pair[p];
      if (s.name.empty()) s = {pair_label(p, false), kPalette[by_pair.size() % 8]};
      const double u = e.value("error_unscaled", 0.0);
      s.pts.emplace_back(e.value("layer", 0), u > 0 ? e.value("error", 0.0) / u : 1.0);
    }
    std::vector<Series> ss;
    for (auto& [p, s] : by_pair) ss.push_back(s);
    h += svg_chart("AWQ: output error, scaled over unscaled", "layer", "error ratio", ss, false, "plot-awq");
  }
  h += "</div>\n";

  // Module table, worst ratios marked
  h += "<h2>Modules</h2>\n<table id=\"modules\"><thead><tr><th>module</th><th>method</th><th>bits</th><th>group</th><th>loss</th><th>RTN loss</th>"
       "<th>ratio</th><th>damp %</th><th>retries</th><th>seconds</th></tr></thead><tbody>\n";
  for (auto& m : mods) {
    const double r = m.value("loss_ratio_vs_rtn", 1.0);
    h += std::string("<tr") + (r > 1.0 + 1e-9 || m.value("damp_retries", 0) > 0 ? " class=\"bad\"" : "") + "><td>" + esc(m.value("name", "")) +
         "</td><td>" + esc(str(m, "method")) +
         (m.contains("clipped_groups") ? ", " + num(100 * m["clipped_groups"].get<double>(), "%.0f") + "% of groups clipped" : "") +   // AWQ's clipping
         "</td><td>" + esc(str(m, "bits", "-")) + "</td><td>" + esc(str(m, "group_size", "-")) + "</td><td>" +
         (m.contains("loss") ? num(m["loss"].get<double>()) : "-") + "</td><td>" + (m.contains("rtn_loss") ? num(m["rtn_loss"].get<double>()) : "-") +
         "</td><td>" + (m.contains("loss_ratio_vs_rtn") ? num(r, "%.3f") : "-") + "</td><td>" + num(100 * m.value("damp_percent", 0.0), "%.3g") +
         "</td><td>" + std::to_string(m.value("damp_retries", 0)) + "</td><td>" + num(m.value("seconds", 0.0), "%.3f") + "</td></tr>\n";
  }
  h += "</tbody></table>\n";
  // MoE: one row per expert of each layer, its three Linears summed
  struct ExpertRow {
    int64_t routed = -1, tokens = 0;
    double loss = 0, rtn = 0;
    std::string methods;
  };
  std::map<std::pair<int, int>, ExpertRow> experts;
  for (auto& m : mods) {
    if (!m.contains("expert")) continue;
    const std::string name = m.value("name", "");
    const int layer = name.rfind("model.layers.", 0) == 0 ? std::atoi(name.c_str() + 13) : -1;
    ExpertRow& e = experts[{layer, m["expert"].get<int>()}];
    e.routed = m.value("routed_tokens", int64_t(-1));
    e.tokens = m.value("hessian_tokens", int64_t(0));
    e.loss += m.value("loss", 0.0);
    e.rtn += m.value("rtn_loss", 0.0);
    const std::string meth = str(m, "method");
    if (e.methods.find(meth) == std::string::npos) e.methods += (e.methods.empty() ? "" : ", ") + meth;
  }
  if (!experts.empty()) {
    h += "<h2>Experts</h2>\n<p>Calibration tokens the router sent to each expert, the tokens its Hessians saw (every token when "
         "all experts are calibrated), and its three Linears' output errors summed.</p>\n<table id=\"experts\"><thead><tr><th>layer</th>"
         "<th>expert</th><th>routed tokens</th><th>Hessian tokens</th><th>method</th><th>loss</th><th>RTN loss</th><th>ratio</th></tr></thead><tbody>\n";
    for (auto& [k, e] : experts) {
      const double r = e.rtn > 0 ? e.loss / e.rtn : 1.0;
      h += std::string("<tr") + (e.methods != "gptq" ? " class=\"bad\"" : "") + "><td>" + std::to_string(k.first) + "</td><td>" +
           std::to_string(k.second) + "</td><td>" + (e.routed >= 0 ? std::to_string(e.routed) : "-") + "</td><td>" + std::to_string(e.tokens) +
           "</td><td>" + esc(e.methods) + "</td><td>" + num(e.loss) + "</td><td>" + num(e.rtn) + "</td><td>" + num(r, "%.3f") + "</td></tr>\n";
    }
    h += "</tbody></table>\n";
  }
  json brief = rep;
  if (brief.contains("calibration")) brief["calibration"].erase("offsets");
  brief.erase("modules");
  h += "<h2>Recipe and run</h2>\n<details><summary>report.json (without the module list and calibration offsets)</summary><pre>" + esc(brief.dump(2)) +
       "</pre></details>\n</body></html>\n";
  return h;
}

}  // namespace ptq
