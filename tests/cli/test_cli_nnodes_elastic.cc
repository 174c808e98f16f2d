// `dtrain launch --nnodes MIN:MAX`: bad ranges and node ids are one clear line, exit 2, before
// anything starts (the elastic run itself: tests/cli/netns_elastic_test.sh); torchrun's
// PET_NPROC_PER_NODE forms.
#include <doctest/doctest.h>

#include <string>

#include "launch/launcher.h"
#include "test_util.h"

using dtrain::testing::contains;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;

}  // namespace

TEST_CASE("elastic nodes: bad --nnodes ranges and node ids are refused with exit 2") {
  TempDir dir;
  const std::string cfg = std::string(DTRAIN_SOURCE_DIR) + "/configs/smoke.yaml";
  const std::string rest = " --nproc-per-node 1 --master-addr 10.0.0.1 --master-port 29500 " + cfg +
                           " --out " + dir / "x";
  // --last-call out of range is refused with fixed nodes too (it ran, ignoring it).
  for (const char* v : {"-1", "nan", "inf", "1e300"}) {
    const auto lc =
        run_cmd(kBin + " launch --nproc 1 --last-call " + v + " " + cfg + " --out " + dir / "lc");
    CHECK(lc.exit_code == 2);
    CHECK_MESSAGE(contains(lc.output, "--last-call: must be between 0 and 1e7 seconds"), lc.output);
  }
  auto r = run_cmd("DTRAIN_JOB_TOKEN=t " + kBin + " launch --nnodes 3:2 --node-rank 0" + rest);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "--nnodes '3:2': need 1 <= MIN <= MAX <= 1024"));
  r = run_cmd("DTRAIN_JOB_TOKEN=t " + kBin + " launch --nnodes 0:2 --node-rank 0" + rest);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "--nnodes '0:2': need 1 <= MIN <= MAX <= 1024"));
  r = run_cmd("DTRAIN_JOB_TOKEN=t " + kBin + " launch --nnodes 1:2 --node-rank 2" + rest);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output,
                 "--node-rank 2 with --nnodes 1:2: a node's id must be below the "
                 "maximum node count 2"));
  r = run_cmd("DTRAIN_JOB_TOKEN=t " + kBin + " launch --nnodes 1:x --node-rank 0" + rest);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "--nnodes '1:x'"));
  // A pipeline's global batch is not ranks x batch: refused as for --nproc MIN:MAX.
  r = run_cmd("DTRAIN_JOB_TOKEN=t " + kBin + " launch --nnodes 1:2 --node-rank 0" + rest +
              " --set distributed.strategy=pipeline");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "--nnodes 1:2 (elastic restarts) needs a data-parallel strategy"));
  // Every node count a restart may run on is laid out up front: 3 nodes of 2 ranks hold no whole
  // cell of tensor parallelism 4 (it trained, then ended at such a restart).
  r = run_cmd("DTRAIN_JOB_TOKEN=t " + kBin +
              " launch --nnodes 2:4 --node-rank 0 --nproc-per-node 2 --master-addr 10.0.0.1 "
              "--master-port 29500 " DTRAIN_SOURCE_DIR "/configs/gpt_tp.yaml --out " +
              dir / "tp" + " --set distributed.tensor_parallel.size=4");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output,
                         "--nnodes 2:4: a restart on 6 rank(s) could not lay out its "
                         "rank grid"),
                r.output);
  // The multi-node rules hold for the elastic form too: the master address is needed.
  r = run_cmd("DTRAIN_JOB_TOKEN=t " + kBin + " launch --nnodes 1:2 --node-rank 0 " +
              "--nproc-per-node 1 --master-port 29500 " + cfg + " --out " + dir / "y");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "give --master-addr"));
}

TEST_CASE("dtrain launch reads torchrun's PET_NPROC_PER_NODE forms: auto and cpu, gpu refused") {
  TempDir dir;
  const std::string cfg = std::string(DTRAIN_SOURCE_DIR) + "/configs/smoke.yaml";
  auto r = run_cmd("PET_NPROC_PER_NODE=gpu " + kBin + " launch " + cfg + " --out " + dir / "g");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "PET_NPROC_PER_NODE=gpu: dtrain trains on CPUs"), r.output);
  // "cpu": --nproc's count (default 2); before, "is not an integer".
  r = run_cmd("PET_NPROC_PER_NODE=cpu " + kBin + " launch " + cfg + " --out " + dir / "c" +
              " --set train.max_steps=2 --set train.epochs=0");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output, "rank(s) finished"));
  // An explicit --nproc wins over the variable, as every flag does (3 ranks were started).
  r = run_cmd("PET_NNODES=1 PET_NPROC_PER_NODE=3 " + kBin + " launch --nproc 2 " + cfg + " --out " +
              dir / "n" + " --set train.max_steps=2 --set train.epochs=0");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(dtrain::testing::read_text(dir / "n/summary.json"), "\"world_size\": 2"));
}

TEST_CASE("node 0's launcher at a --master-addr of another host says so before it waits") {
  // A second machine's launcher started without --node-rank (default 0) took node 0's place and
  // both waited out the check-in (300 s), then blamed node 1 for not checking in.
  TempDir dir;
  const std::string cfg = std::string(DTRAIN_SOURCE_DIR) + "/configs/smoke.yaml";
  const auto r =
      run_cmd("DTRAIN_JOB_TOKEN=t timeout -s TERM 3 " + kBin +
              " launch --nnodes 2 --nproc-per-node 1 --master-addr 192.0.2.1 "
              "--master-port " +
              std::to_string(dtrain::pick_free_port()) + " " + cfg + " --out " + dir / "x");
  CHECK_MESSAGE(contains(r.output,
                         "MASTER_ADDR '192.0.2.1' (192.0.2.1) is not an address of "
                         "this host"),
                r.output);
  CHECK(contains(r.output, "is this another node whose --node-rank (default 0) was left out?"));
}
