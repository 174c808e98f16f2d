#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint.h"
#include "comm/inproc.h"
#include "config/config_diff.h"
#include "data/sampler.h"
#include "nn/loss.h"
#include "optim/optimizer.h"
#include "tensor/blas.h"
#include "train/batch.h"
#include "train/compression.h"
#include "train/compression_state.h"
#include "train/pipeline.h"
#include "train/sharding.h"
#include "train/step_faults.h"
#include "train/stop.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/rng.h"
#include "util/strings.h"

namespace dtrain {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// "1:02:03" or "2:03" for a duration in seconds.
std::string clock_text(double s) {
  const auto t = static_cast<long long>(std::max(0.0, s) + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", t / 60, t % 60);
  return buf;
}

// A one-line progress bar on stderr, redrawn at most 10 times a second: step, epoch, loss,
// samples/s (over the current log interval), elapsed time and the remaining time at the rate
// of the steps this process has run so far (a resumed run counts from its first step).
class ProgressBar {
 public:
  explicit ProgressBar(bool on) : on_(on), start_(Clock::now()) {}
  void update(int64_t step, int64_t total, double epoch, double loss, double sps) {
    if (!on_) return;
    const auto now = Clock::now();
    if (first_step_ < 0) first_step_ = step - 1;
    if (step != total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const int width = 24;
    const double frac = total > 0 ? static_cast<double>(step) / static_cast<double>(total) : 0.0;
    const int filled = static_cast<int>(frac * width);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, '.');
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const int64_t done = step - first_step_;
    std::string eta = "?";
    if (total > 0 && done > 0)
      eta = clock_text(elapsed / static_cast<double>(done) * static_cast<double>(total - step));
    std::fprintf(stderr,
                 "\r\033[K[%s] step %lld/%lld  epoch %.2f  loss %.4f  %.0f samples/s  %s elapsed, "
                 "%s left",
                 bar.c_str(), static_cast<long long>(step), static_cast<long long>(total), epoch,
                 loss, sps, clock_text(elapsed).c_str(), eta.c_str());
    std::fflush(stderr);
    drawn_ = true;
  }
  // Clears the bar so a log line can be printed cleanly.
  void clear() {
    if (on_ && drawn_) {
      std::fprintf(stderr, "\r\033[K");
      std::fflush(stderr);
      drawn_ = false;
    }
  }
  ~ProgressBar() { clear(); }

 private:
  bool on_;
  bool drawn_ = false;
  Clock::time_point start_, last_{};
  int64_t first_step_ = -1;  // the step before the first one drawn
};

nlohmann::json nan_to_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

}  // namespace

ModelShape resolve_model_shape(const Config& cfg, const DataSplits& data) {
  ModelShape s;
  s.in_features = data.train.features;
  if (cfg.model.input_features > 0 && cfg.model.input_features != s.in_features)
    throw UserError("model.input_features is " + std::to_string(cfg.model.input_features) +
                    " but the data has " + std::to_string(s.in_features) + " features");
  s.num_classes = std::max(data.train.num_classes, data.test.num_classes);
  if (cfg.model.num_classes > 0) {
    if (s.num_classes > cfg.model.num_classes)
      throw UserError(
          "the data has label " + std::to_string(s.num_classes - 1) +
          ", out of range for model.num_classes = " + std::to_string(cfg.model.num_classes));
    s.num_classes = cfg.model.num_classes;
  }
  if (s.num_classes < 2)
    throw UserError("the training data has a single class (label 0 only); need at least 2");
  return s;
}

namespace {

// Sums over rows [begin, end) of d: (loss sum, correct count).
std::pair<double, int64_t> eval_rows(const Model& model, const float* params, const Dataset& d,
                                     int64_t begin, int64_t end, int64_t batch,
                                     const std::string& loss) {
  DT_CHECK_GT(batch, 0);
  Activations acts;
  Tensor x;
  std::vector<int32_t> y;
  std::vector<int64_t> idx;
  ForwardCtx ctx{.training = false, .rng = nullptr};
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t start = begin; start < end; start += batch) {
    const int64_t n = std::min(batch, end - start);
    idx.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = start + i;
    gather_rows(d, idx, x, y);
    const Tensor& out = model.forward(params, x, acts, ctx);
    loss_sum += loss_and_grad(loss, out, y.data(), nullptr, 1.0f);
    correct += count_correct(out, y.data());
  }
  return {loss_sum, correct};
}

}  // namespace

EvalResult evaluate(const Model& model, const float* params, const Dataset& d, int64_t batch,
                    const std::string& loss) {
  EvalResult r;
  const auto [loss_sum, correct] = eval_rows(model, params, d, 0, d.rows, batch, loss);
  r.samples = d.rows;
  if (d.rows > 0) {
    r.loss = loss_sum / static_cast<double>(d.rows);
    r.accuracy = static_cast<double>(correct) / static_cast<double>(d.rows);
  }
  return r;
}

void finish_trace(const RunOptions& opts, Communicator& comm, const Tracer& tracer) {
  if (opts.trace.empty()) return;
  const std::string mine = rank_trace_path(opts.trace, comm.rank());
  tracer.write(mine);
  comm.barrier();
  if (comm.rank() != 0) return;
  std::vector<std::string> files;
  for (int r = 0; r < comm.size(); ++r) {
    const std::string f = rank_trace_path(opts.trace, r);
    if (fs::exists(f)) {
      files.push_back(f);
    } else {
      spdlog::warn("trace: no {} (rank {} wrote it on another machine?); merging the others", f, r);
    }
  }
  merge_trace_files(files, opts.trace);
  for (const auto& f : files) fs::remove(f);
  spdlog::info("trace: {} (open in ui.perfetto.dev)", opts.trace);
}

StepPlan plan_steps(const Config& cfg, int64_t batches_per_epoch, int64_t train_rows,
                    int replicas) {
  StepPlan p;
  p.batches_per_epoch = batches_per_epoch;
  if (p.batches_per_epoch == 0)
    throw UserError("the training set (" + std::to_string(train_rows) +
                    " samples) is smaller than one global batch of " +
                    std::to_string(cfg.data.batch_size * replicas) + " and data.drop_last is true");
  p.accum = cfg.train.grad_accum_steps;
  p.steps_per_epoch = (p.batches_per_epoch + p.accum - 1) / p.accum;
  p.total_steps = cfg.train.epochs > 0 ? cfg.train.epochs * p.steps_per_epoch
                                       : std::numeric_limits<int64_t>::max();
  if (cfg.train.max_steps > 0) p.total_steps = std::min(p.total_steps, cfg.train.max_steps);
  p.base_lr = cfg.optimizer.lr * (cfg.optimizer.scale_lr == "linear" ? replicas : 1);
  return p;
}

namespace {

// A resume under another config: name the keys that changed -- a warning when they change what
// is computed (the config hash), else one info line (epochs, logging, checkpointing, timeouts).
// Checkpoints from before the config was stored in them only have the hash.
void report_config_changes(const std::string& path, const CheckpointMeta& m, const Config& cfg,
                           const std::string& hash) {
  if (m.config_json.empty()) {
    if (m.config_hash != hash)
      spdlog::warn("resuming from {} written with config hash {}, this run has {}", path,
                   m.config_hash, hash);
    return;
  }
  nlohmann::json before;
  try {
    before = nlohmann::json::parse(m.config_json);
  } catch (const nlohmann::json::exception&) {
    throw UserError("checkpoint '" + path + "': its stored config is not valid JSON");
  }
  const std::vector<std::string> diff = config_differences(before, config_to_json(cfg));
  std::string lines;
  for (const auto& d : diff) lines += "\n  " + d;
  if (m.config_hash != hash)
    spdlog::warn("resuming from {} under a changed config (hash {} -> {}); {} key(s) differ:{}",
                 path, m.config_hash, hash, diff.size(),
                 diff.empty() ? " (none in the resolved config)" : lines);
  else if (!diff.empty())
    spdlog::info("resuming from {}; changed since it was written (not what is computed):{}", path,
                 lines);
}

}  // namespace

std::string gather_rng_states(Communicator& comm, const Rng& rng) {
  const int world = comm.size();
  const auto st = rng.state();
  std::vector<int64_t> mine(4), all(4 * static_cast<size_t>(world));
  for (size_t k = 0; k < 4; ++k) mine[k] = static_cast<int64_t>(st[k]);
  comm.allgather(mine.data(), all.data(), std::vector<size_t>(static_cast<size_t>(world), 4));
  if (comm.rank() != 0) return "";
  std::string states;
  for (int r = 0; r < world; ++r) {
    std::array<uint64_t, 4> s{};
    for (size_t k = 0; k < 4; ++k)
      s[k] = static_cast<uint64_t>(all[4 * static_cast<size_t>(r) + k]);
    Rng tmp;
    tmp.set_state(s);
    if (r > 0) states.push_back(';');
    states.append(tmp.to_string());
  }
  return states;
}

void start_run_dir(const Config& cfg, const RunOptions& opts, const std::string& ckpt_dir) {
  fs::create_directories(ckpt_dir);
  if (const int64_t n = remove_orphaned_temp_files(ckpt_dir, /*include_step_folders=*/true))
    spdlog::info("removed {} temp file(s) that interrupted checkpoint writes left in {}", n,
                 ckpt_dir);
  write_file_atomic((fs::path(opts.out_dir) / "config.json").string(),
                    config_to_json(cfg).dump(2) + "\n");
}

nlohmann::json interrupt_summary(int stop_signal) {
  const bool interrupted = stop_signal != 0;
  return {{"status", interrupted ? "interrupted" : "completed"},
          {"interrupted_by", interrupted ? nlohmann::json(interrupt_signal_name(stop_signal))
                                         : nlohmann::json(nullptr)},
          {"interrupt_signal", stop_signal}};
}

int64_t schedule_horizon(const ResumePoint& rp, const StepPlan& plan, bool lead) {
  if (!rp.loaded || rp.schedule_steps <= 0 || rp.schedule_steps == plan.total_steps)
    return plan.total_steps;
  if (lead)
    spdlog::warn(
        "this run ends at step {}, its checkpoint's learning-rate schedule at step {}: the "
        "schedule continues as it started (train.max_steps / train.epochs changed; a schedule "
        "that decays to its end stays at its final rate past step {}). To lay out a new schedule, "
        "start a fresh run.",
        plan.total_steps, rp.schedule_steps, rp.schedule_steps);
  return rp.schedule_steps;
}

std::string nothing_left_reason(const Config& cfg, const ResumePoint& rp, const StepPlan& plan) {
  if (!rp.loaded) return "";
  const int64_t epoch = rp.epoch + (rp.batch >= plan.batches_per_epoch ? 1 : 0);
  const bool steps_done = rp.step >= plan.total_steps;
  const bool epochs_done = cfg.train.epochs > 0 && epoch >= cfg.train.epochs;
  if (!steps_done && !epochs_done) return "";
  return "nothing to train: the checkpoint " + rp.from + " is at step " + std::to_string(rp.step) +
         " (epoch " + std::to_string(epoch) + "), where this config " + "stops (" +
         (steps_done
              ? "train.max_steps / epochs give " + std::to_string(plan.total_steps) + " steps"
              : "train.epochs = " + std::to_string(cfg.train.epochs)) +
         "); raise train.max_steps or train.epochs to train further";
}

nlohmann::json nothing_to_do_summary(const std::string& why, const ResumePoint& rp) {
  return {{"status", "nothing_to_do"},
          {"reason", why},
          {"steps", rp.step},
          {"steps_this_run", 0},
          {"resumed_from", rp.from}};
}

ResumePoint resume_full_state(const Config& cfg, const RunOptions& opts, Communicator& comm,
                              const Model& model, const std::string& ckpt_dir,
                              const std::string& hash, float* params,
                              const std::vector<StateBuffer>& state, Rng& rng,
                              CompressionState* comp) {
  const int world = comm.size(), rank = comm.rank();
  const bool lead = rank == 0;
  const int64_t P = model.param_count();
  ResumePoint rp;
  std::vector<int64_t> meta_i(6, 0);  // loaded?, step, epoch, batch, optimizer steps, horizon
  std::string rng_states;
  if (lead) {
    const std::string path =
        resolve_checkpoint(opts.resume == "auto" ? ckpt_dir : opts.resume, opts.resume == "auto");
    if (!path.empty()) {
      const CheckpointMeta m = load_checkpoint(path, model, params, state, comp);
      if (m.optimizer != cfg.optimizer.type)
        throw UserError("checkpoint '" + path + "' was written by optimizer '" + m.optimizer +
                        "', this run uses '" + cfg.optimizer.type + "'");
      report_config_changes(path, m, cfg, hash);
      meta_i = {1, m.step, m.epoch, m.batch, m.optimizer_steps, m.schedule_steps};
      rng_states = m.rng;
      rp.from = path;
    } else {
      spdlog::info("--resume auto: no checkpoint in {}, starting fresh", ckpt_dir);
    }
  }
  comm.broadcast(meta_i.data(), meta_i.size(), 0);
  if (meta_i[0] != 1) return rp;
  comm.broadcast(params, static_cast<size_t>(P), 0);
  for (const auto& sb : state) comm.broadcast(sb.data, static_cast<size_t>(P), 0);
  // RNG states: one per rank of the saving run, as 4 words each.
  std::vector<int64_t> words(static_cast<size_t>(world) * 4, 0);
  if (lead) {
    const auto parts = split(rng_states, ';');
    for (int r = 0; r < world && r < static_cast<int>(parts.size()); ++r) {
      Rng tmp;
      tmp.from_string(parts[static_cast<size_t>(r)]);
      const auto st = tmp.state();
      for (int k = 0; k < 4; ++k)
        words[static_cast<size_t>(r) * 4 + static_cast<size_t>(k)] =
            static_cast<int64_t>(st[static_cast<size_t>(k)]);
    }
    if (static_cast<int>(parts.size()) != world)
      spdlog::warn(
          "checkpoint has RNG states for {} rank(s), this run has {}: ranks without one start a "
          "fresh dropout stream",
          parts.size(), world);
  }
  comm.broadcast(words.data(), words.size(), 0);
  std::array<uint64_t, 4> st{};
  bool any = false;
  for (int k = 0; k < 4; ++k) {
    st[static_cast<size_t>(k)] =
        static_cast<uint64_t>(words[static_cast<size_t>(rank) * 4 + static_cast<size_t>(k)]);
    any = any || st[static_cast<size_t>(k)] != 0;
  }
  if (any) rng.set_state(st);
  rp.loaded = true;
  rp.step = meta_i[1];
  rp.epoch = meta_i[2];
  rp.batch = meta_i[3];
  rp.optimizer_steps = meta_i[4];
  rp.schedule_steps = meta_i[5];
  if (lead)
    spdlog::info("resumed from {} at step {} (epoch {}, batch {})", rp.from, rp.step, rp.epoch,
                 rp.batch);
  return rp;
}

namespace {

// Stops the communicator recording into a tracer that is about to go away, on every exit path.
struct TracerAttachment {
  Communicator& comm;
  TracerAttachment(Communicator& c, Tracer& t) : comm(c) { comm.set_tracer(&t); }
  ~TracerAttachment() { comm.set_tracer(nullptr); }
};

}  // namespace

nlohmann::json train_data_parallel(const Config& cfg, const RunOptions& opts, Communicator& comm,
                                   Tracer& tracer);

nlohmann::json train_rank(const Config& cfg, const RunOptions& opts, Communicator& comm) {
  Tracer tracer(!opts.trace.empty(), comm.rank());
  tracer.set_thread_name("train");
  TracerAttachment attach(comm, tracer);
  nlohmann::json summary = cfg.distributed.strategy == "pipeline"
                               ? train_pipeline(cfg, opts, comm, tracer)
                               : train_data_parallel(cfg, opts, comm, tracer);
  finish_trace(opts, comm, tracer);
  return summary;
}

nlohmann::json train_data_parallel(const Config& cfg, const RunOptions& opts, Communicator& comm,
                                   Tracer& tracer) {
  const auto t_start = Clock::now();
  const int world = comm.size();
  const int rank = comm.rank();
  const bool lead = rank == 0;  // rank 0 writes every file and logs at info
  DT_CHECK_EQ(static_cast<int64_t>(world), cfg.distributed.world_size);

  const std::string ckpt_dir = (fs::path(opts.out_dir) / "checkpoints").string();
  const std::string hash = config_hash(cfg);
  const std::string config_json = config_to_json(cfg).dump();  // stored in checkpoints
  if (lead) {
    start_run_dir(cfg, opts, ckpt_dir);
  }

  // Data and model. Every rank loads the whole data set and takes its slices (sampler.h).
  auto t0 = Clock::now();
  DataSplits data = load_data(cfg.data, cfg.seed);
  const ModelShape shape = resolve_model_shape(cfg, data);
  if (const auto w = idle_ranks_warning(data.train.rows, world, 1); lead && !w.empty())
    spdlog::warn("{}", w);
  if (lead)
    spdlog::info(
        "data: {} train / {} test samples, {} features, {} classes, normalize {} ({:.2f} s)",
        data.train.rows, data.test.rows, shape.in_features, shape.num_classes,
        data.normalizer.method, seconds_since(t0));
  const Model model = build_mlp(cfg.model, shape.in_features, shape.num_classes);
  if (lead) spdlog::info("model:\n{}", model.describe());
  const int64_t P = model.param_count();
  const std::string& strategy = cfg.distributed.strategy;
  const std::vector<Bucket> buckets = make_buckets(
      model, std::max<int64_t>(1, static_cast<int64_t>(cfg.distributed.ddp.bucket_mb * 262144.0)));
  // Sharded strategies (sharding.h): zero1/zero2 shard along DDP's buckets, fsdp along its units.
  const bool sharded = is_sharded_strategy(strategy);
  const bool fsdp = strategy == "fsdp";
  std::unique_ptr<ShardedEngine> engine;
  if (sharded) {
    ShardLayout layout(
        model,
        fsdp ? units_for_fsdp(model, cfg.distributed.fsdp) : units_from_buckets(model, buckets),
        world);
    engine = std::make_unique<ShardedEngine>(model, std::move(layout), shard_mode(strategy), comm,
                                             cfg.distributed.fsdp.reshard_after_forward);
    if (lead)
      spdlog::info("{}: {} unit(s), {} of {} parameters per rank (shard, padding included)",
                   strategy, engine->layout().units().size(), engine->layout().shard_size(), P);
  }
  // Full-size buffers: fsdp holds neither (only its shards), zero2 no full gradient.
  ParamStore store(fsdp ? 0 : P);
  if (strategy == "zero2") std::vector<float>().swap(store.grads);
  if (fsdp) {
    // Each rank initialises one unit at a time and keeps its chunk: layers draw from their own
    // streams (Model::init), so this equals initialising the whole model.
    const ShardLayout& L = engine->layout();
    std::vector<float> tmp;
    for (const auto& u : L.units()) {
      tmp.assign(static_cast<size_t>(u.size()), 0.0f);
      model.init(tmp.data(), static_cast<uint64_t>(cfg.seed), u.first_layer, u.last_layer, u.begin);
      std::copy(tmp.begin() + (u.own_begin(rank) - u.begin),
                tmp.begin() + (u.own_end(rank) - u.begin),
                engine->param_shard().begin() + u.shard_offset);
    }
  } else {
    model.init(store.values.data(), static_cast<uint64_t>(cfg.seed));
    // Every rank starts from rank 0's parameters, whatever its seed.
    comm.broadcast(store.values.data(), static_cast<size_t>(P), 0);
  }
  auto opt = make_optimizer(cfg.optimizer, 0, sharded ? engine->layout().shard_size() : P);
  // state_bufs: the optimizer state as checkpoints see it -- the full layout (ddp, local_sgd)
  // or this rank's shard (sharded strategies).
  std::vector<StateBuffer> state_bufs;
  for (size_t i = 0; i < opt->state_names().size(); ++i)
    state_bufs.push_back({opt->state_names()[i], opt->state(i).data()});
  // Local SGD: ranks step on their own data and average parameters every H steps. With an
  // outer optimizer (DiLoCo), `anchor` holds the parameters of the last synchronisation and
  // `outer_momentum` its Nesterov buffer (checkpointed as optimizer state "outer_momentum").
  const bool local_sgd = cfg.distributed.strategy == "local_sgd";
  const LocalSgdConfig& lsc = cfg.distributed.local_sgd;
  const bool outer = local_sgd && lsc.outer_lr > 0;
  std::vector<float> anchor, outer_momentum;
  if (outer) {
    outer_momentum.assign(static_cast<size_t>(P), 0.0f);
    state_bufs.push_back({"outer_momentum", outer_momentum.data()});
  }

  // Schedule of steps.
  const int64_t b = cfg.data.batch_size;
  Sampler sampler(data.train.rows, b, world, rank, cfg.data.shuffle, cfg.data.drop_last,
                  static_cast<uint64_t>(cfg.seed));
  const StepPlan plan = plan_steps(cfg, sampler.batches_per_epoch(), data.train.rows, world);
  const int64_t bpe = plan.batches_per_epoch, K = plan.accum;
  const int64_t steps_per_epoch = plan.steps_per_epoch, total_steps = plan.total_steps;
  const double base_lr = plan.base_lr;
  Rng rng(static_cast<uint64_t>(cfg.seed), 0xD7A1000ULL + static_cast<uint64_t>(rank));

  // Resume: the full state is read by rank 0 and broadcast; sharded strategies keep their chunks
  // of it (the full buffers are temporary).
  int64_t step = 0, epoch = 0, batch = 0;
  std::string resumed_from;
  ResumePoint rp;
  CompressionState saved_comp;  // rank 0: the checkpoint's compression state
  if (!opts.resume.empty()) {
    std::vector<float> full_params_tmp;
    std::vector<std::vector<float>> full_state_tmp;
    float* load_params = store.values.data();
    std::vector<StateBuffer> load_state = state_bufs;
    if (sharded) {
      if (fsdp) {
        full_params_tmp.assign(static_cast<size_t>(P), 0.0f);
        load_params = full_params_tmp.data();
      }
      full_state_tmp.assign(state_bufs.size(), std::vector<float>(static_cast<size_t>(P), 0.0f));
      for (size_t i = 0; i < state_bufs.size(); ++i) load_state[i].data = full_state_tmp[i].data();
    }
    rp = resume_full_state(cfg, opts, comm, model, ckpt_dir, hash, load_params, load_state, rng,
                           &saved_comp);
    if (rp.loaded) {
      if (sharded) {
        const ShardLayout& L = engine->layout();
        if (fsdp) L.full_to_shard(rank, load_params, engine->param_shard().data());
        for (size_t i = 0; i < state_bufs.size(); ++i)
          L.full_to_shard(rank, load_state[i].data, state_bufs[i].data);
      }
      step = rp.step;
      epoch = rp.epoch;
      batch = rp.batch;
      opt->set_step_count(rp.optimizer_steps);
      resumed_from = rp.from;
    }
  }

  if (const std::string why = nothing_left_reason(cfg, rp, plan); !why.empty()) {
    if (lead) spdlog::warn("{}", why);
    return nothing_to_do_summary(why, rp);
  }
  const int64_t schedule_steps = schedule_horizon(rp, plan, lead);

  // Checkpoints are taken at synchronisation points, where every rank holds the anchor.
  if (outer || (local_sgd && world > 1 && cfg.distributed.compression.type != "none"))
    anchor = store.values;

  std::unique_ptr<LineWriter> metrics;
  if (lead)
    metrics = std::make_unique<LineWriter>((fs::path(opts.out_dir) / "metrics.jsonl").string(),
                                           !resumed_from.empty());
  if (lead)
    spdlog::info(
        "training: {} steps ({} per epoch, batch {} x {} rank(s), grad_accum {}), {} params, "
        "{} BLAS thread(s) ({} kernels), backend {}, out {}",
        total_steps == std::numeric_limits<int64_t>::max() ? -1 : total_steps, steps_per_epoch, b,
        world, K, P, blas_threads(), blas_core(), comm.backend(), opts.out_dir);

  auto epoch_progress = [&] {
    return static_cast<double>(epoch) + static_cast<double>(batch) / static_cast<double>(bpe);
  };
  ProgressBar bar(opts.progress && lead);
  EvalResult last_eval;
  bool have_eval = false;
  int64_t last_eval_step = -1, last_ckpt_step = resumed_from.empty() ? -1 : step;
  // Local SGD synchronisation: average parameters (and optionally optimizer state) over ranks;
  // with the outer optimizer, apply the averaged change as a Nesterov pseudo-gradient step.
  // Local SGD with compression: what each rank moved since the last synchronisation
  // (anchor - params) goes through the compressed reducer, with error feedback on it, instead of
  // the parameters through a dense average.
  std::unique_ptr<GradReducer> delta_reducer;
  std::vector<float> delta;
  if (local_sgd && world > 1 && cfg.distributed.compression.type != "none") {
    delta_reducer = make_grad_reducer(cfg.distributed.compression, model.params(), P,
                                      static_cast<uint64_t>(cfg.seed));
    delta.assign(static_cast<size_t>(P), 0.0f);
    if (lead) spdlog::info("local_sgd compression {}", delta_reducer->describe());
  }
  // DDP with compression: the whole gradient is compressed after backward and exchanged
  // (all-gathered messages, or PowerSGD's all-reduced factors). At world size 1 too: the
  // encode/decode round trip alone (with error feedback), to study its cost in one process.
  std::unique_ptr<GradReducer> compressor;
  if (!local_sgd && cfg.distributed.compression.type != "none") {
    compressor = make_grad_reducer(cfg.distributed.compression, model.params(), P,
                                   static_cast<uint64_t>(cfg.seed));
    if (lead)
      spdlog::info("compression {}{}", compressor->describe(),
                   world == 1 ? " (world size 1: the round trip only, nothing is sent)" : "");
  }
  if (lead && local_sgd && world == 1 && cfg.distributed.compression.type != "none")
    spdlog::warn(
        "distributed.compression {} is unused: local_sgd at world size 1 never "
        "synchronises, so there is nothing to compress",
        cfg.distributed.compression.type);
  // The reducer whose state (error-feedback residuals, PowerSGD's Q) checkpoints carry.
  GradReducer* const reducer = compressor ? compressor.get() : delta_reducer.get();
  if (reducer && rp.loaded)
    restore_compression_state(comm, *reducer, cfg.distributed.compression.type, strategy,
                              saved_comp);
  auto local_sync = [&] {
    std::vector<WorkPtr> w;
    if (!delta_reducer)
      w.push_back(
          comm.allreduce_async(store.values.data(), static_cast<size_t>(P), ReduceOp::kAvg));
    if (lsc.sync_optimizer_state)
      for (size_t i = 0; i < opt->state_names().size(); ++i)
        w.push_back(
            comm.allreduce_async(opt->state(i).data(), static_cast<size_t>(P), ReduceOp::kAvg));
    if (delta_reducer) {
      for (int64_t j = 0; j < P; ++j) delta[j] = anchor[j] - store.values[j];
      delta_reducer->allreduce_sum(comm, delta.data());
    }
    for (auto& x : w) x->wait();
    if (delta_reducer) {
      // The averaged move, applied to the anchor (the outer step below then sees it as its
      // pseudo-gradient).
      const float inv = 1.0f / static_cast<float>(world);
      for (int64_t j = 0; j < P; ++j) store.values[j] = anchor[j] - delta[j] * inv;
      if (!outer) {
        anchor = store.values;
        return;
      }
    }
    if (!outer) return;
    const float mu = static_cast<float>(lsc.outer_momentum);
    const float olr = static_cast<float>(lsc.outer_lr);
    for (int64_t j = 0; j < P; ++j) {
      const float delta = anchor[j] - store.values[j];  // pseudo-gradient
      outer_momentum[j] = mu * outer_momentum[j] + delta;
      anchor[j] -= olr * (delta + mu * outer_momentum[j]);
      store.values[j] = anchor[j];
    }
  };
  auto interval_t0 = Clock::now();
  // Evaluation and checkpoint time is excluded from the train records' samples_per_s.
  auto run_eval = [&] {
    if (data.test.rows == 0) return;
    TraceScope ts(tracer, "eval", "eval");
    const auto e0 = Clock::now();
    // Each rank evaluates a contiguous share of the test set; the sums are all-reduced.
    const int64_t n = data.test.rows;
    const int64_t lo = n * rank / world, hi = n * (rank + 1) / world;
    const auto [loss_sum, correct] =
        fsdp ? engine->eval_rows(data.test, cfg.data.eval_batch_size, cfg.model.loss)
             : eval_rows(model, store.values.data(), data.test, lo, hi, cfg.data.eval_batch_size,
                         cfg.model.loss);
    std::vector<float> sums = {static_cast<float>(loss_sum), static_cast<float>(correct)};
    if (world > 1) comm.allreduce(sums.data(), sums.size(), ReduceOp::kSum);
    last_eval.samples = n;
    last_eval.loss = sums[0] / static_cast<double>(n);
    last_eval.accuracy = std::round(sums[1]) / static_cast<double>(n);
    have_eval = true;
    last_eval_step = step;
    if (lead) {
      nlohmann::json rec = {{"kind", "eval"},
                            {"step", step},
                            {"epoch", epoch_progress()},
                            {"test_loss", nan_to_null(last_eval.loss)},
                            {"test_accuracy", last_eval.accuracy}};
      metrics->write_line(rec.dump());
      bar.clear();
      spdlog::info("eval step {} epoch {:.2f}: test_loss {:.4f} test_accuracy {:.4f}", step,
                   epoch_progress(), last_eval.loss, last_eval.accuracy);
    }
    interval_t0 += Clock::now() - e0;
  };
  // Sharded checkpoint: every rank writes its shard; once all have (an all-reduce of success
  // flags), rank 0 writes the manifest and moves `latest`. A crash before that leaves the
  // previous checkpoint the newest complete one.
  auto save_sharded = [&](const CheckpointMeta& m) {
    const std::string name = sharded_checkpoint_name(step);
    const fs::path dir = fs::path(ckpt_dir) / name;
    if (lead) fs::remove_all(dir);  // leftovers of a crashed attempt at this step
    comm.barrier();
    const ShardLayout& L = engine->layout();
    std::string err;
    try {
      fs::create_directories(dir);
      std::vector<float> pshard;
      const float* pp = nullptr;
      if (fsdp) {
        pp = engine->param_shard().data();
      } else {
        pshard.assign(static_cast<size_t>(L.shard_size()), 0.0f);
        L.full_to_shard(rank, store.values.data(), pshard.data());
        pp = pshard.data();
      }
      save_shard(dir.string(), rank, L.ranges(rank), L.shard_size(), pp, state_bufs);
    } catch (const std::exception& e) {
      err = e.what();
    }
    if (fault_due(opts.faults, "kill_in_save", rank, step))
      die_by_fault("rank " + std::to_string(rank) + " wrote its shard of step " +
                   std::to_string(step));
    float ok = err.empty() ? 1.0f : 0.0f;
    comm.allreduce(&ok, 1, ReduceOp::kMin);
    if (!err.empty()) throw std::runtime_error("writing checkpoint shard: " + err);
    if (ok < 1.0f)
      throw std::runtime_error("another rank failed to write its shard of checkpoint " + name);
    if (lead) {
      std::vector<std::vector<ShardRange>> all;
      for (int r = 0; r < world; ++r) all.push_back(L.ranges(r));
      write_manifest(dir.string(), model, m, all, opt->state_names());
      commit_checkpoint(ckpt_dir, name, cfg.train.checkpoint.keep_last);
      spdlog::debug("checkpoint {}", name);
    }
  };
  auto save = [&] {
    const auto s0 = Clock::now();
    TraceScope ts(tracer, "checkpoint", "checkpoint");
    // Every rank's RNG state goes into the checkpoint (dropout streams differ per rank).
    const std::string states = gather_rng_states(comm, rng);
    CheckpointMeta m;
    if (lead) {
      m.step = step;
      m.epoch = epoch;
      m.batch = batch;
      m.optimizer = cfg.optimizer.type;
      m.optimizer_steps = opt->step_count();
      m.rng = states;
      m.config_hash = hash;
      m.world_size = world;
      m.strategy = cfg.distributed.strategy;
      m.config_json = config_json;
      m.schedule_steps = schedule_steps;
    }
    // Every rank's compression state goes to rank 0 (compression_state.h).
    const CompressionState comp =
        reducer ? gather_compression_state(comm, *reducer, cfg.distributed.compression.type)
                : CompressionState{};
    if (sharded) {
      save_sharded(m);
    } else if (lead) {
      const std::string name = checkpoint_file_name(step);
      save_checkpoint((fs::path(ckpt_dir) / name).string(), model, store.values.data(), state_bufs,
                      m, comp);
      commit_checkpoint(ckpt_dir, name, cfg.train.checkpoint.keep_last);
      spdlog::debug("checkpoint {}", name);
    }
    last_ckpt_step = step;
    interval_t0 += Clock::now() - s0;
  };

  Activations acts;
  Tensor x, dlogits;
  std::vector<int32_t> y;
  ForwardCtx ctx{.training = true, .rng = &rng};
  double interval_loss = 0.0, final_train_loss = std::nan("");
  int64_t interval_samples = 0, samples_trained = 0;
  double train_s = 0.0, last_sps = 0.0;
  const int64_t first_step = step;
  const uint64_t bytes_sent0 = comm.bytes_sent(), bytes_recv0 = comm.bytes_recv();
  const double comm_s0 = comm.comm_seconds();
  if (lead && world > 1 && (strategy == "ddp" || strategy == "zero1"))
    spdlog::info(
        "ddp: {} gradient bucket(s) of at most {} MiB (a layer larger than that is "
        "a bucket of its own): {}",
        buckets.size(), cfg.distributed.ddp.bucket_mb, bucket_sizes_mib(buckets));
  if (lead && world > 1 && local_sgd)
    spdlog::info(
        "local_sgd: parameters averaged every {} step(s){}{}", lsc.sync_every,
        lsc.sync_optimizer_state ? ", optimizer state too" : "",
        outer ? fmt::format(", outer Nesterov lr {} momentum {}", lsc.outer_lr, lsc.outer_momentum)
              : std::string());
  std::vector<WorkPtr> works;
  std::vector<std::vector<int64_t>> micro_idx;
  bool eval_due = false;
  double exposed_comm_s = 0.0;
  int64_t skipped_steps = 0;  // train.nonfinite: skip
  // Safe interrupts: the step after which every rank stops (stop.h); Local SGD stops at the
  // first synchronisation at or after it, where the ranks hold the same parameters.
  StopAgreement stop_vote(opts.stop, comm);
  int stop_pending = 0, stop_signal = 0;
  // Stragglers: at every train record the ranks all-gather their compute time since the last
  // one (synchronous steps give every rank the same wall time, so compute time is what tells a
  // slow rank); rank 0 warns, naming the rank, when the same rank is 25% (and 1 ms per step)
  // above the median of the other ranks in two records running. The slowest rank is left out
  // of the median it is compared with: with it, W = 2 would compare it with itself (the upper
  // median) or with its own mean with the other rank (a 67% threshold instead of 25%).
  int64_t interval_first_step = step;
  double compute_at_record = 0.0;
  int slow_rank = -1, slow_streak = 0;
  int64_t straggler_warnings = 0;
  auto straggler_check = [&](int64_t steps) {
    const double compute_now = train_s - exposed_comm_s;
    const float mine = static_cast<float>(compute_now - compute_at_record);
    compute_at_record = compute_now;
    std::vector<float> all(static_cast<size_t>(world));
    comm.allgather(&mine, all.data(), std::vector<size_t>(static_cast<size_t>(world), 1));
    if (steps <= 0) return;
    const auto it = std::max_element(all.begin(), all.end());
    const int r = static_cast<int>(it - all.begin());
    const double worst = *it / static_cast<double>(steps);
    std::vector<float> others = all;
    others.erase(others.begin() + r);
    std::sort(others.begin(), others.end());
    const size_t m = others.size() / 2;  // even sizes: the mean of the two middle values
    const double median = (others.size() % 2 == 1 ? others[m] : 0.5 * (others[m - 1] + others[m])) /
                          static_cast<double>(steps);
    if (worst > 1.25 * median && worst - median > 1e-3) {
      slow_streak = r == slow_rank ? slow_streak + 1 : 1;
      slow_rank = r;
    } else {
      slow_streak = 0;
      slow_rank = -1;
    }
    if (slow_streak >= 2) {
      ++straggler_warnings;
      if (lead)
        spdlog::warn(
            "straggler: rank {} computes {:.1f} ms per step against a median of {:.1f} ms of "
            "the other ranks over the last {} steps (every rank waits for it)",
            r, worst * 1e3, median * 1e3, steps);
    }
  };

  while (step < total_steps) {
    if (batch >= bpe) {
      ++epoch;
      batch = 0;
    }
    if (cfg.train.epochs > 0 && epoch >= cfg.train.epochs) break;
    // Local SGD ranks can stop only at a synchronisation, so they vote only in the steps that
    // end in one: no collective of its own between synchronisations.
    if (!local_sgd || world == 1 || (step + 1) % lsc.sync_every == 0) stop_vote.begin_step();
    const auto step_t0 = Clock::now();
    TraceScope step_scope(tracer, "step", "train");
    const int64_t n_micro = std::min(K, bpe - batch);
    int64_t step_samples = 0;
    for (int64_t i = 0; i < n_micro; ++i) step_samples += sampler.global_batch_size(batch + i);
    micro_idx.resize(static_cast<size_t>(n_micro));
    int64_t local_samples = 0;
    for (int64_t i = 0; i < n_micro; ++i) {
      micro_idx[static_cast<size_t>(i)] = sampler.batch(epoch, batch + i);
      local_samples += static_cast<int64_t>(micro_idx[static_cast<size_t>(i)].size());
    }
    // DDP: gradients are sums scaled by 1 / (samples in the step over all ranks), so summing
    // them across ranks gives the gradient of the mean loss of the global batch. Local SGD: each
    // rank's own mean.
    const int64_t scale_samples = local_sgd ? std::max<int64_t>(1, local_samples) : step_samples;
    const float scale = 1.0f / static_cast<float>(scale_samples);

    std::fill(store.grads.begin(), store.grads.end(), 0.0f);
    if (engine) std::fill(engine->grad_shard().begin(), engine->grad_shard().end(), 0.0f);
    const double engine_wait0 = engine ? engine->wait_seconds() : 0.0;
    double loss_sum = 0.0;
    works.clear();
    size_t next_bucket = 0;
    // DDP: on the last micro-batch, each bucket's all-reduce starts on the communication thread
    // as soon as backward has finished its layers, overlapping the rest of backward.
    const std::function<void(size_t)> launch_ready = [&](size_t layer) {
      while (next_bucket < buckets.size() && buckets[next_bucket].first_layer == layer) {
        const Bucket& bk = buckets[next_bucket++];
        works.push_back(comm.allreduce_async(
            store.grads.data() + bk.begin, static_cast<size_t>(bk.end - bk.begin), ReduceOp::kSum));
      }
    };
    // ddp and zero1 all-reduce full gradients in buckets; zero2 and fsdp reduce-scatter unit by
    // unit inside the engine, every micro-batch.
    const bool unit_wise = engine && engine->mode() != ShardMode::kZero1;
    const bool bucket_sync = world > 1 && !local_sgd && !compressor && !unit_wise;
    // DDP: the step's loss is known after the last forward; its all-reduce runs during backward,
    // ahead of the gradient buckets, so it adds no round trip after backward.
    float step_loss_sum = 0.0f;
    for (int64_t i = 0; i < n_micro; ++i) {
      gather_rows(data.train, micro_idx[static_cast<size_t>(i)], x, y);
      if (unit_wise) {
        TraceScope ts(tracer, "forward+backward", "compute");
        loss_sum += engine->forward_backward(fsdp ? nullptr : store.values.data(), x, y.data(),
                                             cfg.model.loss, scale, acts, ctx);
        if (i == n_micro - 1 && fault_due(opts.faults, "nan", rank, step + 1))
          engine->grad_shard()[0] = std::nanf("");  // DTRAIN_FAULT
        if (world > 1 && i == n_micro - 1) {
          step_loss_sum = static_cast<float>(loss_sum);
          works.push_back(comm.allreduce_async(&step_loss_sum, 1, ReduceOp::kSum));
        }
        continue;
      }
      std::optional<TraceScope> fw(std::in_place, tracer, "forward", "compute");
      const Tensor& out = model.forward(store.values.data(), x, acts, ctx);
      loss_sum += loss_and_grad(cfg.model.loss, out, y.data(), &dlogits, scale);
      fw.reset();
      if (i == n_micro - 1 && fault_due(opts.faults, "nan", rank, step + 1))
        dlogits.data()[0] = std::nanf("");  // DTRAIN_FAULT: a NaN enters this rank's gradients
      if (world > 1 && !local_sgd && i == n_micro - 1) {
        step_loss_sum = static_cast<float>(loss_sum);
        works.push_back(comm.allreduce_async(&step_loss_sum, 1, ReduceOp::kSum));
      }
      const bool sync = bucket_sync && i == n_micro - 1;
      TraceScope bw(tracer, "backward", "compute");
      model.backward(store.values.data(), store.grads.data(), x, acts, dlogits, nullptr, 0,
                     SIZE_MAX, sync ? launch_ready : std::function<void(size_t)>());
    }
    if (world > 1 && !local_sgd) {
      const auto c0 = Clock::now();
      if (compressor) {
        compressor->allreduce_sum(comm, store.grads.data());
      } else if (bucket_sync) {
        DT_CHECK_EQ(next_bucket, buckets.size());
      }
      exposed_comm_s += seconds_since(c0);
      // Exposed communication: what is still running once backward has ended.
      TraceScope wait_scope(tracer, "wait for communication", "wait");
      const auto w0 = Clock::now();
      for (auto& w : works) w->wait();
      exposed_comm_s += seconds_since(w0);
      loss_sum = step_loss_sum;
    } else if (compressor) {
      compressor->allreduce_sum(comm, store.grads.data());  // world size 1: the round trip
    }
    batch += n_micro;
    // The samples loss_sum covers: the global batch for DDP, this rank's share for Local SGD.
    const int64_t loss_samples = local_sgd ? local_samples : step_samples;
    const double step_loss = loss_samples > 0 ? loss_sum / static_cast<double>(loss_samples) : 0.0;
    // Non-finite guard. DDP (with or without compression) and zero1 hold identical reduced
    // gradients and loss on every rank, so every rank reaches the same verdict alone; Local SGD
    // and the unit-wise strategies hold their own, so the verdict is all-reduced (min code).
    // A skipped step drops its update (and its loss and samples from the record) only: the
    // step still counts, and its record, evaluation, checkpoint and Local SGD synchronisation
    // happen as for any other step.
    bool skip = false;
    {
      float code = kFiniteCode;
      if (!std::isfinite(step_loss)) {
        code = kLossCode;
      } else {
        const int64_t e = unit_wise ? first_nonfinite_param(model, engine->grad_shard().data(),
                                                            engine->layout().ranges(rank))
                                    : first_nonfinite_param(model, store.grads.data(), {{0, P, 0}});
        if (e >= 0) code = static_cast<float>(e + 1);
      }
      if (world > 1 && (local_sgd || unit_wise)) comm.allreduce(&code, 1, ReduceOp::kMin);
      if (code != kFiniteCode) {
        const std::string what = nonfinite_what(model, code);
        if (cfg.train.nonfinite == "abort")
          throw std::runtime_error(
              what + " is not finite at step " + std::to_string(step + 1) +
              " (train.nonfinite: abort; lower optimizer.lr, set optimizer.clip_grad_norm, or "
              "set train.nonfinite: skip)");
        ++skipped_steps;
        if (lead)
          spdlog::warn("step {} skipped on every rank: {} is not finite ({} skipped so far)",
                       step + 1, what, skipped_steps);
        skip = true;
      }
    }
    if (!skip && cfg.optimizer.clip_grad_norm > 0) {
      if (engine) {
        const float f =
            clip_factor(engine->grad_norm(store.grads.data()), cfg.optimizer.clip_grad_norm);
        if (f < 1.0f) engine->scale_grads(store.grads.data(), f);
      } else {
        const double norm = std::sqrt(sum_squares(store.grads.data(), P));
        const float f = clip_factor(norm, cfg.optimizer.clip_grad_norm);
        if (f < 1.0f) scale_inplace(store.grads.data(), P, f);
      }
    }
    const double lr = lr_at(cfg.optimizer.schedule, base_lr, step, schedule_steps);
    if (!skip) {
      TraceScope opt_scope(tracer, "optimizer", "compute");
      if (engine) {
        engine->optimizer_step(*opt, lr, store.values.data(), store.grads.data());
      } else {
        opt->step(store.values.data(), store.grads.data(), lr);
      }
    }
    if (engine) exposed_comm_s += engine->wait_seconds() - engine_wait0;
    ++step;
    if (local_sgd && world > 1 && (step % lsc.sync_every == 0 || step == total_steps)) {
      const auto s0 = Clock::now();
      local_sync();
      exposed_comm_s += seconds_since(s0);
    }
    apply_step_faults(opts.faults, rank, step, comm);  // DTRAIN_FAULT; a delay is step time
    train_s += seconds_since(step_t0);
    if (!skip) {
      samples_trained += step_samples;
      interval_loss += loss_sum;
      interval_samples += loss_samples;
    }

    const bool epoch_done = batch >= bpe;
    if (epoch_done) {
      ++epoch;
      batch = 0;
    }
    const int64_t bar_total = total_steps == std::numeric_limits<int64_t>::max() ? 0 : total_steps;
    if (step % cfg.train.log_every == 0 || step == total_steps || epoch_done) {
      const double el = seconds_since(interval_t0);
      if (world > 1) straggler_check(step - interval_first_step);
      interval_first_step = step;
      if (local_sgd && world > 1) {
        // Each rank's loss covers its own samples: the record reports the mean over all ranks.
        std::vector<float> v = {static_cast<float>(interval_loss),
                                static_cast<float>(interval_samples)};
        comm.allreduce(v.data(), v.size(), ReduceOp::kSum);
        interval_loss = v[0];
        interval_samples = static_cast<int64_t>(std::llround(v[1]));
      }
      // NaN (null in the record) when every step since the last record was skipped.
      const double mean_loss = interval_samples > 0
                                   ? interval_loss / static_cast<double>(interval_samples)
                                   : std::nan("");
      if (interval_samples > 0) final_train_loss = mean_loss;
      const double sps = el > 0 ? static_cast<double>(interval_samples) / el : 0.0;
      last_sps = sps;
      if (lead && (step % cfg.train.log_every == 0 || step == total_steps)) {
        nlohmann::json rec = {{"kind", "train"},
                              {"step", step},
                              {"epoch", epoch_progress()},
                              {"loss", nan_to_null(mean_loss)},
                              {"lr", lr},
                              {"samples_per_s", sps},
                              {"comm_bytes_sent", comm.bytes_sent() - bytes_sent0},
                              {"comm_bytes_recv", comm.bytes_recv() - bytes_recv0},
                              {"comm_s", comm.comm_seconds() - comm_s0},
                              {"compute_s", train_s - exposed_comm_s},
                              {"exposed_comm_s", exposed_comm_s}};
        metrics->write_line(rec.dump());
        if (!opts.progress)
          spdlog::info("step {} epoch {:.2f} loss {:.4f} lr {:.4g} {:.0f} samples/s", step,
                       epoch_progress(), mean_loss, lr, sps);
      }
      interval_loss = 0.0;
      interval_samples = 0;
      interval_t0 = Clock::now();
      bar.update(step, bar_total, epoch_progress(), mean_loss, sps);
    } else {
      // Between records: the rate of the interval so far, so the bar shows one from step 1.
      const double el = seconds_since(interval_t0);
      bar.update(step, bar_total, epoch_progress(), step_loss,
                 el > 0 ? static_cast<double>(interval_samples) / el : last_sps);
    }
    if (epoch_done || (cfg.train.eval_every > 0 && step % cfg.train.eval_every == 0))
      eval_due = true;
    // Local SGD ranks hold the same parameters only right after a synchronisation: an
    // evaluation falls due at the first synchronisation at or after the epoch end (no extra
    // parameter traffic).
    const bool in_sync = !local_sgd || world == 1 || step % lsc.sync_every == 0;
    if (eval_due && in_sync) {
      run_eval();
      eval_due = false;
    }
    if (cfg.train.checkpoint.every_steps > 0 && step % cfg.train.checkpoint.every_steps == 0)
      save();
    if (const int s = stop_vote.end_step(); s != 0 && stop_pending == 0) {
      stop_pending = s;
      if (lead) {
        bar.clear();
        spdlog::warn(
            "{}: stopping after step {}{}, then writing a checkpoint (again: stop at once)",
            interrupt_signal_name(s), step,
            in_sync ? "" : " at the next Local SGD synchronisation");
      }
    }
    if (stop_pending != 0 && in_sync) {
      stop_signal = stop_pending;
      break;
    }
  }
  const bool interrupted = stop_signal != 0;
  if (last_eval_step != step && !interrupted) run_eval();  // an interrupt wants out quickly
  if (last_ckpt_step != step) save();
  bar.clear();

  // Training-state memory of this rank, exact from the buffers (sharding.h's StateMemory).
  StateMemory mem;
  if (engine) {
    mem = engine->memory(*opt, P);
  } else {
    mem.param_bytes = static_cast<int64_t>(store.values.size()) * 4;
    mem.grad_bytes = static_cast<int64_t>(store.grads.size()) * 4;
    mem.optim_bytes = opt->state_bytes() + static_cast<int64_t>(outer_momentum.size()) * 4 +
                      static_cast<int64_t>(anchor.size()) * 4;
  }
  spdlog::info(
      "rank {} memory: params {:.1f} MiB, grads {:.1f} MiB, optimizer {:.1f} MiB, peak "
      "gathered params {:.1f} MiB, peak unit grads {:.1f} MiB; peak RSS {:.0f} MiB",
      rank, mem.param_bytes / 1048576.0, mem.grad_bytes / 1048576.0, mem.optim_bytes / 1048576.0,
      mem.peak_gathered_bytes / 1048576.0, mem.peak_unit_grad_bytes / 1048576.0, peak_rss_mb());
  nlohmann::json summary = interrupt_summary(stop_signal);
  summary.update({
      {"steps", step},
      {"epochs", epoch_progress()},
      {"world_size", world},
      {"strategy", cfg.distributed.strategy},
      {"backend", comm.backend()},
      {"final_train_loss", nan_to_null(final_train_loss)},
      {"test_loss", have_eval ? nan_to_null(last_eval.loss) : nlohmann::json(nullptr)},
      {"test_accuracy", have_eval ? nlohmann::json(last_eval.accuracy) : nlohmann::json(nullptr)},
      {"wall_s", seconds_since(t_start)},
      {"train_s", train_s},
      {"train_samples_per_s", train_s > 0 ? static_cast<double>(samples_trained) / train_s : 0.0},
      {"peak_rss_mb", peak_rss_mb()},
      {"comm_bytes_sent", comm.bytes_sent() - bytes_sent0},
      {"comm_bytes_recv", comm.bytes_recv() - bytes_recv0},
      {"comm_s", comm.comm_seconds() - comm_s0},
      {"compute_s", train_s - exposed_comm_s},
      {"exposed_comm_s", exposed_comm_s},
      {"skipped_steps", skipped_steps},
      {"straggler_warnings", straggler_warnings},
      {"config_hash", hash},
      {"param_count", P},
      {"steps_this_run", step - first_step},
      {"resumed_from",
       resumed_from.empty() ? nlohmann::json(nullptr) : nlohmann::json(resumed_from)},
      {"checkpoint",
       (fs::path(ckpt_dir) / (sharded ? sharded_checkpoint_name(step) : checkpoint_file_name(step)))
           .string()},
      {"param_bytes", mem.param_bytes},
      {"grad_bytes", mem.grad_bytes},
      {"optim_bytes", mem.optim_bytes},
      {"peak_gathered_bytes", mem.peak_gathered_bytes},
      {"peak_unit_grad_bytes", mem.peak_unit_grad_bytes},
  });
  if (lead) {
    write_file_atomic((fs::path(opts.out_dir) / "summary.json").string(), summary.dump(2) + "\n");
    spdlog::debug("done: {} steps, test_accuracy {}, {:.1f} s, results in {}", step,
                  have_eval ? fmt::format("{:.4f}", last_eval.accuracy) : std::string("n/a"),
                  seconds_since(t_start), opts.out_dir);
  }
  return summary;
}

nlohmann::json run_training(const Config& cfg, const RunOptions& opts) {
  const int world = static_cast<int>(cfg.distributed.world_size);
  CommOptions copts;
  copts.timeout_s = cfg.distributed.timeout_s;  // as for gRPC ranks (distributed.cc)
  if (cfg.distributed.backend == "grpc")
    throw UserError(
        "distributed.backend grpc: start the ranks with `dtrain launch` or set RANK/WORLD_SIZE");
  // In-process ranks share one process: OpenBLAS gets cores / ranks threads each (1 on a 2-core
  // machine), and with one thread every call runs in its caller's thread, so ranks compute
  // concurrently without sharing OpenBLAS's thread pool.
  const int threads = cfg.runtime.threads > 0 ? static_cast<int>(cfg.runtime.threads)
                                              : std::max(1, hardware_cores() / world);
  if (world > 1 && threads > 1)
    spdlog::warn(
        "runtime.threads = {} with {} in-process ranks: OpenBLAS serialises calls from "
        "several threads into one pool; 1 thread per rank is usually faster",
        threads, world);
  set_blas_threads(threads);
  auto transports = make_inproc_group(world);
  if (world == 1) {
    Communicator comm(std::move(transports[0]), copts);
    return train_rank(cfg, opts, comm);
  }
  std::vector<nlohmann::json> summaries(static_cast<size_t>(world));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::atomic<int> first_failed{-1};
  std::vector<std::thread> threads_v;
  for (int r = 0; r < world; ++r) {
    threads_v.emplace_back([&, r] {
      Communicator comm(std::move(transports[static_cast<size_t>(r)]), copts);
      try {
        summaries[static_cast<size_t>(r)] = train_rank(cfg, opts, comm);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        int expected = -1;
        first_failed.compare_exchange_strong(expected, r);
        comm.abort("rank " + std::to_string(r) + " failed: " + e.what());
      }
    });
  }
  for (auto& t : threads_v) t.join();
  // Report the rank that failed first: the others only saw its abort.
  if (first_failed.load() >= 0)
    std::rethrow_exception(errors[static_cast<size_t>(first_failed.load())]);
  return summaries[0];
}

}  // namespace dtrain
