// Safe interrupts: the first SIGINT or SIGTERM asks training to stop at a step every rank agrees
// on (train/stop.h), write a checkpoint and a summary, and exit 128 + the signal number; a second
// one ends the process at once, as the default action of that signal would.
//
// The handler only stores the signal number into an atomic the caller owns (a StopRequest); the
// training code is given a pointer to it (RunOptions::stop), so tests can request a stop without
// signals and in-process ranks share one request. Signals are per process, so at most one
// InterruptGuard may be alive at a time (checked).
#pragma once

#include <atomic>
#include <csignal>

namespace dtrain {

// 0: no stop requested; else the signal number that asked for it (SIGINT, SIGTERM).
// Lock-free, so the signal handler may store into it.
struct StopRequest {
  std::atomic<int> signal{0};
  static_assert(std::atomic<int>::is_always_lock_free);
};

// Installs the handlers for SIGINT and SIGTERM for its lifetime (the previous dispositions are
// restored on destruction; signals ignored on entry, e.g. by nohup, stay ignored). The first
// signal sets `req` and is logged by the training loop; the second restores the default action
// and re-raises, so the process ends at once with the usual status (killed by SIGINT/SIGTERM).
class InterruptGuard {
 public:
  explicit InterruptGuard(StopRequest& req);
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  struct sigaction old_int_ {
  }, old_term_{};
  bool int_installed_ = false, term_installed_ = false;
};

// "SIGINT", "SIGTERM", or "signal N".
const char* interrupt_signal_name(int sig);

}  // namespace dtrain
