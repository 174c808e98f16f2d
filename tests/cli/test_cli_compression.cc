// The real binary with gradient compression and Local SGD over gRPC: bitwise equal to
// in-process ranks (shared memory and streams only), and a rank killed mid-run restarts from the
// last checkpoint -- compression state included -- ending bitwise where an uninterrupted run
// ends, for every compression type.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "test_util.h"

using dtrain::testing::check_same_state;
using dtrain::testing::contains;
using dtrain::testing::kRestartCfg;
using dtrain::testing::read_text;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;

dtrain::StFile latest_state(const std::string& run) {
  return dtrain::testing::latest_run_state(kBin, run);
}

std::string compression_sets(const std::string& type) {
  std::string s = " --set distributed.compression.type=" + type;
  if (type == "topk") s += " --set distributed.compression.ratio=0.05";
  if (type == "powersgd") s += " --set distributed.compression.rank=2";
  return s;
}

}  // namespace

TEST_CASE("gRPC ranks equal in-process ranks over streams only, with compression, Local SGD") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", R"(seed: 5
model: {hidden: [16]}
data:
  format: synthetic
  synthetic: {samples: 500, features: 8, classes: 3}
  batch_size: 10
optimizer: {type: adam, lr: 0.01}
train: {epochs: 0, max_steps: 20}
runtime: {threads: 1}
)");
  struct Case {
    int world;
    std::string sets;
  };
  const std::string streams = " --set distributed.shm=false";
  const std::string local =
      " --set distributed.strategy=local_sgd --set "
      "distributed.local_sgd.sync_every=3";
  const std::vector<Case> cases = {
      {2, streams},
      {3, streams},
      {2, compression_sets("int8")},
      {3, compression_sets("powersgd")},
      {2, compression_sets("topk") + streams},
      {2, local},
      {3, local + " --set distributed.local_sgd.outer_lr=0.7" + streams},
      {2, local + compression_sets("powersgd")},
  };
  for (const auto& c : cases) {
    const std::string w = std::to_string(c.world);
    const std::string tag = "W=" + w + c.sets;
    CAPTURE(tag);
    const std::string grpc = dir / "grpc", inproc = dir / "inproc";
    auto r = run_cmd("rm -rf " + grpc + " " + inproc + "; " + kBin + " launch --nproc " + w + " " +
                     cfg + c.sets + " --out " + grpc + " --log-level debug");
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    // Rank 0's console: the shared-memory path is set up unless distributed.shm is false.
    CHECK(contains(r.output, "shared memory from rank(s)") != contains(c.sets, "shm=false"));
    r = run_cmd(kBin + " run " + cfg + c.sets + " --set distributed.world_size=" + w + " --out " +
                inproc + " --log-level warn");
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    const auto a = latest_state(grpc), b = latest_state(inproc);
    check_same_state(a, b, tag);
    // The compression state (per-rank residuals) is part of what was compared.
    if (contains(c.sets, "compression")) CHECK(a.tensors.count("comp.residual.rank1") == 1);
  }
}

TEST_CASE("a rank killed mid-run with compression restarts and ends as if it had not") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kRestartCfg);
  // DDP with every type; Local SGD (optimizer state averaged, so rank 0's is every rank's).
  std::vector<std::string> cases;
  for (const char* type : {"fp16", "bf16", "int8", "topk", "powersgd"})
    cases.push_back(compression_sets(type));
  cases.push_back(compression_sets("int8") +
                  " --set distributed.strategy=local_sgd --set distributed.local_sgd.sync_every=2"
                  " --set distributed.local_sgd.sync_optimizer_state=true");
  for (const std::string& sets : cases) {
    CAPTURE(sets);
    const std::string straight = dir / "straight", run = dir / "restarted";
    auto r = run_cmd("rm -rf " + straight + " " + run + "; " + kBin + " launch --nproc 2 " + cfg +
                     sets + " --out " + straight + " --log-level warn");
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    // Step 15 lies between the checkpoints of steps 10 and 20: the restart redoes 11..15.
    r = run_cmd("DTRAIN_FAULT=kill:rank=1:step=15 " + kBin + " launch --nproc 2 --max-restarts 1 " +
                cfg + sets + " --out " + run + " --log-level info");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(contains(r.output, "rank 1 failed: killed by signal SIGKILL"));
    CHECK(contains(r.output, "all 2 rank(s) finished after 1 restart(s)"));
    CHECK(contains(r.output, "resumed from " + run + "/checkpoints/step-10"));
    CHECK(contains(r.output, "compression state restored: error-feedback residuals of 2 rank(s)"));
    if (contains(sets, "powersgd")) CHECK(contains(r.output, "PowerSGD's Q and RNG"));
    CHECK(nlohmann::json::parse(read_text(run + "/summary.json"))["steps"] == 30);
    REQUIRE(read_text(run + "/checkpoints/latest") == "step-30.safetensors\n");
    check_same_state(latest_state(run), latest_state(straight), sets);
  }
}

TEST_CASE("fp16 compression's overflow is named, and DiLoCo on one replica is said to be unused") {
  // Gradients above 65504 became inf in transit and the message advised clipping and a lower
  // learning rate (both act after the reduction) or blamed the data's float32 range.
  TempDir dir;
  const std::string cfg = dir.write("f.yaml", R"(seed: 7
model: {type: mlp, hidden: [16, 12, 10]}
data:
  format: synthetic
  synthetic: {samples: 190, features: 8, classes: 3, noise: 200000}
  normalize: none
  batch_size: 12
optimizer: {type: sgd, lr: 1.0e-9}
train: {epochs: 2}
distributed: {world_size: 2, compression: {type: fp16}}
runtime: {threads: 1}
)");
  auto r = run_cmd(kBin + " run " + cfg + " --out " + dir / "a");
  CHECK(r.exit_code == 2);  // at step 1, before any update: the input's, no restart changes it
  CHECK_MESSAGE(contains(r.output, "with distributed.compression fp16 (values up to 65504)"),
                r.output);
  r = run_cmd(kBin + " run " + cfg + " --out " + dir / "b" +
              " --set distributed.compression.type=bf16 --log-level warn");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  // One replica: Local SGD never synchronises, so the outer step never runs (silently before).
  r = run_cmd(kBin + " run " + cfg + " --out " + dir / "c" +
              " --set distributed.compression.type=none --set data.synthetic.noise=1"
              " --set distributed.world_size=1 --set distributed.strategy=local_sgd"
              " --set distributed.local_sgd.outer_lr=0.5 --set train.max_steps=2");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output, "distributed.local_sgd.outer_lr 0.5 is unused"));
  // Said once, not once per pipeline stage (each stage's replica group of one finds it).
  r = run_cmd(kBin + " run " + cfg + " --out " + dir / "d" +
              " --set distributed.compression.type=none --set data.synthetic.noise=1"
              " --set distributed.world_size=2 --set distributed.pipeline.stages=2"
              " --set distributed.strategy=local_sgd --set distributed.local_sgd.outer_lr=0.5"
              " --set train.max_steps=2");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  const std::string said = "distributed.local_sgd.outer_lr 0.5 is unused";
  const size_t first = r.output.find(said);
  CHECK(first != std::string::npos);
  CHECK_MESSAGE(r.output.find(said, first + 1) == std::string::npos, r.output);
}
