// progress.h — progress of long work: a line with rate and ETA on a terminal (stderr, silent when
// stderr is not a terminal or with --quiet), and the same events as JSON lines in a log file
// (--log-json FILE) for batch jobs:
//   {"ts":1763800000.123,"event":"progress","task":"quantize","done":3,"total":32,"unit":"layers",
//    "rate":0.41,"eta_s":70.6,"note":"layer 3"}
// Events: "start" and "done" for each task, "progress" at most once a second (and at 100%), and
// whatever the program adds with log_event ("error", "result", "warning").
#pragma once
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

namespace ptq {

class Progress {
 public:
  // `total` units of work (tokens, layers, ...).
  Progress(std::string label, double total, std::string unit);
  ~Progress();
  void update(double done, const std::string& note = "");
  void finish();
  static void set_quiet(bool q);
  double elapsed() const;
 private:
  std::string label_, unit_;
  double total_, done_{0};
  std::chrono::steady_clock::time_point start_, last_, last_log_;
  bool shown_, finished_{false};
};

// Opens (truncates) the JSON-lines log, closing the one before; Errc::io naming the file if it
// cannot. An empty path only closes it.
void open_json_log(const std::string& path);
// Appends {"ts":..., "event": event, ...fields} to the log, if one is open (thread-safe).
void log_event(const std::string& event, nlohmann::json fields = nlohmann::json::object());

std::string format_seconds(double s);   // "1m05s", "3.2s"

}  // namespace ptq
