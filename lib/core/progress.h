// progress.h — a progress line with rate and ETA on a terminal (stderr), silent otherwise;
// an optional JSON-lines sink for batch jobs.
#pragma once
#include <chrono>
#include <string>

namespace ptq {

class Progress {
 public:
  // `total` units of work (tokens, layers, ...). Shown only when stderr is a terminal and not quiet.
  Progress(std::string label, double total, std::string unit);
  ~Progress();
  void update(double done, const std::string& note = "");
  void finish();
  static void set_quiet(bool q);
  double elapsed() const;
 private:
  std::string label_, unit_;
  double total_, done_{0};
  std::chrono::steady_clock::time_point start_, last_;
  bool shown_, finished_{false};
};

std::string format_seconds(double s);   // "1m05s", "3.2s"

}  // namespace ptq
