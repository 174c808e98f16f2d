// Dropout under data parallelism: masks are keyed on the sample and the step (nn/layer.h
// LayerCtx), so W ranks (ddp, fsdp), gradient accumulation and a pipeline draw the masks one
// process draws and train the same model (up to float32 summation order), for the GPT
// (model.dropout: nanoGPT's placement) and the MLP's dropout layers alike.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint.h"
#include "test_util.h"
#include "train/loop.h"
#include "train/train_test_util.h"
#include "train/trainer.h"

using namespace dtrain;
using dtrain::testing::as_file;
using dtrain::testing::checkpoint_rel_diff;
using dtrain::testing::TempDir;

namespace {

// SGD with momentum (Adam would amplify summation-order noise), 12 steps, dropout 0.2.
std::string gpt_yaml(const TempDir& t, bool tied) {
  std::string text;
  for (int i = 0; i < 80; ++i)
    text += "a stitch in time " + std::to_string(i % 9) + " saves nine, or so they say.\n";
  const std::string corpus = t.write("corpus.txt", text);
  return R"(seed: 3
model: {type: gpt, n_layer: 2, n_head: 2, n_embd: 16, block_size: 16, dropout: 0.2, tie_embeddings: )" +
         std::string(tied ? "true" : "false") + R"(}
data: {format: text, train: {path: )" +
         corpus + R"(}, batch_size: 8}
optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
train: {epochs: 0, max_steps: 12, log_every: 12}
runtime: {threads: 1}
)";
}

const std::string kMlp = R"(seed: 8
model: {hidden: [24, 16], activation: tanh, dropout: 0.3}
data:
  format: synthetic
  synthetic: {samples: 256, features: 10, classes: 4, noise: 0.5}
  batch_size: 16
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 0, max_steps: 12, log_every: 12}
runtime: {threads: 1}
)";

void train(const std::string& yaml, const std::string& out, const std::vector<std::string>& sets) {
  RunOptions o;
  o.out_dir = out;
  run_training(parse_config(yaml, "dropout.yaml", sets), o);
}

struct Case {
  std::string name;
  std::vector<std::string> sets;
};

// data.batch_size is per replica: 2 x half is the global batch of one process.
Case ddp2(const std::string& half) {
  return {"ddp2",
          {"distributed.strategy=ddp", "distributed.world_size=2", "data.batch_size=" + half}};
}
Case accum2(const std::string& half) {
  return {"accum2", {"data.batch_size=" + half, "train.grad_accum_steps=2"}};
}
Case fsdp2(const std::string& half) {
  return {"fsdp2",
          {"distributed.strategy=fsdp", "distributed.world_size=2", "data.batch_size=" + half}};
}
const Case kPipeline2 = {"pipeline2",
                         {"distributed.strategy=pipeline", "distributed.world_size=2",
                          "distributed.pipeline.micro_batches=2"}};

// Each case against one process; `other` (another dropout) must train something else, so the
// masks are in effect and the equalities are not vacuous.
void check_layouts(const std::string& yaml, const TempDir& dir, const std::vector<Case>& cases,
                   const std::string& other) {
  train(yaml, dir / "one", {});
  const std::string ref = as_file(dir / "one", 12);
  for (const Case& c : cases) {
    train(yaml, dir / c.name, c.sets);
    const double rel = checkpoint_rel_diff(as_file(dir / c.name, 12), ref);
    MESSAGE(c.name << ": " << rel << " from one process");
    CHECK(rel < 1e-5);
  }
  train(yaml, dir / "other", {other});
  CHECK(checkpoint_rel_diff(as_file(dir / "other", 12), ref) > 1e-3);
}

}  // namespace

TEST_CASE("gpt dropout: 2 ddp ranks, accumulation and a 2-stage pipeline equal one process") {
  spdlog::set_level(spdlog::level::warn);
  SUBCASE("tied embeddings: ddp and accumulation") {
    TempDir dir;
    check_layouts(gpt_yaml(dir, true), dir, {ddp2("4"), accum2("4")}, "model.dropout=0");
  }
  SUBCASE("untied: fsdp and the pipeline (tied copies are not supported there yet)") {
    TempDir dir;
    check_layouts(gpt_yaml(dir, false), dir, {fsdp2("4"), kPipeline2}, "model.dropout=0");
  }
}

TEST_CASE("mlp dropout: 2 ddp ranks, accumulation and a 2-stage pipeline equal one process") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  // Dropout 0 would remove the dropout layers (and change the parameter names): compare with
  // another rate instead.
  check_layouts(kMlp, dir, {ddp2("8"), accum2("8"), kPipeline2}, "model.dropout=0.1");
}
