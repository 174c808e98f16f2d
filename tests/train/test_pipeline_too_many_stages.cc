// More pipeline stages than the model has layers with parameters is bad input (exit 2 with one
// line): found by the config's validation for mlp and sequential models, by the loop for a gpt.
#include <doctest/doctest.h>

#include <string>

#include <spdlog/spdlog.h>

#include "test_util.h"
#include "train/loop.h"
#include "train/trainer.h"
#include "util/check.h"

using namespace dtrain;
using dtrain::testing::TempDir;

TEST_CASE("a pipeline of more stages than a sequential model's layers with parameters is refused") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  // linear, layer_norm and linear have parameters: 3 layers, counted by the config's validation
  // as the built model counts them.
  const std::string yaml = R"(seed: 5
model: {type: sequential, layers: [{linear: 8}, relu, layer_norm, {linear: 4}]}
data: {format: synthetic, synthetic: {samples: 100, features: 6, classes: 4}, batch_size: 4}
train: {epochs: 0, max_steps: 2}
runtime: {threads: 1}
)";
  RunOptions o;
  o.out_dir = dir / "run";
  const Config ok =
      parse_config(yaml, "s.yaml", {"distributed.world_size=3", "distributed.pipeline.stages=3"});
  CHECK(run_training(ok, o)["steps"] == 2);
  std::string what;
  try {
    parse_config(yaml, "s.yaml", {"distributed.world_size=4", "distributed.pipeline.stages=4"});
  } catch (const UserError& e) {
    what = e.what();
  }
  CHECK_MESSAGE(what.find("distributed.pipeline.stages: the model has 3 layers with parameters, "
                          "fewer than 4 stages") != std::string::npos,
                what);
}

TEST_CASE("a GPT pipelines over more stages than model.hidden's default would allow an mlp") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  std::string text;
  for (int i = 0; i < 60; ++i)
    text += "a small text for a pipeline of four stages " + std::to_string(i);
  dir.write("t.txt", text);
  // Embedding, 2 blocks, ln_f and the head: 5 layers with parameters, so 4 stages fit (the
  // config's own count, for mlp only, said 3 for model.hidden's default).
  const std::string yaml = R"(seed: 5
model: {type: gpt, n_layer: 2, n_head: 2, n_embd: 8, block_size: 8}
data: {format: text, train: {path: )" +
                           (dir / "t.txt") + R"(}, batch_size: 4}
optimizer: {type: adamw, lr: 0.001}
train: {epochs: 0, max_steps: 2}
runtime: {threads: 1}
)";
  RunOptions o;
  o.out_dir = dir / "run";
  const Config four =
      parse_config(yaml, "g.yaml", {"distributed.world_size=4", "distributed.pipeline.stages=4"});
  CHECK(run_training(four, o)["steps"] == 2);
  o.out_dir = dir / "run6";
  const Config six =
      parse_config(yaml, "g.yaml", {"distributed.world_size=6", "distributed.pipeline.stages=6"});
  CHECK_THROWS_WITH_AS(run_training(six, o),
                       "distributed.pipeline.stages: the model has 5 layer(s) with parameters, "
                       "fewer than 6 stages",
                       UserError);
}
