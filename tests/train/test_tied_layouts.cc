// Tied embeddings (the GPT's transformer.wte.weight and lm_head.weight, train/tied_grads.h) under
// every strategy and pipeline layout: a tiny tied GPT trains what one process trains on the same
// global batch, clipping counts the tied tensor once, checkpoints resume across layouts, and the
// two copies are bitwise equal -- parameters and optimizer state -- in every checkpoint. Once
// the copies differ they never agree again (different parameters get different gradients), so
// equality after the last step means equality after every step.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "checkpoint/safetensors.h"
#include "test_util.h"
#include "train/loop.h"
#include "train/train_test_util.h"
#include "train/trainer.h"
#include "util/check.h"

using namespace dtrain;
using dtrain::testing::as_file;
using dtrain::testing::checkpoint_rel_diff;
using dtrain::testing::TempDir;
using dtrain::testing::train_yaml;

namespace {

// A tiny tied GPT on about 8 KB of repetitive English (written by the test): ~450 training
// windows of 17 bytes. AdamW with weight decay on the matrices (wte and lm_head both decayed).
std::string gpt_cfg(const TempDir& t) {
  std::string text;
  for (int i = 0; i < 120; ++i)
    text += "the quick brown fox " + std::to_string(i % 7) + " jumps over the lazy dog.\n";
  const std::string corpus = t.write("corpus.txt", text);
  return R"(seed: 5
model: {type: gpt, n_layer: 2, n_head: 2, n_embd: 16, block_size: 16}
data: {format: text, train: {path: )" +
         corpus + R"(}, batch_size: 4, eval_batch_size: 64}
optimizer: {type: adamw, lr: 0.003, weight_decay: 0.1}
train: {epochs: 0, max_steps: 20, log_every: 20}
distributed: {ddp: {bucket_mb: 0.01}}
runtime: {threads: 1}
)";
}

// The number of tensors of checkpoint file `path` (parameters and every optimizer state) whose
// lm_head copy is bitwise equal to its transformer.wte copy; REQUIREs that there are some.
size_t check_copies_equal(const std::string& path) {
  const StFile f = read_safetensors(path);
  const std::string p = "transformer.wte.weight", m = "lm_head.weight";
  size_t pairs = 0;
  for (const auto& [name, t] : f.tensors) {
    if (name.size() < p.size() || name.compare(name.size() - p.size(), p.size(), p) != 0) continue;
    const std::string mirror = name.substr(0, name.size() - p.size()) + m;
    CAPTURE(mirror);
    REQUIRE(f.tensors.count(mirror) == 1);
    const auto& u = f.tensors.at(mirror).data;
    REQUIRE(u.size() == t.data.size());
    CHECK(std::memcmp(u.data(), t.data.data(), u.size() * sizeof(float)) == 0);
    ++pairs;
  }
  REQUIRE(pairs >= 1);
  return pairs;
}

std::vector<std::string> layout(const std::string& strategy, int stages, int replicas) {
  std::vector<std::string> s = {"distributed.strategy=" + strategy,
                                "distributed.world_size=" + std::to_string(stages * replicas)};
  if (stages > 1)
    s.insert(s.end(), {"distributed.pipeline.stages=" + std::to_string(stages),
                       "distributed.pipeline.micro_batches=2"});
  return s;
}

// a, then b (config overrides).
std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Case {
  std::string strategy;
  int stages, replicas;
};

std::string case_name(const Case& c) {
  return c.strategy + "-pp" + std::to_string(c.stages) + "-dp" + std::to_string(c.replicas);
}

// Trains case c for 20 steps (replicas of batch 4; batch 8 on one replica) with `extra`
// overrides in dir/<case name>, checks its copies are equal and its layout, and returns the
// relative difference of its checkpoint from the one-process run ref8 (2 replicas or 1) or
// ref12 (3 replicas).
double train_case(const std::string& cfg, const TempDir& dir, const Case& c,
                  const std::vector<std::string>& extra, const std::string& ref8,
                  const std::string& ref12) {
  const std::string name = case_name(c);
  std::vector<std::string> sets = with(layout(c.strategy, c.stages, c.replicas), extra);
  if (c.replicas == 1) sets.push_back("data.batch_size=8");
  const auto s = train_yaml(cfg, dir / name, sets);
  CHECK(s["layout"] == nlohmann::json({{"dp", c.replicas}, {"pp", c.stages}, {"tp", 1}}));
  const std::string got = as_file(dir / name, 20);
  check_copies_equal(got);
  return checkpoint_rel_diff(got, c.replicas == 3 ? ref12 : ref8);
}

}  // namespace

TEST_CASE(
    "tied GPT: zero2, fsdp at W = 2, 3 and pipelines under every strategy equal one process") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  const std::string cfg = gpt_cfg(dir);
  // One process with each global batch: 2 or 3 replicas of 4. Three stages have one between
  // the embedding's and the head's, which joins the tie's all-reduce with zeros.
  train_yaml(cfg, dir / "ref8", {"data.batch_size=8"});
  train_yaml(cfg, dir / "ref12", {"data.batch_size=12"});
  const std::string ref8 = as_file(dir / "ref8", 20), ref12 = as_file(dir / "ref12", 20);
  CHECK(check_copies_equal(ref8) == 3);  // the parameters, exp_avg, exp_avg_sq
  for (const Case& c :
       {Case{"zero2", 1, 2}, Case{"fsdp", 1, 2}, Case{"zero2", 1, 3}, Case{"fsdp", 1, 3},
        Case{"ddp", 2, 1}, Case{"ddp", 2, 2}, Case{"zero1", 2, 2}, Case{"zero2", 2, 2},
        Case{"fsdp", 2, 2}, Case{"fsdp", 3, 2}}) {
    const std::string name = case_name(c);
    CAPTURE(name);
    const double rel = train_case(cfg, dir, c, {}, ref8, ref12);
    MESSAGE(name << ": " << rel << " from one process with the global batch");
    CHECK(rel < 1e-5);
  }
}

TEST_CASE("tied GPT: local_sgd keeps the copies equal, and H = 1 on pp2 x dp2 is ddp's update") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  const std::string cfg = gpt_cfg(dir);
  // Plain SGD: averaging the parameters after every step is averaging the gradients.
  const std::vector<std::string> sgd = {"optimizer.type=sgd", "optimizer.lr=0.5",
                                        "optimizer.weight_decay=0"};
  train_yaml(cfg, dir / "ddp", with(layout("ddp", 2, 2), sgd));
  train_yaml(cfg, dir / "local",
             with(with(layout("local_sgd", 2, 2), sgd), {"distributed.local_sgd.sync_every=1"}));
  const std::string local = as_file(dir / "local", 20);
  check_copies_equal(local);
  const double rel = checkpoint_rel_diff(local, as_file(dir / "ddp", 20));
  MESSAGE("local_sgd pp2 x dp2 H=1: " << rel << " from ddp's run");
  CHECK(rel < 1e-5);
  // Three replicas average in the ring, where an element's summation order depends on its
  // position: the copies stay equal only because each is averaged as a piece of its own. Then
  // AdamW with its state averaged too, and compression (the tie moves by the primary's average).
  train_yaml(
      cfg, dir / "w3",
      {"distributed.strategy=local_sgd", "distributed.world_size=3",
       "distributed.local_sgd.sync_every=2", "distributed.local_sgd.sync_optimizer_state=true"});
  check_copies_equal(as_file(dir / "w3", 20));
  train_yaml(cfg, dir / "pp2dp3",
             with(layout("local_sgd", 2, 3),
                  {"distributed.local_sgd.sync_every=3", "distributed.local_sgd.outer_lr=0.7"}));
  check_copies_equal(as_file(dir / "pp2dp3", 20));
  train_yaml(cfg, dir / "topk",
             {"distributed.strategy=local_sgd", "distributed.world_size=2",
              "distributed.local_sgd.sync_every=2", "distributed.compression.type=topk"});
  check_copies_equal(as_file(dir / "topk", 20));
}

// The parameters of a one-step run's checkpoint, by name (optimizer state left out).
std::map<std::string, std::vector<float>> params_after_one_step(const std::string& cfg,
                                                                const std::string& out,
                                                                std::vector<std::string> sets) {
  sets.insert(sets.end(), {"train.max_steps=1", "optimizer.type=sgd", "optimizer.momentum=0",
                           "optimizer.weight_decay=0", "data.batch_size=8"});
  train_yaml(cfg, out, sets);
  std::map<std::string, std::vector<float>> p;
  for (auto& [name, t] : read_safetensors(as_file(out, 1)).tensors)
    if (name.rfind("optim.", 0) != 0) p[name] = t.data;
  return p;
}

TEST_CASE("tied GPT: one process's clipping norm counts the tied tensor once") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  const std::string cfg = gpt_cfg(dir);
  // One plain SGD step from the initial parameters p0: lr 1 gives p1 = p0 - g, lr 2 gives
  // p2 = p0 - 2 g, so g = p1 - p2.
  const auto p1 = params_after_one_step(cfg, dir / "lr1", {"optimizer.lr=1"});
  const auto p2 = params_after_one_step(cfg, dir / "lr2", {"optimizer.lr=2"});
  // The global norm PyTorch's clip_grad_norm_ takes over nanoGPT's parameters, where the tied
  // tensor is one parameter: every tensor but the lm_head copy (which holds the same gradient).
  double unique_sq = 0.0, tied_sq = 0.0;
  for (const auto& [name, v] : p1) {
    double sq = 0.0;
    for (size_t i = 0; i < v.size(); ++i) {
      const double g = static_cast<double>(v[i]) - p2.at(name)[i];
      sq += g * g;
    }
    if (name == "lm_head.weight") {
      tied_sq = sq;
    } else {
      unique_sq += sq;
    }
  }
  const double norm = std::sqrt(unique_sq);
  MESSAGE("gradient norm " << norm << ", the tied tensor's " << std::sqrt(tied_sq));
  REQUIRE(tied_sq > 0.1 * unique_sq);  // counting it twice would show
  // Clipping at half that norm halves the step: pc = p0 - g / 2 = p1 + g / 2.
  const auto pc = params_after_one_step(
      cfg, dir / "clip",
      {"optimizer.lr=1", "optimizer.clip_grad_norm=" + std::to_string(norm / 2)});
  double off_sq = 0.0;
  for (const auto& [name, v] : p1)
    for (size_t i = 0; i < v.size(); ++i) {
      const double g = static_cast<double>(v[i]) - p2.at(name)[i];
      const double d = v[i] + g / 2 - pc.at(name)[i];
      off_sq += d * d;
    }
  const double rel = std::sqrt(off_sq) / norm;
  MESSAGE("clipped step off p1 + g / 2 by " << rel << " of |g|");
  CHECK(rel < 1e-3);
}

TEST_CASE("tied GPT: clipping counts the tied tensor once under pipelines and shards") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  const std::string cfg = gpt_cfg(dir);
  // SGD with momentum: its update scales with the clipping factor (Adam's nearly would not), so a
  // norm that counts the tied tensor twice shows.
  const std::vector<std::string> clip = {"optimizer.type=sgd", "optimizer.lr=0.5",
                                         "optimizer.momentum=0.9", "optimizer.weight_decay=0",
                                         "optimizer.clip_grad_norm=0.2"};
  train_yaml(cfg, dir / "ref8", with(clip, {"data.batch_size=8"}));
  train_yaml(cfg, dir / "ref12", with(clip, {"data.batch_size=12"}));
  const std::string ref8 = as_file(dir / "ref8", 20), ref12 = as_file(dir / "ref12", 20);
  // Clipping is active: without it one process trains something else.
  train_yaml(cfg, dir / "unclipped",
             with(clip, {"data.batch_size=8", "optimizer.clip_grad_norm=0"}));
  CHECK(checkpoint_rel_diff(as_file(dir / "unclipped", 20), ref8) > 1e-2);
  for (const Case& c : {Case{"ddp", 2, 1}, Case{"zero2", 2, 2}, Case{"fsdp", 1, 3}}) {
    const std::string name = case_name(c);
    CAPTURE(name);
    const double rel = train_case(cfg, dir, c, clip, ref8, ref12);
    MESSAGE(name << " clipped: " << rel << " from one process");
    CHECK(rel < 1e-5);
  }
}

TEST_CASE("tied GPT: checkpoints resume across layouts, and an untied checkpoint is refused") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  const std::string cfg = gpt_cfg(dir);
  const std::vector<std::string> every8 = {"train.checkpoint.every_steps=8"};
  // Global batch 8 everywhere: one process uninterrupted is the reference.
  train_yaml(cfg, dir / "ref", with({"data.batch_size=8"}, every8));
  struct Resume {
    std::string name;
    std::vector<std::string> from, to;
  };
  const std::vector<Resume> cases = {
      {"zero2 dp2 to pp2 x dp1", layout("zero2", 1, 2),
       with(layout("ddp", 2, 1), {"data.batch_size=8"})},
      {"fsdp pp2 x dp2 to 1 rank", layout("fsdp", 2, 2), {"data.batch_size=8"}},
      {"1 rank to zero2 pp2 x dp2", {"data.batch_size=8"}, layout("zero2", 2, 2)},
  };
  int k = 0;
  for (const Resume& c : cases) {
    CAPTURE(c.name);
    const std::string a = dir / ("a" + std::to_string(k)), b = dir / ("b" + std::to_string(k));
    ++k;
    train_yaml(cfg, a, with(with(c.from, every8), {"train.max_steps=8"}));
    check_copies_equal(as_file(a, 8));
    const auto s = train_yaml(cfg, b, with(c.to, every8), a + "/checkpoints");
    CHECK(s["steps_this_run"] == 12);
    const std::string got = as_file(b, 20);
    check_copies_equal(got);
    const double rel = checkpoint_rel_diff(got, as_file(dir / "ref", 20));
    MESSAGE(c.name << ": " << rel << " from one process uninterrupted");
    CHECK(rel < 1e-5);
  }
  // An untied model's checkpoint has two different tensors: a tied run refuses to resume it.
  train_yaml(cfg, dir / "untied", {"model.tie_embeddings=false", "train.max_steps=2"});
  CHECK_THROWS_WITH_AS(train_yaml(cfg, dir / "tied", {}, dir / "untied/checkpoints"),
                       doctest::Contains("lm_head.weight differs from transformer.wte.weight"),
                       UserError);
}
