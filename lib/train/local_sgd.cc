// local_sgd: every rank steps on its own batches (gradients are its own batch's mean) and the
// ranks of the data axis average their parameters every H = distributed.local_sgd.sync_every
// steps and at the run's last step, optionally their optimizer state too. With an outer
// optimizer (DiLoCo, outer_lr > 0) the averaged change since the last synchronisation is a
// pseudo-gradient applied with Nesterov momentum to `anchor`, the parameters of the last
// synchronisation (its momentum is checkpointed as state "outer_momentum"). With
// distributed.compression, what each rank moved since the last synchronisation (anchor - params)
// goes through the compressing reducer, with error feedback on it, instead of the parameters
// through a dense average. Ranks hold equal parameters only right after a synchronisation:
// in_sync() tells the loop when it may evaluate, checkpoint or stop.
#include <chrono>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "train/replicated.h"
#include "train/tied_grads.h"
#include "util/check.h"
#include "util/duration.h"
#include "util/warn_once.h"

namespace dtrain {

namespace {

class LocalSgd final : public ReplicatedBase {
 public:
  LocalSgd(const Config& cfg, ModelRange range, Communicator& dp)
      : ReplicatedBase(cfg, range, dp),
        c_(cfg.distributed.local_sgd),
        compression_(cfg.distributed.compression.type),
        outer_(c_.outer_lr > 0),
        pieces_(tie_aligned_pieces(*range.model, range.begin, range.end)) {
    if (outer_) outer_momentum_.assign(values_.size(), 0.0f);
    // (once per process: every pipeline stage's replica group finds it)
    if (dp.size() == 1 && outer_ && dp.rank() == 0)
      warn_once(fmt::format(
          "distributed.local_sgd.outer_lr {} is unused: local_sgd with one data-parallel replica "
          "never synchronises, so DiLoCo's outer step (an average of one) never runs; this trains "
          "as one process",
          c_.outer_lr));
    if (dp.size() == 1 && compression_ != CompressionType::kNone && dp.rank() == 0)
      warn_once(fmt::format(
          "distributed.compression {} is unused: local_sgd at world size 1 never synchronises, so "
          "there is nothing to compress",
          to_string(compression_)));
    if (dp.size() > 1 && compression_ != CompressionType::kNone) {
      reducer_ = make_grad_reducer(cfg.distributed.compression, range_params(range), range.size(),
                                   static_cast<uint64_t>(cfg.seed));
      delta_.assign(values_.size(), 0.0f);
    }
  }

  const char* name() const override { return "local_sgd"; }
  std::string describe() const override {
    if (dp_.size() == 1) return "";
    std::string s = fmt::format(
        "local_sgd: parameters averaged every {} step(s){}{}", c_.sync_every,
        c_.sync_optimizer_state ? ", optimizer state too" : "",
        outer_ ? fmt::format(", outer Nesterov lr {} momentum {}", c_.outer_lr, c_.outer_momentum)
               : std::string());
    if (reducer_) s += "; compression " + reducer_->describe(dp_.size());
    return s;
  }

  bool per_rank_optimizer_state() const override {
    return dp_.size() > 1 && !c_.sync_optimizer_state && !opt_->state_names().empty();
  }
  GradReducer* reducer() override { return reducer_.get(); }
  StateMemory memory() const override {
    StateMemory m = replicated_memory();
    m.optim_bytes += static_cast<int64_t>(outer_momentum_.size() + anchor_.size()) * 4;
    return m;
  }
  double wait_seconds() const override { return wait_s_; }

  bool global_mean() const override { return false; }
  void backward(const Tensor& x, Activations& acts, const Tensor& dy, Tensor* dx,
                bool /*last*/) override {
    r_.model->backward(values_.data(), grads_.data(), x, acts, dy, dx, r_.first, r_.last, {},
                       r_.begin);
  }
  void finish_backward() override {}
  bool replicated_grads() const override { return false; }
  void count_samples(int64_t local, int64_t axis) override {
    local_samples_ += local;
    axis_samples_ += axis;
  }
  void end_step(int64_t step, bool last) override {
    if (dp_.size() == 1 || (step % c_.sync_every != 0 && !last)) return;
    const auto t0 = std::chrono::steady_clock::now();
    sync();
    wait_s_ += seconds_since(t0);
    check_finite(step);
  }
  bool in_sync(int64_t step) const override { return dp_.size() == 1 || step % c_.sync_every == 0; }

 protected:
  std::vector<std::string> extra_state_names() const override {
    return outer_ ? std::vector<std::string>{"outer_momentum"} : std::vector<std::string>{};
  }
  std::vector<float*> extra_state() override {
    return outer_ ? std::vector<float*>{outer_momentum_.data()} : std::vector<float*>{};
  }
  // Checkpoints are taken at synchronisation points, where every rank holds the anchor.
  void after_load() override {
    if (outer_ || reducer_) anchor_ = values_;
  }

 private:
  void sync();
  // The loop's non-finite guard judges each step's loss and gradients before the step ends; the
  // synchronisation comes after it (an fp16 change that overflows, an outer step too large) and
  // no step could be skipped to undo it: non-finite parameters here end the run (every rank of
  // the axis holds the same values, so all of them throw; the abort tells the others).
  void check_finite(int64_t step) const;

  LocalSgdConfig c_;
  CompressionType compression_;
  bool outer_;
  std::vector<float> anchor_, outer_momentum_, delta_;
  // sync() averages these pieces of the range one by one (train/tied_grads.h): both copies of a
  // tie, here or on another stage, are summed in the same order and stay bitwise equal.
  std::vector<FlatRange> pieces_;
  std::unique_ptr<GradReducer> reducer_;
  double wait_s_ = 0.0;
  // Samples this rank and the axis trained since the last synchronisation: the average weights
  // each rank by its share, so a short last batch split unevenly (or a rank with none) counts
  // as in one process, and H = 1 with SGD is DDP's update.
  int64_t local_samples_ = 0, axis_samples_ = 0;
};

void LocalSgd::check_finite(int64_t step) const {
  int64_t bad = 0;
  for (const float v : values_) bad += std::isfinite(v) ? 0 : 1;
  if (bad == 0) return;
  const std::string why =
      compression_ == CompressionType::kFp16
          ? " (compression fp16 carries each rank's change since the last synchronisation, and "
            "fp16 ends at 65504: bf16 has float32's range)"
      : outer_ ? " (the outer step: lower distributed.local_sgd.outer_lr)"
               : "";
  throw std::runtime_error(fmt::format(
      "the Local SGD synchronisation at step {} made {} of this rank's {} parameters non-finite{}; "
      "the run stops (train.nonfinite cannot skip a synchronisation, and its checkpoints before "
      "this step are unaffected): lower optimizer.lr or set optimizer.clip_grad_norm",
      step, bad, values_.size(), why));
}

void LocalSgd::sync() {
  const int64_t P = r_.size();
  // This rank's weight times the axis size, applied before an average: W * n_r / N (1 exactly
  // when every rank trained as many samples, so equal shares average as before, bit for bit).
  const float share = axis_samples_ > 0 ? static_cast<float>(static_cast<double>(local_samples_) *
                                                             static_cast<double>(dp_.size()) /
                                                             static_cast<double>(axis_samples_))
                                        : 1.0f;
  local_samples_ = axis_samples_ = 0;
  auto weigh = [&](float* buf) {
    if (share != 1.0f)
      for (int64_t j = 0; j < P; ++j) buf[j] *= share;
  };
  std::vector<WorkPtr> w;
  const SettleOnExit settle(dp_, w);  // (the compressed sum below may throw with these in flight)
  auto average = [&](float* buf) {
    weigh(buf);
    for (const FlatRange& p : pieces_)
      w.push_back(
          dp_.allreduce_async(buf + p.begin, static_cast<size_t>(p.end - p.begin), ReduceOp::kAvg));
  };
  if (!reducer_) average(values_.data());
  if (c_.sync_optimizer_state)
    for (size_t i = 0; i < opt_->state_names().size(); ++i) average(opt_->state(i).data());
  if (reducer_) {
    for (int64_t j = 0; j < P; ++j) delta_[j] = anchor_[j] - values_[j];
    weigh(delta_.data());
    reducer_->allreduce_sum(dp_, delta_.data());
    // The compressor treats the two copies of a tie as two tensors (its own sampling, residuals):
    // the tie moves by the primary's average. Compression refuses pipelines, so both are here.
    for (const TiedParam& t : r_.model->ties()) {
      const ParamEntry& a = r_.model->params()[t.primary];
      const ParamEntry& b = r_.model->params()[t.mirror];
      DT_CHECK(a.offset >= r_.begin && b.offset + b.numel <= r_.end);
      std::copy(delta_.begin() + (a.offset - r_.begin),
                delta_.begin() + (a.offset + a.numel - r_.begin),
                delta_.begin() + (b.offset - r_.begin));
    }
  }
  for (auto& x : w) x->wait();
  if (reducer_) {
    // The averaged move, applied to the anchor (the outer step below then sees it as its
    // pseudo-gradient).
    const float inv = 1.0f / static_cast<float>(dp_.size());
    for (int64_t j = 0; j < P; ++j) values_[j] = anchor_[j] - delta_[j] * inv;
    if (!outer_) {
      anchor_ = values_;
      return;
    }
  }
  if (!outer_) return;
  const float mu = static_cast<float>(c_.outer_momentum);
  const float olr = static_cast<float>(c_.outer_lr);
  for (int64_t j = 0; j < P; ++j) {
    const float d = anchor_[j] - values_[j];  // pseudo-gradient
    outer_momentum_[j] = mu * outer_momentum_[j] + d;
    anchor_[j] -= olr * (d + mu * outer_momentum_[j]);
    values_[j] = anchor_[j];
  }
}

}  // namespace

std::unique_ptr<Strategy> make_local_sgd(const Config& cfg, ModelRange range, Communicator& dp) {
  return std::make_unique<LocalSgd>(cfg, range, dp);
}

}  // namespace dtrain
