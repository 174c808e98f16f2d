// Optimizers over a contiguous range of the flat parameter layout. An optimizer built for
// [begin, begin + n) owns state buffers of n floats each, in the same layout (state element j
// belongs to parameter begin + j), so ZeRO can give each rank a shard and checkpoints can slice
// the state by the parameter table. Semantics follow PyTorch's SGD, Adam and AdamW.
//
// Weight decay applies to the elements of the decayed ranges the optimizer was built with
// (optimizer.weight_decay_on: matrices decays only tensors of 2 or more dimensions): every update
// splits its slice at their boundaries and runs each piece with or without decay, so the update
// loops stay branch-free and any slicing of a step gives bitwise the same result.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "optim/options.h"

namespace dtrain {

// [begin, end) of the whole model's flat layout.
struct FlatRange {
  int64_t begin = 0, end = 0;
  bool operator==(const FlatRange&) const = default;
};
// A piece of the flat layout that an optimizer's state holds: flat [begin, end) at state offset
// `offset` (sharded strategies own several pieces, packed into one shard).
struct StatePiece {
  int64_t begin = 0, end = 0, offset = 0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of params[0, n) from grads[0, n) (pointers at the start of the owned range) at
  // learning rate lr. Increments step_count().
  void step(float* params, const float* grads, double lr) {
    ++steps_;
    update_slice(params, grads, 0, n_, lr);
  }
  // step() that also zeroes grads[0, n), in the same pass (slice by slice while each is in
  // cache): the next step's gradients then accumulate from zero without a separate pass over
  // them (2.7 MB on mlp-ref: 0.1 ms a step). Parameters and state as with step(), bitwise.
  void step_and_zero_grads(float* params, float* grads, double lr);
  // The same step split into slices (sharded strategies own several ranges of the flat layout):
  // begin_step() once, then update_slice() for disjoint slices [state_offset, state_offset + n)
  // of the state, params and grads pointing at the slice's first element.
  void begin_step() { ++steps_; }
  void update_slice(float* params, const float* grads, int64_t state_offset, int64_t n, double lr);
  // Names of the state buffers, e.g. {"momentum"} or {"exp_avg", "exp_avg_sq"}. Empty for plain
  // SGD without momentum.
  const std::vector<std::string>& state_names() const { return names_; }
  std::vector<float>& state(size_t i) { return state_[i]; }
  const std::vector<float>& state(size_t i) const { return state_[i]; }
  int64_t size() const { return n_; }
  int64_t begin() const { return begin_; }
  int64_t step_count() const { return steps_; }
  void set_step_count(int64_t s) { steps_ = s; }
  // Bytes held in optimizer state (for memory accounting).
  int64_t state_bytes() const;
  // The state ranges [begin, end) (state offsets, sorted, disjoint) that weight decay applies to,
  // when it does not apply to the whole state.
  const std::vector<FlatRange>& decayed_state() const { return decayed_; }
  bool decays_all() const { return decay_all_; }

 protected:
  Optimizer(int64_t begin, int64_t n, std::vector<std::string> names);
  // The update rule over n elements with state from `state_offset`, at step count steps_, with
  // weight decay when `decay` (and the configured weight_decay is not 0).
  virtual void update(float* params, const float* grads, int64_t state_offset, int64_t n, double lr,
                      bool decay) = 0;
  friend std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig&, int64_t,
                                                   const std::vector<StatePiece>&,
                                                   const std::vector<FlatRange>&);
  // Restricts weight decay to the flat ranges `decayed` (whole-model offsets, sorted, disjoint)
  // for the state laid out as `pieces`; at construction (make_optimizer's second form).
  void set_decayed(const std::vector<StatePiece>& pieces, const std::vector<FlatRange>& decayed);
  // update() over [state_offset, state_offset + n), split at the decayed ranges' boundaries.
  void update_split(float* params, const float* grads, int64_t state_offset, int64_t n, double lr);
  int64_t begin_ = 0, n_ = 0, steps_ = 0;
  bool decay_all_ = true;           // decayed_ is unused: every element decays
  std::vector<FlatRange> decayed_;  // state ranges that decay when !decay_all_
  std::vector<std::string> names_;
  std::vector<std::vector<float>> state_;
};

// Builds sgd | adam | adamw for the range [begin, begin + n) of the layout, weight decay on every
// element.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, int64_t begin, int64_t n);
// Builds the optimizer for state [0, n) holding the flat pieces `pieces` (within [0, n), disjoint),
// with weight decay only on the flat ranges `decayed` (whole-model offsets, sorted, disjoint: a
// strategy passes decayed_ranges(model, cfg.weight_decay_on), see train/strategy.h).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, int64_t n,
                                          const std::vector<StatePiece>& pieces,
                                          const std::vector<FlatRange>& decayed);

// Learning rate at optimizer step `step` (0-based: the lr used for the update that makes step
// step+1), for a run of `total_steps` steps, base lr `base_lr` (already scaled by scale_lr).
// warmup: lr * (step + 1) / warmup_steps while step < warmup_steps; then the schedule, whose
// clock starts at the end of warmup (step decay every step_size steps after it), with
// cosine running from the end of warmup to total_steps: min_lr + (lr - min_lr) * (1 + cos(pi *
// t)) / 2, t = (step - warmup) / max(1, total - warmup), clamped to [0, 1].
double lr_at(const ScheduleConfig& s, double base_lr, int64_t step, int64_t total_steps);

// Sum of squares of g[0, n) in double precision (for the global gradient norm).
double sum_squares(const float* g, int64_t n);
// True when g[0, n) holds a NaN or an infinity (the non-finite guard's test, one pass).
bool any_nonfinite(const float* g, int64_t n);
// Multiplies g[0, n) by s.
void scale_inplace(float* g, int64_t n, float s);
// Clip factor for a global norm: min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0.
float clip_factor(double norm, double max_norm);

}  // namespace dtrain
