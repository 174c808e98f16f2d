// Pipeline parallelism: partitioning, and every schedule against single-process training.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>

#include <spdlog/spdlog.h>

#include "nn/registry.h"
#include "test_util.h"
#include "train/min_max_split.h"
#include "train/pipeline.h"
#include "train/train_test_util.h"
#include "train/trainer.h"
#include "util/check.h"

using namespace dtrain;
using dtrain::testing::as_file;
using dtrain::testing::checkpoint_rel_diff;
using dtrain::testing::TempDir;

namespace fs = std::filesystem;

namespace {

// Four layers with parameters (12-14-10-8-3), tanh, no dropout: the pipeline's arithmetic is
// the single process's, up to summation order across micro-batches.
const char* kBase = R"(
seed: 9
model: {hidden: [14, 10, 8], activation: tanh}
data:
  format: synthetic
  synthetic: {samples: 700, features: 12, classes: 3, noise: 0.7}
  batch_size: 14
optimizer: {type: adam, lr: 0.004}
train: {epochs: 0, max_steps: 20, log_every: 5}
runtime: {threads: 1}
)";

nlohmann::json train(const std::string& out, const std::vector<std::string>& sets) {
  RunOptions o;
  o.out_dir = out;
  return run_training(parse_config(kBase, "pipe.yaml", sets), o);
}

}  // namespace

TEST_CASE("stage partitions: uniform by layer count, balanced by cost, contiguous and complete") {
  ModelConfig mc;
  mc.hidden = {512, 16, 16, 16, 16};
  const Model m = build_mlp(mc, 784, 10);  // 6 Linear layers, the first far the heaviest
  for (int S = 1; S <= 6; ++S) {
    for (const char* how : {"uniform", "balanced"}) {
      CAPTURE(S);
      CAPTURE(how);
      const auto p = partition_stages(m, S, parse_enum<PipelinePartition>(how).value());
      REQUIRE(p.size() == static_cast<size_t>(S));
      CHECK(p.front().first == 0);
      CHECK(p.back().second == m.num_layers());
      for (size_t s = 0; s + 1 < p.size(); ++s) CHECK(p[s].second == p[s + 1].first);
      for (const auto& [a, b] : p) CHECK(m.layer_end(b - 1) > m.layer_begin(a));
    }
  }
  // uniform: 6 layers with parameters over 4 stages -> 2, 2, 1, 1; balanced puts the big first
  // layer alone.
  const auto u = partition_stages(m, 4, PipelinePartition::kUniform);
  CHECK(u[0] == LayerRange{0, 4});
  const auto b = partition_stages(m, 2, PipelinePartition::kBalanced);
  CHECK(b[0] == LayerRange{0, 2});
}

TEST_CASE("layers without parameters before the first with them join its stage and FSDP unit") {
  // [flatten, linear, relu, linear, relu, linear] at 3 stages: stage 0 was the flatten alone
  // (no parameters: a rank that only copies), and FSDP had an empty leading unit; a 4th stage
  // was accepted as if the flatten were a layer with parameters.
  const Config c = parse_config(R"(model:
  type: sequential
  layers: [flatten, {linear: 512}, relu, {linear: 512}, relu, {linear: 10}]
data: {format: synthetic}
)",
                                "p.yaml", {});
  const Model m = build_model(c.model, {{1, 28, 28}, 10});
  for (const char* how : {"uniform", "balanced"}) {
    CAPTURE(how);
    const auto p = partition_stages(m, 3, parse_enum<PipelinePartition>(how).value());
    REQUIRE(p.size() == 3);
    CHECK(p[0] == LayerRange{0, 3});
    CHECK(p[1] == LayerRange{3, 5});
    CHECK(p[2] == LayerRange{5, 6});
  }
  CHECK_THROWS_WITH(partition_stages(m, 4, PipelinePartition::kBalanced),
                    "distributed.pipeline.stages: the model has 3 layer(s) with parameters, fewer "
                    "than 4 stages");
  FsdpConfig per_layer;
  const auto units = units_for_fsdp(m, per_layer);
  REQUIRE(units.size() == 3);
  CHECK(units[0] == LayerRange{0, 3});
  // A stage's own range starts with its first layer, parameters or not.
  CHECK(units_for_fsdp(m, per_layer, 2, 6).front() == LayerRange{2, 5});
}

TEST_CASE("balanced stages count a convolution's multiply-adds at every output position") {
  // The cost was parameters plus outputs: four 3x3 convolutions on 28x28 looked cheaper than the
  // Linear after them, and stage 0 got all four (1.5x slower than uniform, measured).
  const Config c = parse_config(R"(model:
  type: sequential
  layers:
    - {conv2d: {out_channels: 16, kernel: 3, padding: 1}}
    - tanh
    - {conv2d: {out_channels: 16, kernel: 3, padding: 1}}
    - tanh
    - {conv2d: {out_channels: 16, kernel: 3, padding: 1}}
    - tanh
    - {conv2d: {out_channels: 16, kernel: 3, padding: 1}}
    - tanh
    - flatten
    - {linear: 10}
data: {format: synthetic}
)",
                                "p.yaml", {});
  const Model m = build_model(c.model, {{1, 28, 28}, 10});
  // Multiply-adds per sample: 0.11 M, then 1.81 M for each later convolution, 0.13 M for the
  // Linear: two convolutions on each stage (3.76 M against 1.94 M either way round).
  CHECK(stage_cost(m, 0, 2) == doctest::Approx(784.0 * 16 * 9 + 784 * 16));  // conv, tanh
  const auto b = partition_stages(m, 2, PipelinePartition::kBalanced);
  const auto worst = [&](size_t cut) {
    return std::max(stage_cost(m, 0, cut), stage_cost(m, cut, m.num_layers()));
  };
  CHECK(worst(b[0].second) == doctest::Approx(784.0 * 16 * 144 * 2 + 784 * 16 * 2 + 12544 * 10));
  for (const size_t cut : {2, 4, 6, 9}) CHECK(worst(b[0].second) <= worst(cut));
  CHECK(b[0].second != 9);  // (the split it made)
}

namespace {

// The reference: the O(parts x n^2) dynamic programme partition_stages used before, keeping the
// smallest cut at each level.
std::vector<int> min_max_split_dp(const std::vector<double>& cost, int parts) {
  const int n = static_cast<int>(cost.size());
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + cost[size_t(i)];
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(size_t(parts) + 1, std::vector<double>(size_t(n) + 1, inf));
  std::vector<std::vector<int>> from(size_t(parts) + 1, std::vector<int>(size_t(n) + 1, 0));
  best[0][0] = 0.0;
  for (int s = 1; s <= parts; ++s)
    for (int b = s; b <= n; ++b)
      for (int a = s - 1; a < b; ++a) {
        const double v =
            std::max(best[size_t(s) - 1][size_t(a)], prefix[size_t(b)] - prefix[size_t(a)]);
        if (v < best[size_t(s)][size_t(b)]) {
          best[size_t(s)][size_t(b)] = v;
          from[size_t(s)][size_t(b)] = a;
        }
      }
  std::vector<int> cut(size_t(parts), 0);
  for (int s = parts, b = n; s >= 1; --s) cut[size_t(s) - 1] = b = from[size_t(s)][size_t(b)];
  return cut;
}

}  // namespace

TEST_CASE("min_max_split finds the dynamic programme's split, ties included, in O(parts x n)") {
  std::mt19937 gen(11);
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 1 + static_cast<int>(gen() % 24);
    const int parts = 1 + static_cast<int>(gen() % static_cast<unsigned>(n));
    std::vector<double> cost(static_cast<size_t>(n));
    const int kind = trial % 4;  // integers with many ties, zeros, equal blocks, arbitrary reals
    for (double& c : cost)
      c = kind == 0   ? static_cast<double>(gen() % 4)
          : kind == 1 ? (gen() % 3 == 0 ? 0.0 : static_cast<double>(gen() % 1000))
          : kind == 2 ? 4096.0
                      : std::ldexp(static_cast<double>(gen() % 100000) + 0.1,
                                   -static_cast<int>(gen() % 20));
    CAPTURE(trial);
    CAPTURE(n);
    CAPTURE(parts);
    REQUIRE(min_max_split(cost, parts) == min_max_split_dp(cost, parts));
  }
  // The size that took minutes (30,000 layers, 256 stages): now well under a second.
  std::vector<double> many(30000);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<double>(20 + i % 7);
  const auto cut = min_max_split(many, 256);
  REQUIRE(cut.size() == 256);
  for (size_t s = 1; s < cut.size(); ++s) CHECK(cut[s] > cut[s - 1]);
}

TEST_CASE("pipelines equal single-process training: S = 2, 3, 4, M in 1, S, 2S+1, both schedules") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  train(dir / "single", {});
  const std::string ref = as_file(dir / "single", 20);
  int runs = 0;
  for (int S : {2, 3, 4}) {
    for (int M : {1, S, 2 * S + 1}) {
      for (const char* schedule : {"gpipe", "1f1b"}) {
        for (const char* ckpt : {"false", "true"}) {
          const std::string tag = std::to_string(S) + "_" + std::to_string(M) + schedule + ckpt;
          const auto s =
              train(dir / tag,
                    {"distributed.strategy=pipeline", "distributed.world_size=" + std::to_string(S),
                     "distributed.pipeline.stages=" + std::to_string(S),
                     "distributed.pipeline.micro_batches=" + std::to_string(M),
                     std::string("distributed.pipeline.schedule=") + schedule,
                     std::string("distributed.pipeline.activation_checkpointing=") + ckpt});
          REQUIRE(s["stages"].size() == static_cast<size_t>(S));
          const double rel = checkpoint_rel_diff(ref, as_file(dir / tag, 20));
          INFO(tag, " rel ", rel);
          CHECK(rel < 1e-5);
          ++runs;
        }
      }
    }
  }
  CHECK(runs == 36);
  // S = 2 x D replicas equals one process with the replicas' global batch (14 D). 551 training
  // samples: the epoch ends, before step 25, in a short global batch the replicas split
  // unevenly (19 = 10/9 for D = 2, 5 = 2/2/1 for D = 3), each replica's share cut into uneven
  // micro-batches.
  for (int D : {2, 3}) {
    const std::vector<std::string> uneven = {"data.synthetic.samples=689", "train.max_steps=25"};
    auto single = uneven;
    single.push_back("data.batch_size=" + std::to_string(14 * D));
    const std::string tag = "pd" + std::to_string(D);
    train(dir / ("single_" + tag), single);
    auto pd = uneven;
    pd.insert(pd.end(),
              {"distributed.strategy=pipeline", "distributed.world_size=" + std::to_string(2 * D),
               "distributed.pipeline.stages=2", "distributed.pipeline.micro_batches=3"});
    const auto s = train(dir / tag, pd);
    CHECK(s["steps"] == 25);
    CHECK(s["epochs"].get<double>() > 1.0);  // 20 (D = 2) or 14 (D = 3) steps per epoch
    const double rel =
        checkpoint_rel_diff(as_file(dir / ("single_" + tag), 25), as_file(dir / tag, 25));
    INFO(tag, " rel ", rel);
    CHECK(rel < 1e-5);
  }
  // The uniform partition and SGD with momentum and clipping too.
  const std::vector<std::string> sgd = {"optimizer={type: sgd, lr: 0.1, momentum: 0.9}",
                                        "optimizer.clip_grad_norm=0.3"};
  train(dir / "single_sgd", sgd);
  auto p = sgd;
  p.insert(p.end(), {"distributed.strategy=pipeline", "distributed.world_size=3",
                     "distributed.pipeline.stages=3", "distributed.pipeline.partition=uniform"});
  train(dir / "pipe_sgd", p);
  CHECK(checkpoint_rel_diff(as_file(dir / "single_sgd", 20), as_file(dir / "pipe_sgd", 20)) < 1e-5);
  // Ranks that do not form whole pipelines are refused before any message is sent.
  CHECK_THROWS_AS(train(dir / "bad", {"distributed.strategy=pipeline", "distributed.world_size=3"}),
                  UserError);
  // The comparison can fail.
  train(dir / "other",
        {"distributed.strategy=pipeline", "distributed.world_size=2", "optimizer.lr=0.006"});
  CHECK(checkpoint_rel_diff(ref, as_file(dir / "other", 20)) > 1e-3);
}

TEST_CASE("1f1b stores fewer activations than gpipe, and checkpointing fewer again") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  auto peak = [&](const char* schedule, const char* ckpt) {
    const std::string tag = std::string(schedule) + ckpt;
    const auto s =
        train(dir / tag, {"distributed.strategy=pipeline", "distributed.world_size=2",
                          "distributed.pipeline.micro_batches=7", "train.max_steps=3",
                          std::string("distributed.pipeline.schedule=") + schedule,
                          std::string("distributed.pipeline.activation_checkpointing=") + ckpt});
    return s["stages"][0]["peak_activation_bytes"].get<int64_t>();
  };
  const int64_t gpipe = peak("gpipe", "false"), f1b = peak("1f1b", "false"),
                f1b_ck = peak("1f1b", "true");
  CHECK(f1b < gpipe);
  CHECK(f1b_ck < f1b);
}

TEST_CASE("a resumed pipeline run ends where the uninterrupted one does") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  // Dropout: every stage's RNG state must be restored too.
  const std::vector<std::string> p = {"distributed.strategy=pipeline", "distributed.world_size=2",
                                      "train.checkpoint.every_steps=10",
                                      "train.checkpoint.keep_last=3", "model.dropout=0.2"};
  train(dir / "full", p);
  RunOptions o;
  o.out_dir = dir / "res";
  o.resume = dir / "full/checkpoints/step-10";
  run_training(parse_config(kBase, "pipe.yaml", p), o);
  const StFile a = read_safetensors(as_file(dir / "full", 20));
  const StFile b = read_safetensors(as_file(dir / "res", 20));
  for (const auto& [name, t] : a.tensors) CHECK_MESSAGE(t.data == b.tensors.at(name).data, name);
}
