#include "train/strategy.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "util/check.h"
#include "util/duration.h"

namespace dtrain {

ModelRange ModelRange::whole(const Model& m) {
  return layers(m, 0, m.num_layers());
}

ModelRange ModelRange::layers(const Model& m, size_t first, size_t last) {
  DT_CHECK_LE(first, last);
  DT_CHECK_LE(last, m.num_layers());
  ModelRange r;
  r.model = &m;
  r.first = first;
  r.last = last;
  r.begin = first < last ? m.layer_begin(first) : 0;
  r.end = first < last ? m.layer_end(last - 1) : 0;
  return r;
}

std::vector<ParamEntry> range_params(const ModelRange& r) {
  std::vector<ParamEntry> out;
  for (ParamEntry e : r.model->params()) {
    if (e.offset < r.begin || e.offset >= r.end) continue;
    e.offset -= r.begin;
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<FlatRange> decayed_ranges(const Model& m, WeightDecayOn on) {
  if (on == WeightDecayOn::kAll) return {{0, m.param_count()}};
  std::vector<FlatRange> out;
  for (const ParamEntry& e : m.params()) {
    if (e.shape.size() < 2 || e.numel == 0) continue;
    out.push_back({e.offset, e.offset + e.numel});
  }
  std::sort(out.begin(), out.end(),
            [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  std::vector<FlatRange> merged;
  for (const FlatRange& r : out) {
    if (!merged.empty() && merged.back().end >= r.begin) {
      merged.back().end = std::max(merged.back().end, r.end);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

std::unique_ptr<Strategy> make_strategy(const Config& cfg, ModelRange range, Communicator& dp) {
  const StrategyKind s = cfg.distributed.strategy;
  if (s == StrategyKind::kDdp || s == StrategyKind::kPipeline) return make_ddp(cfg, range, dp);
  if (s == StrategyKind::kLocalSgd) return make_local_sgd(cfg, range, dp);
  if (s == StrategyKind::kZero1) return make_zero1(cfg, range, dp);
  if (s == StrategyKind::kZero2) return make_zero2(cfg, range, dp);
  DT_CHECK_MSG(s == StrategyKind::kFsdp, "unknown strategy " << to_string(s));
  return make_fsdp(cfg, range, dp);
}

BucketAllReduce::BucketAllReduce(const Config& cfg, ModelRange range, Communicator& dp)
    : range_(range), dp_(dp), bucket_mb_(cfg.distributed.ddp.bucket_mb) {
  buckets_ = make_buckets(*range.model, bucket_cap_floats(cfg.distributed.ddp.bucket_mb),
                          range.first, range.last);
}

BucketAllReduce::~BucketAllReduce() {
  for (const WorkPtr& w : works_) settle_before_free(dp_, w);
}

std::function<void(size_t)> BucketAllReduce::on_layer_done(float* grads) {
  next_ = 0;
  for (const WorkPtr& w : works_) settle_before_free(dp_, w);  // (a step that failed midway)
  works_.clear();
  if (dp_.size() == 1) return {};
  return [this, grads](size_t layer) {
    while (next_ < buckets_.size() && buckets_[next_].first_layer == layer) {
      const Bucket& b = buckets_[next_++];
      works_.push_back(dp_.allreduce_async(grads + (b.begin - range_.begin),
                                           static_cast<size_t>(b.end - b.begin), ReduceOp::kSum));
    }
  };
}

double BucketAllReduce::wait() {
  if (dp_.size() == 1) return 0.0;
  DT_CHECK_EQ(next_, buckets_.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& w : works_) w->wait();
  works_.clear();
  return seconds_since(t0);
}

std::string BucketAllReduce::describe() const {
  return fmt::format(
      "{} gradient bucket(s) of at most {} MiB (a layer larger than that is a bucket of its "
      "own): {}",
      buckets_.size(), bucket_mb_, bucket_sizes_mib(buckets_));
}

}  // namespace dtrain
