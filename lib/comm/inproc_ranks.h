// N ranks as threads of this process, started so that a resource limit is an error, not an abort.
#pragma once

#include <functional>
#include <string>

#include "comm/communicator.h"

namespace dtrain {

// Runs body(comm) for each of `world` in-process ranks (make_inproc_group), each on a thread of
// its own, and returns once every thread has ended. Every Communicator (each starts a worker
// thread) is made before any rank thread starts. One that cannot be made, or a rank thread that
// cannot be created (the address-space limit, ulimit -v, or the process limit, ulimit -u), aborts
// the ranks already started, joins them and throws std::runtime_error: "cannot start <world>
// in-process ranks: rank r's thread could not be created (...); <advice>" -- a runtime failure
// (exit 1): the same input runs where more threads fit. (An exception escaping a thread, or a
// std::thread destroyed joinable, would end the process by std::terminate: exit 134.)
// body must not throw: it catches its rank's errors and aborts its Communicator itself.
void run_inproc_ranks(int world, const CommOptions& opts,
                      const std::function<void(Communicator&)>& body, const std::string& advice);

}  // namespace dtrain
