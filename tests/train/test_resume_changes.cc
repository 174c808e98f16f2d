// What a resume keeps and what it says it cannot. optimizer.scale_lr linear (lr x data-parallel
// replicas) across a resume on another number of replicas: with the same samples per optimizer
// step the checkpoint's rate is kept, so the run ends where the uninterrupted one does; with
// another global batch the rate follows the config; an optimizer.lr changed since the checkpoint
// applies as given. Local SGD's per-rank momentum, which the checkpoint holds for every rank.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "test_util.h"
#include "train/checkpoint_config.h"
#include "train/train_test_util.h"

using namespace dtrain;
using dtrain::testing::checkpoint_rel_diff;
using dtrain::testing::contains;
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

TEST_CASE("a Local SGD resume is exact with each rank's own momentum, and says when it cannot be") {
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
    const std::string a = full + "/checkpoints/step-20.safetensors",
                      b = res + "/checkpoints/step-20.safetensors";
    CHECK(checkpoint_rel_diff(a, b) == 0.0);
    CHECK_FALSE(dtrain::testing::contains(cap.text(), "resuming Local SGD"));
    // Rank 1's own momentum is in the file (and only then), equal after the resume.
    const StFile fa = read_safetensors(a), fb = read_safetensors(b);
    REQUIRE(fa.tensors.count("replica.rank1.momentum") == (averaged ? 0 : 1));
    if (averaged) continue;
    CHECK(fa.metadata.at("replica_world_size") == "2");
    CHECK(fa.tensors.at("replica.rank1.momentum").data ==
          fb.tensors.at("replica.rank1.momentum").data);
    // (the first tensor of the flat layout is layers.0.weight: rank 1's differs from rank 0's)
    const std::vector<float>& r0 = fa.tensors.at("optim.momentum.layers.0.weight").data;
    const std::vector<float>& r1 = fa.tensors.at("replica.rank1.momentum").data;
    REQUIRE(r1.size() > r0.size());
    CHECK_FALSE(std::equal(r0.begin(), r0.end(), r1.begin()));
  }
  // DiLoCo without momentum: its outer momentum is the same on every rank, nothing per rank to
  // lose, nothing said (it warned that the resume was inexact).
  {
    std::vector<std::string> diloco = local;
    diloco.insert(diloco.end(), {"optimizer.momentum=0", "distributed.local_sgd.outer_lr=0.7"});
    train_yaml(kYaml, dir / "diloco", diloco);
    LogCapture cap;
    train_yaml(kYaml, dir / "diloco-res", diloco, dir / "diloco/checkpoints/step-10.safetensors");
    CHECK(checkpoint_rel_diff(dir / "diloco/checkpoints/step-20.safetensors",
                              dir / "diloco-res/checkpoints/step-20.safetensors") == 0.0);
    CHECK_MESSAGE(!dtrain::testing::contains(cap.text(), "resuming Local SGD"), cap.text());
  }
  // On 3 ranks, a checkpoint of 2 ranks' own momentum cannot continue exactly: said.
  LogCapture cap;
  std::vector<std::string> three = local;
  three.push_back("distributed.world_size=3");
  train_yaml(kYaml, dir / "three", three, dir / "full-own/checkpoints/step-10.safetensors");
  CHECK_MESSAGE(dtrain::testing::contains(
                    cap.text(),
                    "resuming Local SGD: all 3 ranks continue with rank 0's optimizer state "
                    "(momentum), the checkpoint holds each of its 2 ranks' own state, and this "
                    "run has 3"),
                cap.text());
  // A pipeline's sharded checkpoint: each stage's first replica's shard holds its stage's other
  // replicas' state, and a resume on the same layout is bitwise (it continued every replica from
  // its stage's first one's, 2026-12-07).
  std::vector<std::string> piped = local;
  piped.insert(piped.end(), {"distributed.world_size=4", "distributed.pipeline.stages=2"});
  train_yaml(kYaml, dir / "piped", piped);
  {
    LogCapture pcap;
    train_yaml(kYaml, dir / "piped-res", piped, dir / "piped/checkpoints/step-10");
    CHECK(checkpoint_rel_diff(dir / "piped/checkpoints/step-20",
                              dir / "piped-res/checkpoints/step-20") == 0.0);
    CHECK_MESSAGE(!dtrain::testing::contains(pcap.text(), "resuming Local SGD"), pcap.text());
    // (each of the two stages' shards holds its replica 1's momentum)
    size_t with_replicas = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir / "piped/checkpoints/step-10"))
      if (e.path().extension() == ".safetensors") {
        const StFile f = read_safetensors(e.path().string());
        with_replicas += f.tensors.count("replica.rank1.momentum");
        // (version 3, as a file holding them: an older dtrain read such a shard and ignored them)
        CHECK(f.metadata.at("format_version") ==
              (f.tensors.count("replica.rank1.momentum") ? "3" : "2"));
      }
    CHECK(with_replicas == 2);
  }
  // Without the pipeline (its replicas' states cannot be placed): said, not "one state".
  {
    LogCapture ncap;
    train_yaml(kYaml, dir / "unpiped", local, dir / "piped/checkpoints/step-10");
    CHECK_MESSAGE(dtrain::testing::contains(ncap.text(),
                                            "is a pipeline's checkpoint holding each stage's "
                                            "replicas' own optimizer states"),
                  ncap.text());
  }
  // Another layout (3 replicas per stage) cannot continue each replica's own: said.
  std::vector<std::string> wider = local;
  wider.insert(wider.end(), {"distributed.world_size=6", "distributed.pipeline.stages=2"});
  LogCapture wcap;
  train_yaml(kYaml, dir / "wider", wider, dir / "piped/checkpoints/step-10");
  CHECK_MESSAGE(dtrain::testing::contains(wcap.text(),
                                          "resuming Local SGD: each stage's 3 replicas continue "
                                          "with its first replica's optimizer state (momentum), "
                                          "the checkpoint was written by another layout"),
                wcap.text());
}
TEST_CASE(
    "a Local SGD checkpoint of an older dtrain that kept rank 0's momentum alone is warned of") {
  // A dtrain before 2026-12-07 stored rank 0's optimizer state alone although its ranks' differed
  // (Local SGD without sync_optimizer_state): such a resume drifted with an info line, or none
  // on one rank, where README promises a warning.
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  const std::vector<std::string> local = {"distributed.strategy=local_sgd",
                                          "distributed.local_sgd.sync_every=5",
                                          "distributed.world_size=2", "optimizer.scale_lr=none"};
  train_yaml(kYaml, dir / "full", local);
  // The same checkpoint as such a dtrain wrote it: no replica.* tensors, format version 2.
  const StFile f = read_safetensors(dir / "full/checkpoints/step-10.safetensors");
  std::vector<StTensorRef> refs;
  for (const auto& [name, t] : f.tensors)
    if (name.rfind("replica.", 0) != 0) refs.push_back({name, t.shape, t.data.data()});
  std::map<std::string, std::string> md = f.metadata;
  for (const char* k : {"replica_world_size", "replica_states", kStHeaderCrcKey}) md.erase(k);
  md["format_version"] = "2";
  const std::string old = dir / "old.safetensors";
  write_safetensors(old, refs, md);
  for (const char* world : {"distributed.world_size=2", "distributed.world_size=1"}) {
    CAPTURE(world);
    std::vector<std::string> sets = local;
    sets.push_back(world);
    if (std::string(world).back() == '1') sets.push_back("data.batch_size=20");
    LogCapture cap;
    train_yaml(kYaml, dir / ("res" + std::string(1, std::string(world).back())), sets, old);
    CHECK_MESSAGE(contains(cap.text(),
                           "was written by Local SGD without sync_optimizer_state on 2 "
                           "ranks, whose optimizer states differed"),
                  cap.text());
  }
  // Its own checkpoint holds every rank's: nothing to say.
  LogCapture cap;
  train_yaml(kYaml, dir / "res-new", local, dir / "full/checkpoints/step-10.safetensors");
  CHECK_FALSE(contains(cap.text(), "whose optimizer states differed"));
}

TEST_CASE("a checkpoint's sampler position past its epoch's end is said at resume") {
  // (an edited file: batch 470 of an epoch of 8 skipped the rest of the epoch in silence)
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  train_yaml(kYaml, dir / "full", {});
  const std::string ckpt = dir / "full/checkpoints/step-10.safetensors";
  const std::string edited = dir / "edited.safetensors";
  {
    StFile f = read_safetensors(ckpt);
    f.metadata["batch"] = "470";
    std::vector<StTensorRef> refs;
    for (const auto& [name, t] : f.tensors) refs.push_back({name, t.shape, t.data.data()});
    write_safetensors(edited, refs, f.metadata);
  }
  LogCapture cap;
  train_yaml(kYaml, dir / "res", {}, edited);
  CHECK_MESSAGE(dtrain::testing::contains(cap.text(),
                                          "sampler position (epoch 1, batch 470) is past the end "
                                          "of its epoch, whose training data makes 8 batches"),
                cap.text());
}

TEST_CASE("inputs whose record would not fit a checkpoint's header are refused before training") {
  // Four 2048x2048 images (16 MB) trained to the end, then wrote checkpoints of a 105 MB header
  // (the normaliser's per-pixel statistics as JSON) that no safetensors reader accepts.
  DataSplits d;
  d.train.kind = SampleKind::kFeatures;
  d.train.features = 4'194'304;
  d.normalizer.method = Normalize::kStandardize;
  d.normalizer.shift.assign(static_cast<size_t>(d.train.features), 0.123456789f);
  d.normalizer.scale.assign(static_cast<size_t>(d.train.features), 3.14159265f);
  d.train.sample = {d.train.features};
  try {
    check_input_record_fits(d);
    FAIL("not refused");
  } catch (const UserError& e) {
    CHECK_MESSAGE(contains(e.what(), "the training data's 4194304 features make the input record"),
                  e.what());
    CHECK_MESSAGE(contains(e.what(), "use data.normalize: none"), e.what());
  }
  // Without per-feature statistics the record is small: training goes on.
  d.normalizer = Normalizer{};
  CHECK_NOTHROW(check_input_record_fits(d));
  // The writer refuses a header no reader takes, and leaves no file.
  TempDir t;
  const std::string path = t / "big.safetensors";
  const float v = 1.0f;
  CHECK_THROWS_AS(
      write_safetensors(path, {{"w", {1}, &v}}, {{"note", std::string(100'000'000, 'x')}}),
      UserError);
  CHECK_FALSE(std::filesystem::exists(path));
}
