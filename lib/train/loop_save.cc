// TrainLoop's checkpoint writes (train_loop.h): synchronous and asynchronous saves, sharded
// commits, and the deadline after a preemption signal.
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>

#include "checkpoint/checkpoint.h"
#include "train/replica_state.h"
#include "train/train_loop.h"
#include "util/strings.h"

namespace dtrain {
namespace loop_detail {
namespace {

// 64 random bits from the OS, mixed with the clock (a random_device without entropy still
// differs between runs).
int64_t random_save_id() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  const auto t = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  return static_cast<int64_t>(r ^ (t * 0x9e3779b97f4a7c15ULL));
}

// Refuses to commit a sharded checkpoint whose shard files rank 0 cannot see in `dir`: ranks on
// several nodes that do not share --out each wrote theirs to their own disk, and a manifest
// naming them would be a checkpoint no resume or consolidate can read.
void check_shards_visible(const fs::path& dir, const std::vector<ManifestShard>& shards) {
  std::vector<std::string> missing;
  for (const ManifestShard& s : shards) {
    std::error_code ec;
    const fs::path f = dir / shard_file_name(s.rank);
    if (fs::exists(f, ec)) continue;
    if (ec && ec != std::errc::no_such_file_or_directory)  // (EACCES: not a missing file)
      throw UserError(fmt::format("checkpoint {}: cannot check rank {}'s shard file '{}': {}",
                                  dir.string(), s.rank, f.string(), ec.message()));
    missing.push_back(std::to_string(s.rank));
  }
  if (missing.empty()) return;
  throw UserError(fmt::format(
      "checkpoint {}: the shard file(s) of rank(s) {} are not in that folder as rank 0 sees it "
      "(each rank wrote its own): the ranks do not share the output folder. Ranks on several "
      "nodes need --out on one folder all of them reach (NFS, a PersistentVolumeClaim), or their "
      "sharded checkpoints cannot be read",
      dir.string(), join(missing, ", ")));
}

}  // namespace

void TrainLoop::save() {
  // The wait for the previous write counts as checkpoint time, as a synchronous save's write does:
  // left out of the train record's interval (samples/s), inside the trace's checkpoint span. (It
  // was counted as training: an async run's samples/s after a slow save read 10x too low.)
  const auto s0 = Clock::now();
  TraceScope ts(tracer_, "checkpoint", "checkpoint");
  // Said to the peers while it lasts: a write longer than distributed.timeout_s fails those
  // waiting in the next collective, and their desync report showed "(no collective)" alone.
  struct Saying {
    Communicator& c;
    Saying(Communicator& comm, const std::string& what) : c(comm) { c.set_activity(what); }
    ~Saying() { c.set_activity(""); }
  } saying(world_, fmt::format("writing the checkpoint of step {}", step_));
  finish_save();  // at most one write in flight: the previous one is complete before this one
  // Every rank's RNG state goes into the checkpoint (dropout streams differ per rank).
  const std::string states = gather_rng_states(world_, rng_);
  // The train record in progress, summed over the ranks as record() sums it (collective: every
  // rank saves at the same step), goes into the checkpoint with the skip count, so a resumed run's
  // first record averages the steps an uninterrupted run's does.
  const auto [interval_loss, interval_samples] = interval_totals();
  const std::vector<int64_t> per_rank = interval_per_rank();
  CheckpointMeta m;
  if (lead_) {
    m.step = step_;
    m.epoch = epoch_;
    m.batch = batch_;
    m.optimizer = to_string(cfg_.optimizer.type);
    m.optimizer_steps = strategy_->optimizer().step_count();
    m.rng = states;
    m.config_hash = hash_;
    m.world_size = world_.size();
    m.strategy = to_string(cfg_.distributed.strategy);
    m.config_json = config_json_;
    if (data_->train.kind == SampleKind::kFeatures)
      m.normalizer_json = input_record_json(data_->normalizer, data_->train);
    m.schedule_steps = schedule_steps_;
    nlohmann::json progress = {{"skipped_steps", skipped_steps_},
                               {"record_loss", record_loss_},
                               {"record_samples", record_samples_},
                               {"interval_loss", interval_loss},
                               {"interval_samples", interval_samples},
                               {"eval_due", eval_due_},
                               {"final_train_loss", nan_to_null(final_train_loss_)},
                               {"train_rows", data_->train.rows},
                               {"train_crc", train_crc()},
                               {"base_lr", plan_.base_lr}};
    // (JSON numbers round-trip a double exactly; a non-finite sum has no JSON number, and a
    // resume then takes the total)
    nlohmann::json ranks = nlohmann::json::array();
    for (size_t r = 0; r + 1 < per_rank.size(); r += 2) {
      const double loss = std::bit_cast<double>(per_rank[r]);
      if (!std::isfinite(loss)) break;
      ranks.push_back({loss, per_rank[r + 1]});
    }
    if (!per_rank.empty() && ranks.size() * 2 == per_rank.size())
      progress["interval_ranks"] = std::move(ranks);
    m.progress_json = progress.dump();
  }
  // Every rank's compression state goes to rank 0 (compression_state.h).
  GradReducer* reducer = strategy_->reducer();
  CompressionState comp =
      reducer ? gather_compression_state(world_, *reducer, cfg_.distributed.compression.type)
              : CompressionState{};
  // Every rank's own optimizer state goes to rank 0 too, where the ranks keep one each and one
  // file holds the model (replica_state.h: local_sgd, whose data axis is then the world; in a
  // pipeline's sharded checkpoint, each stage's first replica's shard holds its stage's).
  ReplicaState replicas;
  if (strategy_->per_rank_optimizer_state() && one_file()) {
    DT_CHECK_EQ(DP_, world_.size());
    replicas = gather_replica_state(world_, strategy_->optimizer());
  }
  if (!one_file()) {
    save_sharded(m);
  } else if (lead_) {
    // One rank holds the whole model: one file, which the write commits itself.
    const CheckpointShard sh = snapshot(strategy_->checkpoint_shard());
    const std::string name = checkpoint_file_name(step_);
    run_write([this, name, m, comp = std::move(comp), replicas = std::move(replicas),
               params = sh.params, sb = state_buffers(strategy_->state_names(), sh), step = step_] {
      try {
        save_checkpoint((fs::path(ckpt_dir_) / name).string(), model_, params, sb, m, comp,
                        replicas);
      } catch (const UserError& e) {  // the cause, with who wrote what (async: reported later)
        throw UserError(grid_.describe() + ": writing checkpoint " + name + ": " + e.what());
      } catch (const std::runtime_error& e) {  // (bad_alloc and InternalError pass unchanged)
        throw std::runtime_error(grid_.describe() + ": writing checkpoint " + name + ": " +
                                 e.what());
      }
      save_faults(step);
      commit_checkpoint(ckpt_dir_, name, cfg_.train.checkpoint.keep_last);
      spdlog::debug("checkpoint {}", name);
    });
  }
  last_ckpt_step_ = step_;
  interval_t0_ += Clock::now() - s0;
}

// What a write reads: the strategy's own buffers for a synchronous save; for an asynchronous
// one, copies (reused from save to save: the previous write is done by now), because training
// changes the buffers while the write goes on.
CheckpointShard TrainLoop::snapshot(const CheckpointShard& sh) {
  if (!cfg_.train.checkpoint.async) return sh;
  TraceScope ts(tracer_, "checkpoint copy", "checkpoint");
  const size_t n = static_cast<size_t>(sh.size);
  snap_params_.assign(sh.params, sh.params + n);
  snap_state_.resize(sh.state.size());
  CheckpointShard c{sh.ranges, sh.size, snap_params_.data(), {}};
  for (size_t i = 0; i < sh.state.size(); ++i) {
    snap_state_[i].assign(sh.state[i], sh.state[i] + n);
    c.state.push_back(snap_state_[i].data());
  }
  return c;
}

void TrainLoop::run_write(std::function<void()> job) {
  if (cfg_.train.checkpoint.async)
    writer_.start(std::move(job));
  else
    job();
}

// DTRAIN_FAULT's save faults (util/fault.h), after this rank's file or shard is written and
// before anything commits it.
void TrainLoop::save_faults(int64_t step) const {
  if (const int64_t ms = fault_save_delay_ms(opts_.faults, rank_); ms > 0) {
    spdlog::warn("DTRAIN_FAULT slow_save: rank {} sleeps {} ms in the checkpoint of step {}", rank_,
                 ms, step);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  if (fault_due(opts_.faults, "fail_in_save", rank_, step))
    throw std::runtime_error("DTRAIN_FAULT fail_in_save: rank " + std::to_string(rank_) +
                             "'s write of the checkpoint of step " + std::to_string(step));
  if (fault_due(opts_.faults, "kill_in_save", rank_, step))
    die_by_fault(grid_.describe() + " wrote its part of the checkpoint of step " +
                 std::to_string(step));
}

// Sharded checkpoint: every rank that holds a distinct part (every rank of a sharded strategy,
// the data axis's rank 0 of a replicated one) writes its shard; once all have (commit_sharded:
// an all-reduce of success flags), rank 0 writes the manifest -- every shard's ranges and grid
// coordinates -- and moves `latest`. A crash before that leaves the previous checkpoint the newest
// complete one. The ranges travel to rank 0 before the writes start, so an asynchronous write
// needs no collective until its completion.
void TrainLoop::save_sharded(const CheckpointMeta& meta) {
  const std::string name = sharded_checkpoint_name(step_);
  // One id for this save (CheckpointMeta::save_id), drawn by rank 0: random, so two runs' saves of
  // the same step differ even when their configs and seeds are the same.
  CheckpointMeta m = meta;
  int64_t id = lead_ ? random_save_id() : 0;
  world_.broadcast(&id, 1, 0);
  m.save_id = fmt::format("{:016x}", static_cast<uint64_t>(id));
  const fs::path dir = fs::path(ckpt_dir_) / name;
  if (lead_) {
    // Leftovers of a crashed attempt at this step, or the step of a timeline this run left (it
    // resumed from an earlier checkpoint): `latest` must not name it while it is rewritten.
    release_latest(ckpt_dir_, name);
    std::error_code ec;
    remove_checkpoint(dir.string(), ec);
    if (ec) throw fs::filesystem_error("cannot remove a leftover checkpoint", dir, ec);
  }
  world_.barrier();
  const bool writer = strategy_->sharded() || dpr_ == 0;
  const std::vector<std::string> names = strategy_->state_names();
  // Local SGD's replicas of a stage keep their own states: the stage's first replica writes them
  // with its shard (replica_state.h).
  ReplicaState replicas;
  if (strategy_->per_rank_optimizer_state() && !strategy_->sharded() && DP_ > 1)
    replicas = gather_replica_state(dp_, strategy_->optimizer());
  std::vector<int64_t> mine;  // (begin, end, offset) of each range this rank writes
  CheckpointShard sh;
  std::vector<ShardRange> global;  // the ranges of the whole layout sh fills
  if (writer) {
    sh = snapshot(strategy_->checkpoint_shard());
    // A tensor rank lists the whole layout's ranges its local shard fills (train/tp_train.h).
    global = tp_ ? tp_->global_ranges(sh.ranges) : sh.ranges;
    for (const ShardRange& r : global) mine.insert(mine.end(), {r.begin, r.end, r.offset});
  }
  // Every rank's ranges to rank 0 (counts first: ranks write different numbers of ranges).
  const size_t W = static_cast<size_t>(world_.size());
  std::vector<int64_t> counts(W);
  const int64_t n_mine = static_cast<int64_t>(mine.size());
  world_.allgather(&n_mine, counts.data(), std::vector<size_t>(W, 1));
  std::vector<size_t> sizes(counts.begin(), counts.end());
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<int64_t> all(static_cast<size_t>(total));
  world_.allgather(mine.data(), all.data(), sizes);
  pending_ = PendingSharded{true, name, m, {}};
  if (lead_) {
    size_t at = 0;
    for (size_t r = 0; r < W; ++r) {
      const GridCoord g = grid_.layout().coord(static_cast<int>(r));
      if (strategy_->sharded() || g.dp == 0) {
        ManifestShard ms;
        ms.rank = static_cast<int>(r);
        for (size_t k = 0; k + 3 <= sizes[r]; k += 3)
          ms.ranges.push_back({all[at + k], all[at + k + 1], all[at + k + 2]});
        ms.where = {{"tp", g.tp}, {"dp", g.dp}, {"pp", g.pp}};
        if (tp_) ms.where["tensor_shards"] = tp_->describe_shards(g.tp);
        pending_.shards.push_back(std::move(ms));
      }
      at += sizes[r];
    }
  }
  std::string err;
  try {
    std::vector<StateBuffer> sb;
    if (writer) sb = state_buffers(names, sh);
    run_write([this, writer, dir, sh, global, sb = std::move(sb), step = step_, save_id = m.save_id,
               replicas = std::move(replicas)] {
      if (writer) {
        fs::create_directories(dir);
        save_shard(dir.string(), rank_, step, sh.ranges, sh.size, sh.params, sb, save_id, &global,
                   &replicas);
      }
      save_faults(step);
    });
  } catch (const std::exception& e) {  // a synchronous write's error
    err = e.what();
  }
  if (!cfg_.train.checkpoint.async) commit_sharded(err);
}

// Completes pending_ (collective): every rank says whether its write succeeded (err empty); if
// all did, rank 0 writes the manifest and moves `latest`, else every rank throws an AgreedError
// (the same verdict from the same all-reduce: nobody aborts the group, so the failing rank's own
// error is the one reported, and its peers' name it).
void TrainLoop::commit_sharded(const std::string& err) {
  DT_CHECK(pending_.active);
  const PendingSharded p = std::move(pending_);
  pending_ = PendingSharded{};
  // The lowest failing rank, or the world size when none failed (exact in a float: ranks < 2^24).
  const float none = static_cast<float>(world_.size());
  float failed = err.empty() ? none : static_cast<float>(rank_);
  world_.allreduce(&failed, 1, ReduceOp::kMin);
  if (!err.empty())
    throw ShardWriteError(grid_.describe() + ": writing its shard of checkpoint " + p.name + ": " +
                          err);
  if (failed < none)
    throw PeerFailedError(
        "rank " + std::to_string(static_cast<int>(failed)) +
        " failed to write its shard of checkpoint " + p.name +
        " (its own error names the cause); the checkpoint is not committed: `latest` names the " +
        "newest complete one");
  if (!lead_) return;
  check_shards_visible(fs::path(ckpt_dir_) / p.name, p.shards);
  const nlohmann::json layout = {
      {"tp", grid_.layout().tp()}, {"dp", grid_.layout().dp()}, {"pp", grid_.layout().pp()}};
  write_manifest((fs::path(ckpt_dir_) / p.name).string(), tp_ ? tp_->global() : model_, p.meta,
                 p.shards, strategy_->state_names(), layout);
  commit_checkpoint(ckpt_dir_, p.name, cfg_.train.checkpoint.keep_last);
  spdlog::debug("checkpoint {}", p.name);
}

// Between steps, with an asynchronous write in flight: a checkpoint file's write is done when
// rank 0's writer has finished (its error is rethrown here, at the next step); a sharded one
// when every rank's has, which a one-float all-reduce (min of -1 failed, 0 busy, 1 done) tells
// every rank alike, so all of them complete it (or fail) at the same step.
void TrainLoop::poll_save() {
  if (!cfg_.train.checkpoint.async) return;
  if (!pending_.active) {
    if (writer_.finished()) writer_.wait();  // rank 0's checkpoint file
    return;
  }
  float state = 1.0f;
  std::string err;
  if (writer_.busy()) {
    state = writer_.finished() ? 1.0f : 0.0f;
    if (state == 1.0f) {
      try {
        writer_.wait();
      } catch (const std::exception& e) {
        err = e.what();
        state = -1.0f;
      }
    }
  }
  world_.allreduce(&state, 1, ReduceOp::kMin);
  if (state == 0.0f) return;  // some rank still writes (none failed: that would be -1)
  commit_sharded(err);        // all done, or one failed: every rank throws
}

// Waits for the write in flight and completes it (collective for a sharded checkpoint).
void TrainLoop::finish_save() {
  if (!cfg_.train.checkpoint.async) return;
  std::string err;
  try {
    writer_.wait();
  } catch (const std::exception& e) {
    if (!pending_.active) throw;  // rank 0's checkpoint file
    err = e.what();
  }
  if (pending_.active) commit_sharded(err);
}

// train.preempt_save_timeout_s: from the agreed stop after a preemption signal to the checkpoint
// on disk (SaveDeadline).
void TrainLoop::start_deadline(int sig) {
  const double t = cfg_.train.preempt_save_timeout_s;
  if (t <= 0 || deadline_.armed()) return;
  // What --resume auto will take, named now, in the training thread: the deadline fires when the
  // save is stuck, perhaps on this very filesystem, where its thread must not wait on more I/O.
  // `latest`, or without it the newest complete step-<N> (the save under way commits after this,
  // and once it has, the deadline no longer fires).
  std::string resumes = "there is no complete checkpoint yet (--resume auto starts afresh)";
  try {
    const std::string p = resolve_checkpoint(ckpt_dir_, true);
    if (!p.empty())  // ("step-N" or its file)
      resumes = "the newest complete checkpoint is " + fs::path(p).filename().string() +
                " (--resume auto continues from it)";
  } catch (const std::exception&) {
  }
  deadline_.start(t, [this, t, sig, step = step_, resumes] {
    return fmt::format(
        "{} after {}: the checkpoint of step {} was not on disk within "
        "train.preempt_save_timeout_s = {} s; exiting with {} (preempted): {}",
        grid_.describe(), interrupt_signal_name(sig), step, t, kExitPreempted, resumes);
  });
}

// Every rank's training memory (bytes of parameters, gradients, optimizer state and the peak
// of activations kept for backward) with its grid coordinates, for summary.json. Collective.

}  // namespace loop_detail
}  // namespace dtrain
