#include "core/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <mutex>

#include "core/error.h"

namespace ptq {

namespace {
bool g_quiet = false;
std::FILE* g_log = nullptr;
std::mutex g_log_mu;

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

void Progress::set_quiet(bool q) { g_quiet = q; }

void open_json_log(const std::string& path) {
  std::lock_guard<std::mutex> lk(g_log_mu);
  if (g_log) std::fclose(g_log);
  g_log = nullptr;
  if (path.empty()) return;
  g_log = std::fopen(path.c_str(), "w");
  if (!g_log) fail(Errc::io, path, "--log-json", "cannot create the log file");
}

void log_event(const std::string& event, nlohmann::json fields) {
  std::lock_guard<std::mutex> lk(g_log_mu);
  if (!g_log) return;
  nlohmann::json j = {{"ts", unix_seconds()}, {"event", event}};
  for (auto& [k, v] : fields.items()) j[k] = v;
  const std::string line = j.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), g_log);
  std::fflush(g_log);   // a batch job tails it; a killed run keeps every line written so far
}

std::string format_seconds(double s) {
  char b[32];
  if (s < 60) std::snprintf(b, sizeof b, "%.1fs", s);
  else if (s < 3600) std::snprintf(b, sizeof b, "%dm%02ds", int(s) / 60, int(s) % 60);
  else std::snprintf(b, sizeof b, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  return b;
}

Progress::Progress(std::string label, double total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), start_(std::chrono::steady_clock::now()), last_(start_),
      last_log_(start_), shown_(!g_quiet && ::isatty(2)) {
  log_event("start", {{"task", label_}, {"total", total_}, {"unit", unit_}});
}

Progress::~Progress() { finish(); }

double Progress::elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

void Progress::update(double done, const std::string& note) {
  done_ = done;
  const auto now = std::chrono::steady_clock::now();
  const bool complete = done >= total_;
  const double t = elapsed(), frac = total_ > 0 ? std::min(1.0, done / total_) : 1.0;
  const double eta = frac > 0 ? t * (1 - frac) / frac : 0, rate = t > 0 ? done / t : 0.0;
  if (complete || now - last_log_ >= std::chrono::seconds(1)) {
    last_log_ = now;
    log_event("progress", {{"task", label_}, {"done", done}, {"total", total_}, {"unit", unit_}, {"rate", rate}, {"eta_s", eta}, {"note", note}});
  }
  if (!shown_) return;
  if (!complete && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  const int width = 24, fill = int(frac * width + 0.5);
  std::string bar(size_t(fill), '#');
  bar.resize(width, '.');
  char r[32];
  std::snprintf(r, sizeof r, rate >= 100 ? "%.0f" : "%.2f", rate);
  // The count is of whole units finished (a layer part-way through is not yet one): floor, not round.
  std::fprintf(stderr, "\r\033[K%s [%s] %3.0f%% %.0f/%.0f %s, %s %s/s, ETA %s %s", label_.c_str(), bar.c_str(), 100 * frac, std::floor(done + 1e-9),
               total_, unit_.c_str(), r, unit_.c_str(), format_seconds(eta).c_str(), note.c_str());
  std::fflush(stderr);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  log_event("done", {{"task", label_}, {"done", done_}, {"total", total_}, {"unit", unit_}, {"seconds", elapsed()}});
  if (shown_) std::fprintf(stderr, "\r\033[K%s: %.0f %s in %s\n", label_.c_str(), done_, unit_.c_str(), format_seconds(elapsed()).c_str());
}

}  // namespace ptq
