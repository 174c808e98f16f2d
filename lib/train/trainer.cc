#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "comm/inproc.h"
#include "comm/inproc_ranks.h"
#include "config/config_diff.h"
#include "config/schema.h"
#include "data/sampler.h"
#include "nn/loss.h"
#include "optim/optimizer.h"
#include "tensor/blas.h"
#include "train/batch.h"
#include "train/checkpoint_config.h"
#include "train/compression.h"
#include "train/compression_state.h"
#include "train/loop.h"
#include "train/run_dir.h"
#include "train/stop.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/rng.h"
#include "util/strings.h"

namespace dtrain {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Where the first label >= `limit` is in the files (the splits are shuffled: a sample's index in
// one is no place in a file): " in data row N of 'FILE'" (CSV rows after the header, 1-based),
// " in image N of 'FILE'" or " in generated sample N", read again unsplit; "" when it cannot be
// told. Error path only.
std::string first_label_at_or_above(const DataConfig& d, bool test_files, int32_t limit) {
  DataConfig raw = d;
  if (test_files) {
    raw.train = d.test;
  }
  raw.test = {};
  raw.test_fraction = 0.0;
  try {
    const Dataset t = load_data(raw, 0).train;
    const auto it = std::find_if(t.y.begin(), t.y.end(), [&](int32_t v) { return v >= limit; });
    if (it == t.y.end()) return "";
    const int64_t n = (it - t.y.begin()) + 1;
    if (d.format == DataFormat::kSynthetic) return " in generated sample " + std::to_string(n);
    if (d.format == DataFormat::kIdx)
      return " in image " + std::to_string(n) + " of '" + raw.train.labels + "'";
    if (raw.train.path.size() == 1)
      return " in data row " + std::to_string(n) + " of '" + raw.train.path[0] + "'";
  } catch (...) {  // (out of memory for a second copy, say: the message goes without the row)
  }
  return "";
}

// Labels of which few of the range 0..classes - 1 occur (a stray 1000000 among 0..3 made a
// model of 1,000,001 outputs in silence): most outputs are never taught, said with the largest
// label's place. A range with gaps may be meant (a subset of a larger label set): a warning,
// which model.num_classes silences.
void warn_sparse_labels(const DataConfig& d, const std::vector<int32_t>& y, int64_t classes) {
  std::vector<int32_t> u = y;
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
  const auto distinct = static_cast<int64_t>(u.size());
  if (classes <= 2 * distinct || classes - distinct < 64) return;
  spdlog::warn(
      "the training labels go up to {} (the largest{}), so the model gets {} outputs, but only "
      "{} distinct labels occur: {} outputs are never taught. A wrong label? Fix the data; "
      "otherwise set model.num_classes to {} to say it is meant",
      u.back(), first_label_at_or_above(d, false, u.back()), classes, distinct, classes - distinct,
      classes);
}

}  // namespace

ModelShape resolve_model_shape(const Config& cfg, const DataSplits& data, bool speak,
                               bool training) {
  ModelShape s;
  s.in_features = data.train.input_features();
  s.sample = data.train.input_shape();
  if (cfg.model.input_features > 0 && cfg.model.input_features != s.in_features)
    throw UserError("model.input_features is " + std::to_string(cfg.model.input_features) +
                    " but the data has " + std::to_string(s.in_features) + " features");
  s.num_classes = std::max(data.train.num_classes, data.test.num_classes);
  // The training labels' range, in one pass (num_classes is each split's own max label + 1 or
  // both splits'; the labels tell).
  const std::vector<int32_t>& y = data.train.y;
  const bool labelled = data.train.kind == SampleKind::kFeatures && !y.empty();
  const auto [lo, hi] = std::minmax_element(y.begin(), y.end());
  s.train_classes = labelled ? *hi + 1 : 0;
  if (speak && labelled && cfg.model.num_classes == 0)
    warn_sparse_labels(cfg.data, y, s.train_classes);
  // Test files of their own do not shape the model to train: a stray label there gave it more
  // outputs, other initial weights and another result (46.5% test accuracy became 25.0%).
  if (training && labelled && cfg.model.num_classes == 0 && !cfg.data.test.empty() &&
      s.num_classes > s.train_classes) {
    const std::string where =
        first_label_at_or_above(cfg.data, true, static_cast<int32_t>(s.train_classes));
    throw UserError(fmt::format(
        "the test data (data.test) has label {}{}, above the training data's labels (0..{}): the "
        "model's outputs are the training labels'. Fix the test labels, or set "
        "model.num_classes to {} if the training data lacks classes on purpose",
        s.num_classes - 1, where.empty() ? std::string() : " (the first out of range" + where + ")",
        s.train_classes - 1, s.num_classes));
  }
  if (speak && labelled && cfg.model.num_classes == 0 && s.num_classes > s.train_classes)
    spdlog::warn(
        "the test data has label {}, above the training data's labels (0..{}): the model gets {} "
        "outputs, and no training sample teaches the last {}",
        s.num_classes - 1, s.train_classes - 1, s.num_classes, s.num_classes - s.train_classes);
  if (cfg.model.num_classes > 0) {
    if (s.num_classes > cfg.model.num_classes) {
      // Which split holds it, and the first sample that does (its row: CSV lines and IDX
      // records count from the data, sample 0 first).
      // (each split's num_classes is both splits' count: the labels themselves tell which)
      const bool in_train = s.train_classes > cfg.model.num_classes;
      const std::vector<int32_t>& ys = in_train ? data.train.y : data.test.y;
      const int32_t top = ys.empty() ? 0 : *std::max_element(ys.begin(), ys.end());
      const std::string test_what =
          !cfg.data.test.empty() ? "the test data (data.test)"
                                 : "the test split held out of the training data (data.train)";
      const std::string where =
          first_label_at_or_above(cfg.data, !in_train && !cfg.data.test.empty(),
                                  static_cast<int32_t>(cfg.model.num_classes));
      throw UserError(
          std::string(in_train ? "the training data (data.train)" : test_what) + " has label " +
          std::to_string(top) +
          (where.empty() ? std::string() : " (the first out of range" + where + ")") +
          ", out of range for model.num_classes = " + std::to_string(cfg.model.num_classes));
    }
    s.num_classes = cfg.model.num_classes;
  }
  // (a held-out split that leaves few training rows is the likelier cause: said with it)
  const std::string split =
      cfg.data.test.empty() && data.test.rows > data.train.rows
          ? fmt::format(
                ": data.test_fraction {} holds out {} of the {} samples and leaves these {}",
                resolved_test_fraction(cfg.data), data.test.rows, data.test.rows + data.train.rows,
                data.train.rows)
          : std::string();
  if (s.num_classes < 2)
    throw UserError("the training data has a single class (label 0 only); need at least 2" + split);
  // One label throughout, whichever it is (a wrong label column, a filtered file): nothing to
  // learn, and the loss would reach 0 by pushing one logit up.
  if (labelled && *lo == *hi)
    throw UserError("the training data has a single class (every label is " + std::to_string(*lo) +
                    "); need at least 2" + split);
  return s;
}

namespace {

// The first row of a batch of `samples` whose outputs hold a non-finite value, as a sample index
// within the batch (a GPT's output has targets_per_row rows per sample); 0 when every output is
// finite yet the loss is not (a finite logit gap too large for the loss's float32 arithmetic).
int64_t first_nonfinite_sample(const Tensor& out, int64_t samples) {
  const int64_t per = std::max<int64_t>(1, out.rows() / std::max<int64_t>(1, samples));
  for (int64_t r = 0; r < out.rows(); ++r)
    for (int64_t c = 0; c < out.cols(); ++c)
      if (!std::isfinite(out.at(r, c))) return r / per;
  return 0;
}

// Sums over rows [begin, end) of d: (loss sum, correct count); the first sample whose output or
// loss is not finite into *bad (left alone when none is).
std::pair<double, int64_t> eval_rows(const Model& model, const float* params, const Dataset& d,
                                     int64_t begin, int64_t end, int64_t batch, Loss loss,
                                     int64_t* bad) {
  DT_CHECK_GT(batch, 0);
  Activations acts;
  Batch b;
  std::vector<int64_t> idx;
  ForwardCtx ctx{.training = false, .rng = nullptr};
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t start = begin; start < end; start += batch) {
    consecutive_rows(start, std::min(batch, end - start), idx);
    gather_batch(d, idx, b);
    const Tensor& out = model.forward(params, b.x, acts, ctx);
    const double l = loss_and_grad(loss, out, b.targets.data(), nullptr, 1.0f);
    if (!std::isfinite(l) && *bad < 0)
      *bad = start + first_nonfinite_sample(out, static_cast<int64_t>(idx.size()));
    loss_sum += l;
    correct += count_correct(out, b.targets.data());
  }
  return {loss_sum, correct};
}

}  // namespace

EvalResult evaluate(const Model& model, const float* params, const Dataset& d, int64_t batch,
                    Loss loss) {
  EvalResult r;
  const auto [loss_sum, correct] =
      eval_rows(model, params, d, 0, d.rows, batch, loss, &r.first_nonfinite);
  r.samples = d.rows;
  if (d.rows > 0) {  // means over target positions (one per sample for a classifier)
    const double targets = static_cast<double>(d.rows * d.targets_per_row());
    r.loss = loss_sum / targets;
    r.accuracy = static_cast<double>(correct) / targets;
  }
  return r;
}

void finish_trace(const RunOptions& opts, Communicator& comm, const Tracer& tracer) {
  if (opts.trace.empty()) return;
  // A trace that cannot be written (a full disk) is said, and the run ends as it would have:
  // its results are saved by now, and failing it made `dtrain launch --max-restarts` restart the
  // finished job, whose attempt with nothing to train then wrote its own near-empty trace.
  const auto lost = [&](const std::string& what, const std::exception& e) {
    spdlog::error("trace: could not write {}: {} (the run's results are saved)", what, e.what());
  };
  const std::string mine = rank_trace_path(opts.trace, comm.rank());
  bool own_written = true;
  try {
    tracer.write(mine);
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    own_written = false;
    lost("'" + mine + "'", e);
  }
  comm.barrier();
  if (comm.rank() != 0) return;
  std::vector<std::string> files;
  for (int r = 0; r < comm.size(); ++r) {
    const std::string f = rank_trace_path(opts.trace, r);
    if (r == 0 && !own_written) {
      std::error_code ec;
      fs::remove(f, ec);  // (a stale part of an earlier run: not this one's)
    } else if (fs::exists(f)) {
      files.push_back(f);
    } else {
      spdlog::warn("trace: no {} (rank {} wrote it on another machine?); merging the others", f, r);
    }
  }
  try {
    merge_trace_files(files, opts.trace);
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    lost("'" + opts.trace + "'", e);
    if (!files.empty())
      spdlog::error("trace: the ranks' parts stay unmerged: {}{}", files.front(),
                    files.size() > 1 ? fmt::format(" and {} more", files.size() - 1) : "");
    return;  // (the ranks' files stay: they are the trace)
  }
  std::error_code ec;
  for (const auto& f : files) fs::remove(f, ec);
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
  // (ceil without adding accum - 1, which overflows for an accum near 2^63)
  p.steps_per_epoch = p.batches_per_epoch / p.accum + (p.batches_per_epoch % p.accum != 0);
  // epochs x steps saturates: 10^18 epochs means "until max_steps", not a negative count.
  p.total_steps = std::numeric_limits<int64_t>::max();
  if (cfg.train.epochs > 0 &&
      __builtin_mul_overflow(cfg.train.epochs, p.steps_per_epoch, &p.total_steps))
    p.total_steps = std::numeric_limits<int64_t>::max();
  if (cfg.train.max_steps > 0) p.total_steps = std::min(p.total_steps, cfg.train.max_steps);
  p.base_lr = cfg.optimizer.lr * (cfg.optimizer.scale_lr == ScaleLr::kLinear ? replicas : 1);
  return p;
}

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

OutDirLock start_run_dir(const Config& cfg, const RunOptions& opts, const std::string& ckpt_dir) {
  const std::string what = "checkpoints folder '" + ckpt_dir + "'";
  std::error_code lec;
  if (fs::is_symlink(ckpt_dir, lec) && !fs::exists(ckpt_dir, lec))
    throw UserError(what + " is a symbolic link to '" + fs::read_symlink(ckpt_dir, lec).string() +
                    "', which does not exist (a disk not mounted?): mount it, or remove the link "
                    "(--overwrite replaced it with a folder of its own)");
  // (an existing folder before --overwrite empties it: a link's target is another run's too)
  OutDirLock lock = OutDirLock::checkpoints_folder(ckpt_dir, what);
  if (opts.overwrite) clear_run_files(opts.out_dir, /*clear_logs=*/false);
  std::error_code ec;
  fs::create_directories(ckpt_dir, ec);  // (a folder nothing can be created in: /proc/self)
  if (ec)
    throw UserError("--out '" + opts.out_dir + "': cannot create its checkpoints folder '" +
                    ckpt_dir + "': " + ec.message() + ": choose another --out");
  // (a folder made or replaced just now: locked now)
  if (lock.fd() < 0 || fs::is_symlink(ckpt_dir, ec) == false) {
    lock = OutDirLock();
    lock = OutDirLock::checkpoints_folder(ckpt_dir, what);
  }
  // (a step folder without its manifest is a sharded save that failed or was interrupted: never
  // loaded, and beyond keep_last, which counts complete checkpoints)
  if (const int64_t n = remove_incomplete_checkpoints(ckpt_dir))
    spdlog::info(
        "removed {} temp file(s) and incomplete checkpoint(s) that interrupted or failed "
        "checkpoint writes left in {}",
        n, ckpt_dir);
  // A resumed run writes it once its checkpoint has loaded: a resume that fails (another model,
  // another optimizer) leaves the folder's config.json describing the checkpoints it holds.
  if (opts.resume.empty()) write_run_config(cfg, opts.out_dir);
  return lock;
}

void write_run_config(const Config& cfg, const std::string& out_dir) {
  write_file_atomic((fs::path(out_dir) / "config.json").string(),
                    config_to_json(cfg).dump(2) + "\n", Links::kReplace);
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
        "schedule continues as it started (the run's length in steps changed: train.max_steps, "
        "train.epochs, or the steps per epoch, which the global batch, data.batch_size x "
        "replicas x train.grad_accum_steps, decides; a schedule that decays to its end stays at "
        "its final rate past step {}). To lay out a new schedule, start a fresh run.",
        plan.total_steps, rp.schedule_steps, rp.schedule_steps);
  return rp.schedule_steps;
}

std::string nothing_left_reason(const Config& cfg, const ResumePoint& rp, const StepPlan& plan,
                                int64_t batch) {
  if (!rp.loaded) return "";
  const int64_t epoch = rp.epoch + (batch >= plan.batches_per_epoch ? 1 : 0);
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

namespace {

// The data-parallel replicas of the run that wrote a checkpoint of `world` ranks with config
// `before`: world / (tensor x pipeline); 0 when that is not known.
int64_t saved_replicas(const Config& before, int64_t world) {
  const int64_t cells = before.distributed.tensor_parallel.size * pipeline_stages(before);
  return cells > 0 && world > 0 ? world / cells : 0;
}

// Of the run that wrote the checkpoint, from its stored config (`before`, parsed once by the
// caller), as int64 words for the broadcast: samples per global batch (its data.batch_size
// times its data-parallel replicas), samples per optimizer step (times grad_accum_steps), the
// learning rate it trained at (after optimizer.scale_lr, or the rate a resume kept: its
// progress records it) and its optimizer.lr when it scaled it linearly (else 0), the rates as
// the bits of the doubles. Zeros when its config is not stored.
std::array<int64_t, 4> saved_batch_and_rate(const CheckpointMeta& m,
                                            const std::optional<Config>& before) {
  if (!before) return {0, 0, 0, 0};
  const int64_t replicas = saved_replicas(*before, m.world_size);
  const int64_t global = before->data.batch_size * replicas;
  if (global <= 0) return {0, 0, 0, 0};
  const bool linear = before->optimizer.scale_lr == ScaleLr::kLinear;
  double rate = before->optimizer.lr * static_cast<double>(linear ? replicas : 1);
  try {  // (recorded since 2026-12-07)
    const nlohmann::json p = nlohmann::json::parse(m.progress_json);
    if (const auto it = p.find("base_lr"); it != p.end() && it->is_number()) rate = *it;
  } catch (const nlohmann::json::exception&) {  // none: the rate from the config
  }
  return {global, global * before->train.grad_accum_steps, std::bit_cast<int64_t>(rate),
          linear ? std::bit_cast<int64_t>(before->optimizer.lr) : 0};
}

// ResumePoint::lost_replica_states of checkpoint `path` (meta m, stored config `before`;
// replicas: what it held of them, when read).
int64_t lost_replica_states(const CheckpointMeta& m, const std::optional<Config>& before,
                            const std::string& path, const ReplicaState* replicas) {
  if (!before) return 0;
  const DistributedConfig& d = before->distributed;
  const OptimizerConfig& o = before->optimizer;
  const int64_t ranks = saved_replicas(*before, m.world_size);  // of the data axis
  const bool stateful = o.type != OptimizerType::kSgd || o.momentum > 0;
  if (d.strategy != StrategyKind::kLocalSgd || d.local_sgd.sync_optimizer_state || ranks < 2 ||
      !stateful)
    return 0;
  const bool held = std::filesystem::is_directory(path) ? holds_replica_states(path)
                                                        : replicas && replicas->world_size > 0;
  return held ? 0 : ranks;
}

// Why checkpoint `path` of this run's optimizer cannot fill `state` (its buffers differ), or
// nullopt when they do not: momentum or DiLoCo's outer optimizer turned on or off, Adam's
// weights-only file, or buffers no setting explains (an altered file).
std::optional<UserError> state_mismatch(const std::string& path, const Config& cfg,
                                        const std::vector<StateBuffer>& state) {
  std::vector<std::string> mine;
  for (const StateBuffer& b : state) mine.push_back(b.name);
  std::sort(mine.begin(), mine.end());
  const auto theirs = checkpoint_state_names(path);
  const std::string type = to_string(cfg.optimizer.type);
  const auto weights_only = [&] {
    return UserError("checkpoint '" + path + "' holds no optimizer state (" + type + " keeps [" +
                     join(mine, ", ") +
                     "]): a weights-only file, which a resume cannot continue from "
                     "(train.init_from starts a fresh run from its weights)");
  };
  // Adam always keeps state: none at all is a weights-only file, not a setting changed.
  if (cfg.optimizer.type != OptimizerType::kSgd && theirs && theirs->empty()) return weights_only();
  if (state.empty() || !theirs || *theirs == mine) return std::nullopt;
  // SGD's none: a run without momentum wrote it -- or nothing did (a weights-only file: one from
  // another program, or a dtrain run with momentum whose state was dropped), which its recorded
  // config tells (it blamed a momentum setting that had not changed).
  if (theirs->empty()) {
    bool had_momentum = true;  // (no recorded config: another program's weights)
    try {
      if (const std::string c = checkpoint_config_json(path); !c.empty()) {
        const nlohmann::json j = nlohmann::json::parse(c);
        const nlohmann::json o = j.value("optimizer", nlohmann::json::object());
        const nlohmann::json l = j.value("distributed", nlohmann::json::object())
                                     .value("local_sgd", nlohmann::json::object());
        had_momentum = o.value("momentum", 0.0) > 0 || l.value("outer_lr", 0.0) > 0;
      }
    } catch (const std::exception&) {
    }
    if (had_momentum) return weights_only();
  }
  std::vector<std::string> missing, extra;
  std::set_difference(mine.begin(), mine.end(), theirs->begin(), theirs->end(),
                      std::back_inserter(missing));
  std::set_difference(theirs->begin(), theirs->end(), mine.begin(), mine.end(),
                      std::back_inserter(extra));
  // Only momentum and DiLoCo's outer momentum come and go with a setting.
  const auto setting = [](const std::vector<std::string>& names) {
    return std::all_of(names.begin(), names.end(),
                       [](const auto& n) { return n == "momentum" || n == "outer_momentum"; });
  };
  std::string why;
  if (setting(missing) && setting(extra)) {
    why =
        "optimizer.momentum or distributed.local_sgd.outer_lr (DiLoCo) went from 0 to > 0 or "
        "back, which a resume does not carry over; resume with the settings the checkpoint "
        "was written with";
  } else {
    why = "the file was altered, or not written by a dtrain run of " + type + " (";
    if (!missing.empty()) why += "it lacks [" + join(missing, ", ") + "]";
    if (!extra.empty())
      why += std::string(missing.empty() ? "" : "; ") + "it has [" + join(extra, ", ") +
             "], which this run does not keep";
    why += ")";
  }
  return UserError("checkpoint '" + path + "' holds the optimizer state [" + join(*theirs, ", ") +
                   "], this run keeps [" + join(mine, ", ") + "]: " + why);
}

}  // namespace

ResumePoint resume_full_state(const Config& cfg, const RunOptions& opts, Communicator& comm,
                              const Model& model, const std::string& ckpt_dir,
                              const std::string& hash, float* params,
                              const std::vector<StateBuffer>& state, Rng& rng,
                              CompressionState* comp, ReplicaState* replicas) {
  const int world = comm.size(), rank = comm.rank();
  const bool lead = rank == 0;
  const int64_t P = model.param_count();
  ResumePoint rp;
  // loaded?, step, epoch, batch, optimizer steps, horizon, the saving run's global batch, its
  // samples per optimizer step, rate and linearly scaled optimizer.lr (saved_batch_and_rate)
  std::vector<int64_t> meta_i(10, 0);
  std::string rng_states;
  if (lead) {
    const std::string path =
        resolve_checkpoint(opts.resume == "auto" ? ckpt_dir : opts.resume, opts.resume == "auto");
    if (!path.empty()) {
      const auto another_optimizer = [&](const std::string& saved) {
        return UserError("checkpoint '" + path + "' was written by optimizer '" + saved +
                         "', this run uses '" + to_string(cfg.optimizer.type) + "'");
      };
      CheckpointMeta m;
      try {
        m = load_checkpoint(path, model, params, state, comp, replicas);
      } catch (const UserError&) {
        // Another optimizer's state is missing tensors ("no tensor 'optim.exp_avg...'"): name
        // the cause, read from the header, rather than the first tensor it lacks.
        const std::string saved = checkpoint_optimizer(path);
        if (!saved.empty() && saved != to_string(cfg.optimizer.type))
          throw another_optimizer(saved);
        if (std::optional<UserError> e = state_mismatch(path, cfg, state)) throw *e;
        throw;
      }
      if (parse_enum<OptimizerType>(m.optimizer) != cfg.optimizer.type)
        throw another_optimizer(m.optimizer);
      report_config_changes(path, m, cfg, hash);
      const std::optional<Config> before = stored_config(m, path);
      const std::array<int64_t, 4> saved = saved_batch_and_rate(m, before);
      meta_i = {1,        m.step,   m.epoch,  m.batch, m.optimizer_steps, m.schedule_steps,
                saved[0], saved[1], saved[2], saved[3]};
      rng_states = m.rng;
      rp.from = path;
      rp.progress = m.progress_json;
      rp.normalizer = m.normalizer_json;
      rp.lost_replica_states = lost_replica_states(m, before, path, replicas);
    } else {
      // A folder that holds an earlier run's records but no checkpoint (none saved before it
      // stopped, or removed): starting afresh replaces them, as it should for a restart of a run
      // that died before its first checkpoint -- said, not silent.
      std::string found;
      for (const char* f : {"metrics.jsonl", "summary.json"}) {
        std::error_code ec;
        if (fs::exists(fs::path(opts.out_dir) / f, ec))
          found += (found.empty() ? "" : " and ") + std::string(f);
      }
      if (found.empty())
        spdlog::info("--resume auto: no checkpoint in {}, starting fresh", ckpt_dir);
      else
        spdlog::warn(
            "--resume auto: no checkpoint in {}, starting fresh: the {} of the earlier run in {} "
            "are replaced",
            ckpt_dir, found, opts.out_dir);
    }
  }
  // RNG states: one per rank of the saving run, as 4 words each (parsed before anything is sent:
  // a malformed one is the checkpoint's error, named, while every rank still waits for meta_i).
  std::vector<int64_t> words(static_cast<size_t>(world) * 4, 0);
  const auto parts = split(rng_states, ';');
  if (lead && meta_i[0] == 1) {
    for (int r = 0; r < world && r < static_cast<int>(parts.size()); ++r) {
      Rng tmp;
      try {
        tmp.from_string(parts[static_cast<size_t>(r)]);
      } catch (const UserError& e) {
        throw UserError("checkpoint '" + rp.from + "': rank " + std::to_string(r) +
                        "'s RNG state is malformed (" + json_error_text(e.what()) + ")");
      }
      const auto st = tmp.state();
      for (int k = 0; k < 4; ++k)
        words[static_cast<size_t>(r) * 4 + static_cast<size_t>(k)] =
            static_cast<int64_t>(st[static_cast<size_t>(k)]);
    }
  }
  comm.broadcast(meta_i.data(), meta_i.size(), 0);
  if (meta_i[0] != 1) return rp;
  comm.broadcast(params, static_cast<size_t>(P), 0);
  for (const auto& sb : state) comm.broadcast(sb.data, static_cast<size_t>(P), 0);
  if (lead) {
    // (the words say which case: "ranks without one" was said of a run with fewer ranks too)
    if (static_cast<int>(parts.size()) < world)
      spdlog::warn(
          "checkpoint has RNG states for {} rank(s), this run has {}: {} start{} a fresh RNG "
          "stream (dropout masks do not depend on it: they are keyed on the sample)",
          parts.size(), world,
          parts.size() + 1 == static_cast<size_t>(world)
              ? fmt::format("rank {}", parts.size())
              : fmt::format("ranks {} to {}", parts.size(), world - 1),
          parts.size() + 1 == static_cast<size_t>(world) ? "s" : "");
    else if (static_cast<int>(parts.size()) > world)
      spdlog::info(
          "checkpoint has RNG states for {} rank(s), this run has {}: ranks 0 to {} continue "
          "theirs (dropout masks do not depend on them: they are keyed on the sample)",
          parts.size(), world, world - 1);
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
  rp.global_batch = meta_i[6];
  rp.step_samples = meta_i[7];
  rp.base_lr = std::bit_cast<double>(meta_i[8]);
  rp.linear_lr = std::bit_cast<double>(meta_i[9]);
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

nlohmann::json train_rank(const Config& cfg, const RunOptions& opts, Communicator& comm) {
  Tracer tracer(!opts.trace.empty(), comm.rank());
  tracer.set_thread_name("train");
  TracerAttachment attach(comm, tracer);
  nlohmann::json summary;
  try {
    summary = run_loop(cfg, opts, comm, tracer);
  } catch (...) {
    // A failed run's trace is what explains it: each rank writes its own up to the failure (no
    // merge: that would need the peers, which may be gone).
    if (!opts.trace.empty()) try {
        // Named apart from a finished run's parts, which the next run's merge would take.
        const std::string mine = failed_rank_trace_path(opts.trace, comm.rank());
        tracer.write(mine);
        spdlog::warn("trace of the failed run, this rank's part: {}", mine);
      } catch (const std::exception&) {
      }
    throw;
  }
  finish_trace(opts, comm, tracer);
  return summary;
}

nlohmann::json run_training(const Config& cfg, const RunOptions& opts) {
  const int world = static_cast<int>(cfg.distributed.world_size);
  CommOptions copts;
  copts.timeout_s = cfg.distributed.timeout_s;         // as for gRPC ranks (distributed.cc)
  copts.pause_clock = std::make_shared<PauseClock>();  // one process: its ranks pause together
  if (cfg.distributed.backend == Backend::kGrpc)
    throw UserError(
        "distributed.backend grpc: start the ranks with `dtrain launch` or set RANK/WORLD_SIZE");
  // In-process ranks share one process: OpenBLAS gets cores / ranks threads each (1 on a 2-core
  // machine), and with one thread every call runs in its caller's thread, so ranks compute
  // concurrently without sharing OpenBLAS's thread pool.
  const int threads = run_blas_threads(cfg, world);
  // Before the rank threads start: under a limit too tight for even OpenBLAS's buffers, their
  // first allocations failed at random places (one inside nlohmann::json's destructor, which
  // terminates the process). A runtime failure (exit 1), as a thread that cannot start: the
  // same config runs where more fits. The loop's check adds the model's state and activations.
  if (world > 1) {
    try {
      require_address_space(0, 0, "", world, threads);
    } catch (const UserError& e) {
      throw std::runtime_error("cannot start " + std::to_string(world) +
                               " in-process ranks: " + e.what() +
                               "; or lower distributed.world_size, or run the ranks as "
                               "processes (dtrain launch)");
    }
  }
  if (world > 1 && threads > 1)
    spdlog::warn(
        "runtime.threads = {} with {} in-process ranks: OpenBLAS serialises calls from "
        "several threads into one pool; 1 thread per rank is usually faster",
        threads, world);
  set_blas_threads(threads);
  if (world == 1) {
    Communicator comm(std::move(make_inproc_group(1)[0]), copts);
    return train_rank(cfg, opts, comm);
  }
  // One copy of the data for all ranks (loaded by the first rank to ask for it).
  SharedSplits shared(cfg.data, cfg.seed);
  RunOptions rank_opts = opts;
  if (rank_opts.data == nullptr) rank_opts.data = &shared;
  std::vector<nlohmann::json> summaries(static_cast<size_t>(world));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::atomic<int> first_failed{-1};
  // A rank that cannot be started is a clear error, the ranks already started are aborted and
  // joined, nothing hangs (comm/inproc_ranks.h).
  run_inproc_ranks(
      world, copts,
      [&](Communicator& comm) {
        const int r = comm.rank();
        try {
          summaries[static_cast<size_t>(r)] = train_rank(cfg, rank_opts, comm);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = std::current_exception();
          int expected = -1;
          first_failed.compare_exchange_strong(expected, r);
          // An AgreedError stops every rank at the same step (train/stop.h): no abort, so no
          // peer's CommError (or desync table) lands in front of the one error they share.
          if (dynamic_cast<const AgreedError*>(&e) == nullptr)
            comm.abort(abort_reason(comm.rank_name(r), e));
        }
      },
      "lower distributed.world_size or run the ranks as processes (dtrain launch)");
  // Report the rank that failed first: the others only saw its abort. Except that a rank failing
  // for its own reason (a non-finite loss every rank agreed on, bad data) may abort the group on
  // its way out (an in-flight stop vote: train/stop.h) before its error is recorded here, so a
  // peer's CommError from that abort can come first: an error that is not a CommError is the
  // cause and is preferred -- and so is it over a PeerFailedError, which only says that a peer
  // failed.
  if (first_failed.load() >= 0) {
    for (const std::exception_ptr& e : errors) {
      if (!e) continue;
      try {
        std::rethrow_exception(e);
      } catch (const CommError&) {
      } catch (const PeerFailedError&) {
      } catch (...) {
        throw;
      }
    }
    std::rethrow_exception(errors[static_cast<size_t>(first_failed.load())]);
  }
  return summaries[0];
}

}  // namespace dtrain
