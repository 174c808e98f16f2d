// The one-stage executor (train/executor.h): no pipeline, the strategy's range is the model.
#include <algorithm>
#include <cmath>
#include <optional>

#include "train/batch.h"
#include "train/executor.h"
#include "util/check.h"

namespace dtrain {

namespace {

class SingleStage final : public Executor {
 public:
  SingleStage(const Config& cfg, const Dataset& train, Strategy& s, Rng& rng, Tracer& tracer)
      : loss_(cfg.model.loss), train_(train), s_(s), rng_(rng), tracer_(tracer) {}

  double run_step(const StepWork& w) override {
    const auto& batches = *w.batches;
    ForwardCtx ctx{.training = true, .rng = &rng_, .mask_key = w.mask_key, .tensor = tensor_};
    double loss_sum = 0.0;
    for (size_t i = 0; i < batches.size(); ++i) {
      const bool last = i + 1 == batches.size();
      gather_batch(train_, batches[i], b_);
      ctx.rows = batches[i].data();  // dropout masks keyed on the samples
      std::optional<TraceScope> fw(std::in_place, tracer_, "forward", "compute");
      const Tensor& out = s_.forward(b_.x, acts_, ctx);
      peak_act_ = std::max(peak_act_, acts_.bytes());
      loss_sum += loss_and_grad(loss_, out, b_.targets.data(), &dlogits_, w.scale);
      fw.reset();
      if (last && w.poison && dlogits_.numel() > 0)
        dlogits_.data()[0] = std::nanf("");  // DTRAIN_FAULT: a NaN enters this rank's gradients
      if (last && w.on_loss) w.on_loss(loss_sum);
      TraceScope bw(tracer_, "backward", "compute");
      s_.backward(b_.x, acts_, dlogits_, nullptr, last);
    }
    return loss_sum;
  }

  std::pair<double, int64_t> evaluate(const Dataset& d, int64_t batch, int dp, int DP) override {
    DT_CHECK_GT(batch, 0);
    const int64_t n = d.rows;
    const auto [lo, hi, max_batches] = eval_share(n, batch, dp, DP);
    Activations acts;
    Batch b;
    std::vector<int64_t> idx;
    ForwardCtx ctx{.training = false, .rng = nullptr, .tensor = tensor_};
    double loss_sum = 0.0;
    int64_t correct = 0;
    for (int64_t j = 0; j < max_batches; ++j) {
      const int64_t start = lo + j * batch;
      if (start >= hi) {
        s_.forward_without_data();
        continue;
      }
      consecutive_rows(start, std::min(batch, hi - start), idx);
      gather_batch(d, idx, b);
      const Tensor& out = s_.forward(b.x, acts, ctx);
      loss_sum += loss_and_grad(loss_, out, b.targets.data(), nullptr, 1.0f);
      correct += count_correct(out, b.targets.data());
    }
    return {loss_sum, correct};
  }

  bool computes_loss() const override { return true; }
  int64_t peak_activation_bytes() const override { return peak_act_; }

 private:
  Loss loss_;
  const Dataset& train_;
  Strategy& s_;
  Rng& rng_;
  Tracer& tracer_;
  Activations acts_;
  Batch b_;
  Tensor dlogits_;
  int64_t peak_act_ = 0;
};

}  // namespace

std::unique_ptr<Executor> make_single_stage_executor(const Config& cfg, const Dataset& train,
                                                     Strategy& strategy, Rng& rng, Tracer& tracer) {
  return std::make_unique<SingleStage>(cfg, train, strategy, rng, tracer);
}

}  // namespace dtrain
