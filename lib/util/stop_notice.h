// Says at once that a stop was asked. The training loop acknowledges a signal only where the
// ranks agree on it, at the end of a step: a long evaluation or checkpoint write may put that
// minutes away, and a second Ctrl-C meanwhile ends the run at once, without its checkpoint.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>

#include "util/interrupt.h"

namespace dtrain {

// Logs "received SIGx: ..." for req's signal, once per process (the watcher below, or whoever
// comes first: the loop says it before its "stopping after step N", which may come sooner).
// Nothing when no signal came to this process or the stop is the launcher's death.
void note_stop_received(const StopRequest& req);

// A thread that looks at `req` every 100 ms and logs its first signal, once (not a stop taken
// from the launcher's death, which the loop names). For the process that shows the run: one per
// process, the caller's choice (rank 0). `req` must outlive it.
class StopNotice {
 public:
  explicit StopNotice(const StopRequest& req);
  ~StopNotice();
  StopNotice(const StopNotice&) = delete;
  StopNotice& operator=(const StopNotice&) = delete;

 private:
  void watch(const StopRequest& req);

  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread t_;  // (last: started once the members above exist)
};

}  // namespace dtrain
