#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint.h"
#include "data/sampler.h"
#include "nn/loss.h"
#include "optim/optimizer.h"
#include "tensor/blas.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/rng.h"

namespace dtrain {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Copies rows `idx` of d into x [n, F] and their labels into y.
void gather(const Dataset& d, const std::vector<int64_t>& idx, Tensor& x, std::vector<int32_t>& y) {
  const int64_t n = static_cast<int64_t>(idx.size());
  x.resize({n, d.features});
  y.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = idx[static_cast<size_t>(i)];
    std::copy(d.row(r), d.row(r) + d.features, x.data() + i * d.features);
    y[static_cast<size_t>(i)] = d.y[static_cast<size_t>(r)];
  }
}

double loss_and_grad(const std::string& loss, const Tensor& out, const int32_t* labels,
                     Tensor* grad, float scale) {
  if (loss == "mse") return mse_onehot(out, labels, grad, scale);
  return softmax_cross_entropy(out, labels, grad, scale);
}

// A one-line progress bar on stderr, redrawn at most 10 times a second.
class ProgressBar {
 public:
  explicit ProgressBar(bool on) : on_(on) {}
  void update(int64_t step, int64_t total, double epoch, double loss, double sps) {
    if (!on_) return;
    const auto now = Clock::now();
    if (step != total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const int width = 30;
    const double frac = total > 0 ? static_cast<double>(step) / static_cast<double>(total) : 0.0;
    const int filled = static_cast<int>(frac * width);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "\r\033[K[%s] step %lld/%lld  epoch %.2f  loss %.4f  %.0f samples/s",
                 bar.c_str(), static_cast<long long>(step), static_cast<long long>(total), epoch,
                 loss, sps);
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
  Clock::time_point last_{};
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

EvalResult evaluate(const Model& model, const float* params, const Dataset& d, int64_t batch,
                    const std::string& loss) {
  DT_CHECK_GT(batch, 0);
  EvalResult r;
  Activations acts;
  Tensor x;
  std::vector<int32_t> y;
  std::vector<int64_t> idx;
  ForwardCtx ctx{.training = false, .rng = nullptr};
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t start = 0; start < d.rows; start += batch) {
    const int64_t n = std::min(batch, d.rows - start);
    idx.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = start + i;
    gather(d, idx, x, y);
    const Tensor& out = model.forward(params, x, acts, ctx);
    loss_sum += loss_and_grad(loss, out, y.data(), nullptr, 1.0f);
    correct += count_correct(out, y.data());
  }
  r.samples = d.rows;
  if (d.rows > 0) {
    r.loss = loss_sum / static_cast<double>(d.rows);
    r.accuracy = static_cast<double>(correct) / static_cast<double>(d.rows);
  }
  return r;
}

nlohmann::json run_training(const Config& cfg, const RunOptions& opts) {
  const auto t_start = Clock::now();
  const int world = static_cast<int>(cfg.distributed.world_size);
  const int rank = 0;
  if (world != 1)
    throw UserError("distributed.world_size = " + std::to_string(world) +
                    ": this dtrain build trains in one process only (world_size: 1)");
  set_blas_threads(static_cast<int>(cfg.runtime.threads));

  fs::create_directories(fs::path(opts.out_dir) / "checkpoints");
  const std::string ckpt_dir = (fs::path(opts.out_dir) / "checkpoints").string();
  const std::string hash = config_hash(cfg);
  write_file_atomic((fs::path(opts.out_dir) / "config.json").string(),
                    config_to_json(cfg).dump(2) + "\n");

  // Data and model.
  auto t0 = Clock::now();
  DataSplits data = load_data(cfg.data, cfg.seed);
  const ModelShape shape = resolve_model_shape(cfg, data);
  spdlog::info("data: {} train / {} test samples, {} features, {} classes, normalize {} ({:.2f} s)",
               data.train.rows, data.test.rows, shape.in_features, shape.num_classes,
               data.normalizer.method, seconds_since(t0));
  const Model model = build_mlp(cfg.model, shape.in_features, shape.num_classes);
  spdlog::info("model:\n{}", model.describe());
  const int64_t P = model.param_count();
  ParamStore store(P);
  model.init(store.values.data(), static_cast<uint64_t>(cfg.seed));
  auto opt = make_optimizer(cfg.optimizer, 0, P);
  std::vector<StateBuffer> state_bufs;
  for (size_t i = 0; i < opt->state_names().size(); ++i)
    state_bufs.push_back({opt->state_names()[i], opt->state(i).data()});

  // Schedule of steps.
  const int64_t b = cfg.data.batch_size;
  Sampler sampler(data.train.rows, b, world, rank, cfg.data.shuffle, cfg.data.drop_last,
                  static_cast<uint64_t>(cfg.seed));
  const int64_t bpe = sampler.batches_per_epoch();
  if (bpe == 0)
    throw UserError("the training set (" + std::to_string(data.train.rows) +
                    " samples) is smaller than one global batch of " + std::to_string(b * world) +
                    " and data.drop_last is true");
  const int64_t K = cfg.train.grad_accum_steps;
  const int64_t steps_per_epoch = (bpe + K - 1) / K;
  int64_t total_steps = cfg.train.epochs > 0 ? cfg.train.epochs * steps_per_epoch
                                             : std::numeric_limits<int64_t>::max();
  if (cfg.train.max_steps > 0) total_steps = std::min(total_steps, cfg.train.max_steps);
  const double base_lr = cfg.optimizer.lr * (cfg.optimizer.scale_lr == "linear" ? world : 1);
  Rng rng(static_cast<uint64_t>(cfg.seed), 0xD7A1000ULL + static_cast<uint64_t>(rank));

  int64_t step = 0, epoch = 0, batch = 0;
  std::string resumed_from;
  if (!opts.resume.empty()) {
    const std::string path =
        resolve_checkpoint(opts.resume == "auto" ? ckpt_dir : opts.resume, opts.resume == "auto");
    if (!path.empty()) {
      CheckpointMeta m = load_checkpoint(path, model, store.values.data(), state_bufs);
      if (m.optimizer != cfg.optimizer.type)
        throw UserError("checkpoint '" + path + "' was written by optimizer '" + m.optimizer +
                        "', this run uses '" + cfg.optimizer.type + "'");
      if (m.config_hash != hash)
        spdlog::warn("resuming from {} written with config hash {}, this run has {}", path,
                     m.config_hash, hash);
      step = m.step;
      epoch = m.epoch;
      batch = m.batch;
      opt->set_step_count(m.optimizer_steps);
      rng.from_string(m.rng);
      resumed_from = path;
      spdlog::info("resumed from {} at step {} (epoch {}, batch {})", path, step, epoch, batch);
    } else {
      spdlog::info("--resume auto: no checkpoint in {}, starting fresh", ckpt_dir);
    }
  }

  LineWriter metrics((fs::path(opts.out_dir) / "metrics.jsonl").string(), !resumed_from.empty());
  spdlog::info(
      "training: {} steps ({} per epoch, batch {} x {} rank(s), grad_accum {}), {} params, "
      "{} BLAS thread(s), out {}",
      total_steps == std::numeric_limits<int64_t>::max() ? -1 : total_steps, steps_per_epoch, b,
      world, K, P, blas_threads(), opts.out_dir);

  auto epoch_progress = [&] {
    return static_cast<double>(epoch) + static_cast<double>(batch) / static_cast<double>(bpe);
  };
  ProgressBar bar(opts.progress);
  EvalResult last_eval;
  bool have_eval = false;
  int64_t last_eval_step = -1, last_ckpt_step = resumed_from.empty() ? -1 : step;
  auto interval_t0 = Clock::now();
  // Evaluation and checkpoint time is excluded from the train records' samples_per_s.
  auto run_eval = [&] {
    if (data.test.rows == 0) return;
    const auto e0 = Clock::now();
    last_eval =
        evaluate(model, store.values.data(), data.test, cfg.data.eval_batch_size, cfg.model.loss);
    have_eval = true;
    last_eval_step = step;
    nlohmann::json rec = {{"kind", "eval"},
                          {"step", step},
                          {"epoch", epoch_progress()},
                          {"test_loss", nan_to_null(last_eval.loss)},
                          {"test_accuracy", last_eval.accuracy}};
    metrics.write_line(rec.dump());
    bar.clear();
    spdlog::info("eval step {} epoch {:.2f}: test_loss {:.4f} test_accuracy {:.4f}", step,
                 epoch_progress(), last_eval.loss, last_eval.accuracy);
    interval_t0 += Clock::now() - e0;
  };
  auto save = [&] {
    const auto s0 = Clock::now();
    const std::string name = checkpoint_file_name(step);
    CheckpointMeta m;
    m.step = step;
    m.epoch = epoch;
    m.batch = batch;
    m.optimizer = cfg.optimizer.type;
    m.optimizer_steps = opt->step_count();
    m.rng = rng.to_string();
    m.config_hash = hash;
    m.world_size = world;
    m.strategy = cfg.distributed.strategy;
    save_checkpoint((fs::path(ckpt_dir) / name).string(), model, store.values.data(), state_bufs,
                    m);
    commit_checkpoint(ckpt_dir, name, cfg.train.checkpoint.keep_last);
    last_ckpt_step = step;
    spdlog::debug("checkpoint {}", name);
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

  while (step < total_steps) {
    if (batch >= bpe) {
      ++epoch;
      batch = 0;
    }
    if (cfg.train.epochs > 0 && epoch >= cfg.train.epochs) break;
    const auto step_t0 = Clock::now();
    const int64_t n_micro = std::min(K, bpe - batch);
    int64_t step_samples = 0;
    for (int64_t i = 0; i < n_micro; ++i) step_samples += sampler.global_batch_size(batch + i);
    const float scale = 1.0f / static_cast<float>(step_samples);

    std::fill(store.grads.begin(), store.grads.end(), 0.0f);
    double loss_sum = 0.0;
    for (int64_t i = 0; i < n_micro; ++i) {
      gather(data.train, sampler.batch(epoch, batch + i), x, y);
      const Tensor& out = model.forward(store.values.data(), x, acts, ctx);
      loss_sum += loss_and_grad(cfg.model.loss, out, y.data(), &dlogits, scale);
      model.backward(store.values.data(), store.grads.data(), x, acts, dlogits, nullptr);
    }
    batch += n_micro;
    const double step_loss = loss_sum / static_cast<double>(step_samples);
    if (!std::isfinite(step_loss))
      throw std::runtime_error("training loss is " + std::to_string(step_loss) + " at step " +
                               std::to_string(step + 1) +
                               " (diverged: lower optimizer.lr or set optimizer.clip_grad_norm)");
    if (cfg.optimizer.clip_grad_norm > 0) {
      const double norm = std::sqrt(sum_squares(store.grads.data(), P));
      const float f = clip_factor(norm, cfg.optimizer.clip_grad_norm);
      if (f < 1.0f) scale_inplace(store.grads.data(), P, f);
    }
    const double lr = lr_at(cfg.optimizer.schedule, base_lr, step, total_steps);
    opt->step(store.values.data(), store.grads.data(), lr);
    ++step;
    train_s += seconds_since(step_t0);
    samples_trained += step_samples;
    interval_loss += loss_sum;
    interval_samples += step_samples;

    const bool epoch_done = batch >= bpe;
    if (epoch_done) {
      ++epoch;
      batch = 0;
    }
    if (step % cfg.train.log_every == 0 || step == total_steps || epoch_done) {
      const double el = seconds_since(interval_t0);
      const double mean_loss = interval_loss / static_cast<double>(interval_samples);
      final_train_loss = mean_loss;
      const double sps = el > 0 ? static_cast<double>(interval_samples) / el : 0.0;
      last_sps = sps;
      if (step % cfg.train.log_every == 0 || step == total_steps) {
        nlohmann::json rec = {{"kind", "train"},   {"step", step}, {"epoch", epoch_progress()},
                              {"loss", mean_loss}, {"lr", lr},     {"samples_per_s", sps}};
        metrics.write_line(rec.dump());
        if (!opts.progress)
          spdlog::info("step {} epoch {:.2f} loss {:.4f} lr {:.4g} {:.0f} samples/s", step,
                       epoch_progress(), mean_loss, lr, sps);
      }
      interval_loss = 0.0;
      interval_samples = 0;
      interval_t0 = Clock::now();
      bar.update(step, total_steps == std::numeric_limits<int64_t>::max() ? 0 : total_steps,
                 epoch_progress(), mean_loss, sps);
    } else {
      bar.update(step, total_steps == std::numeric_limits<int64_t>::max() ? 0 : total_steps,
                 epoch_progress(), step_loss, last_sps);
    }
    if (epoch_done || (cfg.train.eval_every > 0 && step % cfg.train.eval_every == 0)) run_eval();
    if (cfg.train.checkpoint.every_steps > 0 && step % cfg.train.checkpoint.every_steps == 0)
      save();
  }
  if (last_eval_step != step) run_eval();
  if (last_ckpt_step != step) save();
  bar.clear();

  nlohmann::json summary = {
      {"status", "completed"},
      {"steps", step},
      {"epochs", epoch_progress()},
      {"world_size", world},
      {"strategy", cfg.distributed.strategy},
      {"final_train_loss", nan_to_null(final_train_loss)},
      {"test_loss", have_eval ? nan_to_null(last_eval.loss) : nlohmann::json(nullptr)},
      {"test_accuracy", have_eval ? nlohmann::json(last_eval.accuracy) : nlohmann::json(nullptr)},
      {"wall_s", seconds_since(t_start)},
      {"train_s", train_s},
      {"train_samples_per_s", train_s > 0 ? static_cast<double>(samples_trained) / train_s : 0.0},
      {"peak_rss_mb", peak_rss_mb()},
      {"comm_bytes_sent", 0},
      {"comm_bytes_recv", 0},
      {"config_hash", hash},
      {"param_count", P},
      {"steps_this_run", step - first_step},
      {"resumed_from",
       resumed_from.empty() ? nlohmann::json(nullptr) : nlohmann::json(resumed_from)},
      {"checkpoint", (fs::path(ckpt_dir) / checkpoint_file_name(step)).string()},
  };
  write_file_atomic((fs::path(opts.out_dir) / "summary.json").string(), summary.dump(2) + "\n");
  spdlog::info("done: {} steps, test_accuracy {}, {:.1f} s, results in {}", step,
               have_eval ? fmt::format("{:.4f}", last_eval.accuracy) : std::string("n/a"),
               seconds_since(t_start), opts.out_dir);
  return summary;
}

}  // namespace dtrain
