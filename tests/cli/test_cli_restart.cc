// `dtrain launch --max-restarts`: what a restart starts from. A job warm-started from another
// folder's checkpoint restarts from it again before its own first checkpoint; a config file edited
// while the job runs does not reach its restarts.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "cli/cli_util.h"
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

}  // namespace

TEST_CASE("a warm-started job restarts from its --resume checkpoint before its own first one") {
  // Before, rank 0 of the restart refused "--resume names a checkpoint of another folder" (the
  // failed attempt had written metrics.jsonl), and the launch ended with exit 2.
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kRestartCfg);
  auto r = run_cmd(kBin + " run " + cfg + " --out " + dir / "base" +
                   " --set train.max_steps=10 --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string warm = " --resume " + dir / "base/checkpoints/step-10.safetensors";
  r = run_cmd(kBin + " launch --nproc 2 " + cfg + warm + " --out " + dir / "straight" +
              " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  // Rank 1 dies at step 15, before the job's first checkpoint (step 20).
  r = run_cmd("DTRAIN_FAULT=kill:rank=1:step=15 " + kBin + " launch --nproc 2 --max-restarts 1 " +
              cfg + warm + " --out " + dir / "ft" + " --log-level info");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.output, "restart 1 of 1: rank "));
  check_same_state(latest_run_state(kBin, dir / "straight"), latest_run_state(kBin, dir / "ft"),
                   "warm start, restarted");
}

TEST_CASE("a job resumed from its own folder by name restarts from it, deleting nothing") {
  // "--resume RUN" names RUN's own latest checkpoint: a first version of the warm-start restart
  // took it for another folder's and cleared RUN, checkpoints and all (a review found it).
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kRestartCfg);
  const std::string run = dir / "run";
  auto r = run_cmd(kBin + " launch --nproc 2 " + cfg + " --out " + run +
                   " --set train.max_steps=10 --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  r = run_cmd(kBin + " launch --nproc 2 " + cfg + " --out " + dir / "straight" + " --resume " +
              run + "/checkpoints/step-10.safetensors --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  r = run_cmd("DTRAIN_FAULT=kill:rank=1:step=15 " + kBin + " launch --nproc 2 --max-restarts 1 " +
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
  auto r = run_cmd(kBin + " launch --nproc 2 " + cfg + " --out " + dir / "straight" +
                   " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
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
