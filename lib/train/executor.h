// Executors run a step's forward and backward passes over this rank's layers through its
// data-parallel strategy (train/strategy.h): the one-stage executor runs the whole model on each
// accumulation micro-batch; the pipeline executor (train/pipeline.h) runs a schedule of
// micro-batches over one stage, exchanging activations and their gradients with the
// neighbouring stages. The loop (train/loop.cc) sees only this interface, so every strategy
// works with and without a pipeline.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "data/dataset.h"
#include "train/strategy.h"
#include "util/rng.h"
#include "util/trace.h"

namespace dtrain {

class TensorGroup;  // nn/tp_gpt.h

// One optimizer step's work on this rank.
struct StepWork {
  // This replica's accumulation micro-batches: indices into the training set.
  const std::vector<std::vector<int64_t>>* batches = nullptr;
  // For each of them, the fewest rows any replica of the data axis holds (Sampler::fewest_rows):
  // what the pipeline cuts micro-batches by, so every replica runs as many of them -- and as
  // many of the strategy's per-micro-batch collectives (zero2's, fsdp's).
  const std::vector<int64_t>* fewest_rows = nullptr;
  float scale = 1.0f;   // gradients are of the loss sum times scale
  bool poison = false;  // DTRAIN_FAULT nan: a NaN enters this rank's last backward
  // The step's dropout key (nn/layer.h LayerCtx): with the rows of each batch, it keys the masks
  // on the sample, so every layout draws the masks one process draws.
  uint64_t mask_key = 0;
  // Called once with this rank's loss sum after the step's last forward, before its backward
  // (the loop overlaps the loss all-reduce with backward). One-stage executor only.
  std::function<void(double)> on_loss;
};

class Executor {
 public:
  virtual ~Executor() = default;
  // Forward and backward of every micro-batch of the step, the strategy's gradients
  // accumulated; returns this rank's loss sum (0 on stages that compute no loss). The caller
  // runs strategy.begin_step() before and finish_backward() after.
  virtual double run_step(const StepWork& w) = 0;
  // Evaluates the rows of `d` that data-parallel replica dp of DP takes, in batches of `batch`,
  // in lockstep with the other replicas (fsdp gathers units in every batch): (loss sum, correct
  // count) that this rank contributes (its replica's, on the stage that computes the loss).
  virtual std::pair<double, int64_t> evaluate(const Dataset& d, int64_t batch, int dp, int DP) = 0;
  // True on the rank that computes the loss (the last stage).
  virtual bool computes_loss() const = 0;
  // Seconds waiting for neighbouring stages so far (training steps; bubbles included).
  virtual double wait_seconds() const { return 0.0; }
  // Peak bytes of the activations a training step kept for backward on this rank (layer
  // outputs and saved state; a pipeline: of every micro-batch in flight).
  virtual int64_t peak_activation_bytes() const { return 0; }
  // Seconds in point-to-point receives (training and evaluation), for comm_s.
  virtual double recv_seconds() const { return 0.0; }
  // Extra summary.json content ({"stages": [...]} for a pipeline); collective over the world.
  virtual nlohmann::json summary(Communicator& /*world*/) { return nlohmann::json::object(); }
  // The tensor-parallel group every forward and backward runs with (LayerCtx::tensor); null
  // without tensor parallelism. Must outlive the executor.
  void set_tensor_group(TensorGroup* g) { tensor_ = g; }

 protected:
  TensorGroup* tensor_ = nullptr;
};

// Evaluation shares: replica dp of DP takes rows [lo, hi) of n, and every replica runs `batches`
// batches of `batch` rows (the most any replica needs), so that they stay in lockstep.
struct EvalShare {
  int64_t lo = 0, hi = 0, batches = 0;
};
inline EvalShare eval_share(int64_t n, int64_t batch, int dp, int DP) {
  EvalShare e{n * dp / DP, n * (dp + 1) / DP, 0};
  for (int r = 0; r < DP; ++r)
    e.batches = std::max(e.batches, (n * (r + 1) / DP - n * r / DP + batch - 1) / batch);
  return e;
}

// The one-stage executor: the whole model on each of the step's micro-batches.
std::unique_ptr<Executor> make_single_stage_executor(const Config& cfg, const Dataset& train,
                                                     Strategy& strategy, Rng& rng, Tracer& tracer);

}  // namespace dtrain
