// Tensor parallelism in training (distributed.tensor_parallel): 20 steps of a tiny tied GPT on a
// slice of the Jargon File at TP 2 and TP 4 alone, TP 2 x DP 2 under ddp, zero1, zero2 and fsdp,
// TP 2 x PP 2 and TP 2 x DP 2 x PP 2 end where one process with the same global batch ends
// (1e-5 of the weights; SGD with momentum, gradient clipping that binds, dropout); checkpoints
// written at one layout resume at another; and the configurations that cannot run are refused.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "test_util.h"
#include "train/real_data.h"
#include "train/train_test_util.h"
#include "util/check.h"
#include "util/fault.h"

using namespace dtrain;
using dtrain::testing::as_file;
using dtrain::testing::checkpoint_rel_diff;
using dtrain::testing::TempDir;
using dtrain::testing::train_yaml;

namespace {

// tiny_gpt_cfg with 4 heads (TP 4 owns one each), SGD with momentum (Adam would amplify the
// summation-order noise), dropout 0.1 and a clipping norm that binds at every step (the
// gradient norm of this model starts near 1.3).
std::string tp_cfg(const std::string& text) {
  return testing::tiny_gpt_cfg(text, true);
}
const std::vector<std::string> kBase = {"model.n_head=4",
                                        "model.dropout=0.1",
                                        "optimizer.type=sgd",
                                        "optimizer.lr=0.05",
                                        "optimizer.momentum=0.9",
                                        "optimizer.weight_decay=0",
                                        "optimizer.clip_grad_norm=0.5",
                                        "train.log_every=20"};

std::vector<std::string> layout(int tp, int dp, int pp, const std::string& strategy = "ddp") {
  std::vector<std::string> s = kBase;
  s.insert(s.end(),
           {"distributed.tensor_parallel.size=" + std::to_string(tp),
            "distributed.world_size=" + std::to_string(tp * dp * pp),
            "distributed.strategy=" + strategy, "data.batch_size=" + std::to_string(24 / dp)});
  if (pp > 1)
    s.insert(s.end(), {"distributed.pipeline.stages=" + std::to_string(pp),
                       "distributed.pipeline.micro_batches=2"});
  return s;
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Fixture {
  TempDir dir;
  std::string cfg, ref;
  bool ok = false;
  Fixture() {
    spdlog::set_level(spdlog::level::warn);
    const std::string text = dir / "jargon.txt";
    ok = testing::write_jargon_slice(text, testing::kJargonSliceBytes);
    if (!ok) return;
    cfg = tp_cfg(text);
    train_yaml(cfg, dir / "ref", layout(1, 1, 1));
    ref = as_file(dir / "ref", 20);
  }
  // Trains the layout into dir/name; returns its checkpoint's difference from the reference.
  double diff(const std::string& name, int tp, int dp, int pp, const std::string& strategy) {
    const auto s = train_yaml(cfg, dir / name, layout(tp, dp, pp, strategy));
    CHECK(s["layout"] == nlohmann::json({{"dp", dp}, {"pp", pp}, {"tp", tp}}));
    CHECK(s["steps"] == 20);
    const double d = checkpoint_rel_diff(as_file(dir / name, 20), ref);
    MESSAGE(name << " rel diff " << d);
    return d;
  }
};

}  // namespace

TEST_CASE(
    "tensor parallel: TP 2 and TP 4 alone, and TP 2 x DP 2 under every strategy, equal one "
    "process") {
  Fixture f;
  if (!f.ok) {
    MESSAGE("jargon-text not installed: skipped");
    return;
  }
  // The reference's loss record, to check the tensor-parallel runs report the same loss.
  for (const auto& [name, tp, dp, strategy] :
       std::vector<std::tuple<std::string, int, int, std::string>>{
           {"tp2", 2, 1, "ddp"},
           {"tp4", 4, 1, "ddp"},
           {"tp2-dp2-ddp", 2, 2, "ddp"},
           {"tp2-dp2-zero1", 2, 2, "zero1"},
           {"tp2-dp2-zero2", 2, 2, "zero2"},
           {"tp2-dp2-fsdp", 2, 2, "fsdp"}}) {
    CAPTURE(name);
    CHECK(f.diff(name, tp, dp, 1, strategy) < 1e-5);
  }
}

TEST_CASE("tensor parallel: TP 2 x PP 2 and TP 2 x DP 2 x PP 2 (8 ranks) equal one process") {
  Fixture f;
  if (!f.ok) return;
  CHECK(f.diff("tp2-pp2", 2, 1, 2, "ddp") < 1e-5);
  CHECK(f.diff("tp2-dp2-pp2", 2, 2, 2, "ddp") < 1e-5);
}

TEST_CASE("tensor parallel: the loss and evaluation are the one process's") {
  Fixture f;
  if (!f.ok) return;
  const auto ref = train_yaml(f.cfg, f.dir / "ref-eval", layout(1, 1, 1));
  const auto tp = train_yaml(f.cfg, f.dir / "tp2-eval", layout(2, 1, 1));
  const auto tpdp = train_yaml(f.cfg, f.dir / "tp2-dp2-eval", layout(2, 2, 1, "fsdp"));
  // Per-rank memory: 4 ranks, each holding half of the blocks' sharded tensors (fsdp: and a
  // half of that); the whole model's parameter count.
  CHECK(tp["param_count"] == ref["param_count"]);
  REQUIRE(tpdp["memory_per_rank"].size() == 4);
  for (const auto& m : tpdp["memory_per_rank"]) {
    CHECK(m["param_bytes"].get<int64_t>() < ref["param_bytes"].get<int64_t>() / 2);
    CHECK(m["activation_bytes"].get<int64_t>() > 0);
    CHECK(m["activation_bytes"].get<int64_t>() < ref["activation_bytes"].get<int64_t>());
  }
  for (const auto* s : {&tp, &tpdp}) {
    CHECK((*s)["final_train_loss"].get<double>() ==
          doctest::Approx(ref["final_train_loss"].get<double>()).epsilon(1e-5));
    CHECK((*s)["test_loss"].get<double>() ==
          doctest::Approx(ref["test_loss"].get<double>()).epsilon(1e-5));
  }
}

TEST_CASE("tensor parallel: a checkpoint saved at TP 2 x PP 2 resumes at TP 1 and TP 4") {
  Fixture f;
  if (!f.ok) return;
  // The run that continues at the saved layout; checkpoints at step 10 and 20.
  const auto every10 = std::vector<std::string>{"train.checkpoint.every_steps=10"};
  train_yaml(f.cfg, f.dir / "saved", with(layout(2, 1, 2), every10));
  const std::filesystem::path ckpts = std::filesystem::path(f.dir / "saved") / "checkpoints";
  const std::string mid = (ckpts / sharded_checkpoint_name(10)).string();
  REQUIRE(std::filesystem::exists(mid + "/manifest.json"));
  // The manifest describes the shards by dimension and offset.
  const auto manifest = nlohmann::json::parse(std::ifstream(mid + "/manifest.json"));
  CHECK(manifest.dump().find("\"kind\":\"row\"") != std::string::npos);
  const std::string cont = as_file(f.dir / "saved", 20);
  CHECK(checkpoint_rel_diff(cont, f.ref) < 1e-5);
  for (const auto& [name, tp] : std::vector<std::pair<std::string, int>>{{"tp1", 1}, {"tp4", 4}}) {
    CAPTURE(name);
    train_yaml(f.cfg, f.dir / name, layout(tp, 1, 1), mid);
    CHECK(checkpoint_rel_diff(as_file(f.dir / name, 20), cont) < 1e-5);
  }
  // The consolidated file is the ordinary nanoGPT-named one, equal to one process's.
  const std::string out = f.dir / "consolidated.safetensors";
  const ConsolidatedCheckpoint c =
      consolidate_checkpoint((ckpts / sharded_checkpoint_name(20)).string(), out);
  CHECK(checkpoint_rel_diff(out, f.ref) < 1e-5);
  // The writer is named by its grid (it was "ddp checkpoint of 4 rank(s)").
  CHECK(describe_writer(c) == "pipeline of 2 stages x tensor parallel 2, 4 rank(s)");
  // Two ranges' offsets swapped in the manifest (and its checksum dropped): each shard's header
  // holds the ranges the manifest lists for it, global under tensor parallelism too, so the
  // values are not loaded into each other's places (they were, with exit 0, before).
  const std::filesystem::path edited = f.dir / "edited";
  std::filesystem::copy(mid, edited);
  auto m = nlohmann::json::parse(std::ifstream(edited / "manifest.json"));
  bool swapped = false;
  for (auto& sh : m["shards"]) {
    auto& rs = sh["ranges"];
    if (swapped || rs.size() < 2) continue;
    std::swap(rs[0][2], rs[1][2]);
    swapped = true;
  }
  REQUIRE(swapped);
  m.erase("crc32");
  std::ofstream(edited / "manifest.json", std::ios::trunc) << m.dump(1);
  CHECK_THROWS_WITH_AS(consolidate_checkpoint(edited.string(), f.dir / "edited.safetensors"),
                       doctest::Contains("the manifest says"), UserError);
  // A layout that is no grid of the world size is refused, not described.
  m = nlohmann::json::parse(std::ifstream(mid + "/manifest.json"));
  m["layout"]["dp"] = 3;
  m.erase("crc32");
  std::filesystem::remove_all(edited);
  std::filesystem::copy(mid, edited);
  std::ofstream(edited / "manifest.json", std::ios::trunc) << m.dump(1);
  CHECK_THROWS_WITH_AS(consolidate_checkpoint(edited.string(), f.dir / "edited.safetensors"),
                       doctest::Contains("(dp 3, pp 2, tp 2) is not a grid of its world size 4"),
                       UserError);
}

TEST_CASE("consolidate: the writer is described by its grid") {
  ConsolidatedCheckpoint c;
  c.meta.strategy = "fsdp";
  c.meta.world_size = 4;
  CHECK(describe_writer(c) == "fsdp, 4 rank(s)");  // an older manifest: no grid recorded
  c.dp = 4;
  CHECK(describe_writer(c) == "fsdp over 4 replicas, 4 rank(s)");
  c.dp = 2;
  c.tp = 2;
  CHECK(describe_writer(c) == "fsdp over 2 replicas x tensor parallel 2, 4 rank(s)");
  c.dp = 1;
  c.pp = 2;
  CHECK(describe_writer(c) == "pipeline of 2 stages x tensor parallel 2, 4 rank(s)");
  c.meta.strategy = "pipeline";  // (ddp on the data axis)
  c.dp = 2;
  c.tp = 1;
  CHECK(describe_writer(c) == "ddp over 2 replicas x pipeline of 2 stages, 4 rank(s)");
  c.meta.world_size = 1;
  c.pp = c.tp = 1;
  c.dp = 1;
  c.meta.strategy = "ddp";
  CHECK(describe_writer(c) == "ddp, 1 rank(s)");
}

TEST_CASE("tensor parallel: configurations that cannot run are refused with one clear line") {
  const auto refused = [](const std::string& yaml, const std::vector<std::string>& sets,
                          const std::string& what) {
    CAPTURE(what);
    try {
      parse_config(yaml, "test.yaml", sets);
      FAIL("accepted");
    } catch (const UserError& e) {
      const std::string m = e.what();
      CAPTURE(m);
      CHECK(m.find("distributed.tensor_parallel.size") != std::string::npos);
      CHECK(m.find(what) != std::string::npos);
    }
  };
  const std::string gpt = testing::tiny_gpt_cfg("/dev/null", true);  // n_head 2, n_embd 16
  refused(gpt, {"distributed.tensor_parallel.size=4", "distributed.world_size=4"},
          "does not divide model.n_head 2");
  refused(gpt,
          {"model.n_head=1", "model.n_embd=24", "distributed.tensor_parallel.size=3",
           "distributed.world_size=3"},
          "does not divide model.n_head 1");
  refused(gpt,
          {"model.n_head=6", "model.n_embd=24", "distributed.tensor_parallel.size=3",
           "distributed.world_size=3"},
          "does not divide the vocabulary of 256");
  const std::string mlp = R"(
model: {type: mlp, hidden: [8]}
data: {format: synthetic}
distributed: {world_size: 2, tensor_parallel: {size: 2}}
)";
  refused(mlp, {}, "has no tensor-parallel layers");
  TempDir t;
  const std::string cnn = testing::small_cnn_cfg(t.path());
  refused(cnn, {"distributed.tensor_parallel.size=2", "distributed.world_size=2"},
          "model.type sequential has no tensor-parallel layers");
  // T x stages must divide the world: the rank grid's check, when the world is known.
  for (const auto& sets : std::vector<std::vector<std::string>>{
           {"distributed.tensor_parallel.size=2", "distributed.world_size=3"},
           {"distributed.tensor_parallel.size=2", "distributed.world_size=2",
            "distributed.pipeline.stages=2"}}) {
    try {
      train_yaml(testing::tiny_gpt_cfg(t.write("c.txt", std::string(4000, 'a')), true),
                 t / "bad-world", sets);
      FAIL("accepted");
    } catch (const UserError& e) {
      const std::string m = e.what();
      CAPTURE(m);
      CHECK(m.find("does not divide the world size") != std::string::npos);
      CHECK(m.find("distributed.tensor_parallel.size") != std::string::npos);
    }
  }
}

TEST_CASE("tensor parallel: a non-finite gradient on one tensor rank skips the step everywhere") {
  Fixture f;
  if (!f.ok) return;
  // The same step skipped in one process and at TP 2 x DP 2 (the NaN on tensor rank 1 of
  // replica 1): both end equal, and every rank of the layout skipped it (or the run would hang
  // or the replicas differ).
  const auto run = [&](const std::string& name, int tp, int dp, const std::string& fault) {
    RunOptions o;
    o.out_dir = f.dir / name;
    o.faults = parse_faults(fault, 0);
    const auto s = run_training(
        parse_config(f.cfg, "test.yaml", with(layout(tp, dp, 1), {"train.nonfinite=skip"})), o);
    CHECK(s["skipped_steps"] == 1);
    return as_file(f.dir / name, 20);
  };
  const std::string ref = run("nan-ref", 1, 1, "nan:rank=0:step=7");
  CHECK(checkpoint_rel_diff(run("nan-tp2-dp2", 2, 2, "nan:rank=3:step=7"), ref) < 1e-5);
  CHECK(checkpoint_rel_diff(ref, f.ref) > 1e-3);  // the skip changed the run
}
