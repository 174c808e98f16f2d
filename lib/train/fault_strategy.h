// Fault injection as a wrapper (principle 3: checks and faults wrap the strategy, they are not
// branches in its loop): DTRAIN_FAULT grad_scale:rank=R:step=S doubles rank R's gradient
// contribution to step S -- the output gradient of every backward of that step is scaled by 2
// before the wrapped strategy sees it, so parameter gradients (linear in it) are doubled before
// any reduction, and the corruption reaches every rank the way a real numerical bug would.
// `dtrain verify`'s tests use it to prove that a wrong layout is caught at the first affected step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "train/strategy.h"
#include "util/fault.h"

namespace dtrain {

// `inner` unchanged when no grad_scale fault names `rank`; else the wrapper. steps_done: the
// loop's count of completed optimizer steps (the step being computed is steps_done + 1); it must
// outlive the returned strategy.
std::unique_ptr<Strategy> with_gradient_faults(std::unique_ptr<Strategy> inner,
                                               const std::vector<Fault>& faults, int rank,
                                               const int64_t& steps_done);

}  // namespace dtrain
