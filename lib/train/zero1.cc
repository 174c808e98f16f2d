// zero1: ddp's replicated parameters and bucketed gradient all-reduce, with the optimizer state
// sharded over the data axis along the buckets (sharding.h): each rank updates its chunks and
// the updated chunks are all-gathered into everyone's parameters.
#include "train/zero_common.h"

namespace dtrain {

namespace {

class Zero1 final : public ZeroBase {
 public:
  Zero1(const Config& cfg, ModelRange range, Communicator& dp)
      : ZeroBase(cfg, range, dp, /*grad_shard=*/false),
        grads_(static_cast<size_t>(range.size())),
        buckets_(cfg, range, dp) {}

  const char* name() const override { return "zero1"; }
  std::string describe() const override {
    return ZeroBase::describe() + "; " + buckets_.describe();
  }
  StateMemory memory() const override {
    StateMemory m;
    m.param_bytes = r_.size() * 4;
    m.grad_bytes = r_.size() * 4;
    m.optim_bytes = ss_.optimizer().state_bytes();
    return m;
  }
  double wait_seconds() const override { return wait_s_ + ss_.wait_seconds(); }

  void begin_step() override { std::fill(grads_.begin(), grads_.end(), 0.0f); }
  HeldGrads held_grads() override { return {{{r_.begin, r_.end, grads_.data()}}, false}; }
  void backward(const Tensor& x, Activations& acts, const Tensor& dy, Tensor* dx,
                bool last) override {
    r_.model->backward(values_.data(), grads_.data(), x, acts, dy, dx, r_.first, r_.last,
                       last ? buckets_.on_layer_done(grads_.data()) : std::function<void(size_t)>(),
                       r_.begin);
  }
  void finish_backward() override { wait_s_ += buckets_.wait(); }
  bool replicated_grads() const override { return true; }
  int64_t first_nonfinite_grad() const override {
    return first_nonfinite_param(*r_.model, grads_.data(), {{r_.begin, r_.end, 0}});
  }
  double grad_sq_sum() override { return ss_.grad_sq_sum(grads_.data(), r_.begin); }
  void scale_grads(float f) override { ss_.scale_grads(grads_.data(), r_.begin, f); }
  void optimizer_step(double lr) override {
    ss_.optimizer_step(lr, values_.data(), r_.begin, grads_.data(), nullptr);
  }

 private:
  std::vector<float> grads_;
  BucketAllReduce buckets_;
  double wait_s_ = 0.0;
};

}  // namespace

std::unique_ptr<Strategy> make_zero1(const Config& cfg, ModelRange range, Communicator& dp) {
  return std::make_unique<Zero1>(cfg, range, dp);
}

}  // namespace dtrain
