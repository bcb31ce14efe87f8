// report_html.h — report.html: a quantization run's report.json as one self-contained page (inline
// CSS and SVG, no script, no network), for a person: the summary first, then per-layer plots
// (GPTQ loss against RTN loss, loss ratio per module kind, damping, time per layer, activation
// outlier ratio before and after smoothing) and the table of every module.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace ptq {

std::string report_html(const nlohmann::json& report);

}  // namespace ptq
