// `dtrain launch --nproc MIN:MAX`: a restart after a rank was killed continues with the ranks
// left, from the sharded checkpoint, keeping the global batch.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

using dtrain::testing::contains;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;

// fsdp, Adam; the global batch 4 x 24 = 96 is also 3 x 32. 20 steps per epoch, a checkpoint
// every 5 steps. lr 0.0025 x 4 replicas (scale_lr linear): a restart on 3 keeps 0.01, not 0.0075.
const char* kElasticCfg = R"(seed: 3
model: {hidden: [32, 32]}
data:
  format: synthetic
  synthetic: {samples: 2400, features: 8, classes: 3}
  batch_size: 24
optimizer: {type: adam, lr: 0.0025, scale_lr: linear}
train: {epochs: 2, checkpoint: {every_steps: 5}}
distributed: {strategy: fsdp}
runtime: {threads: 1}
)";

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read ", path);
  return nlohmann::json::parse(in);
}

double rel_diff(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(a), std::abs(b));
}

}  // namespace

TEST_CASE("elastic launch: a 4-rank fsdp run that loses a rank continues on 3, same global batch") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kElasticCfg);
  auto r = run_cmd(kBin + " run " + cfg + " --set distributed.world_size=4 --out " + dir / "ref" +
                   " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  // Rank 3 is killed after step 12; the newest checkpoint is step 10's.
  r = run_cmd("DTRAIN_FAULT=kill:rank=3:step=12 " + kBin + " launch --nproc 3:4 --max-restarts 1 " +
              cfg + " --out " + dir / "el");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.output, "elastic restart: rank(s) 3 were killed; continuing with 3 rank(s)"));
  CHECK(contains(r.output, "global batch 96 kept: data.batch_size 24 -> 32"));
  CHECK(contains(r.output, "learning rate 0.0025 x 4 replica(s) kept"));
  CHECK(contains(r.output,
                 "restart 1 of 1: rank 3 failed (killed by signal SIGKILL); starting "
                 "all 3 rank(s) again"));

  const auto ref = read_json(dir / "ref/summary.json");
  const auto el = read_json(dir / "el/summary.json");
  CHECK(el["world_size"] == 3);
  CHECK(el["steps"] == ref["steps"]);
  CHECK(el["steps_this_run"] == 30);  // resumed from step 10
  CHECK(contains(el["resumed_from"].get<std::string>(), "step-10"));
  // The global batch: 3 x 32 = 4 x 24.
  const auto ref_cfg = read_json(dir / "ref/config.json");
  const auto el_cfg = read_json(dir / "el/config.json");
  auto global = [](const nlohmann::json& c) {
    return c["data"]["batch_size"].get<int>() * c["distributed"]["world_size"].get<int>() *
           c["train"]["grad_accum_steps"].get<int>();
  };
  CHECK(el_cfg["data"]["batch_size"] == 32);
  CHECK(global(el_cfg) == global(ref_cfg));
  // The same math in another summation order (README "Elastic restarts": 1e-4 relative; the
  // measured difference is about 1e-7).
  CHECK(rel_diff(el["final_train_loss"].get<double>(), ref["final_train_loss"].get<double>()) <
        1e-4);
  CHECK(rel_diff(el["test_loss"].get<double>(), ref["test_loss"].get<double>()) < 1e-4);
}

TEST_CASE("elastic launch under tensor parallelism: whole cells of T ranks, the replicas' batch") {
  // TP 2 x dp 2 loses rank 3: the 3 ranks left hold one cell of 2, so the restart runs 2 ranks
  // (dp 1) with the global batch 2 x 3 = 6. Before, it counted 4 x 3 = 12 ("data.batch_size 3 ->
  // 4") and started 3 ranks, which the rank grid refused.
  TempDir dir;
  std::string text;
  for (int i = 0; i < 400; ++i) text += "line " + std::to_string(i) + ": the quick brown fox.\n";
  const std::string data = dir.write("t.txt", text);
  const std::string cfg = dir.write("g.yaml", R"(seed: 3
model: {type: gpt, n_layer: 2, n_head: 2, n_embd: 16, block_size: 16}
data: {format: text, train: {path: )" + data + R"(}, batch_size: 3}
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 0, max_steps: 12, log_every: 1, checkpoint: {every_steps: 4}}
distributed: {strategy: fsdp, tensor_parallel: {size: 2}}
runtime: {threads: 1}
)");
  auto r = run_cmd(kBin + " run " + cfg + " --set distributed.world_size=4 --out " + dir / "ref" +
                   " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  r = run_cmd("DTRAIN_FAULT=kill:rank=3:step=6 " + kBin + " launch --nproc 2:4 --max-restarts 1 " +
              cfg + " --out " + dir / "el" + " 2>&1");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(
      contains(r.output, "continuing with 2 rank(s) (was 4): the rank grid takes multiples of 2"));
  CHECK(contains(r.output, "global batch 6 kept: data.batch_size 3 -> 6"));
  const auto ref = read_json(dir / "ref/summary.json");
  const auto el = read_json(dir / "el/summary.json");
  CHECK(el["world_size"] == 2);
  CHECK(el["steps"] == 12);
  CHECK(rel_diff(el["final_train_loss"].get<double>(), ref["final_train_loss"].get<double>()) <
        1e-4);
  // 1:2 holds no whole cell below 2 ranks: it was taken, and its first restart gave up.
  r = run_cmd(kBin + " launch --nproc 1:2 --max-restarts 1 " + cfg + " --out " + dir / "one" +
              " 2>&1");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output,
                         "--nproc 1:2: a restart after ranks are lost runs whole "
                         "rank-grid cells of 2 rank(s)"),
                r.output);
}

TEST_CASE("elastic launch: refusals are one clear line") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kElasticCfg);
  // 4 x 32 = 128 cannot be split over 3 ranks: refused before any rank starts, naming the batch
  // (it trained until the first restart, which then ended the job).
  auto r = run_cmd(kBin + " launch --nproc 3:4 --max-restarts 1 " + cfg +
                   " --set data.batch_size=32 --out " + dir / "odd");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output,
                 "error: --nproc 3:4: a restart on 3 rank(s) could not keep the global "
                 "batch, so the job would end there: cannot keep the global batch 128"));
  CHECK_FALSE(std::filesystem::exists(dir / "odd/metrics.jsonl"));
  // Below the minimum: give up.
  r = run_cmd("DTRAIN_FAULT=kill:rank=3:step=12,kill:rank=2:step=12 " + kBin +
              " launch --nproc 3:4 --max-restarts 1 " + cfg + " --out " + dir / "few");
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "2 left, below the minimum 3"));
  // Elastic needs restarts and a data-parallel layout; bad ranges name the flag.
  r = run_cmd(kBin + " launch --nproc 3:4 " + cfg + " --out " + dir / "x");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "give --max-restarts"));
  r = run_cmd(kBin + " launch --nproc 2:4 --max-restarts 1 " + cfg +
              " --set distributed.strategy=pipeline --out " + dir / "x");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "needs a data-parallel strategy"));
  r = run_cmd(kBin + " launch --nproc 4:3 " + cfg + " --out " + dir / "x");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "--nproc '4:3'"));
  // The multi-node flags: --nproc is the single-node form; several nodes need the token.
  r = run_cmd(kBin + " launch --nnodes 2 --node-rank 0 --nproc 2 --master-addr 10.0.0.1 " +
              "--master-port 29500 " + cfg + " --out " + dir / "x");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "give --nproc-per-node"));
  r = run_cmd("env -u DTRAIN_JOB_TOKEN " + kBin +
              " launch --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr 10.0.0.1 " +
              "--master-port 29500 " + cfg + " --out " + dir / "x");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "needs the job token"));
}
