// The progress bar of an interactive run (`dtrain run` on a terminal), drawn by rank 0.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace dtrain {

// Whether a progress bar can be drawn on stderr: a terminal, and not a dumb one (TERM=dumb: no
// way to erase the line it redraws).
bool progress_bar_fits();

// A one-line progress bar on stderr, redrawn at most 10 times a second: step, epoch, loss,
// samples/s (over the current log interval), elapsed time and the remaining time at the rate
// of the steps this process has run so far (a resumed run counts from its first step).
// Off (on = false): every call does nothing.
class ProgressBar {
 public:
  explicit ProgressBar(bool on);
  ~ProgressBar() { clear(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  // total 0: unknown (no ETA). loss: none yet ("loss -").
  void update(int64_t step, int64_t total, double epoch, std::optional<double> loss, double sps);
  // Clears the bar so a log line can be printed cleanly.
  void clear();

 private:
  using Clock = std::chrono::steady_clock;
  bool on_;
  bool drawn_ = false;
  Clock::time_point start_, last_{};
  int64_t first_step_ = -1;  // the step before the first one drawn
};

}  // namespace dtrain
