// Data-parallel layouts over the flat parameter buffer: DDP gradient buckets, and the shards of
// the sharded strategies (zero1, zero2, fsdp) with the unit-wise forward/backward they need.
//
// Units. A unit is a run of consecutive layers, [first_layer, last_layer), and so a range of the
// flat layout, [begin, end). zero1 and zero2 use DDP's buckets as units (the granularity of
// their gradient collectives); fsdp uses distributed.fsdp.unit (one or more layers with
// parameters per unit, or the whole model).
//
// Shards. Within every unit, rank r owns the chunk [begin + r c, begin + (r + 1) c) clipped to
// the unit, c = ceil((end - begin) / W): sizes that W does not divide leave the last ranks a
// shorter (possibly empty) chunk, padded to c in the shard buffers (padding stays zero, so it
// never changes a norm or an update). A rank's shard buffer is its chunks of all units, one after
// another: unit u's chunk starts at shard offset sum of the earlier units' c. Collectives over a
// unit use the exact per-rank counts (reduce-scatter/all-gather with uneven counts).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "nn/model.h"
#include "optim/optimizer.h"

namespace dtrain {

// DDP gradient buckets: ranges of the flat gradient buffer in the order backward completes them
// (last layers first), cut at layer boundaries. Each holds at most bucket_floats, unless one
// layer alone is larger (that layer is then a bucket of its own), and as many layers as fit: a
// bucket closes when the next layer would take it over bucket_floats.
// A bucket is ready when backward has finished its lowest layer, `first_layer`.
struct Bucket {
  int64_t begin = 0, end = 0;
  size_t first_layer = 0;
};
// distributed.ddp.bucket_mb (> 0) as a cap in floats, at least 1; a cap past any model's size
// (2^62 floats) stays there instead of overflowing int64 (a bucket_mb of 1e15 made one bucket per
// layer).
int64_t bucket_cap_floats(double bucket_mb);
// Layers [first, last) only (a pipeline stage's); offsets stay those of the whole model.
std::vector<Bucket> make_buckets(const Model& m, int64_t bucket_floats, size_t first = 0,
                                 size_t last = SIZE_MAX);
// "0.02, 1.00, 1.53 MiB" (more than 8 buckets: "the largest 1.53 MiB"), for the log.
std::string bucket_sizes_mib(const std::vector<Bucket>& buckets);

using LayerRange = std::pair<size_t, size_t>;  // layers [first, last)
// Units covering layers [first, last) (all layers by default; a pipeline stage's), in forward
// order. Layers without parameters join the unit before them (leading ones the first unit).
std::vector<LayerRange> units_from_buckets(const Model& m, const std::vector<Bucket>& buckets,
                                           size_t first = 0, size_t last = SIZE_MAX);
std::vector<LayerRange> units_for_fsdp(const Model& m, const FsdpConfig& cfg, size_t first = 0,
                                       size_t last = SIZE_MAX);

struct ShardUnit {
  size_t first_layer = 0, last_layer = 0;
  int64_t begin = 0, end = 0;  // flat range
  int64_t chunk = 0;           // per-rank chunk (padded size)
  int64_t shard_offset = 0;    // start of every rank's chunk in its shard buffer
  int64_t size() const { return end - begin; }
  int64_t own_begin(int r) const { return std::min(end, begin + r * chunk); }
  int64_t own_end(int r) const { return std::min(end, begin + (r + 1) * chunk); }
};

class ShardLayout {
 public:
  // units: consecutive layer ranges (of the whole model or of a pipeline stage).
  ShardLayout(const Model& m, const std::vector<LayerRange>& units, int world);
  const std::vector<ShardUnit>& units() const { return units_; }
  int world() const { return world_; }
  int64_t shard_size() const { return shard_size_; }  // floats, padding included
  // Per-rank element counts of unit u (for reduce-scatter / all-gather).
  std::vector<size_t> counts(size_t u) const;
  // Rank r's ranges of the flat layout and where they sit in its shard buffer.
  std::vector<ShardRange> ranges(int r) const;
  // Copies rank r's chunks from a full-layout buffer into a shard buffer, and back. `full`
  // holds the flat layout from element `base` on (a stage's buffer: its first offset).
  void full_to_shard(int r, const float* full, float* shard, int64_t base = 0) const;
  void shard_to_full(int r, const float* shard, float* full, int64_t base = 0) const;

 private:
  std::vector<ShardUnit> units_;
  int world_ = 1;
  int64_t shard_size_ = 0;
};

// The non-finite guard (train.nonfinite): index into m.params() of the tensor holding the first
// NaN or infinity among `ranges` of the flat layout, stored in buf at their offsets; -1 when all
// are finite.
int64_t first_nonfinite_param(const Model& m, const float* buf,
                              const std::vector<ShardRange>& ranges);
// Verdict codes all ranks agree on by an all-reduce (min): kLossCode for a non-finite loss,
// 1 + param index for a gradient, kFiniteCode when all is finite.
inline constexpr float kLossCode = 0.0f;
inline constexpr float kFiniteCode = 1e9f;
// "the loss" | "the gradient of layers.0.weight" for a verdict code.
std::string nonfinite_what(const Model& m, float code);

// Bytes this rank holds for training state (exact, from the buffers) and the peaks of transient
// buffers: gathered fsdp parameters and in-flight unit gradients.
struct StateMemory {
  int64_t param_bytes = 0, grad_bytes = 0, optim_bytes = 0;
  int64_t peak_gathered_bytes = 0, peak_unit_grad_bytes = 0;
};

// Gradient a rank holds: span k is the gradient of flat elements [begin, end) of the whole
// model's layout, element begin at data[0]. Valid until the strategy's next call.
struct GradSpan {
  int64_t begin = 0, end = 0;
  float* data = nullptr;
};
struct HeldGrads {
  std::vector<GradSpan> spans;  // ascending, disjoint
  // True: the spans of the data axis's ranks partition the range, each element held by exactly
  // one rank (zero2, fsdp: their gradient shards); false: every rank of the axis holds the whole
  // range (ddp, zero1 and local_sgd: one span, the range).
  bool shards = false;
};

// The parts zero1, zero2 and fsdp share (train/zero1.cc, zero2.cc, fsdp.cc): the optimizer over
// this rank's shard and the reduce-scatter of each unit's gradient into the gradient shard.
// `dp` is the data axis's communicator; its size is the layout's world. Collective: every rank
// of the axis calls every method in the same order. Not thread-safe; one per rank.
class ShardedState {
 public:
  // `decayed`: the flat ranges weight decay applies to (decayed_ranges in train/strategy.h).
  ShardedState(ShardLayout layout, Communicator& dp, const OptimizerConfig& ocfg, bool grad_shard,
               const std::vector<FlatRange>& decayed);
  // Settles the unit reduce-scatters still in flight (settle_before_free): their buffers go.
  ~ShardedState();
  ShardedState(const ShardedState&) = delete;
  ShardedState& operator=(const ShardedState&) = delete;
  const ShardLayout& layout() const { return layout_; }
  Communicator& dp() { return dp_; }
  int rank() const { return rank_; }
  Optimizer& optimizer() { return *opt_; }
  const Optimizer& optimizer() const { return *opt_; }
  std::vector<float>& grad_shard() { return grad_shard_; }  // empty without one (zero1)
  const std::vector<float>& grad_shard() const { return grad_shard_; }
  // The gradient shard's non-empty chunks as spans of the flat layout (zero2, fsdp).
  HeldGrads held_grad_shard();

  // Unit u's gradient `g` (the unit's size, flat layout from units()[u].begin) is summed over
  // the axis; the call returns once at most kUnitsInFlight reduce-scatters are in flight (it
  // finishes unit u's previous one, those already done and then the oldest), so a rank holds
  // about that many units' full gradients, not the model's; collect_unit_grads() waits for all.
  // Finishing a unit adds this rank's chunk into grad_shard() (chunks of different units are
  // disjoint, and one unit's micro-batches are added in order: the order is immaterial).
  static constexpr size_t kUnitsInFlight = 2;
  void reduce_scatter_unit(size_t u, std::vector<float> g);
  void collect_unit_grads();
  // Squared L2 norm of the shard's gradient summed over the axis, this rank's part taken from
  // `full_grads` (zero1: the replicated gradient, flat layout from element `base`) or from
  // grad_shard(). Collective.
  double grad_sq_sum(const float* full_grads, int64_t base);
  void scale_grads(float* full_grads, int64_t base, float f);
  // One optimizer step over this rank's chunks: gradients from full_grads (zero1) or
  // grad_shard(), parameters in `params` (full layout from `base`, zero1/zero2) or in the
  // parameter shard `param_shard` (fsdp, then params is null). zero1/zero2 then all-gather the
  // updated chunks into params.
  void optimizer_step(double lr, float* params, int64_t base, const float* full_grads,
                      float* param_shard);

  // zero2/fsdp's backward through the range [x's layer, dy's layer] unit by unit in reverse: unit
  // u's gradient goes to reduce_scatter_unit as soon as its backward ends. params_of(u) gives
  // unit u's parameters (flat layout from units()[u].begin); before(u) runs before unit u's
  // backward (fsdp prefetches u - 1) and after(u) after it (fsdp frees u). dx as Model::backward.
  void backward(const Model& m, const std::function<const float*(size_t)>& params_of,
                const std::function<void(size_t)>& before, const std::function<void(size_t)>& after,
                const Tensor& x, Activations& acts, const Tensor& dy, Tensor* dx);

  double wait_seconds() const { return wait_s_; }
  void add_wait(double s) { wait_s_ += s; }
  int64_t peak_unit_grad_bytes() const { return peak_unit_grads_; }

 private:
  void finish_unit(size_t u);

  ShardLayout layout_;
  Communicator& dp_;
  int rank_ = 0;
  std::unique_ptr<Optimizer> opt_;
  std::vector<float> grad_shard_;
  std::vector<std::vector<float>> unit_grads_;  // in flight, per unit
  std::vector<WorkPtr> rs_work_;
  std::deque<size_t> in_flight_;  // units with a reduce-scatter in flight, oldest first
  Tensor dx_[2];                  // activation gradients between units
  int64_t unit_grads_now_ = 0, peak_unit_grads_ = 0;
  double wait_s_ = 0.0;
};

}  // namespace dtrain
