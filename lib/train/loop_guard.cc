// TrainLoop's numeric guards on each step (train_loop.h): the non-finite verdict
// (train.nonfinite) and gradient clipping (optimizer.clip_grad_norm).
#include <cmath>
#include <string>

#include "train/train_loop.h"

namespace dtrain {
namespace loop_detail {

namespace {

// Why a loss or gradient is not finite at step 1, before any update (`fp16_hint`: "; with
// distributed.compression fp16 ..." when that may be the cause, else "").
std::string first_step_cause(const Config& cfg, const std::string& fp16_hint) {
  const std::string data =
      cfg.data.format == DataFormat::kText
          ? std::string(
                "the model's first forward overflows float32 (a model this deep or wide "
                "at its initial weights)")
          : "the training data's values overflow the model's float32 arithmetic (values near "
            "3.4e38? data.normalize: " +
                to_string(cfg.data.normalize) + ")";
  // fp16 first: the loss was finite, so the gradient most likely overflowed in transit.
  return fp16_hint.empty() ? data : fp16_hint.substr(2) + "; else " + data;
}

}  // namespace

bool TrainLoop::nonfinite_guard(double loss_sum) {
  // DDP and zero1 without a pipeline hold identical reduced gradients and loss on every rank,
  // so every rank reaches the same verdict alone; otherwise ranks hold their own (their stage's,
  // their shard's, their own Local SGD model) and the verdict is all-reduced (min code). A
  // skipped step drops its update (and its loss and samples from the record) only.
  float code = kFiniteCode;
  if (exec_->computes_loss() && !std::isfinite(loss_sum)) {
    code = kLossCode;
  } else if (const int64_t e = strategy_->first_nonfinite_grad(); e >= 0) {
    code = static_cast<float>(e + 1);
  }
  // Tensor ranks hold different shards' gradients: the verdict is all-reduced there too.
  if ((!loss_global_ || tp_) && world_.size() > 1) {
    // (where ranks run at different speeds, the wait for the slowest is here: exposed)
    TraceScope ts(tracer_, "wait for communication", "wait");
    const auto t0 = Clock::now();
    world_.allreduce(&code, 1, ReduceOp::kMin);
    verdict_wait_s_ += seconds_since(t0);
  }
  if (code == kFiniteCode) return true;
  const std::string what = nonfinite_what(model_, code);
  // fp16 compression carries a rank's gradient in 16 bits: above 65504 it becomes inf in transit
  // (with a finite loss; clipping and the learning rate act after the reduction, so cannot help).
  // Local SGD reduces no gradients (it compresses at its synchronisations, checked apart).
  const std::string fp16_hint =
      code != kLossCode && strategy_->reducer() != nullptr &&
              cfg_.distributed.strategy != StrategyKind::kLocalSgd &&
              cfg_.distributed.compression.type == CompressionType::kFp16
          ? "; with distributed.compression fp16 (values up to 65504), a rank's gradient above "
            "that overflows to inf in transit, which clipping cannot undo: bf16 (float32's "
            "range) or int8 (scaled per bucket) avoid it"
          : "";
  // Before any update the learning rate cannot be the cause, and no restart changes it: exit 2.
  // A NaN injected on purpose (DTRAIN_FAULT nan, which a restart clears) is no input's.
  bool injected = false;
  for (int r = 0; r < world_.size(); ++r)
    injected = injected || fault_due(opts_.faults, "nan", r, step_ + 1);
  const bool first_of_run = rp_.loaded ? step_ == rp_.step : step_ == 0;  // before any update
  if (cfg_.train.nonfinite == Nonfinite::kAbort && injected && first_of_run)
    throw AgreedError(what + " is not finite at step " + std::to_string(step_ + 1) +
                      ": DTRAIN_FAULT injected a NaN there");
  if (cfg_.train.nonfinite == Nonfinite::kAbort && step_ == 0 && !rp_.loaded) {
    throw AgreedInputError(
        what + " is not finite at step 1, before any update: " + first_step_cause(cfg_, fp16_hint));
  }
  // The first step after a resume computes from the checkpoint's weights and state alone, as a
  // restart would again (exit 1 restarted it, with advice to lower a rate that had not acted).
  if (cfg_.train.nonfinite == Nonfinite::kAbort && rp_.loaded && first_of_run)
    throw AgreedInputError(what + " is not finite at step " + std::to_string(step_ + 1) +
                           ", the first after resuming, before this run updated anything: the "
                           "checkpoint" +
                           (rp_.from.empty() ? std::string() : " '" + rp_.from + "'") +
                           " holds weights or optimizer state that overflow (resume an earlier "
                           "checkpoint), or " +
                           first_step_cause(cfg_, fp16_hint));
  if (cfg_.train.nonfinite == Nonfinite::kAbort)
    throw AgreedError(
        what + " is not finite at step " + std::to_string(step_ + 1) +
        " (train.nonfinite: abort; lower optimizer.lr, set optimizer.clip_grad_norm, or set "
        "train.nonfinite: skip" +
        fp16_hint + ")");
  ++skipped_steps_;
  if (lead_)
    spdlog::warn("step {} skipped on every rank: {} is not finite ({} skipped so far)", step_ + 1,
                 what, skipped_steps_);
  return false;
}

void TrainLoop::clip() {
  // The global norm: each stage's squared norm (each element counted once over the data axis),
  // summed over the stages.
  // A tied parameter's two copies hold the same summed gradient: the stage holding the mirror
  // subtracts it, so it counts once (PyTorch's norm of nanoGPT's tied GPT sees one tensor).
  double ss = strategy_->grad_sq_sum() - tied_sq_;
  if (tp_) ss = tp_->global_sq(ss, strategy_->held_grads(), dp_);  // each shard counted once
  if (pp_.size() > 1) ss = pp_.allreduce_sum(ss);  // (a double: see ShardedState::grad_sq_sum)
  const float f = clip_factor(std::sqrt(ss), cfg_.optimizer.clip_grad_norm);
  if (f < 1.0f) strategy_->scale_grads(f);
}

}  // namespace loop_detail
}  // namespace dtrain
