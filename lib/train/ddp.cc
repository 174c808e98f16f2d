// ddp: every rank of the data axis holds the range's parameters, gradients and optimizer state.
// Gradients are summed over the axis: in buckets whose all-reduces start during the step's last
// backward (train/strategy.h BucketAllReduce), or, with distributed.compression, through the
// compressing reducer after backward (at world size 1 too: the encode/decode round trip alone,
// with error feedback, to study its cost in one process).
#include <chrono>

#include <fmt/format.h>

#include "train/strategy.h"
#include "util/check.h"

namespace dtrain {

namespace {

class Ddp final : public Strategy {
 public:
  Ddp(const Config& cfg, ModelRange range, Communicator& dp)
      : r_(range),
        dp_(dp),
        values_(static_cast<size_t>(range.size())),
        grads_(static_cast<size_t>(range.size())),
        opt_(make_optimizer(cfg.optimizer, 0, range.size())),
        buckets_(cfg, range, dp) {
    if (cfg.distributed.compression.type != CompressionType::kNone)
      compressor_ = make_grad_reducer(cfg.distributed.compression, range_params(range),
                                      range.size(), static_cast<uint64_t>(cfg.seed));
  }

  const char* name() const override { return "ddp"; }
  std::string describe() const override {
    if (compressor_)
      return fmt::format(
          "ddp: compression {}{}", compressor_->describe(),
          dp_.size() == 1 ? " (world size 1: the round trip only, nothing is sent)" : "");
    return dp_.size() > 1 ? "ddp: " + buckets_.describe() : "";
  }

  void init_params(uint64_t seed) override {
    r_.model->init(values_.data(), seed, r_.first, r_.last, r_.begin);
    // Every rank starts from the axis's rank 0 parameters, whatever its seed.
    dp_.broadcast(values_.data(), values_.size(), 0);
  }
  void load_full(const float* params, const std::vector<const float*>& state) override {
    std::copy(params + r_.begin, params + r_.end, values_.begin());
    DT_CHECK_EQ(state.size(), opt_->state_names().size());
    for (size_t i = 0; i < state.size(); ++i)
      std::copy(state[i] + r_.begin, state[i] + r_.end, opt_->state(i).begin());
  }
  std::vector<std::string> state_names() const override { return opt_->state_names(); }
  bool sharded() const override { return false; }
  CheckpointShard checkpoint_shard() override {
    CheckpointShard s{{{r_.begin, r_.end, 0}}, r_.size(), values_.data(), {}};
    for (size_t i = 0; i < opt_->state_names().size(); ++i)
      s.state.push_back(opt_->state(i).data());
    return s;
  }
  Optimizer& optimizer() override { return *opt_; }
  GradReducer* reducer() override { return compressor_.get(); }
  StateMemory memory() const override {
    StateMemory m;
    m.param_bytes = r_.size() * 4;
    m.grad_bytes = r_.size() * 4;
    m.optim_bytes = opt_->state_bytes();
    return m;
  }
  double wait_seconds() const override { return wait_s_; }

  void begin_step() override {
    if (!grads_zeroed_) std::fill(grads_.begin(), grads_.end(), 0.0f);
    grads_zeroed_ = false;
  }
  const Tensor& forward(const Tensor& x, Activations& acts, const ForwardCtx& ctx) override {
    return r_.model->forward(values_.data(), x, acts, ctx, r_.first, r_.last, r_.begin);
  }
  void backward(const Tensor& x, Activations& acts, const Tensor& dy, Tensor* dx,
                bool last) override {
    r_.model->backward(values_.data(), grads_.data(), x, acts, dy, dx, r_.first, r_.last,
                       last && !compressor_ ? buckets_.on_layer_done(grads_.data())
                                            : std::function<void(size_t)>(),
                       r_.begin);
  }
  void finish_backward() override {
    if (!compressor_) {
      wait_s_ += buckets_.wait();
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    compressor_->allreduce_sum(dp_, grads_.data());
    wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  bool replicated_grads() const override { return true; }
  int64_t first_nonfinite_grad() const override {
    return first_nonfinite_param(*r_.model, grads_.data(), {{r_.begin, r_.end, 0}});
  }
  double grad_sq_sum() override { return sum_squares(grads_.data(), r_.size()); }
  void scale_grads(float f) override { scale_inplace(grads_.data(), r_.size(), f); }
  // Zeroes the gradients in the update's pass, so the next begin_step skips its fill (a pass
  // over the gradients: 0.1 ms of mlp-ref's step).
  void optimizer_step(double lr) override {
    opt_->step_and_zero_grads(values_.data(), grads_.data(), lr);
    grads_zeroed_ = true;
  }

 private:
  ModelRange r_;
  Communicator& dp_;
  std::vector<float> values_, grads_;
  std::unique_ptr<Optimizer> opt_;
  BucketAllReduce buckets_;
  std::unique_ptr<GradReducer> compressor_;
  double wait_s_ = 0.0;
  bool grads_zeroed_ = false;  // the last optimizer_step left grads_ zero
};

}  // namespace

std::unique_ptr<Strategy> make_ddp(const Config& cfg, ModelRange range, Communicator& dp) {
  return std::make_unique<Ddp>(cfg, range, dp);
}

}  // namespace dtrain
