// The training loop, once for every layout: setup, resume, the step plan, gradient
// accumulation, the non-finite guard, clipping, stragglers, evaluation, checkpoints, metrics and
// the summary. What differs between layouts lives behind two interfaces: the data-parallel
// Strategy (train/strategy.h) and the Executor that runs forward and backward (one stage, or a
// pipeline stage: train/executor.h). Ranks are placed on the rank grid (comm/rank_grid.h):
// tensor axis 1, data axis DP = world / stages, pipeline axis = distributed.pipeline.stages.
#pragma once

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "config/config.h"
#include "train/trainer.h"
#include "util/trace.h"

namespace dtrain {

// The number of pipeline stages a config asks for: distributed.pipeline.stages when the
// pipeline is on (strategy pipeline, or stages > 1), else 1.
int pipeline_stages(const Config& cfg);

// Trains this rank (train_rank's body). Collective over `comm`.
nlohmann::json run_loop(const Config& cfg, const RunOptions& opts, Communicator& comm,
                        Tracer& tracer);

}  // namespace dtrain
