// DTRAIN_FAULT at the end of a training step (util/fault.h), shared by the training loops.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "util/fault.h"

namespace dtrain {

// Called by every rank once it has completed `step`: `kill` dies by SIGKILL; `drop` aborts
// `comm` (peers see this rank's connections closed) and throws std::runtime_error, so the rank
// exits non-zero; `delay` sleeps. Does nothing without faults.
void apply_step_faults(const std::vector<Fault>& faults, int rank, int64_t step,
                       Communicator& comm);

}  // namespace dtrain
