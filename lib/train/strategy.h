// Data-parallel strategies as objects (c10d's Reducer / comm hooks, FSDP's flat parameter): one
// interface that the training loop (train/loop.cc) and the executors (train/executor.h: one
// stage, or a pipeline stage) call at fixed points of a step. A strategy owns this rank's
// parameters, gradients and optimizer state for one ModelRange -- the whole model, or one
// pipeline stage -- and talks only on the data axis's communicator; it knows nothing of
// pipelines, of the loop's bookkeeping or of the config's YAML.
//
//   ddp        train/ddp.cc        replicated; gradients all-reduced in buckets overlapping the
//                                  step's last backward, or through a compressing GradReducer
//   local_sgd  train/local_sgd.cc  replicated; local steps, parameters averaged every H steps
//                                  (DiLoCo's outer optimizer, compression of the deltas)
//   zero1      train/zero1.cc      ddp's gradients, the optimizer state sharded
//   zero2      train/zero2.cc      gradients reduce-scattered unit by unit, shards of grads too
//   fsdp       train/fsdp.cc       parameters sharded too, units gathered for compute
//
// A step, as the loop and an executor drive it (every rank of the data axis in the same order:
// communicator.h's contract):
//   begin_step()
//   { forward(x) ... backward(x, dy, last) }   per micro-batch, in the executor's order; the
//                                              step's last backward has last = true
//   finish_backward()                          gradients reduced as the strategy defines
//   held_grads()                               the loop sums tied copies there (tied_grads.h)
//   first_nonfinite_grad(), grad_sq_sum() / scale_grads()   the guard and clipping
//   optimizer_step(lr)
//   end_step(step)                             local_sgd's synchronisation
// Units of the flat layout: offsets are the whole model's (ModelRange::begin is the first).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "nn/model.h"
#include "optim/optimizer.h"
#include "train/compression.h"
#include "train/sharding.h"

namespace dtrain {

// The layers a rank trains: [first, last), the flat range [begin, end) of the model's layout.
struct ModelRange {
  const Model* model = nullptr;
  size_t first = 0, last = 0;
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  static ModelRange whole(const Model& m);
  static ModelRange layers(const Model& m, size_t first, size_t last);
};

// What this rank writes into a checkpoint: `ranges` of the whole model's flat layout, packed at
// their offsets into buffers of `size` floats (parameters, then each state buffer in
// Strategy::state_names() order). Pointers stay valid until the strategy's next call.
struct CheckpointShard {
  std::vector<ShardRange> ranges;
  int64_t size = 0;
  const float* params = nullptr;
  std::vector<float*> state;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual const char* name() const = 0;
  // Start-up log lines (the rank-0 log); "" for none.
  virtual std::string describe() const = 0;

  // --- state ---
  // A fresh start: every rank of the axis ends with the initial parameters of `seed` (layers draw
  // from their own streams: model.h). Collective over the axis.
  virtual void init_params(uint64_t seed) = 0;
  // A resume: this rank's part of whole-model buffers (param_count floats each; state in
  // state_names() order).
  virtual void load_full(const float* params, const std::vector<const float*>& state) = 0;
  // The optimizer's state names, then the strategy's own state (local_sgd's outer_momentum).
  virtual std::vector<std::string> state_names() const = 0;
  // True when the ranks of the axis hold distinct parts (zero1, zero2, fsdp: every rank writes a
  // shard); false when they hold equal copies (ddp, local_sgd at a synchronisation: the axis's
  // rank 0 writes the range).
  virtual bool sharded() const = 0;
  virtual CheckpointShard checkpoint_shard() = 0;
  // True when the ranks of the axis keep distinct optimizer states that checkpoints hold one per
  // rank (local_sgd without sync_optimizer_state: train/replica_state.h).
  virtual bool per_rank_optimizer_state() const { return false; }
  virtual Optimizer& optimizer() = 0;
  // The compressing reducer whose state checkpoints carry (null: none).
  virtual GradReducer* reducer() { return nullptr; }
  virtual StateMemory memory() const = 0;
  // Seconds blocked on the axis's collectives so far (exposed communication).
  virtual double wait_seconds() const = 0;

  // --- a step ---
  // Gradients are scaled by 1 / (samples of the step over the whole axis) so that their sum is
  // the global batch's mean-loss gradient; local_sgd's are its own batch's mean (false).
  virtual bool global_mean() const { return true; }
  virtual void begin_step() = 0;
  // Layers of the range on x (their outputs in acts.out). fsdp gathers units on the way.
  virtual const Tensor& forward(const Tensor& x, Activations& acts, const ForwardCtx& ctx) = 0;
  // Evaluation in lockstep (fsdp): joins a forward's collectives without computing, for a rank
  // that has no rows where others have.
  virtual void forward_without_data() {}
  // Backward through the range given dy (gradient w.r.t. its output); dx when not null.
  // last: the step's last backward (ddp starts its bucket all-reduces during it).
  virtual void backward(const Tensor& x, Activations& acts, const Tensor& dy, Tensor* dx,
                        bool last) = 0;
  virtual void finish_backward() = 0;
  // The gradient this rank holds after finish_backward (train/tied_grads.h sums tied copies
  // there): the whole range (ddp, local_sgd, zero1) or this rank's shard (zero2, fsdp).
  virtual HeldGrads held_grads() = 0;
  // True when, after finish_backward, every rank of the axis holds the same reduced gradient
  // (ddp, zero1): the non-finite verdict then needs no collective of its own.
  virtual bool replicated_grads() const = 0;
  // Index into model.params() of the first tensor whose gradient this rank holds a NaN or
  // infinity of; -1 when all are finite.
  virtual int64_t first_nonfinite_grad() const = 0;
  // Squared L2 norm of the range's gradient (each element counted once over the axis).
  // Collective over the axis when sharded.
  virtual double grad_sq_sum() = 0;
  virtual void scale_grads(float f) = 0;
  virtual void optimizer_step(double lr) = 0;
  // The samples this rank and the whole data axis trained in the step just taken (called before
  // end_step). local_sgd weights its averages by them; the others need not.
  virtual void count_samples(int64_t /*local*/, int64_t /*axis*/) {}
  // After step `step` (steps done, 1-based); last: the run's final step.
  virtual void end_step(int64_t /*step*/, bool /*last*/) {}
  // Whether the ranks of the axis hold the same parameters after step `step` (local_sgd: only
  // at synchronisations). Evaluations, checkpoints and stops wait for such a step.
  virtual bool in_sync(int64_t /*step*/) const { return true; }
};

// Builds cfg.distributed.strategy (pipeline: ddp) for `range` over the data axis `dp`.
// Throws UserError for combinations it cannot run.
std::unique_ptr<Strategy> make_strategy(const Config& cfg, ModelRange range, Communicator& dp);

// The implementations (one file each).
std::unique_ptr<Strategy> make_ddp(const Config& cfg, ModelRange range, Communicator& dp);
std::unique_ptr<Strategy> make_local_sgd(const Config& cfg, ModelRange range, Communicator& dp);
std::unique_ptr<Strategy> make_zero1(const Config& cfg, ModelRange range, Communicator& dp);
std::unique_ptr<Strategy> make_zero2(const Config& cfg, ModelRange range, Communicator& dp);
std::unique_ptr<Strategy> make_fsdp(const Config& cfg, ModelRange range, Communicator& dp);

// DDP's gradient buckets over a range, as ddp and zero1 use them: on the step's last backward
// each bucket's all-reduce (sum) starts on the communication thread as soon as backward has
// finished its lowest layer; wait() ends them. grads: the range's buffer (from range.begin).
class BucketAllReduce {
 public:
  BucketAllReduce(const Config& cfg, ModelRange range, Communicator& dp);
  // Settles the bucket all-reduces still in flight (settle_before_free): the gradients they
  // write belong to the strategy, which goes with this.
  ~BucketAllReduce();
  BucketAllReduce(const BucketAllReduce&) = delete;
  BucketAllReduce& operator=(const BucketAllReduce&) = delete;
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // The layer-done callback of Model::backward for the last backward (empty at world size 1).
  std::function<void(size_t)> on_layer_done(float* grads);
  double wait();  // seconds blocked
  std::string describe() const;

 private:
  ModelRange range_;
  Communicator& dp_;
  std::vector<Bucket> buckets_;
  double bucket_mb_ = 0;
  size_t next_ = 0;
  std::vector<WorkPtr> works_;
};

// A range's parameter table with offsets relative to its first element (for GradReducer).
std::vector<ParamEntry> range_params(const ModelRange& r);

// The flat ranges (whole-model offsets, sorted, disjoint, adjacent tensors merged) that weight
// decay applies to: the whole layout for `all`; for `matrices` the tensors of 2 or more
// dimensions (linear and convolution weights, embeddings), not biases or LayerNorm weights.
// Every strategy builds its optimizer with these (make_optimizer's second form).
std::vector<FlatRange> decayed_ranges(const Model& m, WeightDecayOn on);

}  // namespace dtrain
