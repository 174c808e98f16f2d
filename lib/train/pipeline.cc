#include "train/pipeline.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include <spdlog/spdlog.h>

#include "train/batch.h"
#include "train/min_max_split.h"
#include "util/check.h"
#include "util/duration.h"

namespace dtrain {

using Clock = std::chrono::steady_clock;

namespace {

// Point-to-point tags between neighbouring stages (messages with one tag arrive in order).
constexpr uint64_t kTagActivation = 1;
constexpr uint64_t kTagGradient = 2;

// Estimated forward multiply-adds per sample of layers [first, last), as each layer counts them:
// a convolution's at every output position, a Linear's at every row of a sample (a GPT's T
// positions), attention's T^2 C. (Parameters plus outputs, counted before, made a stack of
// 3x3 convolutions on 28x28 inputs look 800 times cheaper than it is: one stage got it all.)
double block_cost(const Model& m, size_t first, size_t last) {
  double c = 0;
  for (size_t i = first; i < last; ++i) c += m.layer(i).flops_per_sample();
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

double stage_cost(const Model& m, size_t first, size_t last) {
  return block_cost(m, first, last);
}

std::vector<LayerRange> partition_stages(const Model& m, int stages, PipelinePartition how) {
  FsdpConfig one;  // one block per layer with parameters, followers attached
  const std::vector<LayerRange> blocks = units_for_fsdp(m, one);
  const int B = static_cast<int>(blocks.size());
  DT_CHECK_GE(stages, 1);
  // The config's validation counts an mlp's layers; other model types are known only here.
  if (stages > B)
    throw UserError("distributed.pipeline.stages: the model has " + std::to_string(B) +
                    " layer(s) with parameters, fewer than " + std::to_string(stages) + " stages");
  std::vector<int> cut;  // first block of each stage
  if (how == PipelinePartition::kUniform) {
    int b = 0;
    for (int s = 0; s < stages; ++s) {
      cut.push_back(b);
      b += B / stages + (s < B % stages ? 1 : 0);
    }
  } else {
    DT_CHECK_MSG(how == PipelinePartition::kBalanced, "unknown partition " << to_string(how));
    // Minimise the largest stage cost over contiguous splits.
    std::vector<double> cost(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b)
      cost[static_cast<size_t>(b)] = block_cost(m, blocks[static_cast<size_t>(b)].first,
                                                blocks[static_cast<size_t>(b)].second);
    cut = min_max_split(cost, stages);
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

namespace {

class PipelineStage final : public Executor {
 public:
  PipelineStage(const Config& cfg, const Model& model, const Dataset& train, Strategy& s, Rng& rng,
                Tracer& tracer, Communicator& world, const GridLayout& grid,
                const std::vector<LayerRange>& plan)
      : pc_(cfg.distributed.pipeline),
        loss_(cfg.model.loss),
        train_(train),
        s_(s),
        rng_(rng),
        tracer_(tracer),
        world_(world),
        S_(grid.pp()),
        stage_(grid.coord(world.rank()).pp),
        first_(stage_ == 0),
        last_(stage_ == grid.pp() - 1) {
    const GridCoord c = grid.coord(world.rank());
    if (!first_) prev_ = grid.rank_of({c.tp, c.dp, c.pp - 1});
    if (!last_) next_ = grid.rank_of({c.tp, c.dp, c.pp + 1});
    const auto [f, l] = plan[static_cast<size_t>(stage_)];
    in_width_ = first_ ? train.input_features() : model.layer(f - 1).out_features();
    out_width_ = model.layer(l - 1).out_features();
    for (int st = 0; st < S_; ++st) replica0_.push_back(grid.rank_of({0, 0, st}));
  }

  double run_step(const StepWork& w) override {
    const double idle0 = idle_s_;
    loss_sum_ = 0.0;
    const auto& batches = *w.batches;
    mask_key_ = w.mask_key;
    DT_CHECK(w.fewest_rows != nullptr && w.fewest_rows->size() == batches.size());
    for (size_t i = 0; i < batches.size(); ++i)
      run_schedule(batches[i], (*w.fewest_rows)[i], w.scale, i + 1 == batches.size(), w.poison);
    step_idle_ = idle_s_ - idle0;
    return loss_sum_;
  }
  std::pair<double, int64_t> evaluate(const Dataset& d, int64_t batch, int dp, int DP) override;
  bool computes_loss() const override { return last_; }
  double wait_seconds() const override { return idle_s_; }
  int64_t peak_activation_bytes() const override { return peak_stored_; }
  double recv_seconds() const override { return idle_s_ + eval_recv_s_; }
  nlohmann::json summary(Communicator& world) override;

 private:
  void recv_tensor(int src, uint64_t tag, Tensor& t, int64_t rows, int64_t width, double* clock) {
    t.resize({rows, width});
    TraceScope ts(tracer_, "recv wait", "wait");
    const auto t0 = Clock::now();
    world_.recv(src, tag, t.data(), static_cast<size_t>(rows * width));
    *clock += seconds_since(t0);
  }
  std::unique_ptr<Activations> acquire() {
    if (pool_.empty()) return std::make_unique<Activations>();
    auto a = std::move(pool_.back());
    pool_.pop_back();
    return a;
  }
  void forward(Micro& mb, float scale);
  void backward(Micro& mb, bool last, bool poison);
  void run_schedule(const std::vector<int64_t>& idx, int64_t fewest_rows, float scale,
                    bool last_of_step, bool poison);

  const PipelineConfig pc_;
  const Loss loss_;
  const Dataset& train_;
  Strategy& s_;
  Rng& rng_;
  Tracer& tracer_;
  Communicator& world_;
  const int S_, stage_;
  const bool first_, last_;
  int prev_ = -1, next_ = -1;
  int64_t in_width_ = 0, out_width_ = 0;
  std::vector<int> replica0_;                       // world rank of each stage of replica 0
  std::vector<std::unique_ptr<Activations>> pool_;  // released activation sets, reused
  std::vector<Micro> micro_;
  Tensor dx_, dy_recv_;
  std::vector<int32_t> yb_;
  double compute_s_ = 0.0, idle_s_ = 0.0, schedule_s_ = 0.0, eval_recv_s_ = 0.0, step_idle_ = 0.0;
  int64_t stored_now_ = 0, peak_stored_ = 0;
  double loss_sum_ = 0.0;  // last stage: over this step's micro-batches
  uint64_t mask_key_ = 0;  // this step's dropout key (StepWork::mask_key)
};

void PipelineStage::forward(Micro& mb, float scale) {
  const int64_t rows = static_cast<int64_t>(mb.idx.size());
  if (first_) {
    gather_inputs(train_, mb.idx, mb.input);
  } else {
    recv_tensor(prev_, kTagActivation, mb.input, rows, in_width_, &idle_s_);
  }
  TraceScope ts(tracer_, "forward", "compute");
  const auto t0 = Clock::now();
  mb.rng_state = rng_.state();
  mb.acts = acquire();
  ForwardCtx ctx{.training = true,
                 .rng = &rng_,
                 .rows = mb.idx.data(),
                 .mask_key = mask_key_,
                 .tensor = tensor_};
  const Tensor& out = s_.forward(mb.input, *mb.acts, ctx);
  if (last_) {
    gather_targets(train_, mb.idx, mb.labels);
    loss_sum_ += loss_and_grad(loss_, out, mb.labels.data(), &mb.dy, scale);
  }
  compute_s_ += seconds_since(t0);
  if (!last_) world_.send(next_, kTagActivation, out.data(), static_cast<size_t>(out.numel()));
  mb.stored_bytes = tensor_bytes(mb.input) + tensor_bytes(mb.dy);
  if (pc_.activation_checkpointing) {
    pool_.push_back(std::move(mb.acts));  // keep the input only; recompute in backward
  } else {
    mb.stored_bytes += mb.acts->bytes();
  }
  stored_now_ += mb.stored_bytes;
  peak_stored_ = std::max(peak_stored_, stored_now_);
}

void PipelineStage::backward(Micro& mb, bool last, bool poison) {
  const int64_t rows = static_cast<int64_t>(mb.idx.size());
  Tensor* dy = &mb.dy;
  if (!last_) {
    recv_tensor(next_, kTagGradient, dy_recv_, rows, out_width_, &idle_s_);
    dy = &dy_recv_;
  }
  // DTRAIN_FAULT: NaNs enter this stage's gradient (all of dy: a ReLU at the stage's end would
  // drop a single one where it is inactive).
  if (last && poison) std::fill(dy->data(), dy->data() + dy->numel(), std::nanf(""));
  TraceScope ts(tracer_, "backward", "compute");
  const auto t0 = Clock::now();
  if (!mb.acts) {  // recompute the forward with the same dropout stream
    Rng replay;
    replay.set_state(mb.rng_state);
    ForwardCtx rctx{.training = true,
                    .rng = &replay,
                    .rows = mb.idx.data(),
                    .mask_key = mask_key_,
                    .tensor = tensor_};
    mb.acts = acquire();
    s_.forward(mb.input, *mb.acts, rctx);
    peak_stored_ = std::max(peak_stored_, stored_now_ + mb.acts->bytes());
  }
  s_.backward(mb.input, *mb.acts, *dy, first_ ? nullptr : &dx_, last);
  compute_s_ += seconds_since(t0);
  if (!first_) world_.send(prev_, kTagGradient, dx_.data(), static_cast<size_t>(dx_.numel()));
  pool_.push_back(std::move(mb.acts));
  stored_now_ -= mb.stored_bytes;
}

void PipelineStage::run_schedule(const std::vector<int64_t>& idx, int64_t fewest_rows, float scale,
                                 bool last_of_step, bool poison) {
  const int64_t rows = static_cast<int64_t>(idx.size());
  // As many micro-batches on every replica of the data axis -- cut by the fewest rows a replica
  // holds, not this one's (a short batch splits 5/4) -- since zero2 and fsdp run collectives per
  // micro-batch; at least one, empty when a replica has no rows, so the strategy's collectives
  // (ddp's buckets, fsdp's gathers) run on every rank of the axis alike.
  DT_CHECK_LE(fewest_rows, rows);
  const int64_t M = std::max<int64_t>(1, std::min<int64_t>(pc_.micro_batches, fewest_rows));
  micro_.resize(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) {
    const int64_t lo = rows * m / M, hi = rows * (m + 1) / M;
    micro_[static_cast<size_t>(m)].idx.assign(idx.begin() + lo, idx.begin() + hi);
    micro_[static_cast<size_t>(m)].dy = Tensor();
  }
  auto bwd = [&](int64_t m) {
    backward(micro_[static_cast<size_t>(m)], last_of_step && m == M - 1, poison);
  };
  const auto t0 = Clock::now();
  if (pc_.schedule == PipelineSchedule::kGpipe) {
    for (int64_t m = 0; m < M; ++m) forward(micro_[static_cast<size_t>(m)], scale);
    for (int64_t m = 0; m < M; ++m) bwd(m);
  } else {
    const int64_t warmup = std::min<int64_t>(S_ - 1 - stage_, M);
    int64_t fw = 0, bw = 0;
    for (; fw < warmup; ++fw) forward(micro_[static_cast<size_t>(fw)], scale);
    while (fw < M) {
      forward(micro_[static_cast<size_t>(fw++)], scale);
      bwd(bw++);
    }
    while (bw < M) bwd(bw++);
  }
  schedule_s_ += seconds_since(t0);
}

std::pair<double, int64_t> PipelineStage::evaluate(const Dataset& d, int64_t batch, int dp,
                                                   int DP) {
  DT_CHECK_GT(batch, 0);
  const int64_t nt = d.rows;
  const auto [lo, hi, max_batches] = eval_share(nt, batch, dp, DP);
  Activations acts;
  ForwardCtx ctx{.training = false, .rng = nullptr, .tensor = tensor_};
  std::vector<int64_t> idx;
  Tensor in;
  double ls = 0.0;
  int64_t correct = 0;
  for (int64_t j = 0; j < max_batches; ++j) {
    const int64_t start = lo + j * batch;
    if (start >= hi) {  // the other replicas still evaluate: join the strategy's collectives
      s_.forward_without_data();
      continue;
    }
    const int64_t rows = std::min(batch, hi - start);
    consecutive_rows(start, rows, idx);
    if (first_) {
      gather_inputs(d, idx, in);
    } else {
      recv_tensor(prev_, kTagActivation, in, rows, in_width_, &eval_recv_s_);
    }
    const Tensor& out = s_.forward(in, acts, ctx);
    if (last_) {
      gather_targets(d, idx, yb_);
      ls += loss_and_grad(loss_, out, yb_.data(), nullptr, 1.0f);
      correct += count_correct(out, yb_.data());
    } else {
      world_.send(next_, kTagActivation, out.data(), static_cast<size_t>(out.numel()));
    }
  }
  return {ls, correct};
}

nlohmann::json PipelineStage::summary(Communicator& world) {
  // Per-stage figures of replica 0, gathered over the world.
  const double bubble = schedule_s_ > 0 ? std::max(0.0, 1.0 - compute_s_ / schedule_s_) : 0.0;
  // Seconds as floats; byte counts as int64 (a float holds integers exactly only to 2^24).
  std::vector<float> mine = {static_cast<float>(compute_s_), static_cast<float>(idle_s_),
                             static_cast<float>(bubble)};
  std::vector<int64_t> mine_i = {static_cast<int64_t>(world.bytes_sent()),
                                 static_cast<int64_t>(peak_stored_)};
  const size_t W = static_cast<size_t>(world.size());
  std::vector<float> all(mine.size() * W);
  std::vector<int64_t> all_i(mine_i.size() * W);
  world.allgather(mine.data(), all.data(), std::vector<size_t>(W, mine.size()));
  world.allgather(mine_i.data(), all_i.data(), std::vector<size_t>(W, mine_i.size()));
  nlohmann::json stages = nlohmann::json::array();
  for (int st = 0; st < S_; ++st) {
    const size_t r = static_cast<size_t>(replica0_[static_cast<size_t>(st)]);
    const float* v = all.data() + mine.size() * r;
    const int64_t* vi = all_i.data() + mine_i.size() * r;
    stages.push_back({{"stage", st},
                      {"compute_s", v[0]},
                      {"idle_s", v[1]},
                      {"bubble_fraction", v[2]},
                      {"bytes_sent", vi[0]},
                      {"peak_activation_bytes", vi[1]}});
  }
  spdlog::info(
      "stage {}: compute {:.2f} s, idle {:.2f} s, bubble {:.3f}, peak stored "
      "activations {:.2f} MiB",
      stage_, compute_s_, idle_s_, bubble, peak_stored_ / 1048576.0);
  return {{"stages", stages}};
}

}  // namespace

std::unique_ptr<Executor> make_pipeline_executor(const Config& cfg, const Model& model,
                                                 const Dataset& train, Strategy& strategy, Rng& rng,
                                                 Tracer& tracer, Communicator& world,
                                                 const GridLayout& grid,
                                                 const std::vector<LayerRange>& stages) {
  return std::make_unique<PipelineStage>(cfg, model, train, strategy, rng, tracer, world, grid,
                                         stages);
}

}  // namespace dtrain
