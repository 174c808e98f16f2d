// Pipeline parallelism (distributed.strategy: pipeline). The model's layers are split into S
// contiguous stages; W = S x D ranks run D pipeline replicas. Rank r is stage r % S of replica
// r / S (replica-major: a replica's stages are neighbouring ranks, which on a multi-GPU-style
// launch keeps each pipeline's point-to-point traffic on one host when hosts hold whole
// replicas). Each stage owns only its layers' parameters, gradients and optimizer state: the
// range [layer_begin(first), layer_end(last - 1)) of the flat layout.
//
// A step splits each replica's batch into M micro-batches by samples (fewer when the batch has
// fewer rows). Activations go forward and activation gradients backward by point-to-point
// send/recv between neighbouring stages; the last stage computes the loss. Schedules: gpipe (all
// forwards, then all backwards) and 1f1b (stage s runs S - 1 - s warm-up forwards, then
// alternates one forward and one backward, then drains: at most S - s micro-batches in flight).
// With activation checkpointing a stage keeps only each micro-batch's input and recomputes its
// forward during backward. Gradients of a stage are summed over its D replicas by an all-reduce
// within the stage's group; everything else (clipping, schedules, accumulation, optimizers)
// works as in DDP, and the parameters equal single-process training on the same global batch.
#pragma once

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "config/config.h"
#include "nn/model.h"
#include "train/sharding.h"
#include "train/trainer.h"

namespace dtrain {

// Stage layer ranges for S stages: `uniform` gives each stage the same number of layers with
// parameters (the first stages one more when S does not divide them), `balanced` minimises the
// largest stage's estimated cost (multiply-adds per sample: a Linear's weights, plus the widths
// of the elementwise layers). Layers without parameters stay with the layer before them.
std::vector<LayerRange> partition_stages(const Model& m, int stages, const std::string& how);

// Trains one rank of a pipeline job (called by train_rank for strategy pipeline).
// Events go to `tracer` (disabled unless --trace).
nlohmann::json train_pipeline(const Config& cfg, const RunOptions& opts, Communicator& comm,
                              Tracer& tracer);

}  // namespace dtrain
