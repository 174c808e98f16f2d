// More pipeline stages than the model has layers with parameters is bad input (exit 2 with one
// line), for model types whose layers the config's validation does not count (sequential).
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
  const std::string yaml = R"(seed: 5
model: {type: sequential, layers: [{linear: 8}, relu, {linear: 4}]}
data: {format: synthetic, synthetic: {samples: 100, features: 6, classes: 4}, batch_size: 4}
train: {epochs: 0, max_steps: 2}
runtime: {threads: 1}
)";
  RunOptions o;
  o.out_dir = dir / "run";
  const Config ok =
      parse_config(yaml, "s.yaml", {"distributed.world_size=2", "distributed.pipeline.stages=2"});
  CHECK(run_training(ok, o)["steps"] == 2);
  o.out_dir = dir / "run3";
  const Config three =
      parse_config(yaml, "s.yaml", {"distributed.world_size=3", "distributed.pipeline.stages=3"});
  CHECK_THROWS_WITH_AS(run_training(three, o),
                       "distributed.pipeline.stages: the model has 2 layer(s) with parameters, "
                       "fewer than 3 stages",
                       UserError);
}
