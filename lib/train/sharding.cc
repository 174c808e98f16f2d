#include "train/sharding.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "optim/optimizer.h"
#include "train/batch.h"
#include "util/check.h"

namespace dtrain {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Extends unit boundaries so that layers without parameters belong to the unit before them and
// the units cover [0, num_layers).
std::vector<LayerRange> cover_all_layers(const Model& m, std::vector<size_t> starts) {
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  std::vector<LayerRange> out;
  if (m.num_layers() == 0) return out;
  if (starts.empty() || starts[0] != 0) starts.insert(starts.begin(), 0);
  for (size_t i = 0; i < starts.size(); ++i)
    out.emplace_back(starts[i], i + 1 < starts.size() ? starts[i + 1] : m.num_layers());
  return out;
}

}  // namespace

std::vector<Bucket> make_buckets(const Model& m, int64_t bucket_floats) {
  std::vector<Bucket> out;
  Bucket cur;
  bool open = false;
  for (size_t i = m.num_layers(); i-- > 0;) {
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

std::vector<LayerRange> units_from_buckets(const Model& m, const std::vector<Bucket>& buckets) {
  std::vector<size_t> starts;
  for (const Bucket& b : buckets) starts.push_back(b.first_layer);
  return cover_all_layers(m, starts);
}

std::vector<LayerRange> units_for_fsdp(const Model& m, const FsdpConfig& cfg) {
  if (cfg.unit == "model") return cover_all_layers(m, {0});
  DT_CHECK_GE(cfg.layers_per_unit, 1);
  std::vector<size_t> starts;
  int64_t in_unit = 0;
  for (size_t i = 0; i < m.num_layers(); ++i) {
    if (m.layer_end(i) == m.layer_begin(i)) continue;
    if (in_unit == 0) starts.push_back(i);
    if (++in_unit == cfg.layers_per_unit) in_unit = 0;
  }
  return cover_all_layers(m, starts);
}

ShardLayout::ShardLayout(const Model& m, const std::vector<LayerRange>& units, int world)
    : world_(world) {
  DT_CHECK_GE(world, 1);
  size_t next = 0;
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
  DT_CHECK_EQ(next, m.num_layers());
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

void ShardLayout::full_to_shard(int r, const float* full, float* shard) const {
  for (const auto& u : units_)
    std::copy(full + u.own_begin(r), full + u.own_end(r), shard + u.shard_offset);
}

void ShardLayout::shard_to_full(int r, const float* shard, float* full) const {
  for (const auto& u : units_)
    std::copy(shard + u.shard_offset, shard + u.shard_offset + (u.own_end(r) - u.own_begin(r)),
              full + u.own_begin(r));
}

namespace {

// True when buf[0, n) holds a NaN or infinity: x * 0 is 0 for finite x and NaN otherwise; eight
// independent lanes so the loop vectorises without reassociating.
bool any_nonfinite(const float* buf, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += buf[i + k] * 0.0f;
  for (; i < n; ++i) acc[0] += buf[i] * 0.0f;
  float t = 0.0f;
  for (float a : acc) t += a;
  return std::isnan(t);
}

}  // namespace

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

ShardMode shard_mode(const std::string& strategy) {
  if (strategy == "zero1") return ShardMode::kZero1;
  if (strategy == "zero2") return ShardMode::kZero2;
  DT_CHECK_MSG(strategy == "fsdp", "not a sharded strategy: " << strategy);
  return ShardMode::kFsdp;
}

bool is_sharded_strategy(const std::string& s) {
  return s == "zero1" || s == "zero2" || s == "fsdp";
}

ShardedEngine::ShardedEngine(const Model& model, ShardLayout layout, ShardMode mode,
                             Communicator& comm, bool reshard_after_forward)
    : model_(model),
      layout_(std::move(layout)),
      mode_(mode),
      comm_(comm),
      reshard_(reshard_after_forward),
      rank_(comm.rank()) {
  DT_CHECK_EQ(layout_.world(), comm.size());
  const size_t S = static_cast<size_t>(layout_.shard_size());
  if (mode_ == ShardMode::kFsdp) param_shard_.assign(S, 0.0f);
  if (mode_ != ShardMode::kZero1) grad_shard_.assign(S, 0.0f);
  gathered_.resize(layout_.units().size());
  gather_work_.resize(layout_.units().size());
  unit_grads_.resize(layout_.units().size());
  rs_work_.resize(layout_.units().size());
}

void ShardedEngine::start_gather(size_t u) {
  if (!gathered_[u].empty() || gather_work_[u]) return;  // held or on its way
  const ShardUnit& x = layout_.units()[u];
  std::vector<float>& buf = gathered_[u];
  buf.resize(static_cast<size_t>(x.size()));
  const int64_t own = x.own_end(rank_) - x.own_begin(rank_);
  std::copy(param_shard_.begin() + x.shard_offset, param_shard_.begin() + x.shard_offset + own,
            buf.begin() + (x.own_begin(rank_) - x.begin));
  gathered_now_ += x.size() * 4;
  peak_gathered_ = std::max(peak_gathered_, gathered_now_);
  gather_work_[u] = comm_.allgather_inplace_async(buf.data(), layout_.counts(u));
}

const float* ShardedEngine::wait_gather(size_t u) {
  start_gather(u);
  if (gather_work_[u]) {
    const auto t0 = Clock::now();
    gather_work_[u]->wait();
    wait_s_ += seconds_since(t0);
    gather_work_[u].reset();
  }
  return gathered_[u].data();
}

void ShardedEngine::release(size_t u) {
  if (gather_work_[u]) {  // never free a buffer the communication thread still writes
    gather_work_[u]->wait();
    gather_work_[u].reset();
  }
  if (gathered_[u].empty()) return;
  gathered_now_ -= static_cast<int64_t>(gathered_[u].size()) * 4;
  std::vector<float>().swap(gathered_[u]);
}

double ShardedEngine::forward_backward(const float* full_params, const Tensor& x,
                                       const int32_t* labels, const std::string& loss, float scale,
                                       Activations& acts, const ForwardCtx& ctx) {
  DT_CHECK(mode_ != ShardMode::kZero1);
  const bool fsdp = mode_ == ShardMode::kFsdp;
  const auto& units = layout_.units();
  const size_t U = units.size();
  auto params_of = [&](size_t u) -> const float* {
    return fsdp ? wait_gather(u) : full_params + units[u].begin;
  };
  auto input_of = [&](size_t u) -> const Tensor& {
    return u == 0 ? x : acts.out[units[u].first_layer - 1];
  };
  // Forward, prefetching the next unit while this one computes.
  const Tensor* out = &x;
  for (size_t u = 0; u < U; ++u) {
    if (fsdp && u + 1 < U) start_gather(u + 1);
    out = &model_.forward(params_of(u), input_of(u), acts, ctx, units[u].first_layer,
                          units[u].last_layer, units[u].begin);
    if (fsdp && reshard_ && u + 1 < U) release(u);
  }
  Tensor dlogits;
  const double loss_sum = loss_and_grad(loss, *out, labels, &dlogits, scale);
  // Backward in reverse; each unit's gradient is reduce-scattered while the next computes.
  const Tensor* dy = &dlogits;
  for (size_t u = U; u-- > 0;) {
    if (fsdp && u > 0) start_gather(u - 1);
    const float* p = params_of(u);
    std::vector<float>& g = unit_grads_[u];
    g.assign(static_cast<size_t>(units[u].size()), 0.0f);
    unit_grads_now_ += units[u].size() * 4;
    peak_unit_grads_ = std::max(peak_unit_grads_, unit_grads_now_);
    Tensor* dx = u == 0 ? nullptr : &dx_[u % 2];
    model_.backward(p, g.data(), input_of(u), acts, *dy, dx, units[u].first_layer,
                    units[u].last_layer, {}, units[u].begin);
    if (fsdp) release(u);
    rs_work_[u] = comm_.reduce_scatter_inplace_async(g.data(), layout_.counts(u), ReduceOp::kSum);
    dy = dx;
  }
  const auto t0 = Clock::now();
  for (size_t u = 0; u < U; ++u) {
    rs_work_[u]->wait();
    rs_work_[u].reset();
    const ShardUnit& su = units[u];
    const float* mine = unit_grads_[u].data() + (su.own_begin(rank_) - su.begin);
    float* dst = grad_shard_.data() + su.shard_offset;
    const int64_t n = su.own_end(rank_) - su.own_begin(rank_);
    for (int64_t i = 0; i < n; ++i) dst[i] += mine[i];
    unit_grads_now_ -= su.size() * 4;
    std::vector<float>().swap(unit_grads_[u]);
  }
  wait_s_ += seconds_since(t0);
  return loss_sum;
}

double ShardedEngine::grad_norm(const float* full_grads) {
  double ss = 0.0;
  if (mode_ == ShardMode::kZero1) {
    for (const auto& u : layout_.units())
      ss += sum_squares(full_grads + u.own_begin(rank_), u.own_end(rank_) - u.own_begin(rank_));
  } else {
    ss = sum_squares(grad_shard_.data(), static_cast<int64_t>(grad_shard_.size()));
  }
  // Partial sums travel as float (the collectives are float); the norm is a clipping threshold,
  // so float precision of the sum is ample.
  float v = static_cast<float>(ss);
  comm_.allreduce(&v, 1, ReduceOp::kSum);
  return std::sqrt(static_cast<double>(v));
}

void ShardedEngine::scale_grads(float* full_grads, float f) {
  if (mode_ == ShardMode::kZero1) {
    for (const auto& u : layout_.units())
      scale_inplace(full_grads + u.own_begin(rank_), u.own_end(rank_) - u.own_begin(rank_), f);
  } else {
    scale_inplace(grad_shard_.data(), static_cast<int64_t>(grad_shard_.size()), f);
  }
}

void ShardedEngine::optimizer_step(Optimizer& opt, double lr, float* full_params,
                                   const float* full_grads) {
  DT_CHECK_EQ(opt.size(), layout_.shard_size());
  opt.begin_step();
  for (const auto& u : layout_.units()) {
    const int64_t lo = u.own_begin(rank_), n = u.own_end(rank_) - lo;
    if (n == 0) continue;
    const float* g =
        mode_ == ShardMode::kZero1 ? full_grads + lo : grad_shard_.data() + u.shard_offset;
    float* p = mode_ == ShardMode::kFsdp ? param_shard_.data() + u.shard_offset : full_params + lo;
    opt.update_slice(p, g, u.shard_offset, n, lr);
  }
  if (mode_ == ShardMode::kFsdp) return;
  // zero1/zero2: every rank updated its chunks; gather them into the replicated parameters.
  std::vector<WorkPtr> works;
  for (size_t u = 0; u < layout_.units().size(); ++u)
    works.push_back(
        comm_.allgather_inplace_async(full_params + layout_.units()[u].begin, layout_.counts(u)));
  const auto t0 = Clock::now();
  for (auto& w : works) w->wait();
  wait_s_ += seconds_since(t0);
}

std::pair<double, int64_t> ShardedEngine::eval_rows(const Dataset& d, int64_t batch,
                                                    const std::string& loss) {
  DT_CHECK(mode_ == ShardMode::kFsdp);
  DT_CHECK_GT(batch, 0);
  const int W = layout_.world();
  const int64_t n = d.rows;
  auto share = [&](int r) { return std::make_pair(n * r / W, n * (r + 1) / W); };
  int64_t max_batches = 0;
  for (int r = 0; r < W; ++r) {
    const auto [lo, hi] = share(r);
    max_batches = std::max(max_batches, (hi - lo + batch - 1) / batch);
  }
  const auto [lo, hi] = share(rank_);
  const auto& units = layout_.units();
  Activations acts;
  Tensor x;
  std::vector<int32_t> y;
  std::vector<int64_t> idx;
  ForwardCtx ctx{.training = false, .rng = nullptr};
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t j = 0; j < max_batches; ++j) {
    const int64_t start = lo + j * batch;
    const bool have = start < hi;
    if (have) {
      const int64_t m = std::min(batch, hi - start);
      idx.resize(static_cast<size_t>(m));
      for (int64_t i = 0; i < m; ++i) idx[static_cast<size_t>(i)] = start + i;
      gather_rows(d, idx, x, y);
    }
    const Tensor* out = &x;
    for (size_t u = 0; u < units.size(); ++u) {
      if (u + 1 < units.size()) start_gather(u + 1);
      const float* p = wait_gather(u);
      if (have)
        out = &model_.forward(p, *out, acts, ctx, units[u].first_layer, units[u].last_layer,
                              units[u].begin);
      release(u);
    }
    if (have) {
      loss_sum += loss_and_grad(loss, *out, y.data(), nullptr, 1.0f);
      correct += count_correct(*out, y.data());
    }
  }
  return {loss_sum, correct};
}

void ShardedEngine::gather_full(float* out) {
  for (size_t u = 0; u < layout_.units().size(); ++u) {
    const float* p = wait_gather(u);
    std::copy(p, p + layout_.units()[u].size(), out + layout_.units()[u].begin);
    release(u);
  }
}

StateMemory ShardedEngine::memory(const Optimizer& opt, int64_t full_param_count) const {
  StateMemory m;
  m.param_bytes = mode_ == ShardMode::kFsdp ? static_cast<int64_t>(param_shard_.size()) * 4
                                            : full_param_count * 4;
  m.grad_bytes = mode_ == ShardMode::kZero1 ? full_param_count * 4
                                            : static_cast<int64_t>(grad_shard_.size()) * 4;
  m.optim_bytes = opt.state_bytes();
  m.peak_gathered_bytes = peak_gathered_;
  m.peak_unit_grad_bytes = peak_unit_grads_;
  return m;
}

}  // namespace dtrain
