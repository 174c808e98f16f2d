// `dtrain launch --max-restarts`: what a restart starts from. A job warm-started from another
// folder's checkpoint restarts from it again before its own first checkpoint; a config file edited
// while the job runs does not reach its restarts; a rank 0 restarted by hand during the rendezvous
// is joined again.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "cli/cli_util.h"
#include "launch/launcher.h"
#include "test_util.h"

using dtrain::testing::check_same_state;
using dtrain::testing::Child;
using dtrain::testing::contains;
using dtrain::testing::kRestartCfg;
using dtrain::testing::latest_run_state;
using dtrain::testing::read_text;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;
using dtrain::testing::wait_until;

namespace {

const std::string kBin = DTRAIN_BIN;

// `dtrain ARGS`, which must succeed (the runs the restarted ones are compared with).
void dtrain_ok(const std::string& args) {
  const auto r = run_cmd(kBin + " " + args + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
}

}  // namespace

TEST_CASE("a warm-started job restarts from its --resume checkpoint before its own first one") {
  // Before, rank 0 of the restart refused "--resume names a checkpoint of another folder" (the
  // failed attempt had written metrics.jsonl), and the launch ended with exit 2.
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kRestartCfg);
  dtrain_ok("run " + cfg + " --out " + dir / "base" + " --set train.max_steps=10");
  const std::string warm = " --resume " + dir / "base/checkpoints/step-10.safetensors";
  dtrain_ok("launch --nproc 2 " + cfg + warm + " --out " + dir / "straight");
  dtrain_ok("launch --nproc 2 " + cfg + warm + " --out " + dir / "straight-fsdp" +
            " --set distributed.strategy=fsdp");
  // Rank 1 dies at step 15, before the job's first checkpoint (step 20); or in that checkpoint's
  // save, leaving its shard of step-20/ without a manifest (fsdp), which rank 0 also took for a
  // run already in the folder.
  // Or rank 0 dies in its one-file save after the file, before `latest`: the restart continues
  // from that complete checkpoint (it was taken for a run already in the folder too).
  struct Case {
    std::string fault, set, straight, out;
  };
  for (const Case& k : {Case{"kill:rank=1:step=15", "", "straight", "ft-kill"},
                        Case{"kill_in_save:rank=1:step=20", " --set distributed.strategy=fsdp",
                             "straight-fsdp", "ft-save-fsdp"},
                        Case{"kill_in_save:rank=0:step=20", "", "straight", "ft-save-rank0"}}) {
    CAPTURE(k.fault);
    const auto r =
        run_cmd("DTRAIN_FAULT=" + k.fault + " " + kBin + " launch --nproc 2 --max-restarts 1 " +
                cfg + warm + " --out " + dir / k.out + k.set + " --log-level info");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(contains(r.output, "restart 1 of 1: rank "));
    check_same_state(latest_run_state(kBin, dir / k.straight), latest_run_state(kBin, dir / k.out),
                     "warm start, restarted");
  }
}

TEST_CASE("a warm start from a run folder whose latest moves restarts from the same checkpoint") {
  // The restart resolved "--resume SRC" again: SRC's `latest` had moved on (a run still
  // training), and the job continued from another checkpoint than its first attempt's.
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kRestartCfg);
  const std::string src = dir / "src";
  dtrain_ok("run " + cfg + " --out " + src + " --set train.max_steps=20");
  dir.write("src/checkpoints/latest", "step-10.safetensors\n");
  dtrain_ok("launch --nproc 2 " + cfg + " --resume " + src + "/checkpoints/step-10.safetensors" +
            " --out " + dir / "straight");
  Child c("DTRAIN_FAULT=delay:rank=1:ms=200,kill:rank=1:step=18 exec " + kBin +
              " launch --nproc 2 --max-restarts 1 " + cfg + " --resume " + src + " --out " +
              dir / "ws" + " --log-level info",
          dir / "log");
  REQUIRE(wait_until(
      [&] { return contains(read_text(dir / "ws/logs/rank-0.log"), "resumed from"); }, 60));
  dir.write("src/checkpoints/latest", "step-20.safetensors\n");  // SRC's run went on
  const int rc = c.wait(120);
  INFO(read_text(dir / "log"));
  REQUIRE(rc == 0);
  check_same_state(latest_run_state(kBin, dir / "straight"), latest_run_state(kBin, dir / "ws"),
                   "warm start from a moving folder, restarted");
}

TEST_CASE("a job resumed from its own folder by name restarts from it, deleting nothing") {
  // "--resume RUN" names RUN's own latest checkpoint: a first version of the warm-start restart
  // took it for another folder's and cleared RUN, checkpoints and all (a review found it).
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kRestartCfg);
  const std::string run = dir / "run";
  dtrain_ok("launch --nproc 2 " + cfg + " --out " + run + " --set train.max_steps=10");
  dtrain_ok("launch --nproc 2 " + cfg + " --out " + dir / "straight" + " --resume " + run +
            "/checkpoints/step-10.safetensors");
  const auto r =
      run_cmd("DTRAIN_FAULT=kill:rank=1:step=15 " + kBin + " launch --nproc 2 --max-restarts 1 " +
              cfg + " --out " + run + " --resume " + run + " --log-level info");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(std::filesystem::exists(run + "/checkpoints/step-10.safetensors"));
  check_same_state(latest_run_state(kBin, dir / "straight"), latest_run_state(kBin, run),
                   "resumed from its own folder, restarted");
}

TEST_CASE("a restart runs the config as launched, not the file as edited since") {
  // Before, the restart read the edited file: it continued under lr 0.05 (a warning listed the
  // changed key), or failed on a half-saved file, spending the restart budget.
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kRestartCfg);
  dtrain_ok("launch --nproc 2 " + cfg + " --out " + dir / "straight");
  // Rank 1 takes 200 ms a step and dies at step 28: the file is edited after the step-10
  // checkpoint, some 3.6 s before.
  Child c("DTRAIN_FAULT=delay:rank=1:ms=200,kill:rank=1:step=28 exec " + kBin +
              " launch --nproc 2 --max-restarts 1 " + cfg + " --out " + dir / "ed" +
              " --log-level info",
          dir / "log");
  REQUIRE(wait_until(
      [&] { return std::filesystem::exists(dir / "ed/checkpoints/step-10.safetensors"); }, 60));
  std::string text = kRestartCfg;
  text.replace(text.find("lr: 0.01"), 8, "lr: 0.05");
  dir.write("c.yaml", text + "train: [half-saved\n");
  const int rc = c.wait(120);
  const std::string log = read_text(dir / "log");
  INFO(log);
  REQUIRE(rc == 0);
  CHECK(contains(log, "has changed since the launch"));
  CHECK_FALSE(contains(log, "under a changed config"));
  check_same_state(latest_run_state(kBin, dir / "straight"), latest_run_state(kBin, dir / "ed"),
                   "edited config, restarted");
}

TEST_CASE("a rank 0 restarted by hand during the rendezvous: the ranks that joined join again") {
  // Rank 1 had joined the first rank 0's store; the second rank 0's never saw it, and after the
  // rendezvous timeout every rank (rank 1 too) failed with "rank 1 never joined".
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", R"(seed: 3
model: {hidden: [8]}
data: {format: synthetic, synthetic: {samples: 200, features: 4, classes: 2}, batch_size: 8}
optimizer: {type: sgd, lr: 0.05}
train: {epochs: 0, max_steps: 20}
distributed: {backend: grpc, world_size: 3, timeout_s: 30, rendezvous_timeout_s: 30}
runtime: {threads: 1}
)");
  const int port = dtrain::pick_free_port();
  const auto env = [&](int r) {
    return "RANK=" + std::to_string(r) +
           " WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
           " DTRAIN_JOB_TOKEN=tok ";
  };
  const auto rank = [&](int r, const std::string& log) {
    return env(r) + kBin + " run " + cfg + " --out " + dir / "out" + " > " + dir / log + " 2>&1";
  };
  // Rank 1 joins the first rank 0 (killed 2 s later, once rank 1's join is in), then a second
  // rank 0 and rank 2 start.
  const std::string script = rank(1, "r1.log") + " & p1=$!; sleep 0.5; " + rank(0, "r0a.log") +
                             " & p0=$!; sleep 2; kill -9 $p0; wait $p0; " + rank(0, "r0b.log") +
                             " & p0=$!; sleep 0.5; " + rank(2, "r2.log") +
                             "; rc2=$?; wait $p0; rc0=$?; wait $p1; rc1=$?; "
                             "echo rc0=$rc0 rc1=$rc1 rc2=$rc2";
  const auto r = run_cmd("bash -c '" + script + "'");
  INFO(r.output, "\nrank 1:\n", read_text(dir / "r1.log"), "\nrank 0:\n",
       read_text(dir / "r0b.log"));
  CHECK(contains(r.output, "rc0=0 rc1=0 rc2=0"));
  CHECK(contains(read_text(dir / "r1.log"), "is a new one (rank 0 restarted): joining it again"));
}

TEST_CASE("a restart after the binary was removed starts the ranks from the launcher's own") {
  // A package upgrade or a cleaned build folder between the start and a restart: the restart
  // failed ("cannot start rank 0 (...): No such file or directory", exit 1).
  TempDir dir;
  const std::string bin = dir / "dtrain-copy";
  std::filesystem::copy_file(kBin, bin);
  std::filesystem::permissions(bin, std::filesystem::perms::owner_all);
  const std::string log = dir / "log";
  Child c("DTRAIN_FAULT=kill:rank=1:step=2500 exec " + bin +
              " launch --nproc 2 --max-restarts 1 " DTRAIN_SOURCE_DIR
              "/configs/smoke.yaml --set train.epochs=60 --set train.checkpoint.every_steps=1000 "
              "--out " +
              dir / "r",
          log);
  REQUIRE(wait_until([&] { return contains(read_text(log), "step 100 "); }, 60));
  std::filesystem::remove(bin);
  CHECK_MESSAGE(c.wait(120) == 0, read_text(log));
  CHECK(contains(read_text(log), bin + " was removed since this launcher started"));
  CHECK(contains(read_text(log), "restart 1 of 1"));
}
