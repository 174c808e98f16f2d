// What ddp and local_sgd share (train/ddp.cc, train/local_sgd.cc): every rank of the data axis
// holds the range's parameters, gradients and optimizer state whole. The subclasses add how and
// when the ranks agree (gradient all-reduce, parameter averaging) and any state of their own
// (extra_state: local_sgd's outer momentum), which follows the optimizer's in checkpoints.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "train/strategy.h"
#include "util/check.h"

namespace dtrain {

class ReplicatedBase : public Strategy {
 public:
  ReplicatedBase(const Config& cfg, ModelRange range, Communicator& dp)
      : r_(range),
        dp_(dp),
        values_(static_cast<size_t>(range.size())),
        grads_(static_cast<size_t>(range.size())),
        opt_(make_optimizer(cfg.optimizer, range.size(), {{range.begin, range.end, 0}},
                            decayed_ranges(*range.model, cfg.optimizer.weight_decay_on))) {}

  void init_params(uint64_t seed) override {
    r_.model->init(values_.data(), seed, r_.first, r_.last, r_.begin);
    // Every rank starts from the axis's rank 0 parameters, whatever its seed.
    dp_.broadcast(values_.data(), values_.size(), 0);
    after_load();
  }
  void load_full(const float* params, const std::vector<const float*>& state) override {
    std::copy(params + r_.begin, params + r_.end, values_.begin());
    const std::vector<float*> mine = state_buffers();
    DT_CHECK_EQ(state.size(), mine.size());
    for (size_t i = 0; i < state.size(); ++i)
      std::copy(state[i] + r_.begin, state[i] + r_.end, mine[i]);
    after_load();
  }
  std::vector<std::string> state_names() const override {
    std::vector<std::string> n = opt_->state_names();
    for (const std::string& e : extra_state_names()) n.push_back(e);
    return n;
  }
  bool sharded() const override { return false; }
  CheckpointShard checkpoint_shard() override {
    return {{{r_.begin, r_.end, 0}}, r_.size(), values_.data(), state_buffers()};
  }
  Optimizer& optimizer() override { return *opt_; }

  void begin_step() override {
    if (!grads_zeroed_) std::fill(grads_.begin(), grads_.end(), 0.0f);
    grads_zeroed_ = false;
  }
  const Tensor& forward(const Tensor& x, Activations& acts, const ForwardCtx& ctx) override {
    return r_.model->forward(values_.data(), x, acts, ctx, r_.first, r_.last, r_.begin);
  }
  int64_t first_nonfinite_grad() const override {
    return first_nonfinite_param(*r_.model, grads_.data(), {{r_.begin, r_.end, 0}});
  }
  double grad_sq_sum() override { return sum_squares(grads_.data(), r_.size()); }
  HeldGrads held_grads() override { return {{{r_.begin, r_.end, grads_.data()}}, false}; }
  void scale_grads(float f) override { scale_inplace(grads_.data(), r_.size(), f); }
  // Zeroes the gradients in the update's pass, so the next begin_step skips its fill (a pass
  // over the gradients: 0.1 ms of mlp-ref's step).
  void optimizer_step(double lr) override {
    opt_->step_and_zero_grads(values_.data(), grads_.data(), lr);
    grads_zeroed_ = true;
  }

 protected:
  // The subclass's own state buffers (range-sized, one per name), checkpointed after the
  // optimizer's.
  virtual std::vector<std::string> extra_state_names() const { return {}; }
  virtual std::vector<float*> extra_state() { return {}; }
  // After fresh or loaded parameters are in place.
  virtual void after_load() {}
  // The range's full-layout bytes of parameters, gradients and optimizer state.
  StateMemory replicated_memory() const {
    StateMemory m;
    m.param_bytes = r_.size() * 4;
    m.grad_bytes = r_.size() * 4;
    m.optim_bytes = opt_->state_bytes();
    return m;
  }

  ModelRange r_;
  Communicator& dp_;
  std::vector<float> values_, grads_;
  std::unique_ptr<Optimizer> opt_;

 private:
  std::vector<float*> state_buffers() {
    std::vector<float*> s;
    for (size_t i = 0; i < opt_->state_names().size(); ++i) s.push_back(opt_->state(i).data());
    for (float* b : extra_state()) s.push_back(b);
    return s;
  }
  bool grads_zeroed_ = false;  // the last optimizer_step left grads_ zero
};

}  // namespace dtrain
