#include "comm/deadline.h"

#include <algorithm>

#include "util/duration.h"

namespace dtrain {

PauseClock::PauseClock() : last_(Clock::now()) {
  ticker_ = std::thread([this] {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      note(Clock::now());
      cv_.wait_for(lk, kTick, [&] { return stop_; });
    }
  });
}

PauseClock::~PauseClock() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  ticker_.join();
}

void PauseClock::note(Clock::time_point now) {
  // A reader that took `now` before another thread noted a later time sees no gap.
  if (now <= last_) return;
  const Clock::duration gap = now - last_;
  // The ticker would have noted within kTick had this process run: the rest did not run.
  if (gap > kTick + kMinPause) paused_ += gap - kTick;
  last_ = now;
}

PauseClock::Clock::duration PauseClock::paused() {
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lk(mu_);
  note(now);
  return paused_;
}

Deadline Deadline::in(double seconds, PauseClock* clock) {
  Deadline d(deadline_in(seconds));
  d.clock = clock;
  if (clock != nullptr) d.paused_at_set = clock->paused();
  return d;
}

Deadline::Clock::duration Deadline::paused_since_set() const {
  if (clock == nullptr) return Clock::duration::zero();
  // Saturating: a far deadline (kMaxWaitSeconds) plus a pause must not overflow.
  const Clock::duration moved = clock->paused() - paused_at_set;
  return std::min(moved, Clock::time_point::max() - at);
}

}  // namespace dtrain
