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
// Nothing when no signal came to this process or the stop is the launcher's death. A warning
// where the process shows the run (rank 0), info in the other ranks' own logs (a rank signalled
// alone, by hand or by a scheduler, left no word of why it stopped).
void note_stop_received(const StopRequest& req, bool shows_run = true);

// A thread that looks at `req` every 100 ms and logs its first signal, once (not a stop taken
// from the launcher's death, which the loop names). One per process; shows_run as above.
// `req` must outlive it.
class StopNotice {
 public:
  explicit StopNotice(const StopRequest& req, bool shows_run = true);
  ~StopNotice();
  StopNotice(const StopNotice&) = delete;
  StopNotice& operator=(const StopNotice&) = delete;

 private:
  void watch(const StopRequest& req, bool shows_run);

  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread t_;  // (last: started once the members above exist)
};

}  // namespace dtrain
