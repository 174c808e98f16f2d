// A bound on a teardown that may never end after a failure. gRPC's shutdown waits forever for
// threads of its own that never started when the process could not create threads (ulimit -v,
// ulimit -u, a container's process limit): the rank failed, printed nothing and ignored SIGTERM.
// Armed on the failure's path with the error it will report, it ends the process with that
// error and its exit code if the teardown has not ended within the bound.
#pragma once

#include <string_view>

namespace dtrain {

// alarm(2) is per process: deadlines alive at once (ranks that are threads, failing together)
// share the first one's bound and error, and the alarm is disarmed when the last one ends.
// Thread-safe.
class ExitDeadline {
 public:
  // After `seconds`, writes "error: <message>" and why it is ending to stderr, runs the abrupt
  // exit cleanup (util/interrupt.h: temp files, shared-memory segments) and _exits `exit_code`.
  ExitDeadline(unsigned seconds, int exit_code, std::string_view message);
  ~ExitDeadline();  // disarms: the teardown ended in time
  ExitDeadline(const ExitDeadline&) = delete;
  ExitDeadline& operator=(const ExitDeadline&) = delete;
};

}  // namespace dtrain
