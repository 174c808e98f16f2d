// fsdp (ZeRO-3): parameters, gradients and optimizer state sharded over the data axis along
// distributed.fsdp units (sharding.h). A unit is all-gathered before its forward (the next one
// is prefetched while the current computes), freed after forward when reshard_after_forward
// (the range's last unit stays for the backward that follows), gathered again for backward (the
// previous unit prefetched) and freed after it; each unit's gradient is reduce-scattered as soon
// as its backward ends. With M micro-batches in a step (gradient accumulation, a pipeline's
// schedule) a unit is so gathered 2M times per step; without reshard_after_forward it is
// gathered once and kept until the step's last backward (the whole range's parameters held
// for the step: memory for traffic).
#include <chrono>

#include <fmt/format.h>

#include "train/strategy.h"
#include "util/check.h"
#include "util/duration.h"

namespace dtrain {

namespace {

class Fsdp final : public Strategy {
 public:
  Fsdp(const Config& cfg, ModelRange range, Communicator& dp)
      : r_(range),
        dp_(dp),
        reshard_(cfg.distributed.fsdp.reshard_after_forward),
        ss_(ShardLayout(*range.model,
                        units_for_fsdp(*range.model, cfg.distributed.fsdp, range.first, range.last),
                        dp.size()),
            dp, cfg.optimizer, /*grad_shard=*/true,
            decayed_ranges(*range.model, cfg.optimizer.weight_decay_on)) {
    const size_t U = ss_.layout().units().size();
    param_shard_.assign(static_cast<size_t>(ss_.layout().shard_size()), 0.0f);
    gathered_.resize(U);
    gather_work_.resize(U);
  }
  ~Fsdp() override {
    for (size_t u = 0; u < gather_work_.size(); ++u) {
      try {
        release(u);    // never free a buffer the communication thread still writes
      } catch (...) {  // an aborted communicator: its error is reported elsewhere
      }
    }
  }

  const char* name() const override { return "fsdp"; }
  std::string describe() const override {
    return fmt::format("fsdp: {} unit(s), {} of {} parameters per rank (shard, padding included)",
                       ss_.layout().units().size(), ss_.layout().shard_size(), r_.size());
  }

  void init_params(uint64_t seed) override {
    // Each rank initialises one unit at a time and keeps its chunk: layers draw from their own
    // streams (Model::init), so this equals initialising the whole model.
    const int rank = ss_.rank();
    std::vector<float> tmp;
    for (const auto& u : ss_.layout().units()) {
      tmp.assign(static_cast<size_t>(u.size()), 0.0f);
      r_.model->init(tmp.data(), seed, u.first_layer, u.last_layer, u.begin);
      std::copy(tmp.begin() + (u.own_begin(rank) - u.begin),
                tmp.begin() + (u.own_end(rank) - u.begin), param_shard_.begin() + u.shard_offset);
    }
  }
  void load_full(const float* params, const std::vector<const float*>& state) override {
    const ShardLayout& L = ss_.layout();
    L.full_to_shard(ss_.rank(), params, param_shard_.data());
    DT_CHECK_EQ(state.size(), ss_.optimizer().state_names().size());
    for (size_t i = 0; i < state.size(); ++i)
      L.full_to_shard(ss_.rank(), state[i], ss_.optimizer().state(i).data());
  }
  std::vector<std::string> state_names() const override { return ss_.optimizer().state_names(); }
  bool sharded() const override { return true; }
  CheckpointShard checkpoint_shard() override {
    const ShardLayout& L = ss_.layout();
    CheckpointShard s{L.ranges(ss_.rank()), L.shard_size(), param_shard_.data(), {}};
    for (size_t i = 0; i < state_names().size(); ++i)
      s.state.push_back(ss_.optimizer().state(i).data());
    return s;
  }
  Optimizer& optimizer() override { return ss_.optimizer(); }
  StateMemory memory() const override {
    StateMemory m;
    m.param_bytes = static_cast<int64_t>(param_shard_.size()) * 4;
    m.grad_bytes = static_cast<int64_t>(ss_.grad_shard().size()) * 4;
    m.optim_bytes = ss_.optimizer().state_bytes();
    m.peak_gathered_bytes = peak_gathered_;
    m.peak_unit_grad_bytes = ss_.peak_unit_grad_bytes();
    return m;
  }
  double wait_seconds() const override { return wait_s_ + ss_.wait_seconds(); }

  void begin_step() override { std::fill(ss_.grad_shard().begin(), ss_.grad_shard().end(), 0.0f); }
  const Tensor& forward(const Tensor& x, Activations& acts, const ForwardCtx& ctx) override {
    const auto& units = ss_.layout().units();
    const size_t U = units.size();
    const Tensor* out = &x;
    for (size_t u = 0; u < U; ++u) {
      if (u + 1 < U) start_gather(u + 1);
      out = &r_.model->forward(wait_gather(u), *out, acts, ctx, units[u].first_layer,
                               units[u].last_layer, units[u].begin);
      if ((reshard_ || !ctx.training) && u + 1 < U) release(u);
    }
    if (!ctx.training) release(U - 1);
    return *out;
  }
  void forward_without_data() override {
    const size_t U = ss_.layout().units().size();
    for (size_t u = 0; u < U; ++u) {
      if (u + 1 < U) start_gather(u + 1);
      wait_gather(u);
      release(u);
    }
  }
  void backward(const Tensor& x, Activations& acts, const Tensor& dy, Tensor* dx,
                bool last) override {
    ss_.backward(
        *r_.model, [&](size_t u) { return wait_gather(u); },
        [&](size_t u) {
          if (u > 0) start_gather(u - 1);
        },
        [&](size_t u) {
          // Without resharding a unit stays gathered until the step's last backward: the step's
          // other micro-batches (accumulation, a pipeline's schedule) reuse it.
          if (reshard_ || last) release(u);
        },
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
    ss_.optimizer_step(lr, nullptr, 0, nullptr, param_shard_.data());
  }

 private:
  void start_gather(size_t u);
  const float* wait_gather(size_t u);
  void release(size_t u);

  ModelRange r_;
  Communicator& dp_;
  bool reshard_;
  ShardedState ss_;
  std::vector<float> param_shard_;
  std::vector<std::vector<float>> gathered_;  // per unit, empty when released
  std::vector<WorkPtr> gather_work_;
  int64_t gathered_now_ = 0, peak_gathered_ = 0;
  double wait_s_ = 0.0;
};

void Fsdp::start_gather(size_t u) {
  if (!gathered_[u].empty() || gather_work_[u]) return;  // held or on its way
  const ShardUnit& x = ss_.layout().units()[u];
  const int rank = ss_.rank();
  std::vector<float>& buf = gathered_[u];
  buf.resize(static_cast<size_t>(x.size()));
  const int64_t own = x.own_end(rank) - x.own_begin(rank);
  std::copy(param_shard_.begin() + x.shard_offset, param_shard_.begin() + x.shard_offset + own,
            buf.begin() + (x.own_begin(rank) - x.begin));
  gathered_now_ += x.size() * 4;
  peak_gathered_ = std::max(peak_gathered_, gathered_now_);
  gather_work_[u] = dp_.allgather_inplace_async(buf.data(), ss_.layout().counts(u));
}

const float* Fsdp::wait_gather(size_t u) {
  start_gather(u);
  if (gather_work_[u]) {
    const auto t0 = std::chrono::steady_clock::now();
    gather_work_[u]->wait();
    wait_s_ += seconds_since(t0);
    gather_work_[u].reset();
  }
  return gathered_[u].data();
}

void Fsdp::release(size_t u) {
  if (gather_work_[u]) {  // never free a buffer the communication thread still writes
    gather_work_[u]->wait();
    gather_work_[u].reset();
  }
  if (gathered_[u].empty()) return;
  gathered_now_ -= static_cast<int64_t>(gathered_[u].size()) * 4;
  std::vector<float>().swap(gathered_[u]);
}

}  // namespace

std::unique_ptr<Strategy> make_fsdp(const Config& cfg, ModelRange range, Communicator& dp) {
  return std::make_unique<Fsdp>(cfg, range, dp);
}

}  // namespace dtrain
