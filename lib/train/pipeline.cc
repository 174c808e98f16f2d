#include "train/pipeline.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>

#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint.h"
#include "comm/subgroup.h"
#include "data/sampler.h"
#include "optim/optimizer.h"
#include "train/batch.h"
#include "train/step_faults.h"
#include "train/stop.h"
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

// Point-to-point tags between neighbouring stages (messages with one tag arrive in order).
constexpr uint64_t kTagActivation = 1;
constexpr uint64_t kTagGradient = 2;

// Estimated multiply-adds per sample of layers [first, last).
double block_cost(const Model& m, size_t first, size_t last) {
  double c = 0;
  for (size_t i = first; i < last; ++i)
    c += static_cast<double>(m.layer_end(i) - m.layer_begin(i)) +
         static_cast<double>(m.layer(i).out_features());
  return c;
}

// One micro-batch in flight on this stage.
struct Micro {
  std::vector<int64_t> idx;
  Tensor input;                       // the stage's input (kept until backward)
  std::vector<int32_t> labels;        // last stage
  Tensor dy;                          // last stage: gradient of the loss w.r.t. the output
  std::unique_ptr<Activations> acts;  // null once released (activation checkpointing)
  std::array<uint64_t, 4> rng_state{};
  int64_t stored_bytes = 0;
};

int64_t tensor_bytes(const Tensor& t) {
  return t.numel() * 4;
}

}  // namespace

std::vector<LayerRange> partition_stages(const Model& m, int stages, const std::string& how) {
  FsdpConfig one;  // one block per layer with parameters, followers attached
  const std::vector<LayerRange> blocks = units_for_fsdp(m, one);
  const int B = static_cast<int>(blocks.size());
  DT_CHECK_GE(stages, 1);
  DT_CHECK_LE(stages, B);
  std::vector<int> cut;  // first block of each stage
  if (how == "uniform") {
    int b = 0;
    for (int s = 0; s < stages; ++s) {
      cut.push_back(b);
      b += B / stages + (s < B % stages ? 1 : 0);
    }
  } else {
    DT_CHECK_MSG(how == "balanced", "unknown partition " << how);
    // Minimise the largest stage cost over contiguous splits (dynamic programming).
    std::vector<double> cost(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b)
      cost[static_cast<size_t>(b)] = block_cost(m, blocks[static_cast<size_t>(b)].first,
                                                blocks[static_cast<size_t>(b)].second);
    std::vector<double> prefix(static_cast<size_t>(B) + 1, 0.0);
    for (int b = 0; b < B; ++b)
      prefix[static_cast<size_t>(b) + 1] =
          prefix[static_cast<size_t>(b)] + cost[static_cast<size_t>(b)];
    const double inf = std::numeric_limits<double>::infinity();
    // best[s][b]: minimal max cost of splitting blocks [0, b) into s stages; from[s][b]: cut.
    std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1,
                                          std::vector<double>(static_cast<size_t>(B) + 1, inf));
    std::vector<std::vector<int>> from(static_cast<size_t>(stages) + 1,
                                       std::vector<int>(static_cast<size_t>(B) + 1, 0));
    best[0][0] = 0.0;
    for (int s = 1; s <= stages; ++s)
      for (int b = s; b <= B; ++b)
        for (int a = s - 1; a < b; ++a) {
          const double v =
              std::max(best[static_cast<size_t>(s) - 1][static_cast<size_t>(a)],
                       prefix[static_cast<size_t>(b)] - prefix[static_cast<size_t>(a)]);
          if (v < best[static_cast<size_t>(s)][static_cast<size_t>(b)]) {
            best[static_cast<size_t>(s)][static_cast<size_t>(b)] = v;
            from[static_cast<size_t>(s)][static_cast<size_t>(b)] = a;
          }
        }
    cut.assign(static_cast<size_t>(stages), 0);
    int b = B;
    for (int s = stages; s >= 1; --s) {
      b = from[static_cast<size_t>(s)][static_cast<size_t>(b)];
      cut[static_cast<size_t>(s) - 1] = b;
    }
  }
  std::vector<LayerRange> out;
  for (int s = 0; s < stages; ++s) {
    const int b0 = cut[static_cast<size_t>(s)];
    const int b1 = s + 1 < stages ? cut[static_cast<size_t>(s) + 1] : B;
    DT_CHECK_LT(b0, b1);
    out.emplace_back(blocks[static_cast<size_t>(b0)].first,
                     blocks[static_cast<size_t>(b1) - 1].second);
  }
  return out;
}

nlohmann::json train_pipeline(const Config& cfg, const RunOptions& opts, Communicator& comm,
                              Tracer& tracer) {
  const auto t_start = Clock::now();
  const int world = comm.size();
  const int rank = comm.rank();
  const bool lead = rank == 0;
  const PipelineConfig& pc = cfg.distributed.pipeline;
  const int S = static_cast<int>(pc.stages);
  if (world % S != 0)
    throw UserError("world size " + std::to_string(world) +
                    " is not a multiple of distributed.pipeline.stages (" + std::to_string(S) +
                    "): ranks form stages x replicas");
  const int D = world / S;
  const int stage = rank % S, replica = rank / S;
  const bool first_stage = stage == 0, last_stage = stage == S - 1;
  const std::string ckpt_dir = (fs::path(opts.out_dir) / "checkpoints").string();
  const std::string hash = config_hash(cfg);
  const std::string config_json = config_to_json(cfg).dump();  // stored in checkpoints
  if (lead) {
    start_run_dir(cfg, opts, ckpt_dir);
  }

  DataSplits data = load_data(cfg.data, cfg.seed);
  const ModelShape shape = resolve_model_shape(cfg, data);
  if (const auto w = idle_ranks_warning(data.train.rows, world, S); lead && !w.empty())
    spdlog::warn("{}", w);
  const Model model = build_mlp(cfg.model, shape.in_features, shape.num_classes);
  const int64_t P = model.param_count();
  const std::vector<LayerRange> plan = partition_stages(model, S, pc.partition);
  const size_t f = plan[static_cast<size_t>(stage)].first;
  const size_t l = plan[static_cast<size_t>(stage)].second;
  const int64_t pb = model.layer_begin(f), pe = model.layer_end(l - 1), n = pe - pb;
  if (lead) {
    spdlog::info("model:\n{}", model.describe());
    spdlog::info(
        "pipeline: {} stage(s) x {} replica(s), schedule {}, {} micro-batches, partition "
        "{}{}; rank r is stage r % {} of replica r / {}",
        S, D, pc.schedule, pc.micro_batches, pc.partition,
        pc.activation_checkpointing ? ", activation checkpointing" : "", S, S);
    for (int s = 0; s < S; ++s) {
      const auto [a, b] = plan[static_cast<size_t>(s)];
      spdlog::info("  stage {}: layers [{}, {}), {} parameters, est. cost {:.0f} per sample", s, a,
                   b, model.layer_end(b - 1) - model.layer_begin(a), block_cost(model, a, b));
    }
  }

  // This stage's parameters: the flat layout's [pb, pe), initialised like the whole model.
  std::vector<float> params(static_cast<size_t>(n)), grads(static_cast<size_t>(n));
  model.init(params.data(), static_cast<uint64_t>(cfg.seed), f, l, pb);
  auto opt = make_optimizer(cfg.optimizer, 0, n);
  std::vector<StateBuffer> state_bufs;
  for (size_t i = 0; i < opt->state_names().size(); ++i)
    state_bufs.push_back({opt->state_names()[i], opt->state(i).data()});

  // The stage's data-parallel group: the same stage of every replica.
  std::unique_ptr<Communicator> dp;
  if (D > 1) {
    std::vector<int> members;
    for (int d = 0; d < D; ++d) members.push_back(d * S + stage);
    dp = std::make_unique<Communicator>(
        make_subgroup_transport(comm.transport(), members, static_cast<uint32_t>(stage)),
        comm.options());
  }

  const int64_t b = cfg.data.batch_size;
  Sampler sampler(data.train.rows, b, D, replica, cfg.data.shuffle, cfg.data.drop_last,
                  static_cast<uint64_t>(cfg.seed));
  const StepPlan steps = plan_steps(cfg, sampler.batches_per_epoch(), data.train.rows, D);
  const int64_t bpe = steps.batches_per_epoch, K = steps.accum;
  const int64_t steps_per_epoch = steps.steps_per_epoch, total_steps = steps.total_steps;
  const double base_lr = steps.base_lr;
  Rng rng(static_cast<uint64_t>(cfg.seed), 0xD7A1000ULL + static_cast<uint64_t>(rank));

  // Resume: the full state is read by rank 0 and broadcast; each stage keeps its range.
  int64_t step = 0, epoch = 0, batch = 0;
  std::string resumed_from;
  ResumePoint rp;
  if (!opts.resume.empty()) {
    std::vector<float> full_p(static_cast<size_t>(P));
    std::vector<std::vector<float>> full_s(state_bufs.size(),
                                           std::vector<float>(static_cast<size_t>(P)));
    std::vector<StateBuffer> sb = state_bufs;
    for (size_t i = 0; i < sb.size(); ++i) sb[i].data = full_s[i].data();
    rp = resume_full_state(cfg, opts, comm, model, ckpt_dir, hash, full_p.data(), sb, rng);
    if (rp.loaded) {
      std::copy(full_p.begin() + pb, full_p.begin() + pe, params.begin());
      for (size_t i = 0; i < full_s.size(); ++i)
        std::copy(full_s[i].begin() + pb, full_s[i].begin() + pe, opt->state(i).begin());
      step = rp.step;
      epoch = rp.epoch;
      batch = rp.batch;
      opt->set_step_count(rp.optimizer_steps);
      resumed_from = rp.from;
    }
  }

  if (const std::string why = nothing_left_reason(cfg, rp, steps); !why.empty()) {
    if (lead) spdlog::warn("{}", why);
    return nothing_to_do_summary(why, rp);
  }
  const int64_t schedule_steps = schedule_horizon(rp, steps, lead);

  std::unique_ptr<LineWriter> metrics;
  if (lead)
    metrics = std::make_unique<LineWriter>((fs::path(opts.out_dir) / "metrics.jsonl").string(),
                                           !resumed_from.empty());

  // Widths crossing stage boundaries.
  const int64_t in_width = first_stage ? shape.in_features : model.layer(f - 1).out_features();
  const int64_t out_width = model.layer(l - 1).out_features();
  ForwardCtx ctx{.training = true, .rng = &rng};
  std::vector<std::unique_ptr<Activations>> pool;  // released activation sets, reused
  auto acquire = [&] {
    if (pool.empty()) return std::make_unique<Activations>();
    auto a = std::move(pool.back());
    pool.pop_back();
    return a;
  };
  std::vector<Micro> micro;
  Tensor dx, dy_recv, xb;
  std::vector<int32_t> yb;
  double compute_s = 0.0, idle_s = 0.0, schedule_s = 0.0, eval_recv_s = 0.0;
  int64_t stored_now = 0, peak_stored = 0;
  double loss_sum = 0.0;  // last stage: over this step's micro-batches

  auto recv_tensor = [&](int src, uint64_t tag, Tensor& t, int64_t rows, int64_t width) {
    t.resize({rows, width});
    TraceScope ts(tracer, "recv wait", "wait");
    const auto t0 = Clock::now();
    comm.recv(src, tag, t.data(), static_cast<size_t>(rows * width));
    idle_s += seconds_since(t0);
  };
  auto forward = [&](Micro& mb, float scale) {
    const int64_t rows = static_cast<int64_t>(mb.idx.size());
    if (first_stage) {
      gather_rows(data.train, mb.idx, mb.input, yb);
    } else {
      recv_tensor(rank - 1, kTagActivation, mb.input, rows, in_width);
    }
    TraceScope ts(tracer, "forward", "compute");
    const auto t0 = Clock::now();
    mb.rng_state = rng.state();
    mb.acts = acquire();
    const Tensor& out = model.forward(params.data(), mb.input, *mb.acts, ctx, f, l, pb);
    if (last_stage) {
      mb.labels.resize(static_cast<size_t>(rows));
      for (int64_t i = 0; i < rows; ++i)
        mb.labels[static_cast<size_t>(i)] =
            data.train.y[static_cast<size_t>(mb.idx[static_cast<size_t>(i)])];
      loss_sum += loss_and_grad(cfg.model.loss, out, mb.labels.data(), &mb.dy, scale);
    }
    compute_s += seconds_since(t0);
    if (!last_stage)
      comm.send(rank + 1, kTagActivation, out.data(), static_cast<size_t>(out.numel()));
    mb.stored_bytes = tensor_bytes(mb.input) + tensor_bytes(mb.dy);
    if (pc.activation_checkpointing) {
      pool.push_back(std::move(mb.acts));  // keep the input only; recompute in backward
    } else {
      mb.stored_bytes += mb.acts->bytes();
    }
    stored_now += mb.stored_bytes;
    peak_stored = std::max(peak_stored, stored_now);
  };
  auto backward = [&](Micro& mb) {
    const int64_t rows = static_cast<int64_t>(mb.idx.size());
    const Tensor* dy = &mb.dy;
    if (!last_stage) {
      recv_tensor(rank + 1, kTagGradient, dy_recv, rows, out_width);
      dy = &dy_recv;
    }
    TraceScope ts(tracer, "backward", "compute");
    const auto t0 = Clock::now();
    if (!mb.acts) {  // recompute the forward with the same dropout stream
      Rng replay;
      replay.set_state(mb.rng_state);
      ForwardCtx rctx{.training = true, .rng = &replay};
      mb.acts = acquire();
      model.forward(params.data(), mb.input, *mb.acts, rctx, f, l, pb);
      peak_stored = std::max(peak_stored, stored_now + mb.acts->bytes());
    }
    model.backward(params.data(), grads.data(), mb.input, *mb.acts, *dy,
                   first_stage ? nullptr : &dx, f, l, {}, pb);
    compute_s += seconds_since(t0);
    if (!first_stage) comm.send(rank - 1, kTagGradient, dx.data(), static_cast<size_t>(dx.numel()));
    pool.push_back(std::move(mb.acts));
    stored_now -= mb.stored_bytes;
  };
  // One batch through the pipeline with the configured schedule.
  auto run_schedule = [&](const std::vector<int64_t>& idx, float scale) {
    const int64_t rows = static_cast<int64_t>(idx.size());
    const int64_t M = std::min<int64_t>(pc.micro_batches, rows);
    if (M == 0) return;
    micro.resize(static_cast<size_t>(M));
    for (int64_t m = 0; m < M; ++m) {
      const int64_t lo = rows * m / M, hi = rows * (m + 1) / M;
      micro[static_cast<size_t>(m)].idx.assign(idx.begin() + lo, idx.begin() + hi);
      micro[static_cast<size_t>(m)].dy = Tensor();
    }
    const auto t0 = Clock::now();
    if (pc.schedule == "gpipe") {
      for (int64_t m = 0; m < M; ++m) forward(micro[static_cast<size_t>(m)], scale);
      for (int64_t m = 0; m < M; ++m) backward(micro[static_cast<size_t>(m)]);
    } else {
      const int64_t warmup = std::min<int64_t>(S - 1 - stage, M);
      int64_t fw = 0, bw = 0;
      for (; fw < warmup; ++fw) forward(micro[static_cast<size_t>(fw)], scale);
      while (fw < M) {
        forward(micro[static_cast<size_t>(fw++)], scale);
        backward(micro[static_cast<size_t>(bw++)]);
      }
      while (bw < M) backward(micro[static_cast<size_t>(bw++)]);
    }
    schedule_s += seconds_since(t0);
  };

  // Evaluation: each replica evaluates its share of the test set through its pipeline; the
  // last stages' sums are all-reduced over the world (other ranks add zeros).
  EvalResult last_eval;
  bool have_eval = false;
  int64_t last_eval_step = -1, last_ckpt_step = resumed_from.empty() ? -1 : step;
  auto run_eval = [&] {
    if (data.test.rows == 0) return;
    const int64_t nt = data.test.rows;
    const int64_t lo = nt * replica / D, hi = nt * (replica + 1) / D;
    Activations acts;
    ForwardCtx ectx{.training = false, .rng = nullptr};
    std::vector<int64_t> idx;
    Tensor in;
    double ls = 0.0;
    int64_t correct = 0;
    for (int64_t start = lo; start < hi; start += cfg.data.eval_batch_size) {
      const int64_t rows = std::min(cfg.data.eval_batch_size, hi - start);
      idx.resize(static_cast<size_t>(rows));
      for (int64_t i = 0; i < rows; ++i) idx[static_cast<size_t>(i)] = start + i;
      if (first_stage) {
        gather_rows(data.test, idx, in, yb);
      } else {
        in.resize({rows, in_width});
        const auto r0 = Clock::now();
        comm.recv(rank - 1, kTagActivation, in.data(), static_cast<size_t>(rows * in_width));
        eval_recv_s += seconds_since(r0);
      }
      const Tensor& out = model.forward(params.data(), in, acts, ectx, f, l, pb);
      if (last_stage) {
        yb.resize(static_cast<size_t>(rows));
        for (int64_t i = 0; i < rows; ++i)
          yb[static_cast<size_t>(i)] = data.test.y[static_cast<size_t>(start + i)];
        ls += loss_and_grad(cfg.model.loss, out, yb.data(), nullptr, 1.0f);
        correct += count_correct(out, yb.data());
      } else {
        comm.send(rank + 1, kTagActivation, out.data(), static_cast<size_t>(out.numel()));
      }
    }
    std::vector<float> sums = {static_cast<float>(ls), static_cast<float>(correct)};
    comm.allreduce(sums.data(), sums.size(), ReduceOp::kSum);
    last_eval.samples = nt;
    last_eval.loss = sums[0] / static_cast<double>(nt);
    last_eval.accuracy = std::round(sums[1]) / static_cast<double>(nt);
    have_eval = true;
    last_eval_step = step;
    if (lead) {
      metrics->write_line(nlohmann::json({{"kind", "eval"},
                                          {"step", step},
                                          {"epoch", epoch + static_cast<double>(batch) / bpe},
                                          {"test_loss", last_eval.loss},
                                          {"test_accuracy", last_eval.accuracy}})
                              .dump());
      spdlog::info("eval step {}: test_loss {:.4f} test_accuracy {:.4f}", step, last_eval.loss,
                   last_eval.accuracy);
    }
  };
  // Checkpoint: replica 0's stages each write their range as a shard of a sharded checkpoint;
  // rank 0 writes the manifest once every stage has.
  auto save = [&] {
    const std::string rng_states = gather_rng_states(comm, rng);
    const std::string name = sharded_checkpoint_name(step);
    const fs::path dir = fs::path(ckpt_dir) / name;
    if (lead) fs::remove_all(dir);
    comm.barrier();
    std::string err;
    if (replica == 0) {
      try {
        fs::create_directories(dir);
        save_shard(dir.string(), stage, {{pb, pe, 0}}, n, params.data(), state_bufs);
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    float ok = err.empty() ? 1.0f : 0.0f;
    comm.allreduce(&ok, 1, ReduceOp::kMin);
    if (!err.empty()) throw std::runtime_error("writing checkpoint shard: " + err);
    if (ok < 1.0f) throw std::runtime_error("another stage failed to write checkpoint " + name);
    if (lead) {
      CheckpointMeta m;
      m.step = step;
      m.epoch = epoch;
      m.batch = batch;
      m.optimizer = cfg.optimizer.type;
      m.optimizer_steps = opt->step_count();
      m.rng = rng_states;
      m.config_hash = hash;
      m.world_size = world;
      m.strategy = "pipeline";
      m.config_json = config_json;
      m.schedule_steps = schedule_steps;
      std::vector<std::vector<ShardRange>> ranges;
      for (int s = 0; s < S; ++s) {
        const auto [a, c] = plan[static_cast<size_t>(s)];
        ranges.push_back({{model.layer_begin(a), model.layer_end(c - 1), 0}});
      }
      write_manifest(dir.string(), model, m, ranges, opt->state_names());
      commit_checkpoint(ckpt_dir, name, cfg.train.checkpoint.keep_last);
    }
    last_ckpt_step = step;
  };

  if (lead)
    spdlog::info(
        "training: {} steps ({} per epoch, batch {} x {} replica(s)), {} params, backend {}",
        total_steps == std::numeric_limits<int64_t>::max() ? -1 : total_steps, steps_per_epoch, b,
        D, P, comm.backend());
  const uint64_t sent0 = comm.bytes_sent(), recv0 = comm.bytes_recv();
  // comm_s: seconds in the world's and the replica group's collectives, and in point-to-point
  // receives (training and evaluation). exposed_comm_s: what the training steps wait for --
  // the replica all-reduce (synchronous) and the receives from neighbouring stages (idle_s:
  // bubbles included, since a stage waiting for its neighbour is waiting for communication).
  // compute_s = train_s - exposed_comm_s, as in the data-parallel loop.
  auto comm_seconds = [&] {
    return comm.comm_seconds() + (dp ? dp->comm_seconds() : 0.0) + idle_s + eval_recv_s;
  };
  const double comm_s0 = comm_seconds();
  double exposed_comm_s = 0.0;
  double interval_loss = 0.0, train_s = 0.0, final_loss = std::nan("");
  int64_t interval_samples = 0, samples_trained = 0;
  const int64_t first_step = step;
  auto interval_t0 = Clock::now();
  bool eval_due = false;
  int64_t skipped_steps = 0;  // train.nonfinite: skip
  // Safe interrupts (stop.h): one vote per step, at its end; the schedule's point-to-point
  // traffic has drained by then.
  StopAgreement stop_vote(opts.stop, comm);
  int stop_signal = 0;
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
    std::fill(grads.begin(), grads.end(), 0.0f);
    loss_sum = 0.0;
    const double idle0 = idle_s;
    for (int64_t i = 0; i < n_micro; ++i) run_schedule(sampler.batch(epoch, batch + i), scale);
    if (fault_due(opts.faults, "nan", rank, step + 1) && n > 0)
      grads[0] = std::nanf("");  // DTRAIN_FAULT: a NaN enters this stage's gradient
    if (dp) {
      const auto a0 = Clock::now();
      dp->allreduce(grads.data(), grads.size(), ReduceOp::kSum);
      exposed_comm_s += seconds_since(a0);
    }
    exposed_comm_s += idle_s - idle0;  // waits for the neighbouring stages
    // Non-finite guard: stages hold different tensors, so the verdict is all-reduced (min code).
    // A skipped step drops its update (and its loss and samples from the record) only, as in
    // the data-parallel loop.
    bool skip = false;
    {
      float code = kFiniteCode;
      if (last_stage && !std::isfinite(loss_sum)) {
        code = kLossCode;
      } else {
        const int64_t e = first_nonfinite_param(model, grads.data(), {{pb, pe, 0}});
        if (e >= 0) code = static_cast<float>(e + 1);
      }
      comm.allreduce(&code, 1, ReduceOp::kMin);
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
      // Stages hold disjoint parameters; replicas hold equal copies: divide by D.
      float ss = static_cast<float>(sum_squares(grads.data(), n));
      comm.allreduce(&ss, 1, ReduceOp::kSum);
      const float fct =
          clip_factor(std::sqrt(static_cast<double>(ss) / D), cfg.optimizer.clip_grad_norm);
      if (fct < 1.0f) scale_inplace(grads.data(), n, fct);
    }
    const double lr = lr_at(cfg.optimizer.schedule, base_lr, step, schedule_steps);
    if (!skip) {
      TraceScope ts(tracer, "optimizer", "compute");
      opt->step(params.data(), grads.data(), lr);
    }
    ++step;
    batch += n_micro;
    apply_step_faults(opts.faults, rank, step, comm);  // DTRAIN_FAULT; a delay is step time
    train_s += seconds_since(step_t0);
    if (!skip) {
      samples_trained += step_samples;
      interval_loss += loss_sum;
      interval_samples += step_samples;
    }
    const bool epoch_done = batch >= bpe;
    if (epoch_done) {
      ++epoch;
      batch = 0;
    }
    if (step % cfg.train.log_every == 0 || step == total_steps || epoch_done) {
      // The loss lives on the last stages: one world all-reduce per record.
      float v = last_stage ? static_cast<float>(interval_loss) : 0.0f;
      comm.allreduce(&v, 1, ReduceOp::kSum);
      const double el = seconds_since(interval_t0);
      // NaN (null in the record) when every step since the last record was skipped.
      const double mean =
          interval_samples > 0 ? v / static_cast<double>(interval_samples) : std::nan("");
      if (interval_samples > 0) final_loss = mean;
      if (lead && (step % cfg.train.log_every == 0 || step == total_steps)) {
        const double sps = el > 0 ? interval_samples / el : 0.0;
        metrics->write_line(
            nlohmann::json({{"kind", "train"},
                            {"step", step},
                            {"epoch", epoch + static_cast<double>(batch) / bpe},
                            {"loss", std::isfinite(mean) ? nlohmann::json(mean) : nlohmann::json()},
                            {"lr", lr},
                            {"samples_per_s", sps},
                            {"comm_bytes_sent", comm.bytes_sent() - sent0},
                            {"comm_bytes_recv", comm.bytes_recv() - recv0},
                            {"comm_s", comm_seconds() - comm_s0},
                            {"compute_s", train_s - exposed_comm_s},
                            {"exposed_comm_s", exposed_comm_s},
                            {"idle_s", idle_s}})
                .dump());
        spdlog::info("step {} loss {:.4f} lr {:.4g} {:.0f} samples/s", step, mean, lr, sps);
      }
      interval_loss = 0.0;
      interval_samples = 0;
      interval_t0 = Clock::now();
    }
    if (epoch_done || (cfg.train.eval_every > 0 && step % cfg.train.eval_every == 0))
      eval_due = true;
    if (eval_due) {
      run_eval();
      eval_due = false;
    }
    if (cfg.train.checkpoint.every_steps > 0 && step % cfg.train.checkpoint.every_steps == 0)
      save();
    stop_vote.begin_step();
    if ((stop_signal = stop_vote.end_step()) != 0) {
      if (lead)
        spdlog::warn("{}: stopping after step {}, then writing a checkpoint (again: stop at once)",
                     interrupt_signal_name(stop_signal), step);
      break;
    }
  }
  const bool interrupted = stop_signal != 0;
  if (last_eval_step != step && !interrupted) run_eval();  // an interrupt wants out quickly
  if (last_ckpt_step != step) save();

  // Per-stage figures, gathered to rank 0 (replica 0's stages).
  const double bubble = schedule_s > 0 ? std::max(0.0, 1.0 - compute_s / schedule_s) : 0.0;
  // Seconds as floats; byte counts as int64 (a float holds integers exactly only to 2^24).
  std::vector<float> mine = {static_cast<float>(compute_s), static_cast<float>(idle_s),
                             static_cast<float>(bubble)};
  std::vector<int64_t> mine_i = {static_cast<int64_t>(comm.bytes_sent() - sent0),
                                 static_cast<int64_t>(peak_stored)};
  std::vector<float> all(mine.size() * static_cast<size_t>(world));
  std::vector<int64_t> all_i(mine_i.size() * static_cast<size_t>(world));
  comm.allgather(mine.data(), all.data(),
                 std::vector<size_t>(static_cast<size_t>(world), mine.size()));
  comm.allgather(mine_i.data(), all_i.data(),
                 std::vector<size_t>(static_cast<size_t>(world), mine_i.size()));
  spdlog::info(
      "rank {} (stage {}, replica {}): compute {:.2f} s, idle {:.2f} s, bubble {:.3f}, "
      "peak stored activations {:.2f} MiB, {} parameters",
      rank, stage, replica, compute_s, idle_s, bubble, peak_stored / 1048576.0, n);
  nlohmann::json stages = nlohmann::json::array();
  for (int s = 0; s < S; ++s) {
    const float* v = all.data() + mine.size() * static_cast<size_t>(s);
    const int64_t* vi = all_i.data() + mine_i.size() * static_cast<size_t>(s);
    stages.push_back({{"stage", s},
                      {"compute_s", v[0]},
                      {"idle_s", v[1]},
                      {"bubble_fraction", v[2]},
                      {"bytes_sent", vi[0]},
                      {"peak_activation_bytes", vi[1]}});
  }
  nlohmann::json summary = interrupt_summary(stop_signal);
  summary.update({
      {"steps", step},
      {"epochs", epoch + static_cast<double>(batch) / bpe},
      {"world_size", world},
      {"strategy", "pipeline"},
      {"backend", comm.backend()},
      {"final_train_loss",
       std::isfinite(final_loss) ? nlohmann::json(final_loss) : nlohmann::json()},
      {"test_loss", have_eval ? nlohmann::json(last_eval.loss) : nlohmann::json()},
      {"test_accuracy", have_eval ? nlohmann::json(last_eval.accuracy) : nlohmann::json()},
      {"wall_s", seconds_since(t_start)},
      {"train_s", train_s},
      {"train_samples_per_s", train_s > 0 ? samples_trained / train_s : 0.0},
      {"peak_rss_mb", peak_rss_mb()},
      {"comm_bytes_sent", comm.bytes_sent() - sent0},
      {"comm_bytes_recv", comm.bytes_recv() - recv0},
      {"comm_s", comm_seconds() - comm_s0},
      {"compute_s", train_s - exposed_comm_s},
      {"exposed_comm_s", exposed_comm_s},
      {"skipped_steps", skipped_steps},
      // Not tracked for pipelines: stages do different work by design (their compute and idle
      // time are in `stages`), and the other replicas wait for a slow one in the replica
      // all-reduce (their exposed_comm_s).
      {"straggler_warnings", 0},
      {"config_hash", hash},
      {"param_count", P},
      {"steps_this_run", step - first_step},
      {"resumed_from", resumed_from.empty() ? nlohmann::json() : nlohmann::json(resumed_from)},
      {"checkpoint", (fs::path(ckpt_dir) / sharded_checkpoint_name(step)).string()},
      // Rank 0's training state: its stage's parameters, gradients and optimizer state (no
      // gathered parameters or unit gradient buffers: those are the sharded strategies').
      {"param_bytes", n * 4},
      {"grad_bytes", n * 4},
      {"optim_bytes", opt->state_bytes()},
      {"peak_gathered_bytes", 0},
      {"peak_unit_grad_bytes", 0},
      {"stages", stages},
  });
  if (lead) {
    write_file_atomic((fs::path(opts.out_dir) / "summary.json").string(), summary.dump(2) + "\n");
    spdlog::debug("done: {} steps, test_accuracy {}, {:.1f} s, results in {}", step,
                  have_eval ? fmt::format("{:.4f}", last_eval.accuracy) : std::string("n/a"),
                  seconds_since(t_start), opts.out_dir);
  }
  return summary;
}

}  // namespace dtrain
