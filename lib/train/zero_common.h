// What zero1 and zero2 share (train/zero1.cc, train/zero2.cc): replicated parameters over the
// range and the optimizer state sharded along DDP's buckets (ShardedState). The subclasses add
// how gradients are reduced.
#pragma once

#include <string>
#include <vector>

#include <fmt/format.h>

#include "train/strategy.h"
#include "util/check.h"

namespace dtrain {

class ZeroBase : public Strategy {
 public:
  ZeroBase(const Config& cfg, ModelRange range, Communicator& dp, bool grad_shard)
      : r_(range),
        dp_(dp),
        values_(static_cast<size_t>(range.size())),
        ss_(ShardLayout(*range.model,
                        units_from_buckets(*range.model, BucketAllReduce(cfg, range, dp).buckets(),
                                           range.first, range.last),
                        dp.size()),
            dp, cfg.optimizer, grad_shard,
            decayed_ranges(*range.model, cfg.optimizer.weight_decay_on)) {}

  std::string describe() const override {
    return fmt::format("{}: {} unit(s), {} of {} parameters per rank (shard, padding included)",
                       name(), ss_.layout().units().size(), ss_.layout().shard_size(), r_.size());
  }
  void init_params(uint64_t seed) override {
    r_.model->init(values_.data(), seed, r_.first, r_.last, r_.begin);
    // Every rank starts from the axis's rank 0 parameters, whatever its seed.
    dp_.broadcast(values_.data(), values_.size(), 0);
  }
  void load_full(const float* params, const std::vector<const float*>& state) override {
    std::copy(params + r_.begin, params + r_.end, values_.begin());
    DT_CHECK_EQ(state.size(), ss_.optimizer().state_names().size());
    for (size_t i = 0; i < state.size(); ++i)
      ss_.layout().full_to_shard(ss_.rank(), state[i], ss_.optimizer().state(i).data());
  }
  std::vector<std::string> state_names() const override { return ss_.optimizer().state_names(); }
  bool sharded() const override { return true; }
  CheckpointShard checkpoint_shard() override {
    const ShardLayout& L = ss_.layout();
    shard_tmp_.assign(static_cast<size_t>(L.shard_size()), 0.0f);
    L.full_to_shard(ss_.rank(), values_.data(), shard_tmp_.data(), r_.begin);
    CheckpointShard s{L.ranges(ss_.rank()), L.shard_size(), shard_tmp_.data(), {}};
    for (size_t i = 0; i < state_names().size(); ++i)
      s.state.push_back(ss_.optimizer().state(i).data());
    return s;
  }
  Optimizer& optimizer() override { return ss_.optimizer(); }
  const Tensor& forward(const Tensor& x, Activations& acts, const ForwardCtx& ctx) override {
    return r_.model->forward(values_.data(), x, acts, ctx, r_.first, r_.last, r_.begin);
  }

 protected:
  ModelRange r_;
  Communicator& dp_;
  std::vector<float> values_, shard_tmp_;
  ShardedState ss_;
};

}  // namespace dtrain
