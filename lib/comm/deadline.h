// Deadlines that do not count the time this process was stopped.
//
// A collective's deadline (distributed.timeout_s) is there for a peer that does not answer. A
// Ctrl-Z that suspends a job's ranks (SIGTSTP, or the SIGSTOP that `dtrain launch` passes on)
// for longer than the timeout is not a silent peer, and must not fail the collectives in flight
// when the job continues; but steady_clock counts a stopped process's time. PauseClock measures
// that time: its thread notes the time every kTick, and a gap between two notes longer than
// kTick + kMinPause is time this process did not run (stopped, or starved of CPU: either way
// not a peer's silence). Every reader notes the gap first, so a waiter that wakes when the
// process continues sees its deadline moved before it judges it, whichever thread runs first.
// The count is conservative: it misses up to kTick of each pause, never adds time that ran.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace dtrain {

class PauseClock {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr Clock::duration kTick = std::chrono::milliseconds(100);
  static constexpr Clock::duration kMinPause = std::chrono::seconds(1);

  PauseClock();   // starts the ticking thread
  ~PauseClock();  // stops and joins it
  PauseClock(const PauseClock&) = delete;
  PauseClock& operator=(const PauseClock&) = delete;

  // Time this process spent stopped since the clock was made; never decreases.
  // Thread-safe (every method is).
  Clock::duration paused();

 private:
  void note(Clock::time_point now);  // mu_ held

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  Clock::time_point last_;  // the latest time noted
  Clock::duration paused_ = Clock::duration::zero();
  std::thread ticker_;
};

// A point on steady_clock that moves later by every pause its PauseClock records after it was
// set. Without a clock (converted from a plain time_point) it is fixed. The clock must outlive
// the deadline (a Communicator's deadlines point at its options' clock).
struct Deadline {
  using Clock = std::chrono::steady_clock;
  Clock::time_point at{};  // as set, before any pause
  PauseClock* clock = nullptr;
  Clock::duration paused_at_set = Clock::duration::zero();  // clock->paused() when set

  Deadline() = default;
  Deadline(Clock::time_point t) : at(t) {}  // NOLINT: implicit, a fixed deadline
  // now + seconds (saturating as util/duration.h's deadline_in), moved by clock's pauses.
  static Deadline in(double seconds, PauseClock* clock);

  // Pause time recorded since the deadline was set.
  Clock::duration paused_since_set() const;
  // The deadline as it stands now.
  Clock::time_point when() const { return at + paused_since_set(); }
  // (pauses only move a deadline later: before `at` it has not passed, without the clock's lock)
  bool passed(Clock::time_point now) const { return now >= at && now >= when(); }
};

}  // namespace dtrain
