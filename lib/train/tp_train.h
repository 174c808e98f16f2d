// What the training loop adds for tensor parallelism (distributed.tensor_parallel, nn/tp_gpt.h):
// the layers' all-reduce over the rank grid's tensor axis, the whole (T = 1) model that
// checkpoints and resumes are written in, and the global gradient norm.
//
// Checkpoints of a tensor-parallel run are sharded folders in the whole model's flat layout:
// each rank writes its own shard buffer (its strategy's checkpoint_shard(), in its local
// layout), and the manifest lists the whole-layout ranges that buffer fills -- a column
// shard is one range per chunk, a row shard one per row of the whole weight; a replicated
// tensor is listed by tensor rank 0 only -- plus, per shard, the tensors it holds a slice of
// (name, dimension, offset, extent, chunks, global shape). Any layout (TP, DP, PP) then reads
// it with the ordinary loader into the whole layout and slices its own shards out, and
// `dtrain checkpoint consolidate` writes the ordinary nanoGPT-named file.
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "nn/model.h"
#include "nn/tp_gpt.h"
#include "train/sharding.h"

namespace dtrain {

// The tensor axis's communicator as the layers' TensorGroup.
class GridTensorGroup final : public TensorGroup {
 public:
  explicit GridTensorGroup(Communicator& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  void allreduce_sum(float* data, size_t n) override;
  // Seconds spent in allreduce_sum so far: the layers block in it (forward and backward), so
  // all of it is communication the step waits for (exposed_comm_s).
  double wait_seconds() const { return wait_s_; }

 private:
  Communicator& c_;
  double wait_s_ = 0.0;
};

class TensorParallel {
 public:
  // local: this tensor rank's model (build_gpt with tp_size > 1); global: the same config's
  // T = 1 model; tp: the tensor axis.
  TensorParallel(const Model& local, Model global, Communicator& tp);

  const Model& global() const { return global_; }
  TensorGroup* group() { return &group_; }
  double wait_seconds() const { return group_.wait_seconds(); }
  int rank() const { return tp_.rank(); }
  int size() const { return tp_.size(); }
  // Whole-layout buffer -> this rank's local-layout buffer.
  void slice(const float* global, float* local) const { tp_slice(pieces_, global, local); }

  // The squared global gradient norm from `ss`, this rank's data-axis total (the strategy's
  // grad_sq_sum minus its tied mirrors): the tensor ranks' totals summed, with the replicated
  // parameters (tied mirrors aside) counted on tensor rank 0 only. Collective over the data
  // axis (when `held` are shards) and the tensor axis.
  double global_sq(double ss, const HeldGrads& held, Communicator& dp);

  // A checkpoint shard's local ranges -> the whole layout's (see above).
  std::vector<ShardRange> global_ranges(const std::vector<ShardRange>& local) const;
  // The manifest's description of tensor rank tp_rank's sharded tensors (the ranks' tables
  // differ in the offsets only).
  nlohmann::json describe_shards(int tp_rank) const;

 private:
  const Model& local_;
  Model global_;
  Communicator& tp_;
  GridTensorGroup group_;
  std::vector<TpPiece> pieces_;
  std::vector<TpShard> table_;
  std::vector<FlatRange> counted_once_;  // replicated, not tied mirrors: local flat ranges
};

}  // namespace dtrain
