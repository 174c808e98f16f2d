// Gradient-compression state in checkpoints: between the ranks' GradReducers (compression.h)
// and the CompressionState a checkpoint file holds (checkpoint/checkpoint.h).
//
// Saving: rank 0 writes the file, so every rank's error-feedback residual travels to rank 0
// (point to point: rank 0 only receives, so its comm_bytes_sent does not change); PowerSGD's Q
// and RNG are the same on every rank and taken from rank 0.
//
// Resume rule (README "Checkpoint format"):
// - residuals are per rank and mean "what this rank's messages have not delivered yet" for one
//   compression type, one strategy (DDP gradients or Local SGD parameter moves) and one global
//   batch: they are restored only when type, strategy, world size and sizes (residual, and
//   PowerSGD's Q: the same factor layout) all match the saving run; otherwise they are dropped with
//   a warning and error feedback starts from zero (what the saved run had not yet delivered is
//   lost, as when error feedback is switched on mid-run);
// - PowerSGD's Q (the power iteration's warm start) and its RNG are global: they are restored
//   whenever both runs use powersgd and Q has the same size (same model and rank), whatever the
//   world size or strategy; otherwise Q starts from the run seed, with a warning;
// - a checkpoint without compression state (written without compression, or format version 1)
//   resumed with compression starts the state fresh, with a warning.
#pragma once

#include <string>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "train/compression.h"

namespace dtrain {

// Collective. The state of every rank's reducer on rank 0 (other ranks get type "none");
// `type` is distributed.compression.type.
CompressionState gather_compression_state(Communicator& comm, const GradReducer& reducer,
                                          CompressionType type);

// Collective. Sets every rank's reducer state from `saved`, what rank 0 read from the
// checkpoint (ignored on the other ranks), by the resume rule above; `type` and `strategy` are
// this run's. Rank 0 logs what was restored and warns about what was dropped.
void restore_compression_state(Communicator& comm, GradReducer& reducer, CompressionType type,
                               StrategyKind strategy, const CompressionState& saved);

}  // namespace dtrain
