// The project's own scripts/slurm.sbatch, unmodified, submitted with sbatch to a real (private,
// one-node) Slurm cluster: 2 tasks train together, a task killed mid-run fails the job naming its
// rank, and scancel --signal=TERM makes the ranks checkpoint so that --resume auto continues to
// the parameters of a run that was never interrupted. Skipped (77) where Slurm is missing.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engines/engines_util.h"
#include "launch/dist_env.h"
#include "launch/launcher.h"

using dtrain::testing::check_same_state;
using dtrain::testing::contains;
using dtrain::testing::JobEnd;
using dtrain::testing::kSource;
using dtrain::testing::latest_run_state;
using dtrain::testing::read_text;
using dtrain::testing::run_cmd;
using dtrain::testing::SlurmCluster;
using dtrain::testing::TempDir;
using dtrain::testing::wait_until;

namespace {

const std::string kBin = DTRAIN_BIN;
const std::string kSbatch = kSource + "/scripts/slurm.sbatch";
// 2 tasks of 1 CPU on the one node (the script's defaults ask for 2 nodes of 4-CPU tasks).
const std::string kShape = "--nodes=1 --ntasks-per-node=2 --cpus-per-task=1 ";

// The batch script's output and every rank's log, for failure messages.
std::string job_logs(const std::string& submit_dir, long job, const std::string& out) {
  std::string s = "--- slurm-" + std::to_string(job) + ".out\n" +
                  read_text(submit_dir + "/slurm-" + std::to_string(job) + ".out");
  for (int r = 0; r < 2; ++r)
    s += "--- rank " + std::to_string(r) + "\n" +
         read_text(out + "/logs/rank-" + std::to_string(r) + ".log");
  return s;
}

// DTRAIN_BIN, and MASTER_PORT set to a free port (the script's own choice, slurm_default_port of
// the job's step 0, is what the first test checks; here a port another program may hold cannot
// interfere).
std::string free_port_env() {
  return "DTRAIN_BIN=" + kBin + " MASTER_PORT=" + std::to_string(dtrain::pick_free_port()) + " ";
}

// The codes of srun's "Exited with exit code N" reports in `text`.
std::vector<int> exit_codes(const std::string& text) {
  const std::string key = "Exited with exit code ";
  std::vector<int> codes;
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1))
    codes.push_back(std::atoi(text.c_str() + at + key.size()));
  return codes;
}

size_t lines_in(const std::string& path) {
  const std::string t = read_text(path);
  return static_cast<size_t>(std::count(t.begin(), t.end(), '\n'));
}

}  // namespace

TEST_CASE("sbatch scripts/slurm.sbatch: 2 tasks train 2 ranks over gRPC, summary world_size 2") {
  SlurmCluster slurm;
  TempDir dir;
  const std::string out = dir / "run";
  // As README and the script's header say, from the submit folder; DTRAIN_BIN because the
  // submit folder is not the repository.
  const long job =
      slurm.submit(kShape + kSbatch + " " + kSource +
                       "/configs/smoke.yaml --set distributed.backend=grpc --out " + out,
                   dir.path(), "DTRAIN_BIN=" + kBin);
  const JobEnd end = slurm.wait(job, 120);
  const std::string logs = job_logs(dir.path(), job, out);
  REQUIRE_MESSAGE(end.state == "COMPLETED", end.state, "\n", logs);
  CHECK(end.exit_code == 0);

  const auto s = nlohmann::json::parse(read_text(out + "/summary.json"));
  CHECK(s["world_size"] == 2);
  CHECK(s["backend"] == "grpc");
  CHECK(s["status"] == "completed");
  CHECK(s["test_accuracy"].get<double>() > 0.9);
  // Each rank took its place from Slurm's variables, and srun wrote one log per task.
  CHECK_MESSAGE(
      contains(read_text(out + "/logs/rank-0.log"), "rank 0 of 2 (local 0 of 2, from slurm)"),
      logs);
  CHECK_MESSAGE(
      contains(read_text(out + "/logs/rank-1.log"), "rank 1 of 2 (local 1 of 2, from slurm)"),
      logs);
  CHECK_MESSAGE(contains(logs, "dtrain: job " + std::to_string(job) + ", 2 rank(s) on 1 node(s)"),
                logs);
  // The port the script derives from the job id (as `dtrain run` would itself), where rank 1
  // joined.
  const std::string port =
      ":" + std::to_string(dtrain::slurm_default_port(static_cast<int>(job), 0));
  CHECK_MESSAGE(contains(logs, port + ", logs in "), logs);
  CHECK_MESSAGE(contains(read_text(out + "/logs/rank-1.log"), port + ", listening on"), logs);
  slurm.stop();
}

TEST_CASE("sbatch: `dtrain run` in the batch shell itself (no srun) trains as its config says") {
  // The batch shell of a 2-task job has SLURM_PROCID=0 and SLURM_NTASKS=2 but is no rank: read
  // as one, the run would wait for a rank 1 that never comes.
  SlurmCluster slurm;
  TempDir dir;
  const std::string out = dir / "run";
  const long job = slurm.submit(kShape + "--wrap='exec " + kBin + " run " + kSource +
                                    "/configs/smoke.yaml --out " + out + "'",
                                dir.path());
  const JobEnd end = slurm.wait(job, 60);
  const std::string batch_out = read_text(dir / ("slurm-" + std::to_string(job) + ".out"));
  REQUIRE_MESSAGE(end.state == "COMPLETED", end.state, "\n", batch_out);
  CHECK_MESSAGE(contains(batch_out, "SLURM_PROCID=0 and SLURM_NTASKS=2 are the batch shell's"),
                batch_out);
  const auto s = nlohmann::json::parse(read_text(out + "/summary.json"));
  CHECK(s["world_size"] == 1);
  CHECK(s["status"] == "completed");
  slurm.stop();
}

TEST_CASE("sbatch: a task SIGKILLed mid-run fails the job, and the logs name its rank") {
  SlurmCluster slurm;
  TempDir dir;
  // 100000 steps would take minutes: the job can only end early by the failure.
  const std::string cfg = dir.write("long.yaml", R"(seed: 3
model: {hidden: [16]}
data:
  format: synthetic
  synthetic: {samples: 400, features: 8, classes: 3}
  batch_size: 8
optimizer: {type: sgd, lr: 0.01}
train: {epochs: 0, max_steps: 100000, log_every: 10, checkpoint: {every_steps: 0}}
distributed: {heartbeat_s: 2, timeout_s: 30}
runtime: {threads: 1}
)");
  const std::string out = dir / "run";
  const auto t0 = std::chrono::steady_clock::now();
  const long job = slurm.submit(kShape + kSbatch + " " + cfg + " --out " + out, dir.path(),
                                free_port_env() + "DTRAIN_FAULT=kill:rank=1:step=40");
  const JobEnd end = slurm.wait(job, 90);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string logs = job_logs(dir.path(), job, out);
  REQUIRE_MESSAGE(end.state == "FAILED", end.state, "\n", logs);
  CHECK(end.exit_code != 0);
  CHECK_MESSAGE(took < 60, took);
  // The killed task by its rank (srun's task number is the rank), and why it died.
  const std::string batch_out = read_text(dir / ("slurm-" + std::to_string(job) + ".out"));
  CHECK_MESSAGE(contains(batch_out, "task 1: Killed"), logs);
  // Rank 0, when it ended by itself before srun's kill reached it, says which peer it lost.
  if (contains(batch_out, "task 0: Exited with exit code"))
    CHECK_MESSAGE(contains(read_text(out + "/logs/rank-0.log"), "connection to rank 1 lost"), logs);
  CHECK_MESSAGE(
      contains(read_text(out + "/logs/rank-1.log"), "DTRAIN_FAULT: rank 1 reached step 40"), logs);
  CHECK_FALSE(contains(read_text(out + "/summary.json"), "\"completed\""));
  slurm.stop();
}

TEST_CASE("sbatch + scancel --signal=TERM: the ranks checkpoint, --resume auto ends bitwise") {
  SlurmCluster slurm;
  TempDir dir;
  // Adam and dropout (every rank's RNG must resume), made long: 3000 steps, and the only
  // checkpoints are the interrupt's and the final one.
  const std::string cfg = dir.write("cfg.yaml", dtrain::testing::kRestartCfg) +
                          " --set train.max_steps=3000 --set train.log_every=10"
                          " --set train.checkpoint.every_steps=0"
                          // SIGTERM is then a plain interrupt (exit 143, not requeued by
                          // scripts/slurm.sbatch), as a user's scancel should be; with the
                          // default (TERM) it would be a preemption: exit 75 and a requeue.
                          " --set train.preempt_signal=USR1";
  const std::string out = dir / "run", ref = dir / "ref";
  // The interrupted job sleeps 3 ms a step (timing only, the same numbers): surely mid-run when
  // the signal comes.
  const long job = slurm.submit(kShape + kSbatch + " " + cfg + " --out " + out, dir.path(),
                                free_port_env() + "DTRAIN_FAULT=delay:rank=0:ms=3");
  const bool running = wait_until([&] { return lines_in(out + "/metrics.jsonl") >= 3; }, 90);
  REQUIRE_MESSAGE(running, job_logs(dir.path(), job, out));
  // Without --batch/--full scancel signals the job's steps (the ranks), not the batch shell.
  const auto r = run_cmd(slurm.env() + "scancel --signal=TERM " + std::to_string(job));
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const JobEnd end = slurm.wait(job, 60);
  std::string logs = job_logs(dir.path(), job, out);
  // Every rank exits 143 after checkpointing; srun and the script pass that on.
  REQUIRE_MESSAGE(end.state == "FAILED", end.state, "\n", logs);
  CHECK(end.exit_code == 143);

  const auto s = nlohmann::json::parse(read_text(out + "/summary.json"));
  CHECK(s["status"] == "interrupted");
  CHECK(s["interrupted_by"] == "SIGTERM");
  const int64_t step = s["steps"].get<int64_t>();
  CHECK(step > 0);
  CHECK(step < 3000);
  CHECK_MESSAGE(contains(read_text(out + "/checkpoints/latest"), "step-" + std::to_string(step)),
                logs);
  CHECK_MESSAGE(
      contains(read_text(out + "/logs/rank-0.log"), "interrupted at step " + std::to_string(step)),
      logs);
  // Both ranks stopped on their own with the signal's code: every exit srun reports ("tasks 0-1:
  // Exited with exit code 143", or one line per task) is 143, none was killed.
  const std::vector<int> codes = exit_codes(logs);
  CHECK_MESSAGE(!codes.empty(), logs);
  for (int code : codes) CHECK_MESSAGE(code == 143, logs);
  CHECK_MESSAGE(!contains(logs, "Killed"), logs);

  // The same command again with --resume auto continues from that checkpoint to the end.
  const long job2 = slurm.submit(kShape + kSbatch + " " + cfg + " --out " + out + " --resume auto",
                                 dir.path(), free_port_env());
  const JobEnd end2 = slurm.wait(job2, 120);
  logs = job_logs(dir.path(), job2, out);
  REQUIRE_MESSAGE(end2.state == "COMPLETED", end2.state, "\n", logs);
  const auto s2 = nlohmann::json::parse(read_text(out + "/summary.json"));
  CHECK(s2["status"] == "completed");
  CHECK(s2["steps"] == 3000);
  CHECK(s2["steps_this_run"] == 3000 - step);
  slurm.stop();

  // Equal, bit for bit, to 2 in-process ranks that were never interrupted.
  const auto r0 = run_cmd(kBin + " run " + cfg + " --set distributed.world_size=2 --out " + ref +
                          " --log-level warn");
  REQUIRE_MESSAGE(r0.exit_code == 0, r0.output);
  check_same_state(latest_run_state(kBin, ref), latest_run_state(kBin, out), "slurm resume");
}
