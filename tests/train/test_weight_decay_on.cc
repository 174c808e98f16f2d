// optimizer.weight_decay_on: matrices through the strategies. decayed_ranges picks the tensors
// of 2 or more dimensions from the parameter table; zero2 and fsdp, whose shards cut through
// tensors, train what one process trains with the same global batch.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "config/config.h"
#include "nn/model.h"
#include "test_util.h"
#include "train/strategy.h"
#include "train/train_test_util.h"
#include "train/trainer.h"

using namespace dtrain;
using dtrain::testing::as_file;
using dtrain::testing::checkpoint_rel_diff;
using dtrain::testing::TempDir;

namespace fs = std::filesystem;

namespace {

// 10-24-16-3 with LayerNorm: weights [24, 10], [16, 24], [3, 16]; biases and LayerNorm weights
// and biases 1-D. Large weight decay, so that where it applies shows in 20 steps.
const char* kBase = R"(
seed: 5
model: {hidden: [24, 16], activation: tanh, layer_norm: true}
data:
  format: synthetic
  synthetic: {samples: 400, features: 10, classes: 3, noise: 0.8}
  batch_size: 16
optimizer: {type: sgd, lr: 0.05, momentum: 0.9, weight_decay: 0.2, weight_decay_on: matrices}
train: {epochs: 0, max_steps: 20, log_every: 10}
distributed: {ddp: {bucket_mb: 0.001}}
runtime: {threads: 1}
)";

void train(const std::string& out, const std::vector<std::string>& sets) {
  RunOptions o;
  o.out_dir = out;
  run_training(parse_config(kBase, "decay.yaml", sets), o);
}

}  // namespace

TEST_CASE("decayed_ranges: all is the whole layout, matrices the tensors of >= 2 dimensions") {
  const Config cfg = parse_config(kBase, "decay.yaml", {});
  const Model m = build_mlp(cfg.model, 10, 3);
  CHECK(decayed_ranges(m, WeightDecayOn::kAll) == std::vector<FlatRange>{{0, m.param_count()}});
  const std::vector<FlatRange> d = decayed_ranges(m, WeightDecayOn::kMatrices);
  int64_t decayed = 0, matrix_numel = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    decayed += d[i].end - d[i].begin;
    if (i > 0) CHECK(d[i - 1].end < d[i].begin);  // sorted, disjoint, touching ones merged
  }
  for (const ParamEntry& e : m.params()) {
    CAPTURE(e.name);
    bool inside = false;
    for (const FlatRange& r : d) inside |= e.offset >= r.begin && e.offset + e.numel <= r.end;
    CHECK(inside == (e.shape.size() >= 2));
    if (e.shape.size() >= 2) matrix_numel += e.numel;
  }
  CHECK(decayed == matrix_numel);
  CHECK(matrix_numel == 24 * 10 + 16 * 24 + 3 * 16);
}

TEST_CASE("weight_decay_on matrices: zero2 and fsdp on 2 ranks equal one process") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  // One process with the global batch: 2 ranks x 16.
  train(dir / "ref", {"data.batch_size=32"});
  const std::string ref = as_file(dir / "ref", 20);
  for (const std::string strategy : {"zero2", "fsdp"}) {
    CAPTURE(strategy);
    const std::string run = dir / strategy;
    train(run, {"distributed.strategy=" + strategy, "distributed.world_size=2"});
    const double rel = checkpoint_rel_diff(ref, as_file(run, 20));
    MESSAGE(strategy << ": " << rel << " from one process");
    CHECK(rel < 1e-5);
  }
  // The comparison can fail: decay on every element trains something else.
  train(dir / "all", {"data.batch_size=32", "optimizer.weight_decay_on=all"});
  CHECK(checkpoint_rel_diff(ref, as_file(dir / "all", 20)) > 1e-3);
}
