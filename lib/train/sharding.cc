#include "train/sharding.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "optim/optimizer.h"
#include "train/batch.h"
#include "util/check.h"
#include "util/duration.h"

namespace dtrain {

namespace {

using Clock = std::chrono::steady_clock;

// Extends unit boundaries so that layers without parameters belong to the unit before them and
// the units cover [first, last); layers without parameters before the first start join the first
// unit (a unit of their own held no parameters: an FSDP unit that gathers nothing, a pipeline
// stage of a flatten alone).
std::vector<LayerRange> cover_layers(std::vector<size_t> starts, size_t first, size_t last) {
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  std::vector<LayerRange> out;
  if (first >= last) return out;
  if (starts.empty())
    starts.push_back(first);
  else
    starts[0] = first;
  for (size_t i = 0; i < starts.size(); ++i)
    out.emplace_back(starts[i], i + 1 < starts.size() ? starts[i + 1] : last);
  return out;
}

}  // namespace

int64_t bucket_cap_floats(double bucket_mb) {
  const double floats = std::min(bucket_mb * 262144.0, 0x1p62);  // 262,144 floats per MiB
  return std::max<int64_t>(1, static_cast<int64_t>(floats));
}

std::vector<Bucket> make_buckets(const Model& m, int64_t bucket_floats, size_t first, size_t last) {
  last = std::min(last, m.num_layers());
  std::vector<Bucket> out;
  Bucket cur;
  bool open = false;
  for (size_t i = last; i-- > first;) {
    if (m.layer_end(i) == m.layer_begin(i)) continue;  // no parameters
    // Close the open bucket rather than let this layer take it over the cap.
    if (open && cur.end - m.layer_begin(i) > bucket_floats) {
      out.push_back(cur);
      open = false;
    }
    if (!open) {
      cur = Bucket{m.layer_begin(i), m.layer_end(i), i};
      open = true;
    }
    cur.begin = m.layer_begin(i);
    cur.first_layer = i;
    if (cur.end - cur.begin >= bucket_floats) {  // full (or one layer over the cap alone)
      out.push_back(cur);
      open = false;
    }
  }
  if (open) out.push_back(cur);
  return out;
}

std::string bucket_sizes_mib(const std::vector<Bucket>& buckets) {
  auto mib = [](const Bucket& b) { return static_cast<double>(b.end - b.begin) * 4 / 1048576.0; };
  if (buckets.size() > 8) {
    double largest = 0.0;
    for (const Bucket& b : buckets) largest = std::max(largest, mib(b));
    return fmt::format("the largest {:.2f} MiB", largest);
  }
  std::string out;
  for (const Bucket& b : buckets) out += fmt::format("{}{:.2f}", out.empty() ? "" : ", ", mib(b));
  return out + " MiB";
}

std::vector<LayerRange> units_from_buckets(const Model& m, const std::vector<Bucket>& buckets,
                                           size_t first, size_t last) {
  last = std::min(last, m.num_layers());
  std::vector<size_t> starts;
  for (const Bucket& b : buckets)
    if (b.first_layer >= first && b.first_layer < last) starts.push_back(b.first_layer);
  return cover_layers(starts, first, last);
}

std::vector<LayerRange> units_for_fsdp(const Model& m, const FsdpConfig& cfg, size_t first,
                                       size_t last) {
  last = std::min(last, m.num_layers());
  if (cfg.unit == FsdpUnit::kModel) return cover_layers({first}, first, last);
  DT_CHECK_GE(cfg.layers_per_unit, 1);
  std::vector<size_t> starts;
  int64_t in_unit = 0;
  for (size_t i = first; i < last; ++i) {
    if (m.layer_end(i) == m.layer_begin(i)) continue;
    if (in_unit == 0) starts.push_back(i);
    if (++in_unit == cfg.layers_per_unit) in_unit = 0;
  }
  return cover_layers(starts, first, last);
}

ShardLayout::ShardLayout(const Model& m, const std::vector<LayerRange>& units, int world)
    : world_(world) {
  DT_CHECK_GE(world, 1);
  size_t next = units.empty() ? 0 : units[0].first;
  for (const auto& [first, last] : units) {
    DT_CHECK_EQ(first, next);
    DT_CHECK_LT(first, last);
    ShardUnit u;
    u.first_layer = first;
    u.last_layer = last;
    u.begin = m.layer_begin(first);
    u.end = m.layer_end(last - 1);
    u.chunk = (u.size() + world - 1) / world;
    u.shard_offset = shard_size_;
    shard_size_ += u.chunk;
    units_.push_back(u);
    next = last;
  }
  DT_CHECK_LE(next, m.num_layers());
}

std::vector<size_t> ShardLayout::counts(size_t u) const {
  const ShardUnit& x = units_[u];
  std::vector<size_t> c(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r)
    c[static_cast<size_t>(r)] = static_cast<size_t>(x.own_end(r) - x.own_begin(r));
  return c;
}

std::vector<ShardRange> ShardLayout::ranges(int r) const {
  std::vector<ShardRange> out;
  for (const auto& u : units_)
    if (u.own_end(r) > u.own_begin(r))
      out.push_back({u.own_begin(r), u.own_end(r), u.shard_offset});
  return out;
}

void ShardLayout::full_to_shard(int r, const float* full, float* shard, int64_t base) const {
  for (const auto& u : units_)
    std::copy(full + (u.own_begin(r) - base), full + (u.own_end(r) - base), shard + u.shard_offset);
}

void ShardLayout::shard_to_full(int r, const float* shard, float* full, int64_t base) const {
  for (const auto& u : units_)
    std::copy(shard + u.shard_offset, shard + u.shard_offset + (u.own_end(r) - u.own_begin(r)),
              full + (u.own_begin(r) - base));
}

// any_nonfinite: optim/optimizer.h.
int64_t first_nonfinite_param(const Model& m, const float* buf,
                              const std::vector<ShardRange>& ranges) {
  int64_t best = -1;
  for (const auto& r : ranges) {
    if (!any_nonfinite(buf + r.offset, r.end - r.begin)) continue;
    for (size_t e = 0; e < m.params().size(); ++e) {
      const ParamEntry& p = m.params()[e];
      const int64_t lo = std::max(r.begin, p.offset), hi = std::min(r.end, p.offset + p.numel);
      if (lo >= hi) continue;
      if (any_nonfinite(buf + r.offset + (lo - r.begin), hi - lo)) {
        if (best < 0 || static_cast<int64_t>(e) < best) best = static_cast<int64_t>(e);
        break;
      }
    }
  }
  return best;
}

std::string nonfinite_what(const Model& m, float code) {
  if (code == kLossCode) return "the loss";
  const auto e = static_cast<size_t>(code) - 1;
  if (code >= kFiniteCode || e >= m.params().size()) return "nothing";
  return "the gradient of " + m.params()[e].name;
}

ShardedState::ShardedState(ShardLayout layout, Communicator& dp, const OptimizerConfig& ocfg,
                           bool grad_shard, const std::vector<FlatRange>& decayed)
    : layout_(std::move(layout)), dp_(dp), rank_(dp.rank()) {
  DT_CHECK_EQ(layout_.world(), dp.size());
  std::vector<StatePiece> pieces;
  for (const ShardRange& r : layout_.ranges(rank_)) pieces.push_back({r.begin, r.end, r.offset});
  opt_ = make_optimizer(ocfg, layout_.shard_size(), pieces, decayed);
  if (grad_shard) grad_shard_.assign(static_cast<size_t>(layout_.shard_size()), 0.0f);
  unit_grads_.resize(layout_.units().size());
  rs_work_.resize(layout_.units().size());
}

ShardedState::~ShardedState() {
  for (const WorkPtr& w : rs_work_) settle_before_free(dp_, w);
}

void ShardedState::reduce_scatter_unit(size_t u, std::vector<float> g) {
  DT_CHECK_EQ(static_cast<int64_t>(g.size()), layout_.units()[u].size());
  const auto t0 = Clock::now();
  if (rs_work_[u]) finish_unit(u);  // the previous micro-batch's (a pipeline's backwards follow)
  unit_grads_[u] = std::move(g);
  unit_grads_now_ += layout_.units()[u].size() * 4;
  peak_unit_grads_ = std::max(peak_unit_grads_, unit_grads_now_);
  rs_work_[u] =
      dp_.reduce_scatter_inplace_async(unit_grads_[u].data(), layout_.counts(u), ReduceOp::kSum);
  in_flight_.push_back(u);
  // (collectives complete in call order: the oldest is the first to be done)
  while (!in_flight_.empty() &&
         (in_flight_.size() > kUnitsInFlight || rs_work_[in_flight_.front()]->done()))
    finish_unit(in_flight_.front());
  wait_s_ += seconds_since(t0);
}

void ShardedState::backward(const Model& m, const std::function<const float*(size_t)>& params_of,
                            const std::function<void(size_t)>& before,
                            const std::function<void(size_t)>& after, const Tensor& x,
                            Activations& acts, const Tensor& dy, Tensor* dx) {
  const auto& units = layout_.units();
  const size_t first_layer = units.front().first_layer;
  const Tensor* d = &dy;
  for (size_t u = units.size(); u-- > 0;) {
    const ShardUnit& su = units[u];
    if (before) before(u);
    const float* p = params_of(u);
    std::vector<float> g(static_cast<size_t>(su.size()), 0.0f);
    Tensor* out = u == 0 ? dx : &dx_[u % 2];
    const Tensor& in = su.first_layer == first_layer ? x : acts.out[su.first_layer - 1];
    m.backward(p, g.data(), in, acts, *d, out, su.first_layer, su.last_layer, {}, su.begin);
    if (after) after(u);
    reduce_scatter_unit(u, std::move(g));
    d = out;
  }
}

void ShardedState::finish_unit(size_t u) {
  rs_work_[u]->wait();
  rs_work_[u].reset();
  std::erase(in_flight_, u);
  const ShardUnit& su = layout_.units()[u];
  const float* mine = unit_grads_[u].data() + (su.own_begin(rank_) - su.begin);
  float* dst = grad_shard_.data() + su.shard_offset;
  const int64_t n = su.own_end(rank_) - su.own_begin(rank_);
  for (int64_t i = 0; i < n; ++i) dst[i] += mine[i];
  unit_grads_now_ -= su.size() * 4;
  std::vector<float>().swap(unit_grads_[u]);
}

void ShardedState::collect_unit_grads() {
  const auto t0 = Clock::now();
  for (size_t u = 0; u < layout_.units().size(); ++u)
    if (rs_work_[u]) finish_unit(u);
  wait_s_ += seconds_since(t0);
}

HeldGrads ShardedState::held_grad_shard() {
  DT_CHECK(!grad_shard_.empty() || layout_.shard_size() == 0);
  HeldGrads h;
  h.shards = true;
  for (const ShardUnit& u : layout_.units())
    if (u.own_end(rank_) > u.own_begin(rank_))
      h.spans.push_back(
          {u.own_begin(rank_), u.own_end(rank_), grad_shard_.data() + u.shard_offset});
  return h;
}

double ShardedState::grad_sq_sum(const float* full_grads, int64_t base) {
  double ss = 0.0;
  if (grad_shard_.empty()) {
    for (const auto& u : layout_.units())
      ss += sum_squares(full_grads + (u.own_begin(rank_) - base),
                        u.own_end(rank_) - u.own_begin(rank_));
  } else {
    ss = sum_squares(grad_shard_.data(), static_cast<int64_t>(grad_shard_.size()));
  }
  // As a double: a float would overflow past a norm of 1.8e19 and clip every gradient to zero.
  return dp_.allreduce_sum(ss);
}

void ShardedState::scale_grads(float* full_grads, int64_t base, float f) {
  if (grad_shard_.empty()) {
    for (const auto& u : layout_.units())
      scale_inplace(full_grads + (u.own_begin(rank_) - base), u.own_end(rank_) - u.own_begin(rank_),
                    f);
  } else {
    scale_inplace(grad_shard_.data(), static_cast<int64_t>(grad_shard_.size()), f);
  }
}

void ShardedState::optimizer_step(double lr, float* params, int64_t base, const float* full_grads,
                                  float* param_shard) {
  opt_->begin_step();
  for (const auto& u : layout_.units()) {
    const int64_t lo = u.own_begin(rank_), n = u.own_end(rank_) - lo;
    if (n == 0) continue;
    const float* g =
        grad_shard_.empty() ? full_grads + (lo - base) : grad_shard_.data() + u.shard_offset;
    float* p = param_shard ? param_shard + u.shard_offset : params + (lo - base);
    opt_->update_slice(p, g, u.shard_offset, n, lr);
  }
  if (param_shard) return;
  // zero1/zero2: every rank updated its chunks; gather them into the replicated parameters.
  std::vector<WorkPtr> works;
  const SettleOnExit settle(dp_, works);  // (a failed wait leaves the later gathers in flight)
  for (size_t u = 0; u < layout_.units().size(); ++u)
    works.push_back(
        dp_.allgather_inplace_async(params + (layout_.units()[u].begin - base), layout_.counts(u)));
  const auto t0 = Clock::now();
  for (auto& w : works) w->wait();
  wait_s_ += seconds_since(t0);
}

}  // namespace dtrain
