// Layouts of the rank grid: a pipeline's replicas under every data-parallel strategy trains
// what one process trains on the same global batch; a checkpoint saved at one layout resumes
// at another; the per-rank state of pp2 x dp2 fsdp is a quarter of one process's.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint.h"
#include "data/dataset.h"
#include "test_util.h"
#include "train/loop.h"
#include "train/real_data.h"
#include "train/train_test_util.h"
#include "train/trainer.h"

using namespace dtrain;
using dtrain::testing::as_file;
using dtrain::testing::checkpoint_rel_diff;
using dtrain::testing::TempDir;
using dtrain::testing::train_yaml;
using dtrain::testing::write_fmnist_subset;

namespace fs = std::filesystem;

namespace {

// Four Linear layers, tanh (smooth: no kinks that float32-vs-float32 summation order could flip),
// SGD with momentum (principle 10: Adam amplifies summation-order noise).
std::string fmnist_cfg(const std::string& dir) {
  return R"(
seed: 4
model: {hidden: [48, 32, 24], activation: tanh}
data:
  format: idx
  train: {images: )" +
         dir + R"(/images.idx, labels: )" + dir + R"(/labels.idx}
  batch_size: 32
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 0, max_steps: 20, log_every: 10}
distributed: {ddp: {bucket_mb: 0.01}}
runtime: {threads: 1}
)";
}

}  // namespace

TEST_CASE("pipeline stages x data-parallel replicas under every strategy equal one process") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  if (!write_fmnist_subset(dir.path(), 1280)) {
    MESSAGE("Fashion-MNIST not installed; skipped");
    return;
  }
  const std::string cfg = fmnist_cfg(dir.path());
  // One process with the global batch: 2 replicas x 32.
  train_yaml(cfg, dir / "ref", {"data.batch_size=64"});
  const std::string ref = as_file(dir / "ref", 20);
  struct Case {
    std::string strategy;
    int stages, replicas;
  };
  for (const Case& c : {Case{"ddp", 2, 2}, Case{"zero1", 2, 2}, Case{"zero2", 2, 2},
                        Case{"fsdp", 2, 2}, Case{"zero2", 3, 2}, Case{"local_sgd", 2, 2}}) {
    const std::string name = c.strategy + "-pp" + std::to_string(c.stages);
    CAPTURE(name);
    std::vector<std::string> sets = {
        "distributed.strategy=" + c.strategy,
        "distributed.world_size=" + std::to_string(c.stages * c.replicas),
        "distributed.pipeline.stages=" + std::to_string(c.stages),
        "distributed.pipeline.micro_batches=4"};
    // Local SGD with H = 1 and plain averaging averages the parameters after every SGD step:
    // without momentum that is DDP's update.
    if (c.strategy == "local_sgd")
      sets.insert(sets.end(), {"distributed.local_sgd.sync_every=1", "optimizer.momentum=0"});
    const auto s = train_yaml(cfg, dir / name, sets);
    CHECK(s["layout"] == nlohmann::json({{"dp", c.replicas}, {"pp", c.stages}, {"tp", 1}}));
    CHECK(s["stages"].size() == static_cast<size_t>(c.stages));
    std::string against = ref;
    if (c.strategy == "local_sgd") {
      train_yaml(cfg, dir / "ref-nomomentum", {"data.batch_size=64", "optimizer.momentum=0"});
      against = as_file(dir / "ref-nomomentum", 20);
    }
    const double rel = checkpoint_rel_diff(as_file(dir / name, 20), against);
    MESSAGE(name << ": " << rel << " from one process with the global batch");
    CHECK(rel < 1e-5);
  }
}

TEST_CASE(
    "a short batch split unevenly over a pipeline's replicas: as many micro-batches on each") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  // 265 rows, global batch 16: step 17 is the short batch of 9 rows, 5 and 4 on the two
  // replicas. Each cut its micro-batches by its own rows (5 and 4), so zero2's and fsdp's
  // per-micro-batch collectives differed in number: a hang until timeout_s, or mismatched calls.
  const std::string cfg = R"(
seed: 1
model: {hidden: [16, 16], activation: tanh}
data:
  format: synthetic
  synthetic: {samples: 265, features: 10, classes: 3}
  test_fraction: 0
  batch_size: 8
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 0, max_steps: 18}
distributed: {timeout_s: 20}
runtime: {threads: 1}
)";
  train_yaml(cfg, dir / "ref", {"data.batch_size=16"});
  for (const std::string strategy : {"ddp", "zero2", "fsdp"}) {
    CAPTURE(strategy);
    train_yaml(cfg, dir / strategy,
               {"distributed.strategy=" + strategy, "distributed.world_size=4",
                "distributed.pipeline.stages=2", "distributed.pipeline.micro_batches=8"});
    CHECK(checkpoint_rel_diff(as_file(dir / strategy, 18), as_file(dir / "ref", 18)) < 1e-5);
  }
}

TEST_CASE(
    "a checkpoint of one layout resumes at another: pp2 x dp2 fsdp <-> dp4 ddp, 1 rank, "
    "pp2 x dp1") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  // Synthetic data (fast); SGD with momentum, smooth activations: layouts differ only in
  // float32 summation order.
  const std::string cfg = R"(
seed: 11
model: {hidden: [20, 16, 12], activation: tanh}
data:
  format: synthetic
  synthetic: {samples: 800, features: 10, classes: 4}
  batch_size: 8
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 0, max_steps: 16, checkpoint: {every_steps: 8}}
runtime: {threads: 1}
)";
  const std::vector<std::string> pp2dp2 = {"distributed.world_size=4", "data.batch_size=16",
                                           "distributed.strategy=fsdp",
                                           "distributed.pipeline.stages=2"};
  const std::vector<std::string> dp4 = {"distributed.world_size=4"};
  // Global batch 32 in every layout: dp4 4 x 8, pp2 x dp2 two replicas of 16, 1 rank and
  // pp2 x dp1 one of 32.
  const std::vector<std::string> one = {"data.batch_size=32"};
  const std::vector<std::string> pp2dp1 = {"distributed.world_size=2", "data.batch_size=32",
                                           "distributed.pipeline.stages=2"};
  struct Case {
    std::string name;
    std::vector<std::string> from, to;
  };
  const std::vector<Case> cases = {
      {"pp2dp2-fsdp to dp4-ddp", pp2dp2, dp4},   {"pp2dp2-fsdp to 1 rank", pp2dp2, one},
      {"pp2dp2-fsdp to pp2dp1", pp2dp2, pp2dp1}, {"dp4-ddp to pp2dp2-fsdp", dp4, pp2dp2},
      {"1 rank to pp2dp2-fsdp", one, pp2dp2},    {"pp2dp1 to pp2dp2-fsdp", pp2dp1, pp2dp2}};
  int k = 0;
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const std::string tag = std::to_string(k++);
    const std::string a = dir / ("a" + tag), b = dir / ("b" + tag), ac = dir / ("c" + tag);
    // The saving layout trains 8 steps and stops; its step-8 checkpoint is resumed at the other
    // layout for 8 more, and at its own.
    auto from = c.from;
    from.push_back("train.max_steps=8");
    train_yaml(cfg, a, from);
    const auto s = train_yaml(cfg, b, c.to, a + "/checkpoints");
    CHECK(s["steps"] == 16);
    CHECK(s["steps_this_run"] == 8);
    train_yaml(cfg, ac, c.from, a + "/checkpoints");
    const double rel = checkpoint_rel_diff(as_file(b, 16), as_file(ac, 16));
    MESSAGE(c.name << ": " << rel << " from the saving layout's own continuation");
    CHECK(rel < 1e-5);
  }
  // Where two layouts do the same arithmetic -- zero1 shards only the optimizer state of ddp's
  // all-reduced gradients -- the resumed run is bitwise the saving layout's continuation: what
  // one layout wrote is loaded exactly by another.
  train_yaml(cfg, dir / "ddp8", {"distributed.world_size=4", "train.max_steps=8"});
  train_yaml(cfg, dir / "zero1", {"distributed.world_size=4", "distributed.strategy=zero1"},
             dir / "ddp8/checkpoints");
  train_yaml(cfg, dir / "ddp16", {"distributed.world_size=4"}, dir / "ddp8/checkpoints");
  CHECK(checkpoint_rel_diff(as_file(dir / "zero1", 16), as_file(dir / "ddp16", 16)) == 0.0);
}

TEST_CASE(
    "pp2 x dp2 fsdp holds a quarter of one process's parameter, gradient and optimizer "
    "bytes per rank") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  // Eight equal Linear layers (so two balanced stages hold equal halves), Adam (two moments).
  const std::string cfg = R"(
seed: 2
model: {hidden: [64, 64, 64, 64, 64, 64, 64], activation: tanh}
data:
  format: synthetic
  synthetic: {samples: 256, features: 64, classes: 64}
  batch_size: 16
optimizer: {type: adam, lr: 0.001}
train: {epochs: 0, max_steps: 2}
runtime: {threads: 1}
)";
  const auto one = train_yaml(cfg, dir / "one", {});
  const auto four =
      train_yaml(cfg, dir / "four",
                 {"distributed.world_size=4", "distributed.strategy=fsdp",
                  "distributed.pipeline.stages=2", "distributed.pipeline.partition=uniform"});
  for (const char* key : {"param_bytes", "grad_bytes", "optim_bytes"}) {
    CAPTURE(key);
    const double ratio = four[key].get<double>() / one[key].get<double>();
    MESSAGE(std::string(key) << ": " << four[key] << " of " << one[key] << " bytes (" << ratio
                             << ")");
    // Exactly a quarter up to the padding of each unit's chunks (at most 1 float per unit).
    CHECK(ratio == doctest::Approx(0.25).epsilon(0.01));
  }
}

TEST_CASE("fsdp without resharding gathers a unit once per step under a pipeline's micro-batches") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  const std::string cfg = R"(
seed: 3
model: {hidden: [24, 16, 12], activation: tanh}
data:
  format: synthetic
  synthetic: {samples: 600, features: 10, classes: 3}
  batch_size: 16
optimizer: {type: adam, lr: 0.01}
train: {epochs: 0, max_steps: 10}
distributed: {world_size: 4, strategy: fsdp, pipeline: {stages: 2, micro_batches: 4}}
runtime: {threads: 1}
)";
  // Per step and unit, with resharding: 4 micro-batches x (a forward's and a backward's gather)
  // (the range's last unit is not regathered for backward); without: one gather. The same
  // arithmetic, bitwise.
  for (const std::string layout : {"pp2 x dp2, 4 micro-batches", "dp2, grad_accum 4"}) {
    CAPTURE(layout);
    std::vector<std::string> sets;
    if (layout[0] == 'd')
      sets = {"distributed.world_size=2", "distributed.pipeline.stages=1",
              "distributed.pipeline.micro_batches=4", "train.grad_accum_steps=4"};
    const std::string a = dir / (layout.substr(0, 3) + "-re"),
                      b = dir / (layout.substr(0, 3) + "-keep");
    const auto re = train_yaml(cfg, a, sets);
    sets.push_back("distributed.fsdp.reshard_after_forward=false");
    const auto keep = train_yaml(cfg, b, sets);
    CHECK(checkpoint_rel_diff(as_file(a, 10), as_file(b, 10)) == 0.0);
    const double ratio =
        keep["comm_bytes_sent"].get<double>() / re["comm_bytes_sent"].get<double>();
    MESSAGE(layout << ": bytes sent without resharding " << ratio << " of with");
    // Gradient reduce-scatters (every micro-batch either way) and, in the pipeline, activations
    // make up the rest. dp2: 4 + 16 of 28 + 16 unit-sized messages.
    CHECK(ratio < (layout[0] == 'd' ? 0.5 : 0.8));
  }
}
