// Elastic restarts: keeping the global batch when the number of data-parallel ranks changes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {

struct BatchPlan {
  int64_t batch_size = 1;  // data.batch_size: per rank
  int64_t grad_accum = 1;  // train.grad_accum_steps
};

// The per-rank batch and gradient accumulation that keep the global batch
// G = batch_size * world * grad_accum when `world` data-parallel ranks (replicas: ranks over the
// tensor x pipeline cell) become `new_world`. The rule, in order:
//   1. the same accumulation, per-rank batch G / (new_world * grad_accum), when that is whole;
//   2. else the smallest accumulation a > grad_accum with G / (new_world * a) whole (more
//      micro-batches of a smaller per-rank batch: never more memory per rank than before).
// Throws UserError, one line naming G and new_world, when neither keeps G exactly.
BatchPlan keep_global_batch(int64_t batch_size, int64_t grad_accum, int world, int new_world);

// "data.batch_size 24 -> 32" / "train.grad_accum_steps 1 -> 2", the changes as the log says them
// ("" when nothing changed).
std::string describe_batch_change(const BatchPlan& from, const BatchPlan& to);

// The `--set KEY=VALUE` settings that run a job of `first_dp` data-parallel replicas on `new_dp`
// with the global batch kept (plan: keep_global_batch's). The learning rate is the job's too:
// under `optimizer.scale_lr: linear` (lr x replicas) the restarted ranks would scale by new_dp
// and train the same global batch at another rate, so they get scale_lr none and the rate the
// first ranks used, lr x first_dp (printed to round-trip: the same double the first ranks had).
std::vector<std::string> resize_settings(const BatchPlan& plan, double lr, bool scale_lr_linear,
                                         int64_t first_dp, int64_t new_dp);

}  // namespace dtrain
