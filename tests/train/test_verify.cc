// dtrain verify's library: the single-process reference derived from a layout, the comparison
// of states and updates, and whole verifications on small synthetic problems -- exact layouts
// pass, a gradient doubled on one rank fails at exactly the faulty step, lossy layouts are
// reported as diverging by design.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "checkpoint/compare.h"
#include "test_util.h"
#include "train/verify.h"

using namespace dtrain;
using dtrain::testing::TempDir;

namespace {

// Synthetic clusters, smooth activations (no kinks for summation order to flip), SGD with
// momentum (principle 10), a small bucket so ddp really overlaps buckets.
const char* kLayout = R"(seed: 3
model: {hidden: [24, 16], activation: tanh}
data:
  format: synthetic
  synthetic: {samples: 600, features: 10, classes: 4}
  batch_size: 16
optimizer: {type: sgd, lr: 0.05, momentum: 0.9, scale_lr: linear}
train: {epochs: 2}
distributed: {world_size: 2, strategy: ddp, ddp: {bucket_mb: 0.001}}
runtime: {threads: 1}
)";

VerifyReport verify(const TempDir& t, const std::vector<std::string>& sets, int64_t steps = 4,
                    std::vector<Fault> faults = {}) {
  VerifyOptions o;
  o.config_path = t.write("layout.yaml", kLayout);
  o.sets = sets;
  o.steps = steps;
  o.faults = std::move(faults);
  return run_verify(o);
}

NamedTensor t1(std::vector<float> v) {
  const auto n = static_cast<int64_t>(v.size());
  return NamedTensor{{n}, std::move(v)};
}

}  // namespace

TEST_CASE("verify: the reference has one rank, the global batch and the scaled learning rate") {
  TempDir t;
  const std::string path = t.write("layout.yaml", kLayout);
  {
    const ReferencePlan p = plan_reference(
        load_config(path, {"distributed.world_size=4", "distributed.strategy=fsdp"}));
    CHECK(p.replicas == 4);
    CHECK(p.exact);
    CHECK(p.teacher_forcing);
    CHECK(p.reference.distributed.world_size == 1);
    CHECK(p.reference.distributed.strategy == StrategyKind::kDdp);
    CHECK(p.reference.data.batch_size == 64);
    CHECK(p.reference.optimizer.lr == doctest::Approx(0.2));
    CHECK(p.reference.optimizer.scale_lr == ScaleLr::kNone);
  }
  {  // pp2 x dp2: two replicas of 16, accumulation kept
    const ReferencePlan p = plan_reference(
        load_config(path, {"distributed.world_size=4", "distributed.pipeline.stages=2",
                           "train.grad_accum_steps=2", "optimizer.scale_lr=none"}));
    CHECK(p.replicas == 2);
    CHECK(p.reference.data.batch_size == 32);
    CHECK(p.reference.train.grad_accum_steps == 2);
    CHECK(p.reference.distributed.pipeline.stages == 1);
    CHECK(p.reference.optimizer.lr == doctest::Approx(0.05));
  }
  {  // Local SGD H = 8: free running only, steps in whole rounds, diverging by design
    const ReferencePlan p = plan_reference(load_config(
        path, {"distributed.strategy=local_sgd", "distributed.local_sgd.sync_every=8"}));
    CHECK_FALSE(p.exact);
    CHECK_FALSE(p.teacher_forcing);
    CHECK(p.step_multiple == 8);
    CHECK(p.divergence.find("H = 8") != std::string::npos);
  }
  {  // H = 1 with SGD is DDP's update; with Adam it is not
    CHECK(plan_reference(load_config(path, {"distributed.strategy=local_sgd",
                                            "distributed.local_sgd.sync_every=1"}))
              .exact);
    const ReferencePlan p = plan_reference(
        load_config(path, {"distributed.strategy=local_sgd", "distributed.local_sgd.sync_every=1",
                           "optimizer.type=adam", "optimizer.momentum=0"}));
    CHECK_FALSE(p.exact);
    CHECK(p.divergence.find("not linear") != std::string::npos);
  }
  {  // H = 1 with SGD momentum: each replica keeps its own momentum, so parameters only, unless
     // the state is averaged too (or there is none)
    CHECK(plan_reference(load_config(path, {"distributed.strategy=local_sgd",
                                            "distributed.local_sgd.sync_every=1"}))
              .unchecked_state.find("parameters are compared") != std::string::npos);
    for (const char* s :
         {"distributed.local_sgd.sync_optimizer_state=true", "optimizer.momentum=0"})
      CHECK(plan_reference(load_config(path, {"distributed.strategy=local_sgd",
                                              "distributed.local_sgd.sync_every=1", s}))
                .unchecked_state.empty());
  }
  {
    const ReferencePlan p =
        plan_reference(load_config(path, {"distributed.compression.type=topk"}));
    CHECK_FALSE(p.exact);
    CHECK(p.reference.distributed.compression.type == CompressionType::kNone);
    CHECK(p.divergence.find("cost of compression") != std::string::npos);
  }
  {  // Local SGD on one replica never synchronises, so its compression is never applied
    const ReferencePlan p = plan_reference(
        load_config(path, {"distributed.world_size=1", "distributed.strategy=local_sgd",
                           "distributed.compression.type=int8"}));
    CHECK(p.exact);
    CHECK(p.divergence.empty());
  }
}

TEST_CASE("verify: tensor and update differences are relative to the reference's scale") {
  TensorMap from{{"w", t1({1.0f, 2.0f, 3.0f})}};
  TensorMap want{{"w", t1({1.1f, 2.0f, 2.8f})}, {"optim.momentum.w", t1({0.5f, 0.0f, -1.0f})}};
  TensorMap got = want;
  got["w"].data[2] = 2.7f;  // update -0.3 where -0.2 was due: 0.1 off a largest update of 0.2
  const auto u = update_diffs(from, want, got);
  REQUIRE(u.size() == 2);
  const TensorDiff& w = u[1].name == "w" ? u[1] : u[0];
  CHECK(w.max_rel == doctest::Approx(0.5).epsilon(1e-5));
  CHECK(w.rel == doctest::Approx(0.1 / std::sqrt(0.05)).epsilon(1e-5));
  CHECK(w.index == 2);
  CHECK(format_index({3}, w.index) == "[2]");
  CHECK(worst(u).name == "w");
  // The optimizer state absent from `from` starts at zero: exact here.
  CHECK((u[0].name == "optim.momentum.w" ? u[0] : u[1]).rel == 0.0);
  const auto d = tensor_diffs(want, got);
  CHECK(worst(d).max_rel == doctest::Approx(0.1 / 2.8).epsilon(1e-5));
  CHECK(worst(d).rel == doctest::Approx(0.1 / std::sqrt(1.21 + 4.0 + 7.84)).epsilon(1e-5));
  got["w"].data[0] = NAN;
  CHECK(std::isinf(worst(tensor_diffs(want, got)).rel));
  CHECK(format_index({2, 3, 4}, 23) == "[1, 2, 3]");
  got.erase("w");
  CHECK_THROWS_WITH_AS(tensor_diffs(want, got), doctest::Contains("'w' is missing"), UserError);
}

TEST_CASE("verify: a tensor whose reference update is rounding noise is measured against a floor") {
  // "b" learns nothing (its true update is 0: a conv bias under a layer_norm), so both updates
  // are float32 noise, 1e-9 against the 1e-2 updates of its kind's other tensor.
  TensorMap from{{"w", t1({1.0f, 2.0f, 3.0f, 4.0f})}, {"b", t1({0.0f, 0.0f})}};
  TensorMap want{{"w", t1({1.01f, 1.99f, 3.01f, 3.99f})}, {"b", t1({2e-9f, -1e-9f})}};
  TensorMap got = want;
  got["b"].data[0] = 4e-9f;
  const auto noise = update_diffs(from, want, got);
  const TensorDiff& b = noise[0].name == "b" ? noise[0] : noise[1];
  CHECK(b.rel < 1e-4);  // noise over its own size would be ~1
  // A real error in it -- an update of the kind's size where none is due -- stands out.
  got["b"].data[0] = 1e-2f;
  const auto error = update_diffs(from, want, got);
  CHECK(worst(error).name == "b");
  CHECK(worst(error).rel > 0.5);  // (the tolerance is 1e-4)
  // The floor is per kind: optimizer state is measured against its own kind, not the weights'.
  TensorMap s_want{{"w", t1({1.0f, 2.0f})}, {"optim.m.w", t1({1e-6f, 1e-6f})}};
  TensorMap s_got = s_want;
  s_got["optim.m.w"].data[0] = 2e-6f;
  CHECK(worst(tensor_diffs(s_want, s_got)).rel > 0.5);
}

TEST_CASE(
    "verify: ddp, zero2, fsdp and pp2 x dp2 fsdp pass, and a doubled gradient fails at its step") {
  spdlog::set_level(spdlog::level::warn);
  TempDir t;
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{},
        {"distributed.strategy=zero2", "distributed.world_size=3"},
        {"distributed.strategy=fsdp"},
        {"distributed.strategy=fsdp", "distributed.world_size=4", "distributed.pipeline.stages=2",
         "data.batch_size=8"}}) {
    const VerifyReport r = verify(t, sets);
    CAPTURE(report_text(r));
    CHECK(r.verdict == "pass");
    REQUIRE(r.forced.size() == 4);
    for (const ForcedStep& f : r.forced) {
      CHECK(f.worst.rel < 1e-5);
      CHECK(f.loss_layout == doctest::Approx(f.loss_reference).epsilon(1e-5));
    }
    CHECK(worst(r.end_state).rel < 1e-5);
  }
  // Rank 1's gradient doubled at step 3 only: steps 1-2 agree, step 3 is named, and step 4
  // (from the reference's own state again) agrees: teacher forcing isolates the faulty step.
  Fault f;
  f.kind = "grad_scale";
  f.rank = 1;
  f.step = 3;
  const VerifyReport r = verify(t, {"distributed.strategy=zero2"}, 4, {f});
  CAPTURE(report_text(r));
  CHECK(r.verdict == "fail");
  CHECK(r.first_bad_step == 3);
  CHECK(r.forced[0].worst.rel < 1e-5);
  CHECK(r.forced[1].worst.rel < 1e-5);
  CHECK(r.forced[2].worst.rel > 1e-2);
  CHECK(r.forced[3].worst.rel < 1e-5);
  CHECK(worst(r.end_state).rel > 1e-4);  // the free run carries the fault on
  CHECK(report_text(r).find("FAIL at step 3") != std::string::npos);
}

TEST_CASE("verify: Local SGD H = 1 with per-replica momentum passes on its parameters") {
  spdlog::set_level(spdlog::level::warn);
  TempDir t;
  const VerifyReport r =
      verify(t, {"distributed.strategy=local_sgd", "distributed.local_sgd.sync_every=1"});
  CAPTURE(report_text(r));
  CHECK(r.verdict == "pass");
  for (const TensorDiff& d : r.end_state) CHECK(d.name.rfind("optim.", 0) != 0);
  CHECK(report_text(r).find("compared:   Local SGD keeps each replica's momentum") !=
        std::string::npos);
}

TEST_CASE("verify: tensor parallelism is verified against one process without it") {
  spdlog::set_level(spdlog::level::warn);
  TempDir t;
  std::string text;
  for (int i = 0; i < 60; ++i)
    text += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\n";
  const std::string data = t.write("text.txt", text);
  VerifyOptions o;
  o.config_path = t.write("gpt.yaml", R"(seed: 5
model: {type: gpt, n_layer: 1, n_head: 2, n_embd: 16, block_size: 16}
data: {format: text, train: {path: )" + data +
                                          R"(}, batch_size: 4}
optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
train: {epochs: 10}
distributed: {world_size: 4, strategy: zero2, tensor_parallel: {size: 2}}
runtime: {threads: 1}
)");
  o.steps = 3;
  {
    const ReferencePlan p = plan_reference(load_config(o.config_path, {}));
    CHECK(p.replicas == 2);
    CHECK(p.reference.distributed.tensor_parallel.size == 1);
    CHECK(p.reference.data.batch_size == 8);
    CHECK(p.layout_text.find("tensor-parallel size 2") != std::string::npos);
  }
  const VerifyReport r = run_verify(o);
  CAPTURE(report_text(r));
  CHECK(r.verdict == "pass");
  REQUIRE(r.forced.size() == 3);
  for (const ForcedStep& f : r.forced) CHECK(f.worst.rel < 1e-4);
  // A tensor-parallel size that leaves no whole replica is named as such.
  o.sets = {"distributed.world_size=6", "distributed.pipeline.stages=2"};
  CHECK_THROWS_AS(run_verify(o), UserError);
}

TEST_CASE("verify: top-k compression and Local SGD H = 8 diverge as expected, not as bugs") {
  spdlog::set_level(spdlog::level::warn);
  TempDir t;
  const VerifyReport topk =
      verify(t, {"distributed.compression.type=topk", "distributed.compression.ratio=0.05"});
  CAPTURE(report_text(topk));
  CHECK(topk.verdict == "diverges as expected");
  CHECK(topk.forced.size() == 4);
  CHECK(topk.forced[0].worst.rel > 1e-3);  // really compressed
  CHECK(report_text(topk).find("cost of compression") != std::string::npos);
  const VerifyReport lsgd =
      verify(t, {"distributed.strategy=local_sgd", "distributed.local_sgd.sync_every=8"}, 5);
  CAPTURE(report_text(lsgd));
  CHECK(lsgd.verdict == "diverges as expected");
  CHECK(lsgd.steps == 8);  // rounded up to a whole round
  CHECK(lsgd.forced.empty());
  CHECK(worst(lsgd.end_state).rel > 1e-4);
  // H = 1 with clipping: each replica clips its own gradient, which is not linear in it.
  const VerifyReport clipped =
      verify(t, {"distributed.strategy=local_sgd", "distributed.local_sgd.sync_every=1",
                 "optimizer.clip_grad_norm=0.05"});
  CAPTURE(report_text(clipped));
  CHECK(clipped.verdict == "diverges as expected");
  CHECK(report_text(clipped).find("clips each replica's own gradient") !=
        std::string::npos);  // DiLoCo at H = 1: its outer momentum is state one process has not, so
                             // the layout runs free
  // (it resumed from the reference's checkpoints, which hold none: exit 2 naming a temp file).
  const VerifyReport diloco =
      verify(t, {"distributed.strategy=local_sgd", "distributed.local_sgd.sync_every=1",
                 "distributed.local_sgd.outer_lr=0.7"});
  CAPTURE(report_text(diloco));
  CHECK(diloco.verdict == "diverges as expected");
  CHECK(report_text(diloco).find("DiLoCo") != std::string::npos);
  CHECK(report_text(diloco).find("teacher forcing: skipped (DiLoCo's outer momentum") !=
        std::string::npos);
  CHECK(report_text(lsgd).find("teacher forcing: skipped (Local SGD's replicas hold") !=
        std::string::npos);
}

TEST_CASE("verify: Local SGD with one replica per stage is one process, even with H = 8") {
  const Config c = parse_config(R"(
model: {hidden: [8, 8]}
data: {format: synthetic}
distributed: {world_size: 2, strategy: local_sgd, local_sgd: {sync_every: 8},
              pipeline: {stages: 2}}
)",
                                "p.yaml");
  const ReferencePlan p = plan_reference(c);
  CHECK(p.replicas == 1);
  CHECK(p.exact);
  CHECK(p.teacher_forcing);
  CHECK(p.divergence.empty());
  // The plan alone passed; the run was refused: the every-step checkpoints verify sets are not a
  // multiple of H = 8 (blaming "--set train.checkpoint.every_steps=1", which no user gave).
  CHECK(p.layout_sets == std::vector<std::string>{"distributed.local_sgd.sync_every=1"});
  spdlog::set_level(spdlog::level::warn);
  TempDir t;
  for (const std::string w : {"1", "2"}) {          // one process, and 2 stages of one replica
    for (const std::string outer : {"0", "0.7"}) {  // DiLoCo's outer step never runs either
      CAPTURE(w);
      CAPTURE(outer);
      std::vector<std::string> sets = {
          "distributed.world_size=" + w, "distributed.pipeline.stages=" + w,
          "distributed.strategy=local_sgd", "distributed.local_sgd.sync_every=8",
          "distributed.local_sgd.outer_lr=" + outer};
      // A momentum of its own, which needs an outer optimizer (the layout drops both).
      if (outer != "0") sets.push_back("distributed.local_sgd.outer_momentum=0.8");
      CHECK(verify(t, sets).verdict == "pass");
    }
  }
  spdlog::set_level(spdlog::level::info);
}

namespace {

// Whether the end state drifted past the tolerance, so that verify measured one process's own
// drift; when it did not (the BLAS kernels' summation order decides), that was not measured.
bool drift_was_measured(const VerifyReport& r) {
  if (worst(r.end_state).rel > r.tolerance) return true;
  MESSAGE("no drift with these kernels: the drift comparison was not needed");
  CHECK(r.noise_floor == 0.0);
  return false;
}

}  // namespace

TEST_CASE("verify: a deep ReLU net's free-running drift is measured against one process's own") {
  spdlog::set_level(spdlog::level::warn);
  TempDir t;
  // 15 ReLU layers of 256 on 2 pipeline stages: every step agrees from the same state, but over
  // 8 free-running steps float32 rounding is amplified by flipping kinks (principle 10), here
  // to ~1e-2 -- as far as one process drifts from itself with each batch summed in two halves.
  VerifyOptions o;
  o.config_path = t.write("deep.yaml", R"(seed: 1
model: {hidden: [256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256]}
data:
  format: synthetic
  synthetic: {samples: 2048, features: 256, classes: 10, noise: 1.0}
  batch_size: 256
optimizer: {type: sgd, lr: 0.01, momentum: 0.9}
train: {epochs: 0, max_steps: 30}
distributed: {world_size: 2, strategy: pipeline, pipeline: {stages: 2, micro_batches: 4}}
runtime: {threads: 1}
)");
  o.steps = 8;
  const VerifyReport r = run_verify(o);
  CAPTURE(report_text(r));
  for (const ForcedStep& f : r.forced) CHECK(f.worst.rel < 1e-4);
  CHECK(r.verdict == "pass");
  // How far rounding is amplified depends on the BLAS kernels' summation order: measured 2.3e-2
  // (end state) and 2.3e-2 (one process against itself) with OpenBLAS's SkylakeX kernels.
  if (!drift_was_measured(r)) return;
  CHECK(r.noise_floor > 1e-4);
  CHECK(worst(r.end_state).rel <= kDriftFactor * r.noise_floor);
  CHECK(report_text(r).find("one process against itself") != std::string::npos);
}

TEST_CASE("verify: an odd global batch measures the drift in its smallest prime factor of parts") {
  spdlog::set_level(spdlog::level::warn);
  TempDir t;
  // 3 replicas x 5 rows: the reference's batch of 15 is summed in 3 parts of 5 (it was skipped
  // as "odd", and a drift of 1.2e-3 over 30 steps was failed against the bare tolerance).
  VerifyOptions o;
  o.config_path = t.write("deep.yaml", R"(seed: 3
model: {type: mlp, hidden: [64, 64, 64, 64, 64, 64], activation: relu}
data:
  format: synthetic
  synthetic: {samples: 3000, features: 16, classes: 4, noise: 3.0}
  batch_size: 5
optimizer: {type: sgd, lr: 0.25, momentum: 0.9}
train: {epochs: 1, log_every: 2}
distributed: {backend: inproc, world_size: 3, strategy: ddp}
runtime: {threads: 1}
)");
  o.steps = 30;
  const VerifyReport r = run_verify(o);
  CAPTURE(report_text(r));
  for (const ForcedStep& f : r.forced) CHECK(f.worst.rel < 1e-4);
  CHECK(r.verdict == "pass");
  if (!drift_was_measured(r)) return;
  CHECK(r.noise_parts == 3);
  CHECK(r.noise_floor > 0.0);
  CHECK(report_text(r).find("summed in 3 parts") != std::string::npos);
  CHECK(report_json(r)["noise_parts"] == 3);
  spdlog::set_level(spdlog::level::info);
}

TEST_CASE("verify: a fault on a rank the layout has not is refused, not a drill that passes") {
  TempDir t;
  Fault f;
  f.kind = "grad_scale";
  f.rank = 7;  // the layout has 2 ranks
  f.step = 2;
  CHECK_THROWS_WITH_AS(verify(t, {}, 2, {f}), doctest::Contains("names rank 7, but the run has 2"),
                       UserError);
}
