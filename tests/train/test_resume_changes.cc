// What a resume keeps and what it says it cannot. optimizer.scale_lr linear (lr x data-parallel
// replicas) across a resume on another number of replicas: with the same samples per optimizer
// step the checkpoint's rate is kept, so the run ends where the uninterrupted one does; with
// another global batch the rate follows the config; an optimizer.lr changed since the checkpoint
// applies as given. Local SGD's per-rank momentum, of which the checkpoint holds rank 0's.
#include <doctest/doctest.h>

#include <fstream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train/train_test_util.h"

using namespace dtrain;
using dtrain::testing::checkpoint_rel_diff;
using dtrain::testing::LogCapture;
using dtrain::testing::TempDir;
using dtrain::testing::train_yaml;

namespace {

const char* kYaml = R"(
seed: 5
model: {type: mlp, hidden: [7, 5], activation: tanh}
data:
  format: synthetic
  synthetic: {samples: 300, features: 6, classes: 3, noise: 0.5}
  batch_size: 10
optimizer: {type: sgd, lr: 0.03, momentum: 0.9, scale_lr: linear}
train: {max_steps: 20, log_every: 1, checkpoint: {every_steps: 10}}
distributed: {backend: inproc, world_size: 3, strategy: ddp}
runtime: {threads: 1}
)";

// The learning rate of the train record of `step` in a run's metrics.jsonl.
double lr_at_step(const std::string& run, int64_t step) {
  std::ifstream in(run + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") == "train" && j.value("step", int64_t{-1}) == step) return j["lr"];
  }
  FAIL("no train record of step ", step, " in ", run);
  return 0;
}

}  // namespace

TEST_CASE(
    "resume on other replicas under scale_lr linear keeps the rate of the same global batch") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  const std::string full = dir / "full", ckpt = full + "/checkpoints/step-10.safetensors";
  train_yaml(kYaml, full, {});
  CHECK(lr_at_step(full, 11) == doctest::Approx(0.09));

  // 3 ranks x batch 10 -> 1 rank x batch 30: the same training, at 0.09 (it was 0.03).
  const std::string one = dir / "one";
  train_yaml(kYaml, one, {"distributed.world_size=1", "data.batch_size=30"}, ckpt);
  CHECK(lr_at_step(one, 11) == doctest::Approx(0.09));
  const double d = checkpoint_rel_diff(full + "/checkpoints/step-20.safetensors",
                                       one + "/checkpoints/step-20.safetensors");
  CHECK(d < 1e-5);
  // Resumed again with the same settings: the kept rate is the checkpoint's own (its progress
  // records it), not 0.03 x 1 from the config it stores.
  const std::string again = dir / "again";
  train_yaml(kYaml, again, {"distributed.world_size=1", "data.batch_size=30", "train.max_steps=25"},
             one + "/checkpoints/step-20.safetensors");
  CHECK(lr_at_step(again, 21) == doctest::Approx(0.09));

  // 1 rank x batch 10: another global batch, the rate scale_lr gives for it.
  const std::string small = dir / "small";
  train_yaml(kYaml, small, {"distributed.world_size=1"}, ckpt);
  CHECK(lr_at_step(small, 11) == doctest::Approx(0.03));

  // optimizer.lr changed since the checkpoint: the user's rate, scaled as configured.
  const std::string lower = dir / "lower";
  train_yaml(kYaml, lower, {"distributed.world_size=1", "data.batch_size=30", "optimizer.lr=0.01"},
             ckpt);
  CHECK(lr_at_step(lower, 11) == doctest::Approx(0.01));
}

TEST_CASE("a Local SGD resume says when per-rank momentum makes it inexact, and is exact else") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  const std::vector<std::string> local = {"distributed.strategy=local_sgd",
                                          "distributed.local_sgd.sync_every=5",
                                          "distributed.world_size=2", "optimizer.scale_lr=none"};
  for (const bool averaged : {false, true}) {
    CAPTURE(averaged);
    std::vector<std::string> sets = local;
    if (averaged) sets.push_back("distributed.local_sgd.sync_optimizer_state=true");
    const std::string tag = averaged ? "avg" : "own";
    const std::string full = dir / ("full-" + tag), res = dir / ("res-" + tag);
    train_yaml(kYaml, full, sets);
    LogCapture cap;
    train_yaml(kYaml, res, sets, full + "/checkpoints/step-10.safetensors");
    const double d = checkpoint_rel_diff(full + "/checkpoints/step-20.safetensors",
                                         res + "/checkpoints/step-20.safetensors");
    if (averaged) {
      CHECK(d == 0.0);
      CHECK_FALSE(dtrain::testing::contains(cap.text(), "resuming Local SGD"));
    } else {
      CHECK(d > 1e-6);  // what the warning is about
      CHECK_MESSAGE(dtrain::testing::contains(cap.text(),
                                              "resuming Local SGD: all 2 ranks continue with "
                                              "rank 0's optimizer state (momentum)"),
                    cap.text());
    }
  }
}
