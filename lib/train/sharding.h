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
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "data/dataset.h"
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
std::vector<Bucket> make_buckets(const Model& m, int64_t bucket_floats);
// "0.02, 1.00, 1.53 MiB" (more than 8 buckets: "the largest 1.53 MiB"), for the log.
std::string bucket_sizes_mib(const std::vector<Bucket>& buckets);

using LayerRange = std::pair<size_t, size_t>;  // layers [first, last)
// Units covering all layers, in forward order. Layers without parameters join the unit before
// them (leading ones the first unit).
std::vector<LayerRange> units_from_buckets(const Model& m, const std::vector<Bucket>& buckets);
std::vector<LayerRange> units_for_fsdp(const Model& m, const FsdpConfig& cfg);

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
  ShardLayout(const Model& m, const std::vector<LayerRange>& units, int world);
  const std::vector<ShardUnit>& units() const { return units_; }
  int world() const { return world_; }
  int64_t shard_size() const { return shard_size_; }  // floats, padding included
  // Per-rank element counts of unit u (for reduce-scatter / all-gather).
  std::vector<size_t> counts(size_t u) const;
  // Rank r's ranges of the flat layout and where they sit in its shard buffer.
  std::vector<ShardRange> ranges(int r) const;
  // Copies rank r's chunks from a full-layout buffer into a shard buffer, and back.
  void full_to_shard(int r, const float* full, float* shard) const;
  void shard_to_full(int r, const float* shard, float* full) const;

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

enum class ShardMode { kZero1, kZero2, kFsdp };
ShardMode shard_mode(const std::string& strategy);  // zero1 | zero2 | fsdp
bool is_sharded_strategy(const std::string& strategy);

// Bytes this rank holds for training state (exact, from the buffers) and the peaks of transient
// buffers: gathered fsdp parameters and in-flight unit gradients.
struct StateMemory {
  int64_t param_bytes = 0, grad_bytes = 0, optim_bytes = 0;
  int64_t peak_gathered_bytes = 0, peak_unit_grad_bytes = 0;
};

// One rank's sharded training: the shard buffers and the collectives of each strategy.
//  zero1: parameters and gradients full (the caller's buffers); gradients all-reduced by the
//         caller as in DDP; the optimizer owns the shard; updated chunks are all-gathered.
//  zero2: parameters full; forward_backward reduce-scatters each unit's gradient as soon as
//         backward produced it and keeps only this rank's gradient shard.
//  fsdp:  parameters sharded too: each unit is all-gathered before its forward (the next one is
//         prefetched while the current computes), freed after forward when
//         reshard_after_forward, gathered again for backward; gradients as zero2.
// Collective: every rank calls every method in the same order (communicator.h's contract).
// Not thread-safe; one engine per rank.
class ShardedEngine {
 public:
  ShardedEngine(const Model& model, ShardLayout layout, ShardMode mode, Communicator& comm,
                bool reshard_after_forward);

  const ShardLayout& layout() const { return layout_; }
  ShardMode mode() const { return mode_; }
  // fsdp: this rank's parameter shard (the master copy). Empty for zero1/zero2.
  std::vector<float>& param_shard() { return param_shard_; }
  // zero2/fsdp: this rank's gradient shard. Empty for zero1.
  std::vector<float>& grad_shard() { return grad_shard_; }

  // zero2/fsdp: one micro-batch. Forward and backward unit by unit; each unit's gradient is
  // reduce-scattered (summed) and this rank's chunk added to grad_shard(). full_params: the
  // replicated parameters (zero2), null for fsdp. Returns the loss sum over x's rows, whose
  // gradient is scaled by `scale`.
  double forward_backward(const float* full_params, const Tensor& x, const int32_t* labels,
                          const std::string& loss, float scale, Activations& acts,
                          const ForwardCtx& ctx);
  // Sum over ranks of the squared gradient norm, this rank's part taken from full_grads (zero1)
  // or grad_shard(). Collective.
  double grad_norm(const float* full_grads);
  void scale_grads(float* full_grads, float f);
  // One optimizer step over this rank's shard (opt must cover shard_size() elements), then for
  // zero1/zero2 the updated chunks are all-gathered into full_params.
  void optimizer_step(Optimizer& opt, double lr, float* full_params, const float* full_grads);
  // fsdp evaluation: this rank evaluates rows [n r / W, n (r + 1) / W) of d in batches of
  // `batch`, the units gathered in lockstep with the other ranks (ranks with fewer batches still
  // join every gather). Returns (loss sum, correct count) of this rank's rows.
  std::pair<double, int64_t> eval_rows(const Dataset& d, int64_t batch, const std::string& loss);
  // Gathers the full parameters into out (param_count floats). Collective; for fsdp checkpoints
  // that need the whole model (consolidation) -- not used in training.
  void gather_full(float* out);

  StateMemory memory(const Optimizer& opt, int64_t full_param_count) const;
  double wait_seconds() const { return wait_s_; }  // time blocked on collectives

 private:
  void start_gather(size_t u);
  const float* wait_gather(size_t u);
  void release(size_t u);

  const Model& model_;
  ShardLayout layout_;
  ShardMode mode_;
  Communicator& comm_;
  bool reshard_;
  int rank_ = 0;
  std::vector<float> param_shard_, grad_shard_;
  std::vector<std::vector<float>> gathered_;  // per unit, empty when released
  std::vector<WorkPtr> gather_work_;
  std::vector<std::vector<float>> unit_grads_;
  std::vector<WorkPtr> rs_work_;
  Tensor dx_[2];
  int64_t gathered_now_ = 0, peak_gathered_ = 0, unit_grads_now_ = 0, peak_unit_grads_ = 0;
  double wait_s_ = 0.0;
};

}  // namespace dtrain
