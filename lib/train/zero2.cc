// zero2: replicated parameters; each unit's gradient (DDP's buckets are the units) is
// reduce-scattered as soon as backward has produced it, and a rank keeps only its gradient shard
// and the optimizer state of its chunks; the updated chunks are all-gathered after the step.
#include "train/zero_common.h"

namespace dtrain {

namespace {

class Zero2 final : public ZeroBase {
 public:
  Zero2(const Config& cfg, ModelRange range, Communicator& dp)
      : ZeroBase(cfg, range, dp, /*grad_shard=*/true) {}

  const char* name() const override { return "zero2"; }
  StateMemory memory() const override {
    StateMemory m;
    m.param_bytes = r_.size() * 4;
    m.grad_bytes = static_cast<int64_t>(ss_.grad_shard().size()) * 4;
    m.optim_bytes = ss_.optimizer().state_bytes();
    m.peak_unit_grad_bytes = ss_.peak_unit_grad_bytes();
    return m;
  }
  double wait_seconds() const override { return ss_.wait_seconds(); }

  void begin_step() override { std::fill(ss_.grad_shard().begin(), ss_.grad_shard().end(), 0.0f); }
  void backward(const Tensor& x, Activations& acts, const Tensor& dy, Tensor* dx,
                bool /*last*/) override {
    const auto& units = ss_.layout().units();
    ss_.backward(
        *r_.model, [&](size_t u) { return values_.data() + (units[u].begin - r_.begin); }, {}, {},
        x, acts, dy, dx);
  }
  void finish_backward() override { ss_.collect_unit_grads(); }
  HeldGrads held_grads() override { return ss_.held_grad_shard(); }
  bool replicated_grads() const override { return false; }
  int64_t first_nonfinite_grad() const override {
    return first_nonfinite_param(*r_.model, ss_.grad_shard().data(),
                                 ss_.layout().ranges(ss_.rank()));
  }
  double grad_sq_sum() override { return ss_.grad_sq_sum(nullptr, 0); }
  void scale_grads(float f) override { ss_.scale_grads(nullptr, 0, f); }
  void optimizer_step(double lr) override {
    ss_.optimizer_step(lr, values_.data(), r_.begin, nullptr, nullptr);
  }
};

}  // namespace

std::unique_ptr<Strategy> make_zero2(const Config& cfg, ModelRange range, Communicator& dp) {
  return std::make_unique<Zero2>(cfg, range, dp);
}

}  // namespace dtrain
