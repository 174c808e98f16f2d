#include "train/train_loop.h"

#include <bit>
#include <map>

#include "checkpoint/checkpoint.h"
#include "train/checkpoint_config.h"
#include "train/data_agreement.h"
#include "util/stop_notice.h"
#include "util/strings.h"

namespace dtrain {
namespace loop_detail {

TrainLoop::TrainLoop(const Config& cfg, const RunOptions& opts, Communicator& comm, Tracer& tracer)
    : cfg_(cfg),
      opts_(opts),
      world_(comm),
      tracer_(tracer),
      rank_(comm.rank()),
      lead_(comm.rank() == 0),
      S_(pipeline_stages(cfg)),
      grid_(comm, static_cast<int>(cfg.distributed.tensor_parallel.size), S_),
      dp_(grid_.comm(GridAxis::kData)),
      pp_(grid_.comm(GridAxis::kPipeline)),
      tp_comm_(grid_.comm(GridAxis::kTensor)),
      DP_(grid_.layout().dp()),
      dpr_(grid_.coord().dp),
      stage_(grid_.coord().pp),
      rng_(static_cast<uint64_t>(cfg.seed), 0xD7A1000ULL + static_cast<uint64_t>(comm.rank())) {
  DT_CHECK_EQ(static_cast<int64_t>(comm.size()), cfg.distributed.world_size);
  // The axes' collectives go into the trace as the world's do (the grid, and with it the axis
  // communicators, ends before the tracer).
  grid_.set_tracer(&tracer_);
  ckpt_dir_ = (fs::path(opts.out_dir) / "checkpoints").string();
  hash_ = config_hash(cfg);
  config_json_ = config_to_json(cfg).dump();  // stored in checkpoints
  // Until the run's folder is touched (start_run_dir), a stop signal of `dtrain run` ends the
  // process at once: nothing to save, and a long data load went on for minutes after a Ctrl-C,
  // then trained a step and wrote its checkpoint (an --overwrite had replaced the old run).
  AtOnceScope starting(opts.final_run ? opts.stop : nullptr);
  resuming_ = resuming();  // (collective; the memory check counts it)
  setup_model(starting);
}

void TrainLoop::setup_model(AtOnceScope& starting) {
  auto t0 = Clock::now();
  data_ = opts_.data != nullptr
              ? opts_.data->get()
              : std::make_shared<const DataSplits>(load_data(cfg_.data, cfg_.seed));
  // (ranks of one process share one copy; processes each load their own)
  if (opts_.data == nullptr && world_.size() > 1) train_crc_ = check_same_data(world_, *data_);
  if (const int64_t ms = fault_load_delay_ms(opts_.faults, rank_); ms > 0) {
    spdlog::warn("DTRAIN_FAULT slow_load: rank {} sleeps {} ms after loading its data", rank_, ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  const ModelShape shape = resolve_model_shape(cfg_, *data_, lead_, /*training=*/true);
  check_input_record_fits(*data_);
  if (const auto w = idle_ranks_warning(data_->train.rows, world_.size(), S_, grid_.layout().tp());
      lead_ && !w.empty())
    spdlog::warn("{}", w);
  if (lead_)
    spdlog::info(
        "data: {} train / {} test samples, {} features, {} classes, normalize {} ({:.2f} s)",
        data_->train.rows, data_->test.rows, shape.in_features, shape.num_classes,
        to_string(data_->normalizer.method), seconds_since(t0));
  model_ = build_model(cfg_.model, {shape.sample, shape.num_classes});
  if (grid_.layout().tp() > 1) {
    // This tensor rank's shards; model_ so far is the whole model checkpoints are written in.
    Model whole = std::move(model_);
    model_ = build_gpt(cfg_.model, shape.num_classes, shape.sample.at(0), grid_.coord().tp,
                       grid_.layout().tp());
    tp_ = std::make_unique<TensorParallel>(model_, std::move(whole), grid_.comm(GridAxis::kTensor));
  }
  tps_ = data_->train.targets_per_row();
  DT_CHECK_EQ(model_.targets_per_sample(), tps_);
  // The whole model, as checkpoints hold it; under tensor parallelism each rank then holds a
  // 1/T shard of every block's weights.
  if (lead_)
    spdlog::info("model:\n{}{}", (tp_ ? tp_->global() : model_).describe(),
                 tp_ ? fmt::format("\n(each of the {} tensor ranks holds {} of these parameters)",
                                   grid_.layout().tp(), model_.distinct_param_count())
                     : std::string());
  const bool pipelined = pipelined_ =
      S_ > 1 || cfg_.distributed.strategy == StrategyKind::kPipeline;
  // (distributed.compression with a pipeline is refused by the config's validation.)
  stages_ = pipelined ? partition_stages(model_, S_, cfg_.distributed.pipeline.partition)
                      : std::vector<LayerRange>{{0, model_.num_layers()}};
  const auto [f, l] = stages_[static_cast<size_t>(stage_)];
  check_memory();
  strategy_ = with_gradient_faults(make_strategy(cfg_, ModelRange::layers(model_, f, l), dp_),
                                   opts_.faults, rank_, step_);
  // (every rank refuses alike, before the barrier below: a drill that cannot fail)
  if (const std::string why = fault_unfired_save(opts_.faults, one_file()); !why.empty())
    throw UserError(why);
  // train.init_from read and checked now, before the run's folder is touched (an --overwrite
  // deletes the old run only once the input is known good), unless a checkpoint of the run's
  // own will be loaded instead (a resume, a restart: the file need not be there any more); the
  // weights go out in resume().
  if (lead_ && !cfg_.train.init_from.empty() &&
      (!resuming_ || (opts_.resume == "auto" && resolve_checkpoint(ckpt_dir_, true).empty())))
    read_init_from();
  tied_.emplace(model_, stages_, stage_, dp_, pp_);
  strategy_->init_params(static_cast<uint64_t>(cfg_.seed));
  exec_ = pipelined ? make_pipeline_executor(cfg_, model_, data_->train, *strategy_, rng_, tracer_,
                                             world_, grid_.layout(), stages_)
                    : make_single_stage_executor(cfg_, data_->train, *strategy_, rng_, tracer_);
  if (tp_) exec_->set_tensor_group(tp_->group());
  sampler_.emplace(data_->train.rows, cfg_.data.batch_size, DP_, dpr_, cfg_.data.shuffle,
                   cfg_.data.drop_last, static_cast<uint64_t>(cfg_.seed));
  plan_ = plan_steps(cfg_, sampler_->batches_per_epoch(), data_->train.rows, DP_);
  // The run starts here, every rank's input checked (data, model, memory, steps): the folder is
  // prepared, and an --overwrite deletes the old run's files only now. The barrier first: a rank
  // that refused its input never comes, so rank 0 fails instead of deleting. (Every rank: only
  // the folder's owner knows of --overwrite.)
  if (world_.size() > 1) world_.barrier();
  starting.end();
  if (lead_) ckpt_lock_ = start_run_dir(cfg_, opts_, ckpt_dir_);
  if (const std::string why = fault_past(opts_.faults, plan_.total_steps); lead_ && !why.empty())
    spdlog::warn("{}", why);
  // A warm-up longer than the run: the rate never reaches optimizer.lr, and the schedule after it
  // never starts (accepted: a short smoke run of a long config is legitimate; said, not silent).
  if (const int64_t warmup = cfg_.optimizer.schedule.warmup_steps;
      lead_ && warmup > 0 && warmup > plan_.total_steps)
    spdlog::warn(
        "optimizer.schedule.warmup_steps {} is more than the run's {} steps: the learning rate "
        "rises to {:.3g} x optimizer.lr at most{}",
        warmup, plan_.total_steps,
        static_cast<double>(plan_.total_steps) / static_cast<double>(warmup),
        cfg_.optimizer.schedule.type == ScheduleType::kConstant
            ? ""
            : " and the schedule's decay after it never starts");
  bpe_ = plan_.batches_per_epoch;
  loss_global_ = !pipelined && DP_ > 1 && strategy_->replicated_grads();
}

// The start-up memory check (train/trainer.h's check_training_memory): this rank's stage, or,
// for in-process ranks, every stage with its ranks (the same figure on every rank: all refuse).
void TrainLoop::check_memory() const {
  const bool inproc = cfg_.distributed.backend == Backend::kInproc;
  MemoryPlan plan{
      .stages = inproc ? stages_ : std::vector<LayerRange>{stages_[static_cast<size_t>(stage_)]},
      .replicas = DP_,
      .ranks_here = inproc ? world_.size() / static_cast<int>(stages_.size()) : 1,
      .processes_here = inproc ? 1 : std::max(1, opts_.processes_here),
      .machine_available = opts_.machine_available,
      // rank 0's decision: every rank reads the checkpoint's full state (train.init_from's weights
      // likewise: the same whole-model buffers)
      .resume = resuming_ || !cfg_.train.init_from.empty(),
      // (node 0 holds ranks 0 .. LOCAL_WORLD_SIZE - 1: torchrun's, dtrain launch's, Slurm's
      // block order)
      .gathered_share = inproc || opts_.processes_here <= 1    ? (world_.rank() == 0 ? 1.0 : 0.0)
                        : world_.rank() < opts_.processes_here ? 1.0 / opts_.processes_here
                                                               : 0.0,
      .stage_lead = !inproc && pipelined_ && dpr_ == 0 && world_.rank() != 0,
      .resume_params = tp_ ? tp_->global().param_count() : -1,
      // The address-space probe once per process: rank 0 for the in-process ranks.
      .blas_threads = !inproc || world_.rank() == 0 ? std::max(1, blas_threads()) : 0,
      .train_rows = data_->train.rows,
      // A replica evaluates its contiguous share of the test set.
      .eval_rows = opts_.evaluate ? (data_->test.rows + DP_ - 1) / DP_ : 0};
  check_training_memory(cfg_, model_, plan);
}

void TrainLoop::log_start() const {
  if (!lead_) return;
  if (pipelined_) {
    const PipelineConfig& pc = cfg_.distributed.pipeline;
    // A batch of fewer rows than micro_batches runs one micro-batch per row (the default is not
    // refused for a small batch; a short last batch cuts further, not shown).
    const int64_t micro = std::min<int64_t>(pc.micro_batches, cfg_.data.batch_size);
    spdlog::info(
        "pipeline: {} stage(s) x {} replica(s), schedule {}, {} micro-batches{}, partition "
        "{}{}; {}",
        S_, DP_, to_string(pc.schedule), micro,
        micro < pc.micro_batches ? fmt::format(" (one per row of the batch of {})", micro) : "",
        to_string(pc.partition), pc.activation_checkpointing ? ", activation checkpointing" : "",
        grid_.layout().tp() > 1
            ? fmt::format(
                  "tensor rank tp of stage pp of replica dp is rank tp + {} * (dp + {} * pp)",
                  grid_.layout().tp(), DP_)
            : fmt::format("stage pp of replica dp is rank dp + {} * pp", DP_));
    for (int s = 0; s < S_; ++s) {
      const auto [a, b] = stages_[static_cast<size_t>(s)];
      spdlog::info(
          "  stage {}: layers [{}, {}), {} parameters, est. {:.0f} multiply-adds per sample", s, a,
          b, model_.layer_end(b - 1) - model_.layer_begin(a), stage_cost(model_, a, b));
    }
  }
  if (const std::string d = strategy_->describe(); !d.empty()) spdlog::info("{}", d);
  const int64_t total = plan_.total_steps;
  spdlog::info(
      "training: {} steps ({} per epoch, batch {} x {} replica(s), grad_accum {}), {} params, "
      "layout {}, {} BLAS thread(s) ({} kernels), backend {}, out {}",
      total == std::numeric_limits<int64_t>::max() ? std::string("unlimited")
                                                   : std::to_string(total),
      plan_.steps_per_epoch, cfg_.data.batch_size, DP_, plan_.accum,
      // Counted as the model table and summary.json count: a tied tensor once (PyTorch's way).
      (tp_ ? tp_->global() : model_).distinct_param_count(), grid_.layout().shape(), blas_threads(),
      blas_core(), world_.backend(), opts_.out_dir);
}

double TrainLoop::comm_seconds() const {
  double s = world_.comm_seconds() + exec_->recv_seconds();
  if (&dp_ != &world_) s += dp_.comm_seconds();
  if (&pp_ != &world_ && pp_.size() > 1) s += pp_.comm_seconds();
  if (tp_ && &tp_comm_ != &world_) s += tp_comm_.comm_seconds();  // (the world: counted above)
  return s;
}

void TrainLoop::traced_wait(const std::function<void()>& f) {
  const int64_t t0 = tracer_.enabled() ? tracer_.now_us() : 0;
  const double w0 = waited_seconds();
  f();
  if (tracer_.enabled() && waited_seconds() > w0)
    tracer_.complete("wait for communication", "wait", t0, tracer_.now_us() - t0);
}

double TrainLoop::waited_seconds() const {
  return strategy_->wait_seconds() + exec_->wait_seconds() + tied_->wait_seconds() +
         (tp_ ? tp_->wait_seconds() : 0.0) + verdict_wait_s_;
}

bool TrainLoop::step() {
  TraceScope step_scope(tracer_, "step", "train");
  const int64_t K = plan_.accum;
  const int64_t n_micro = std::min(K, bpe_ - batch_);
  int64_t step_samples = 0, local_samples = 0;
  micro_idx_.resize(static_cast<size_t>(n_micro));
  micro_fewest_.resize(static_cast<size_t>(n_micro));
  for (int64_t i = 0; i < n_micro; ++i) {
    step_samples += sampler_->global_batch_size(batch_ + i);
    micro_fewest_[static_cast<size_t>(i)] = sampler_->fewest_rows(batch_ + i);
    micro_idx_[static_cast<size_t>(i)] = sampler_->batch(epoch_, batch_ + i);
    local_samples += static_cast<int64_t>(micro_idx_[static_cast<size_t>(i)].size());
  }
  // Gradients are sums scaled by 1 / (targets of the step over the data axis: samples times
  // targets per sample), so summing them over the axis gives the gradient of the global batch's
  // mean loss over all its target positions; Local SGD: its own mean.
  const int64_t scale_samples =
      (strategy_->global_mean() ? step_samples : std::max<int64_t>(1, local_samples)) * tps_;
  const double wait0 = waited_seconds();
  // A skipped step leaves no trace: the compressing reducer updates its error-feedback residual
  // and PowerSGD's warm start during the step, before the verdict, so its state is kept to be put
  // back (a NaN left there made every later step non-finite too).
  // (Local SGD's reducer runs at synchronisations, after the verdict: nothing to restore.)
  GradReducer* reducer = cfg_.train.nonfinite == Nonfinite::kSkip &&
                                 cfg_.distributed.strategy != StrategyKind::kLocalSgd
                             ? strategy_->reducer()
                             : nullptr;
  std::optional<GradReducer::State> reducer_before;
  if (reducer != nullptr) reducer_before = reducer->export_state();
  strategy_->begin_step();
  // The step's loss (loss_global_) is known after the last forward; its all-reduce runs during
  // backward, ahead of the gradient buckets, so it adds no round trip after backward.
  float step_loss = 0.0f;
  std::vector<WorkPtr> loss_work;             // (at most one: a list for SettleOnExit)
  const SettleOnExit settle(dp_, loss_work);  // step_loss must outlive its all-reduce
  StepWork w;
  w.batches = &micro_idx_;
  w.fewest_rows = &micro_fewest_;
  w.scale = 1.0f / static_cast<float>(scale_samples);
  w.poison = fault_due(opts_.faults, "nan", rank_, step_ + 1);
  w.mask_key = dropout_step_key(static_cast<uint64_t>(cfg_.seed), step_);
  if (loss_global_)
    w.on_loss = [&](double l) {
      step_loss = static_cast<float>(l);
      loss_work.push_back(dp_.allreduce_async(&step_loss, 1, ReduceOp::kSum));
    };
  double loss_sum = exec_->run_step(w);
  // What the step waits for once backward is done -- the gradient buckets' (or a compressor's)
  // all-reduce, the tied copies' sum, the loss all-reduce -- is its exposed communication
  // (exposed_comm_s), and the trace shows it as such. (Waits inside forward and backward --
  // fsdp's gathers, a pipeline's sends -- are in those spans, and counted too.)
  traced_wait([&] {
    strategy_->finish_backward();
    // Tied copies (the GPT's wte and lm_head) get the sum of their gradients, so they stay equal.
    tied_sq_ = tied_->sum(strategy_->held_grads());
  });
  if (!loss_work.empty()) {
    TraceScope ts(tracer_, "wait for communication", "wait");
    const auto t0 = Clock::now();
    loss_work.back()->wait();
    exposed_comm_s_ += seconds_since(t0);
    loss_sum = step_loss;
  }
  batch_ += n_micro;
  const bool ok = nonfinite_guard(loss_sum);
  if (!ok && reducer_before) reducer->import_state(*reducer_before);
  if (ok && cfg_.optimizer.clip_grad_norm > 0) clip();
  const double lr = lr_at(cfg_.optimizer.schedule, plan_.base_lr, step_, schedule_steps_);
  if (ok) {
    TraceScope ts(tracer_, "optimizer", "compute");
    strategy_->optimizer_step(lr);
  }
  ++step_;
  // (a skipped step trained no samples: Local SGD weighs its averages by the samples that moved
  // each rank's model)
  if (ok) strategy_->count_samples(local_samples, step_samples);
  traced_wait([&] { strategy_->end_step(step_, step_ == plan_.total_steps); });  // (Local SGD)
  exposed_comm_s_ += waited_seconds() - wait0;
  if (ok) {
    samples_trained_ += step_samples;
    // The loss sum covers the global batch (loss_global_) or this rank's own samples (added up
    // over the ranks that compute a loss at each record).
    // (Tensor ranks compute the same loss: tensor rank 0's counts.)
    const bool mine = loss_global_ || (exec_->computes_loss() && grid_.coord().tp == 0);
    interval_loss_ += mine ? loss_sum : 0.0;
    interval_samples_ += loss_global_ ? step_samples : (mine ? local_samples : 0);
  }
  last_lr_ = lr;
  // The step's loss over the global batch is known here with an all-reduced loss, and on one
  // replica without a pipeline (its loss is the global batch's).
  if (loss_global_ || (DP_ == 1 && !pipelined_))
    last_step_loss_ = loss_sum / static_cast<double>(std::max<int64_t>(1, step_samples) * tps_);
  else if (!std::isnan(last_record_loss_))
    last_step_loss_ = last_record_loss_;
  return ok;
}

// The loss sum and samples of the steps since the last record, over all ranks as record() sums
// them (collective where the loss is per rank).
std::pair<double, int64_t> TrainLoop::interval_totals() {
  double loss = interval_loss_;
  int64_t samples = interval_samples_;
  if (!loss_global_ && world_.size() > 1) {
    float l = static_cast<float>(loss);  // as record() sums it
    world_.allreduce(&l, 1, ReduceOp::kSum);
    world_.allreduce(&samples, 1, ReduceOp::kSum);
    loss = l;
  }
  return {loss, samples};
}

std::vector<int64_t> TrainLoop::interval_per_rank() {
  if (loss_global_ || world_.size() == 1) return {};
  // Each rank fills its own slots; the sum over ranks of zeros and one bit pattern is exact.
  std::vector<int64_t> w(static_cast<size_t>(world_.size()) * 2, 0);
  w[static_cast<size_t>(rank_) * 2] = std::bit_cast<int64_t>(interval_loss_);
  w[static_cast<size_t>(rank_) * 2 + 1] = interval_samples_;
  world_.allreduce(w.data(), w.size(), ReduceOp::kSum);
  return w;
}

// An interrupted run stops between records: its final_train_loss is the mean over the steps
// since the last record (or epoch end), as the next record would have reported them. No record
// is written (the checkpoint carries those steps on to a resumed run's next record). Collective
// where the loss is per rank: the stop is agreed, so every rank is here.
void TrainLoop::settle_final_loss() {
  const auto [loss, samples] = interval_totals();
  // Steps since the last record that were all skipped have no loss: none, as their record's.
  if (samples > 0)
    final_train_loss_ = loss / static_cast<double>(samples * tps_);
  else if (step_ > interval_first_step_)
    final_train_loss_ = std::nan("");
}

void TrainLoop::record(bool epoch_done) {
  const int64_t total = plan_.total_steps;
  const int64_t bar_total = total == std::numeric_limits<int64_t>::max() ? 0 : total;
  const bool write = step_ % cfg_.train.log_every == 0 || step_ == total;
  if (!write && !epoch_done) {
    // Between records: the rate since the last record, so the bar shows one from step 1
    // (samples_trained_ counts the global batches on every rank, whatever computes the loss).
    const double el = seconds_since(interval_t0_);
    const double sps =
        el > 0 ? static_cast<double>(samples_trained_ - samples_at_t0_) / el : last_sps_;
    if (bar_) bar_->update(step_, bar_total, epoch_progress(), last_step_loss_, sps);
    return;
  }
  if (stragglers_) stragglers_->check(train_s_ - exposed_comm_s_, step_ - interval_first_step_);
  interval_first_step_ = step_;
  if (!loss_global_ && world_.size() > 1) {
    // Each rank that computes a loss holds its own samples' sum: the record reports the mean
    // over all of them.
    float l = static_cast<float>(interval_loss_);
    world_.allreduce(&l, 1, ReduceOp::kSum);
    world_.allreduce(&interval_samples_, 1, ReduceOp::kSum);
    interval_loss_ = l;
  }
  // final_train_loss: the mean over the steps since the last record or epoch end, whichever is
  // later (so a resumed run's agrees with an uninterrupted one's at the same step).
  // (null when every step since was skipped, as the record's loss is)
  final_train_loss_ = interval_samples_ > 0
                          ? interval_loss_ / static_cast<double>(interval_samples_ * tps_)
                          : std::nan("");
  // The record itself covers every step since the previous record: an epoch end between two
  // records carries its steps (their all-ranks sums) over into the next one.
  record_loss_ += interval_loss_;
  record_samples_ += interval_samples_;
  interval_loss_ = 0.0;
  interval_samples_ = 0;
  if (!write) {
    if (bar_) bar_->update(step_, bar_total, epoch_progress(), last_step_loss_, last_sps_);
    return;
  }
  const double el = seconds_since(interval_t0_);
  // NaN (null in the record) when every step since the last record was skipped.
  const double mean_loss = record_samples_ > 0
                               ? record_loss_ / static_cast<double>(record_samples_ * tps_)
                               : std::nan("");
  if (record_samples_ > 0) last_record_loss_ = mean_loss;
  // The rate of this process's steps since the last record (record_samples_ may hold samples a
  // resumed checkpoint carried over, trained before this process started).
  const double sps = el > 0 ? static_cast<double>(samples_trained_ - samples_at_t0_) / el : 0.0;
  last_sps_ = sps;
  if (lead_) {
    nlohmann::json rec = {{"kind", "train"},
                          {"step", step_},
                          {"epoch", epoch_progress()},
                          {"loss", nan_to_null(mean_loss)},
                          {"lr", last_lr_},
                          {"samples_per_s", sps},
                          {"comm_bytes_sent", world_.bytes_sent() - bytes_sent0_},
                          {"comm_bytes_recv", world_.bytes_recv() - bytes_recv0_},
                          {"comm_s", comm_seconds() - comm_s0_},
                          {"compute_s", train_s_ - exposed_comm_s_},
                          {"exposed_comm_s", exposed_comm_s_},
                          {"idle_s", exec_->wait_seconds()}};
    metrics_->write_line(rec.dump());
    if (!opts_.progress)
      spdlog::info("step {} epoch {:.2f} loss {:.4f} lr {:.4g} {:.0f} samples/s", step_,
                   epoch_progress(), mean_loss, last_lr_, sps);
  }
  record_loss_ = 0.0;
  record_samples_ = 0;
  interval_t0_ = Clock::now();
  samples_at_t0_ = samples_trained_;
  if (bar_) bar_->update(step_, bar_total, epoch_progress(), mean_loss, sps);
}

void TrainLoop::evaluate() {
  if (data_->test.rows == 0) return;
  TraceScope ts(tracer_, "eval", "eval");
  const auto e0 = Clock::now();
  // Each replica evaluates a contiguous share of the test set; the sums of the ranks that
  // compute the loss are all-reduced.
  const int64_t n = data_->test.rows;
  const auto [loss_sum, correct] =
      exec_->evaluate(data_->test, cfg_.data.eval_batch_size, dpr_, DP_);
  // Every rank's (double loss sum, int64 count) gathered as int64 words and summed in rank order:
  // exact counts (a float stops counting at 2^24 correct targets), the loss with a double's
  // precision, and the same figures on every rank and backend.
  double total = loss_sum;
  int64_t right = correct;
  if (world_.size() > 1) {
    const size_t W = static_cast<size_t>(world_.size());
    // Tensor ranks compute the same sums: tensor rank 0's count.
    const bool counts = grid_.coord().tp == 0;
    const double my_loss = counts ? loss_sum : 0.0;
    int64_t mine[2] = {0, counts ? correct : 0};
    std::memcpy(&mine[0], &my_loss, sizeof(double));
    std::vector<int64_t> all(2 * W);
    world_.allgather(mine, all.data(), std::vector<size_t>(W, 2));
    total = 0.0;
    right = 0;
    for (size_t r = 0; r < W; ++r) {
      double v;
      std::memcpy(&v, &all[2 * r], sizeof(double));
      total += v;
      right += all[2 * r + 1];
    }
  }
  last_eval_.samples = n;
  last_eval_.loss = total / static_cast<double>(n * tps_);
  last_eval_.accuracy = static_cast<double>(right) / static_cast<double>(n * tps_);
  // Non-finite outputs make the accuracy meaningless (NaN logits never win argmax): neither is
  // reported, and the cause is named once per evaluation.
  if (!std::isfinite(last_eval_.loss)) {
    last_eval_.accuracy = std::nan("");
    if (lead_)
      spdlog::warn(
          "eval step {}: the test loss is not finite: the model's outputs overflow on some test "
          "samples (values too large for float32), or its weights have diverged; no test loss "
          "or accuracy is reported (dtrain eval names the first such sample)",
          step_);
  }
  have_eval_ = true;
  last_eval_step_ = step_;
  if (lead_) {
    nlohmann::json rec = {{"kind", "eval"},
                          {"step", step_},
                          {"epoch", epoch_progress()},
                          {"test_loss", nan_to_null(last_eval_.loss)},
                          {"test_accuracy", nan_to_null(last_eval_.accuracy)}};
    if (cfg_.data.format == DataFormat::kText)  // bits per byte: nats / ln 2
      rec["test_bpb"] = nan_to_null(last_eval_.loss / std::log(2.0));
    metrics_->write_line(rec.dump());
    if (bar_) bar_->clear();
    spdlog::info("eval step {} epoch {:.2f}: test_loss {:.4f} test_accuracy {:.4f}", step_,
                 epoch_progress(), last_eval_.loss, last_eval_.accuracy);
  }
  interval_t0_ += Clock::now() - e0;
}

nlohmann::json TrainLoop::memory_per_rank(const StateMemory& mem, int64_t* straggler_warnings) {
  // (with each data-parallel group's straggler warnings, from its first data rank: a pipeline's
  // later stages and the other tensor ranks warned in their own logs and were not counted)
  const bool counts = stragglers_ && dpr_ == 0;
  const std::vector<int64_t> mine = {mem.param_bytes, mem.grad_bytes, mem.optim_bytes,
                                     exec_->peak_activation_bytes(),
                                     counts ? stragglers_->warnings() : 0};
  const size_t W = static_cast<size_t>(world_.size()), k = mine.size();
  std::vector<int64_t> all(W * k);
  world_.allgather(mine.data(), all.data(), std::vector<size_t>(W, k));
  nlohmann::json out = nlohmann::json::array();
  // Per stage, the tensor ranks' groups compare the same replicas: their largest count (a slow
  // replica is one straggler, not one per tensor rank; one seen by a single tensor rank counts).
  std::map<int, int64_t> per_stage;
  for (size_t r = 0; r < W; ++r) {
    const GridCoord g = grid_.layout().coord(static_cast<int>(r));
    per_stage[g.pp] = std::max(per_stage[g.pp], all[r * k + 4]);
  }
  *straggler_warnings = 0;
  for (const auto& [pp, n] : per_stage) *straggler_warnings += n;
  for (size_t r = 0; r < W; ++r) {
    const GridCoord g = grid_.layout().coord(static_cast<int>(r));
    out.push_back({{"rank", r},
                   {"tp", g.tp},
                   {"dp", g.dp},
                   {"pp", g.pp},
                   {"param_bytes", all[r * k]},
                   {"grad_bytes", all[r * k + 1]},
                   {"optim_bytes", all[r * k + 2]},
                   {"activation_bytes", all[r * k + 3]}});
  }
  return out;
}

nlohmann::json TrainLoop::summary(int stop_signal) {
  // The whole model's, as PyTorch counts them (a tied tensor once).
  const int64_t P = (tp_ ? tp_->global() : model_).distinct_param_count();
  // Training-state memory of this rank, exact from the buffers (sharding.h's StateMemory).
  const StateMemory mem = strategy_->memory();
  spdlog::info(
      "{} memory: params {:.1f} MiB, grads {:.1f} MiB, optimizer {:.1f} MiB, peak gathered "
      "params {:.1f} MiB, peak unit grads {:.1f} MiB; peak RSS {:.0f} MiB",
      grid_.describe(), mem.param_bytes / 1048576.0, mem.grad_bytes / 1048576.0,
      mem.optim_bytes / 1048576.0, mem.peak_gathered_bytes / 1048576.0,
      mem.peak_unit_grad_bytes / 1048576.0, peak_rss_mb());
  const nlohmann::json extra = exec_->summary(world_);  // collective
  int64_t straggler_warnings = 0;
  const nlohmann::json per_rank = memory_per_rank(mem, &straggler_warnings);  // collective
  nlohmann::json s = interrupt_summary(stop_signal);
  s["format_version"] = kSummaryFormatVersion;
  // (RunOptions::final_save false: none written)
  const std::string ckpt =
      last_ckpt_step_ == step_
          ? (fs::path(ckpt_dir_) /
             (one_file() ? checkpoint_file_name(step_) : sharded_checkpoint_name(step_)))
                .string()
          : std::string();
  s.update({
      {"steps", step_},
      {"epochs", epoch_progress()},
      {"world_size", world_.size()},
      {"strategy", to_string(cfg_.distributed.strategy)},
      {"layout",
       {{"dp", grid_.layout().dp()}, {"pp", grid_.layout().pp()}, {"tp", grid_.layout().tp()}}},
      {"backend", world_.backend()},
      {"final_train_loss", nan_to_null(final_train_loss_)},
      {"test_loss", have_eval_ ? nan_to_null(last_eval_.loss) : nlohmann::json(nullptr)},
      {"test_accuracy", have_eval_ ? nan_to_null(last_eval_.accuracy) : nlohmann::json(nullptr)},
      {"wall_s", seconds_since(t_start_)},
      {"train_s", train_s_},
      {"train_samples_per_s",
       train_s_ > 0 ? static_cast<double>(samples_trained_) / train_s_ : 0.0},
      {"peak_rss_mb", peak_rss_mb()},
      {"comm_bytes_sent", world_.bytes_sent() - bytes_sent0_},
      {"comm_bytes_recv", world_.bytes_recv() - bytes_recv0_},
      {"comm_s", comm_seconds() - comm_s0_},
      {"compute_s", train_s_ - exposed_comm_s_},
      {"exposed_comm_s", exposed_comm_s_},
      {"idle_s", exec_->wait_seconds()},
      {"skipped_steps", skipped_steps_},
      {"straggler_warnings", straggler_warnings},
      {"config_hash", hash_},
      {"param_count", P},
      {"steps_this_run", step_ - first_step_},
      {"resumed_from", rp_.from.empty() ? nlohmann::json(nullptr) : nlohmann::json(rp_.from)},
      {"checkpoint", ckpt.empty() ? nlohmann::json(nullptr) : nlohmann::json(ckpt)},
      // (rank 0 wrote it, and reads its header now: the run folder's resume compares it)
      {"checkpoint_id", ckpt.empty() || !lead_ ? nlohmann::json(nullptr)
                                               : nlohmann::json(checkpoint_identity(ckpt))},
      {"param_bytes", mem.param_bytes},
      {"grad_bytes", mem.grad_bytes},
      {"optim_bytes", mem.optim_bytes},
      {"peak_gathered_bytes", mem.peak_gathered_bytes},
      {"peak_unit_grad_bytes", mem.peak_unit_grad_bytes},
      {"activation_bytes", exec_->peak_activation_bytes()},
      {"memory_per_rank", per_rank},
  });
  if (cfg_.data.format == DataFormat::kText)  // bits per byte
    s["test_bpb"] =
        have_eval_ ? nan_to_null(last_eval_.loss / std::log(2.0)) : nlohmann::json(nullptr);
  s.update(extra);
  return s;
}

// The agreed stop, said: by rank 0, which shows the run; by a gRPC rank that received the signal
// itself, in its own log (in-process ranks share rank 0's StopRequest and log).
void TrainLoop::announce_stop(int sig, bool preempted, bool in_sync) {
  if (!lead_ && opts_.stop != nullptr && cfg_.distributed.backend != Backend::kInproc)
    note_stop_received(*opts_.stop, /*shows_run=*/false);
  if (!lead_) return;
  if (bar_) bar_->clear();
  const bool orphaned = opts_.stop != nullptr && opts_.stop->launcher_gone.load();
  if (opts_.stop != nullptr) note_stop_received(*opts_.stop);  // (said first, once)
  spdlog::warn("{}{}{}: stopping after step {}{}{} (again: stop at once)",
               orphaned ? "the launcher is gone, taken as " : "", interrupt_signal_name(sig),
               preempted ? " (preemption)" : "", step_,
               in_sync ? "" : " at the next Local SGD synchronisation",
               opts_.final_save ? ", then writing a checkpoint" : "");
}

nlohmann::json TrainLoop::run() {
  if (!resume()) return early_summary_;
  if (lead_) {
    const std::string path = (fs::path(opts_.out_dir) / "metrics.jsonl").string();
    metrics_ = std::make_unique<LineWriter>(path, rp_.loaded);
    if (metrics_->dropped_bytes() > 0)
      spdlog::warn(
          "{}: its last line was unfinished (a write cut short); its {} bytes were dropped", path,
          metrics_->dropped_bytes());
  }
  log_start();
  if (lead_) bar_.emplace(opts_.progress);
  if (DP_ > 1) stragglers_.emplace(dp_, grid_.layout(), grid_.coord(), dpr_ == 0);
  first_step_ = interval_first_step_ = step_;
  bytes_sent0_ = world_.bytes_sent();
  bytes_recv0_ = world_.bytes_recv();
  comm_s0_ = comm_seconds();
  interval_t0_ = Clock::now();
  samples_at_t0_ = samples_trained_;
  // Safe interrupts: the step after which every rank stops (stop.h). A run without a pipeline
  // votes at the start of a step (the vote's latency hides behind it; Local SGD votes only in
  // the steps that end in a synchronisation, where it can stop); a pipeline votes at the end of
  // a step, when its point-to-point traffic has drained.
  const int preempt_sig = preempt_signal_number(cfg_.train.preempt_signal);
  StopAgreement stop_vote(opts_.stop, world_, preempt_sig);
  int stop_pending = 0, stop_signal = 0;
  bool stop_preempted = false;  // the agreed stop is a preemption (the vote's, on every rank)
  // Whether the ranks hold the same parameters after `step`: Local SGD's synchronisations, and
  // its last step, which synchronises whatever its number (end_step's `last`), so a stop
  // requested within the last sync_every steps ends the run there as interrupted.
  const auto synced_after = [&](int64_t step) {
    return strategy_->in_sync(step) || step == plan_.total_steps;
  };
  // The evaluation the checkpoint's step had due, which its run died before (it saves first).
  if (eval_due_ && opts_.evaluate && synced_after(step_) && step_ < plan_.total_steps) {
    evaluate();
    eval_due_ = false;
  }
  while (step_ < plan_.total_steps) {
    if (batch_ >= bpe_) {
      ++epoch_;
      batch_ = 0;
    }
    if (cfg_.train.epochs > 0 && epoch_ >= cfg_.train.epochs) break;
    if (!pipelined_ && synced_after(step_ + 1)) stop_vote.begin_step();
    const auto step_t0 = Clock::now();
    const int64_t batch_before = batch_;
    try {
      step();
    } catch (const AgreedError&) {
      stop_vote.settle();
      throw;
    } catch (const std::exception& e) {
      fail_group(e);
      stop_vote.abandon(e.what());
      throw;
    }
    apply_step_faults(opts_.faults, rank_, step_, world_);  // DTRAIN_FAULT; a delay is step time
    const double step_s = seconds_since(step_t0);
    train_s_ += step_s;
    if (opts_.after_step) {  // outside the step's time, and the record's (bench step's replays)
      const auto a0 = Clock::now();
      opts_.after_step(rank_, step_, step_s, batch_ - batch_before);
      interval_t0_ += Clock::now() - a0;
    }
    const bool epoch_done = batch_ >= bpe_;
    if (epoch_done) {
      ++epoch_;
      batch_ = 0;
    }
    record(epoch_done);
    // (only where there is one to run: a checkpoint carries it, and a resume runs it)
    if ((epoch_done || (cfg_.train.eval_every > 0 && step_ % cfg_.train.eval_every == 0)) &&
        opts_.evaluate && data_->test.rows > 0)
      eval_due_ = true;
    // Local SGD ranks hold the same parameters only right after a synchronisation: an
    // evaluation falls due at the first synchronisation at or after the epoch end.
    const bool in_sync = synced_after(step_);
    // A checkpoint before the evaluation of the same step: an evaluation that fails (out of
    // memory) loses no training. The last step's evaluation comes after the final checkpoint,
    // below the loop.
    try {
      if (cfg_.train.checkpoint.every_steps > 0 && step_ % cfg_.train.checkpoint.every_steps == 0)
        save();
      poll_save();                  // an asynchronous write in flight: its error, or its completion
    } catch (const AgreedError&) {  // a shard write failed: every rank is here, at this step
      stop_vote.settle();
      throw;
    } catch (const std::exception& e) {  // this rank's own (the peers learn it from the abort)
      fail_group(e);
      stop_vote.abandon(e.what());
      throw;
    }
    const bool last = step_ >= plan_.total_steps ||
                      (cfg_.train.epochs > 0 && epoch_ >= cfg_.train.epochs && batch_ == 0);
    if (eval_due_ && in_sync && opts_.evaluate && !last) {
      evaluate();
      eval_due_ = false;
    }
    if (pipelined_) stop_vote.begin_step();
    if (const int sig = stop_vote.end_step(); sig != 0 && stop_pending == 0) {
      stop_pending = sig;
      stop_preempted = stop_vote.preempted();
      if (stop_preempted) start_deadline(sig);
      announce_stop(sig, stop_preempted, in_sync);
    }
    if (stop_pending != 0 && in_sync) {
      stop_signal = stop_pending;
      break;
    }
  }
  return finish_run(stop_signal, stop_preempted);
}

nlohmann::json TrainLoop::finish_run(int stop_signal, bool stop_preempted) {
  const bool interrupted = stop_signal != 0;
  nlohmann::json s;
  try {
    if (opts_.final_save && last_ckpt_step_ != step_) save();
    // The final checkpoint is complete before the final evaluation (one that fails, out of
    // memory, loses no training; the loop leaves the last step's to here) and the summary.
    finish_save();
    if (opts_.evaluate && last_eval_step_ != step_ && !interrupted)
      evaluate();  // an interrupt wants out quickly
    if (bar_) bar_->clear();
    if (interrupted) settle_final_loss();
    s = summary(stop_signal);  // (collective: every rank is past its save)
  } catch (const CommError& e) {
    if (!stop_preempted) throw;
    throw PreemptedError(
        fmt::format("{} lost its job after the agreed preemption stop at step {} ({}); exiting {} "
                    "(preempted): --resume auto continues from the newest complete checkpoint",
                    grid_.describe(), step_, e.what(), kExitPreempted));
  }
  // The preemption's checkpoint is on disk on every rank. (Armed until here: a rank that saves
  // nothing must not outlive, in the summary's collective, a peer its deadline ends.)
  deadline_.cancel();
  s["preempted"] = stop_signal != 0 && stop_preempted;
  // The stop was the launcher's loss, taken as the preemption signal (rank 0's output went
  // through the launcher: nothing else says so)
  s["launcher_lost"] =
      stop_signal != 0 && opts_.stop != nullptr && opts_.stop->launcher_gone.load();
  const int exit_code = stop_exit_code(stop_signal, stop_preempted);  // (cmd_run's, from s)
  // A rank of its own process is done now; ranks that are threads share the lead's request.
  const bool own_process = cfg_.distributed.backend != Backend::kInproc;
  const bool mark = opts_.final_run && opts_.stop != nullptr;
  if (!lead_ && own_process && mark) opts_.stop->done_code.store(exit_code);
  if (lead_) {
    // (replace: a path that is not UTF-8, refused up front where it is known, must not lose
    // the summary of a finished run)
    write_file_atomic((fs::path(opts_.out_dir) / "summary.json").string(),
                      s.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                      Links::kReplace);
    if (mark) opts_.stop->done_code.store(exit_code);
    spdlog::debug("done: {} steps, test_accuracy {}, {:.1f} s, results in {}", step_,
                  have_eval_ ? fmt::format("{:.4f}", last_eval_.accuracy) : std::string("n/a"),
                  seconds_since(t_start_), opts_.out_dir);
  }
  return s;
}

}  // namespace loop_detail

int pipeline_stages(const Config& cfg) {
  const int64_t s = cfg.distributed.pipeline.stages;
  return cfg.distributed.strategy == StrategyKind::kPipeline || s > 1 ? static_cast<int>(s) : 1;
}

nlohmann::json run_loop(const Config& cfg, const RunOptions& opts, Communicator& comm,
                        Tracer& tracer) {
  const int S = pipeline_stages(cfg);
  if (comm.size() % S != 0)
    throw UserError("world size " + std::to_string(comm.size()) +
                    " is not a multiple of distributed.pipeline.stages (" + std::to_string(S) +
                    "): ranks form stages x replicas");
  loop_detail::TrainLoop loop(cfg, opts, comm, tracer);
  return loop.run();
}

}  // namespace dtrain