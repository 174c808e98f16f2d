#include "train/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace dtrain {

namespace {

// "1:02:03" or "2:03" for a duration in seconds.
std::string clock_text(double s) {
  const auto t = static_cast<long long>(std::max(0.0, s) + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", t / 60, t % 60);
  return buf;
}

}  // namespace

bool progress_bar_fits() {
  const char* term = std::getenv("TERM");
  return ::isatty(STDERR_FILENO) && !(term != nullptr && std::string_view(term) == "dumb");
}

ProgressBar::ProgressBar(bool on) : on_(on), start_(Clock::now()) {}

void ProgressBar::update(int64_t step, int64_t total, double epoch, std::optional<double> loss,
                         double sps) {
  if (!on_) return;
  const auto now = Clock::now();
  if (first_step_ < 0) first_step_ = step - 1;
  if (step != total && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  const int width = 24;
  const double frac = total > 0 ? static_cast<double>(step) / static_cast<double>(total) : 0.0;
  const int filled = static_cast<int>(frac * width);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(width, '.');
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const int64_t done = step - first_step_;
  std::string eta = "?";
  if (total > 0 && done > 0)
    eta = clock_text(elapsed / static_cast<double>(done) * static_cast<double>(total - step));
  char loss_text[32] = "-";
  if (loss) std::snprintf(loss_text, sizeof loss_text, "%.4f", *loss);
  char text[256];
  std::snprintf(text, sizeof text,
                "step %lld/%lld  epoch %.2f  loss %s  %.0f samples/s  %s elapsed, %s left",
                static_cast<long long>(step), static_cast<long long>(total), epoch, loss_text, sps,
                clock_text(elapsed).c_str(), eta.c_str());
  // One line that fits the terminal: a line that wraps is redrawn below itself (\r and "erase
  // line" act on its last row), leaving a stale row per update. The bar goes first, then the
  // text is cut. (the width is asked each time: the window may be resized)
  std::string line = "[" + bar + "] " + text;
  winsize ws{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
    const size_t cols = ws.ws_col;
    if (line.size() >= cols) line = text;
    if (line.size() >= cols) line.resize(cols - 1);
  }
  std::fprintf(stderr, "\r\033[K%s", line.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (on_ && drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }
}

}  // namespace dtrain
