#include "train/fault_strategy.h"

#include <utility>

namespace dtrain {

namespace {

// Forwards every call to the wrapped strategy; backward scales dy on the faulty steps.
class GradScaleFault final : public Strategy {
 public:
  GradScaleFault(std::unique_ptr<Strategy> inner, std::vector<int64_t> steps,
                 const int64_t& steps_done)
      : s_(std::move(inner)), steps_(std::move(steps)), done_(steps_done) {}

  const char* name() const override { return s_->name(); }
  std::string describe() const override { return s_->describe(); }
  void init_params(uint64_t seed) override { s_->init_params(seed); }
  void load_full(const float* p, const std::vector<const float*>& st) override {
    s_->load_full(p, st);
  }
  std::vector<std::string> state_names() const override { return s_->state_names(); }
  bool sharded() const override { return s_->sharded(); }
  CheckpointShard checkpoint_shard() override { return s_->checkpoint_shard(); }
  Optimizer& optimizer() override { return s_->optimizer(); }
  GradReducer* reducer() override { return s_->reducer(); }
  StateMemory memory() const override { return s_->memory(); }
  double wait_seconds() const override { return s_->wait_seconds(); }
  bool global_mean() const override { return s_->global_mean(); }
  void begin_step() override { s_->begin_step(); }
  const Tensor& forward(const Tensor& x, Activations& acts, const ForwardCtx& ctx) override {
    return s_->forward(x, acts, ctx);
  }
  void forward_without_data() override { s_->forward_without_data(); }
  void backward(const Tensor& x, Activations& acts, const Tensor& dy, Tensor* dx,
                bool last) override {
    if (!due()) return s_->backward(x, acts, dy, dx, last);
    scaled_ = dy;
    for (int64_t i = 0; i < scaled_.numel(); ++i) scaled_[i] *= 2.0f;
    s_->backward(x, acts, scaled_, dx, last);
  }
  void finish_backward() override { s_->finish_backward(); }
  HeldGrads held_grads() override { return s_->held_grads(); }
  bool replicated_grads() const override { return s_->replicated_grads(); }
  int64_t first_nonfinite_grad() const override { return s_->first_nonfinite_grad(); }
  double grad_sq_sum() override { return s_->grad_sq_sum(); }
  void scale_grads(float f) override { s_->scale_grads(f); }
  void optimizer_step(double lr) override { s_->optimizer_step(lr); }
  void count_samples(int64_t local, int64_t axis) override { s_->count_samples(local, axis); }
  void end_step(int64_t step, bool last) override { s_->end_step(step, last); }
  bool in_sync(int64_t step) const override { return s_->in_sync(step); }

 private:
  bool due() const {
    for (int64_t s : steps_)
      if (s == done_ + 1) return true;
    return false;
  }

  std::unique_ptr<Strategy> s_;
  const std::vector<int64_t> steps_;
  const int64_t& done_;
  Tensor scaled_;
};

}  // namespace

std::unique_ptr<Strategy> with_gradient_faults(std::unique_ptr<Strategy> inner,
                                               const std::vector<Fault>& faults, int rank,
                                               const int64_t& steps_done) {
  std::vector<int64_t> steps;
  for (const Fault& f : faults)
    if (f.kind == "grad_scale" && f.rank == rank) steps.push_back(f.step);
  if (steps.empty()) return inner;
  return std::make_unique<GradScaleFault>(std::move(inner), std::move(steps), steps_done);
}

}  // namespace dtrain
