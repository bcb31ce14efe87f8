#include "core/progress.h"

#include <unistd.h>

#include <cstdio>

namespace ptq {

namespace { bool g_quiet = false; }

void Progress::set_quiet(bool q) { g_quiet = q; }

std::string format_seconds(double s) {
  char b[32];
  if (s < 60) std::snprintf(b, sizeof b, "%.1fs", s);
  else if (s < 3600) std::snprintf(b, sizeof b, "%dm%02ds", int(s) / 60, int(s) % 60);
  else std::snprintf(b, sizeof b, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  return b;
}

Progress::Progress(std::string label, double total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), start_(std::chrono::steady_clock::now()), last_(start_),
      shown_(!g_quiet && ::isatty(2)) {}

Progress::~Progress() { finish(); }

double Progress::elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

void Progress::update(double done, const std::string& note) {
  done_ = done;
  if (!shown_) return;
  auto now = std::chrono::steady_clock::now();
  if (done < total_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  const double t = elapsed(), frac = total_ > 0 ? done / total_ : 1.0;
  const double eta = frac > 0 ? t * (1 - frac) / frac : 0;
  const int width = 24, fill = int(frac * width + 0.5);
  std::string bar(size_t(fill), '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "\r\033[K%s [%s] %3.0f%% %.0f/%.0f %s, %.1f %s/s, ETA %s %s", label_.c_str(), bar.c_str(), 100 * frac, done,
               total_, unit_.c_str(), t > 0 ? done / t : 0.0, unit_.c_str(), format_seconds(eta).c_str(), note.c_str());
  std::fflush(stderr);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (shown_) {
    std::fprintf(stderr, "\r\033[K%s: %.0f %s in %s\n", label_.c_str(), done_, unit_.c_str(), format_seconds(elapsed()).c_str());
  }
}

}  // namespace ptq
