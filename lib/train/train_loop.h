// The training loop's rank object, shared by the files that implement it (loop.cc: setup, steps,
// records, evaluation, the summary and run(); loop_save.cc: checkpoint writes, synchronous and
// asynchronous, and the preemption deadline). Internal to lib/train: the interface is loop.h.
#pragma once

#include "train/loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint.h"
#include "comm/rank_grid.h"
#include "data/sampler.h"
#include "nn/gpt.h"
#include "nn/loss.h"
#include "nn/registry.h"
#include "optim/optimizer.h"
#include "tensor/blas.h"
#include "train/async_checkpoint.h"
#include "train/compression_state.h"
#include "train/executor.h"
#include "train/fault_strategy.h"
#include "train/pipeline.h"
#include "train/progress.h"
#include "train/step_faults.h"
#include "train/stop.h"
#include "train/straggler.h"
#include "train/strategy.h"
#include "train/tied_grads.h"
#include "train/tp_train.h"
#include "util/check.h"
#include "util/duration.h"
#include "util/fs.h"

namespace dtrain {
namespace loop_detail {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A checkpoint shard's state buffers with their names.
inline std::vector<StateBuffer> state_buffers(const std::vector<std::string>& names,
                                              const CheckpointShard& sh) {
  std::vector<StateBuffer> sb;
  for (size_t i = 0; i < names.size(); ++i) sb.push_back({names[i], sh.state[i]});
  return sb;
}

inline nlohmann::json nan_to_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

// One rank's training run. Construction sets everything up (collective); run() trains.
// Collectives run on three communicators: the world (stop votes, the non-finite verdict when
// ranks hold different gradients, records, evaluation sums, checkpoints), the data axis (the
// strategy's, the loss all-reduce, straggler checks, a tie's sharded gradient) and the pipeline
// axis (the clipping norm, a tie whose copies are on different stages: train/tied_grads.h).
// Every rank issues them in the same order (communicator.h).
class TrainLoop {
 public:
  TrainLoop(const Config& cfg, const RunOptions& opts, Communicator& comm, Tracer& tracer);
  nlohmann::json run();

 private:
  void setup_model(AtOnceScope& starting);
  void check_memory() const;
  bool resume();  // false: nothing left to train (summary_ holds the answer)
  void restore_progress(const std::string& progress);  // collective
  bool run_left_unfinished();                          // collective
  std::pair<double, int64_t> interval_totals();        // collective where the loss is per rank
  // Where the loss is per rank, every rank's own interval sums (loss bits, samples; rank r at
  // 2r, 2r + 1), so a resume on as many ranks continues each one's and its next record is
  // bitwise the uninterrupted run's (the reduced total, rounded through float32 as record()
  // sums it, is not). Empty where the loss is global. Collective where it is per rank.
  std::vector<int64_t> interval_per_rank();
  // This rank's own failure (not an agreed one), told to the peers before anything that owns an
  // in-flight collective's buffers goes (settle_before_free would abort with a vaguer reason;
  // the first reason is the one kept): as an abandoned stop vote tells it, the error itself
  // (peers read "rank N aborted: <error>").
  void fail_group(const std::exception& e) { world_.abort(e.what()); }
  void read_init_from();          // rank 0: train.init_from's weights into init_full_
  void init_weights_from_file();  // collective: train.init_from's weights (init_from.h)
  void settle_final_loss();       // collective: an interrupted run's
  void announce_stop(int sig, bool preempted, bool in_sync);
  // After the loop (every rank): the final save and evaluation, the summary (collective), the
  // exit code for a stop and the lead's summary.json. stop_signal 0: the run ended.
  nlohmann::json finish_run(int stop_signal, bool stop_preempted);
  bool resuming();                      // collective: rank 0's --resume decides
  int64_t resumed_batch_index() const;  // rp_.batch in this run's global batches
  int64_t resumed_total_steps() const;  // plan_.total_steps from the resume point
  void keep_resumed_lr();               // plan_.base_lr under scale_lr linear on a resume
  void log_start() const;
  bool step();  // one optimizer step; false when skipped (non-finite)
  bool nonfinite_guard(double loss_sum);
  void clip();
  // After each step: every log_every steps and at the last step a train record covering every
  // step since the previous one; at an epoch end final_train_loss's interval closes too.
  void record(bool epoch_done);
  void evaluate();
  void save();
  void save_sharded(const CheckpointMeta& m);
  // The checkpoint path's pieces (train/async_checkpoint.h): the state to write (copied when
  // async), running a write (now, or on the writer), a save's DTRAIN_FAULT hooks, completing the
  // sharded checkpoint, and polling / finishing the write in flight.
  CheckpointShard snapshot(const CheckpointShard& sh);
  void run_write(std::function<void()> job);
  void save_faults(int64_t step) const;
  void commit_sharded(const std::string& err);
  void poll_save();
  void finish_save();
  void start_deadline(int sig);
  nlohmann::json summary(int stop_signal);
  nlohmann::json memory_per_rank(const StateMemory& mem, int64_t* straggler_warnings);
  double comm_seconds() const;
  // Seconds the steps have waited for communication so far (every source counted once): the
  // strategy's, the executor's, the tied copies', the tensor layers' and the verdict's.
  double waited_seconds() const;
  // Runs f, and when it waited on communication (waited_seconds grew) records its span as "wait
  // for communication": a span per call, empty on one rank or between Local SGD's
  // synchronisations, spent the trace's event cap on nothing.
  void traced_wait(const std::function<void()>& f);
  // One rank holds the whole model (no pipeline, a replicated strategy): checkpoints are one
  // file; otherwise sharded folders.
  bool one_file() const { return !pipelined_ && !strategy_->sharded() && !tp_; }
  // Epochs completed, fractional by items (the same with or without gradient accumulation).
  double epoch_progress() const {
    const double part = sampler_ ? sampler_->epoch_fraction(std::min(batch_, bpe_))
                                 : static_cast<double>(batch_) / static_cast<double>(bpe_);
    return static_cast<double>(epoch_) + part;
  }

  const Config& cfg_;
  const RunOptions& opts_;
  Communicator& world_;
  Tracer& tracer_;
  const Clock::time_point t_start_ = Clock::now();
  const int rank_;
  const bool lead_;
  const int S_;  // pipeline stages
  RankGrid grid_;
  Communicator& dp_;
  Communicator& pp_;
  Communicator& tp_comm_;  // the tensor axis (of size 1 without tensor parallelism)
  const int DP_, dpr_, stage_;
  std::string ckpt_dir_, hash_, config_json_;
  OutDirLock ckpt_lock_;  // rank 0: its checkpoints folder's, for the run (start_run_dir)

  std::shared_ptr<const DataSplits> data_;  // (shared by the in-process ranks: RunOptions::data)
  // The training split's data_fingerprint, computed once: by the data check of ranks that are
  // processes (check_same_data), else when a save or a resume first needs it (0: not yet): a
  // checkpoint records it, a resume on other contents says so.
  uint32_t train_crc_ = 0;
  uint32_t train_crc();
  Model model_;
  std::vector<LayerRange> stages_;  // per stage (one: the whole model)
  std::unique_ptr<Strategy> strategy_;
  std::optional<TiedGrads> tied_;       // the GPT's tied embeddings (train/tied_grads.h)
  std::unique_ptr<TensorParallel> tp_;  // distributed.tensor_parallel.size > 1 (train/tp_train.h)
  double tied_sq_ = 0.0;                // the step's TiedGrads::sum, subtracted by clip()
  std::unique_ptr<Executor> exec_;
  std::optional<Sampler> sampler_;
  StepPlan plan_;
  int64_t bpe_ = 1, schedule_steps_ = 0;
  Rng rng_;
  int64_t tps_ = 1;           // targets per sample: 1 label, or T next tokens
  bool loss_global_ = false;  // the step loss is all-reduced over the data axis every step
  CompressionState saved_comp_;
  std::vector<float> init_full_;  // rank 0: train.init_from's weights (whole layout), until sent
  ReplicaState saved_replicas_;   // rank 0: the checkpoint's per-rank optimizer state, until sent

  // Progress.
  int64_t step_ = 0, epoch_ = 0, batch_ = 0, first_step_ = 0;
  ResumePoint rp_;
  nlohmann::json early_summary_;
  std::unique_ptr<LineWriter> metrics_;
  std::optional<ProgressBar> bar_;
  std::optional<StragglerCheck> stragglers_;
  std::vector<std::vector<int64_t>> micro_idx_;
  std::vector<int64_t> micro_fewest_;  // Sampler::fewest_rows of each of micro_idx_'s batches
  Clock::time_point interval_t0_;
  double interval_loss_ = 0.0, final_train_loss_ = std::nan(""), train_s_ = 0.0, last_sps_ = 0.0;
  double last_record_loss_ = std::nan(""), last_lr_ = 0.0;
  // The loss the progress bar shows; none before this rank has one (a rank that computes no loss
  // shows the last record's, and there is none before the first).
  std::optional<double> last_step_loss_;
  bool pipelined_ = false;  // the pipeline executor (strategy pipeline, or stages > 1)
  bool resuming_ = false;   // rank 0 was given --resume (resuming(): every rank follows it)
  int64_t interval_samples_ = 0, samples_trained_ = 0, interval_first_step_ = 0;
  int64_t samples_at_t0_ = 0;  // samples_trained_ at interval_t0_ (the last record): the bar's rate
  // Since the last train record, all ranks' sums: the intervals an epoch end closed in between.
  double record_loss_ = 0.0;
  int64_t record_samples_ = 0;
  double exposed_comm_s_ = 0.0;
  double verdict_wait_s_ = 0.0;  // in the non-finite verdict's all-reduce (nonfinite_guard)
  int64_t skipped_steps_ = 0;
  uint64_t bytes_sent0_ = 0, bytes_recv0_ = 0;
  double comm_s0_ = 0.0;
  EvalResult last_eval_;
  bool have_eval_ = false;
  // An evaluation is due (an epoch ended, or train.eval_every) and not yet run: a checkpoint
  // written in between carries it, so a resume runs it at the same step (progress_json).
  bool eval_due_ = false;
  int64_t last_eval_step_ = -1, last_ckpt_step_ = -1;
  // Checkpoint writes. pending_: a sharded checkpoint whose shards are being written in the
  // background (the same on every rank), to be completed by commit_sharded; one_file_pending_:
  // rank 0's write of a checkpoint file (it commits itself).
  struct PendingSharded {
    bool active = false;
    std::string name;
    CheckpointMeta meta;
    std::vector<ManifestShard> shards;  // rank 0
  } pending_;
  std::vector<float> snap_params_;  // the copies an asynchronous write reads
  std::vector<std::vector<float>> snap_state_;
  BackgroundWriter writer_;  // after what its job reads: destroyed (joined) first
  SaveDeadline deadline_;
};

}  // namespace loop_detail
}  // namespace dtrain
