// report.cpp — `ptqkit report`: a saved report.json rendered as a self-contained report.html.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "command.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/json_field.h"
#include "report/report_html.h"

namespace ptq {

Command add_report(CLI::App& app) {
  struct Args { std::string in, out; };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("report", "render a report.json (from quantize) as a self-contained report.html");
  sub->add_option("report_json", a->in, "report.json")->required();
  sub->add_option("-o,--output", a->out, "HTML file (default: beside the JSON, .html)");
  return {sub, [a] {
            nlohmann::json rep;
            try { rep = nlohmann::json::parse(read_text_file(a->in)); } catch (const nlohmann::json::exception& e) {
              fail(Errc::format, a->in, "", std::string("malformed JSON: ") + e.what());
            }
            if (!rep.is_object() || !rep.contains("modules")) fail(Errc::format, a->in, "modules", "missing: not a ptqkit report.json");
            const std::string out = a->out.empty() ? std::filesystem::path(a->in).replace_extension(".html").string() : a->out;
            write_file_atomic(out, json_errors_named(Errc::format, a->in, "", [&] { return report_html(rep); }));
            std::printf("wrote %s\n", out.c_str());
            return 0;
          }};
}

}  // namespace ptq
