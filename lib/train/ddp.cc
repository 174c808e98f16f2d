// ddp: every rank of the data axis holds the range's parameters, gradients and optimizer state.
// Gradients are summed over the axis: in buckets whose all-reduces start during the step's last
// backward (train/strategy.h BucketAllReduce), or, with distributed.compression, through the
// compressing reducer after backward (at world size 1 too: the encode/decode round trip alone,
// with error feedback, to study its cost in one process).
#include <chrono>

#include <fmt/format.h>

#include "train/replicated.h"
#include "util/check.h"
#include "util/duration.h"

namespace dtrain {

namespace {

class Ddp final : public ReplicatedBase {
 public:
  Ddp(const Config& cfg, ModelRange range, Communicator& dp)
      : ReplicatedBase(cfg, range, dp), buckets_(cfg, range, dp) {
    if (cfg.distributed.compression.type != CompressionType::kNone)
      compressor_ = make_grad_reducer(cfg.distributed.compression, range_params(range),
                                      range.size(), static_cast<uint64_t>(cfg.seed));
  }

  const char* name() const override { return "ddp"; }
  std::string describe() const override {
    if (compressor_)
      return fmt::format(
          "ddp: compression {}{}", compressor_->describe(dp_.size()),
          dp_.size() == 1 ? " (world size 1: the round trip only, nothing is sent)" : "");
    return dp_.size() > 1 ? "ddp: " + buckets_.describe() : "";
  }
  GradReducer* reducer() override { return compressor_.get(); }
  StateMemory memory() const override { return replicated_memory(); }
  double wait_seconds() const override { return wait_s_; }

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
    wait_s_ += seconds_since(t0);
  }
  bool replicated_grads() const override { return true; }

 private:
  BucketAllReduce buckets_;
  std::unique_ptr<GradReducer> compressor_;
  double wait_s_ = 0.0;
};

}  // namespace

std::unique_ptr<Strategy> make_ddp(const Config& cfg, ModelRange range, Communicator& dp) {
  return std::make_unique<Ddp>(cfg, range, dp);
}

}  // namespace dtrain
