// Tensor parallelism in the training loop (train/tp_train.h).
#include "train/tp_train.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "optim/optimizer.h"
#include "util/check.h"
#include "util/duration.h"

namespace dtrain {

void GridTensorGroup::allreduce_sum(float* data, size_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  c_.allreduce(data, n, ReduceOp::kSum);
  wait_s_ += seconds_since(t0);
}

TensorParallel::TensorParallel(const Model& local, Model global, Communicator& tp)
    : local_(local), global_(std::move(global)), tp_(tp), group_(tp) {
  DT_CHECK_GT(tp.size(), 1);
  pieces_ = tp_pieces(local_, global_, tp.rank(), tp.size());
  table_ = tp_shard_table(local_, tp.rank(), tp.size());
  std::vector<bool> mirror(local_.params().size(), false);
  for (const TiedParam& t : local_.ties()) mirror[t.mirror] = true;
  for (size_t i = 0; i < table_.size(); ++i) {
    if (table_[i].dim >= 0 || mirror[i]) continue;
    const ParamEntry& e = local_.params()[i];
    if (!counted_once_.empty() && counted_once_.back().end == e.offset)
      counted_once_.back().end = e.offset + e.numel;
    else
      counted_once_.push_back({e.offset, e.offset + e.numel});
  }
}

double TensorParallel::global_sq(double ss, const HeldGrads& held, Communicator& dp) {
  // r: the replicated parameters' part of ss, from the spans this rank holds.
  double r = 0.0;
  for (const GradSpan& s : held.spans)
    for (const FlatRange& c : counted_once_) {
      const int64_t lo = std::max(s.begin, c.begin), hi = std::min(s.end, c.end);
      if (lo < hi) r += sum_squares(s.data + (lo - s.begin), hi - lo);
    }
  // Doubles throughout: see ShardedState::grad_sq_sum.
  if (held.shards && dp.size() > 1) r = dp.allreduce_sum(r);
  return tp_.allreduce_sum(tp_.rank() == 0 ? ss : ss - r);
}

std::vector<ShardRange> TensorParallel::global_ranges(const std::vector<ShardRange>& local) const {
  std::vector<ShardRange> out;
  for (const ShardRange& r : local)
    for (const TpRange& g : tp_global_ranges(pieces_, r.begin, r.end, tp_.rank() != 0))
      out.push_back({g.gbegin, g.gend, r.offset + (g.lbegin - r.begin)});
  return out;
}

nlohmann::json TensorParallel::describe_shards(int tp_rank) const {
  nlohmann::json a = nlohmann::json::array();
  for (const TpShard& s : table_)
    if (s.dim >= 0)
      a.push_back({{"name", s.name},
                   {"dim", s.dim},
                   {"offset", tp_rank * s.extent},
                   {"extent", s.extent},
                   {"chunks", s.chunks},
                   {"global_shape", s.global},
                   {"kind", s.dim == 0 ? "column" : "row"}});
  return a;
}

}  // namespace dtrain
