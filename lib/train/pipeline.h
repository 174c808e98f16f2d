// Pipeline parallelism: the executor of one stage (train/executor.h). The model's layers are split
// into S = distributed.pipeline.stages contiguous stages; the rank grid (comm/rank_grid.h) puts
// stage pp of data-parallel replica dp at rank dp + DP * pp (tensor axis of size 1). Each stage's
// strategy (any of train/strategy.h) owns only its layers' parameters, gradients and optimizer
// state -- the range [layer_begin(first), layer_end(last - 1)) of the flat layout -- and runs its
// collectives on the data axis, among the same stage of every replica.
//
// A step splits each accumulation micro-batch of the replica into M micro-batches by samples
// (fewer when it has fewer rows). Activations go forward and activation gradients backward by
// point-to-point send/recv between neighbouring stages; the last stage computes the loss.
// Schedules: gpipe (all forwards, then all backwards) and 1f1b (stage s runs S - 1 - s warm-up
// forwards, then alternates one forward and one backward, then drains: at most S - s
// micro-batches in flight). With activation checkpointing a stage keeps only each micro-batch's
// input and recomputes its forward during backward. The step's last backward is the strategy's
// `last` (ddp's bucket all-reduces overlap it), so every strategy trains the parameters one
// process would on the same global batch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/rank_grid.h"
#include "config/config.h"
#include "nn/model.h"
#include "train/executor.h"
#include "train/sharding.h"

namespace dtrain {

// Stage layer ranges for S stages: `uniform` gives each stage the same number of layers with
// parameters (the first stages one more when S does not divide them), `balanced` minimises the
// largest stage's estimated cost (multiply-adds per sample: a Linear's weights, plus the widths
// of the elementwise layers). Layers without parameters stay with the layer before them.
// Throws UserError when the model has fewer layers with parameters than `stages`.
std::vector<LayerRange> partition_stages(const Model& m, int stages, PipelinePartition how);
// Estimated multiply-adds per sample of layers [first, last) (the cost `balanced` balances).
double stage_cost(const Model& m, size_t first, size_t last);

// The executor of this rank's stage, grid.coord().pp, whose layers are stages[pp]. world: the
// job's communicator (point-to-point to the neighbouring stages of the same replica).
std::unique_ptr<Executor> make_pipeline_executor(const Config& cfg, const Model& model,
                                                 const Dataset& train, Strategy& strategy, Rng& rng,
                                                 Tracer& tracer, Communicator& world,
                                                 const GridLayout& grid,
                                                 const std::vector<LayerRange>& stages);

}  // namespace dtrain
