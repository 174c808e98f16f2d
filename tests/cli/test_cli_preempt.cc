// Preemption through the real binary (train.preempt_signal, train.preempt_save_timeout_s, exit
// kExitPreempted = 75) and crashes in the middle of an asynchronous checkpoint write: the
// signal to one rank of `dtrain launch` stops every rank at one step; a signal during a save;
// the save deadline; SIGKILL mid-write leaves the previous checkpoint the newest complete one.
// Every case resumes with `--resume auto` and ends bitwise equal to an uninterrupted run.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "test_util.h"
#include "util/interrupt.h"

using dtrain::kExitPreempted;
using dtrain::testing::check_same_state;
using dtrain::testing::Child;
using dtrain::testing::CmdResult;
using dtrain::testing::contains;
using dtrain::testing::latest_run_state;
using dtrain::testing::read_text;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;
using dtrain::testing::wait_until;

namespace fs = std::filesystem;

namespace {

const std::string kBin = DTRAIN_BIN;

// 1000 short steps with dropout and momentum; a checkpoint every 20 steps, 2 kept.
const char* kCfg = R"(seed: 9
model: {hidden: [32, 16], dropout: 0.1}
data:
  format: synthetic
  synthetic: {samples: 2000, features: 12, classes: 4, noise: 0.6}
  batch_size: 16
optimizer: {type: sgd, lr: 0.05, momentum: 0.9, schedule: {type: cosine}}
train: {epochs: 0, max_steps: 1000, log_every: 10, checkpoint: {every_steps: 20, keep_last: 2}}
distributed: {timeout_s: 30}
runtime: {threads: 1}
)";

std::string latest_of(const std::string& run) {
  std::string l = read_text(run + "/checkpoints/latest");
  while (!l.empty() && l.back() == '\n') l.pop_back();
  return l;
}

size_t lines_in(const std::string& path) {
  const std::string t = read_text(path);
  return static_cast<size_t>(std::count(t.begin(), t.end(), '\n'));
}

// The pid of the child of `parent` whose environment has RANK=<rank>, or -1.
pid_t rank_pid(pid_t parent, int rank) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream st(e.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(st)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state = 0;
    pid_t ppid = -1;
    rest >> state >> ppid;
    if (ppid != parent) continue;
    std::ifstream env(e.path() / "environ");
    std::string var;
    bool found = false;
    while (std::getline(env, var, '\0'))
      if (var == "RANK=" + std::to_string(rank)) found = true;
    if (found) return static_cast<pid_t>(std::stoi(name));
  }
  return -1;
}

// Resumes `cut` with `cmd_tail` (verb, config, flags) and checks that it ends bitwise equal to
// `ref`.
void resume_matches(const std::string& cmd_tail, const std::string& ref, const std::string& cut,
                    int64_t from_step) {
  const auto r =
      run_cmd(kBin + " " + cmd_tail + " --out " + cut + " --resume auto --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto s = nlohmann::json::parse(read_text(cut + "/summary.json"));
  CHECK(s["status"] == "completed");
  CHECK(s["steps"] == 1000);
  CHECK(s["steps_this_run"] == 1000 - from_step);
  check_same_state(latest_run_state(kBin, ref), latest_run_state(kBin, cut), cmd_tail);
}

// Starts `dtrain ARGS --out CUT` (rank 0 slowed to 3 ms a step), sends SIG once 3 records are
// written, and returns its exit code and output; it must exit, not be killed by the signal.
std::pair<int, std::string> signal_mid_run(const TempDir& dir, const std::string& args,
                                           const std::string& cut, int sig) {
  Child c(
      "DTRAIN_FAULT=delay:rank=0:ms=3 exec " + kBin + " " + args + " --no-progress --out " + cut,
      dir / "cut.log");
  REQUIRE(wait_until([&] { return lines_in(cut + "/metrics.jsonl") >= 3; }, 60));
  c.signal(sig);
  const int rc = c.wait(60);
  CHECK_FALSE(c.signaled());
  return {rc, read_text(dir / "cut.log")};
}

}  // namespace

TEST_CASE(
    "a stop signal to one rank of dtrain launch while the ranks connect: a stop, not restarted") {
  // Before the first step the ranks cannot agree to stop together: rank 1 exits alone (75 for
  // SIGTERM, the preemption signal; 130 for SIGINT, which killed it by the signal and read as a
  // failure to restart). The launcher passes the signal on to rank 0, which stops too instead
  // of failing without its peer once its deadline passes (that failure read as "rank 0 failed",
  // exit 1, and with --max-restarts a restart).
  for (const int sig : {SIGTERM, SIGINT}) {
    CAPTURE(sig);
    const int code = sig == SIGTERM ? kExitPreempted : 128 + sig;
    TempDir dir;
    const std::string cfg = dir.write("cfg.yaml", kCfg);
    Child c("DTRAIN_FAULT=stall_in_connect:rank=1:at=joined:ms=5000 exec " + kBin +
                " launch --nproc 2 " + cfg +
                " --set distributed.heartbeat_s=2 --max-restarts 2 --out " + dir / "run",
            dir / "run.log");
    // Rank 1 stalls 5 s after joining, its signal handler installed: signal it then.
    REQUIRE(wait_until(
        [&] { return contains(read_text(dir / "run/logs/rank-1.log"), "stalling 5000 ms"); }, 60));
    pid_t pid = -1;
    REQUIRE(wait_until([&] { return (pid = rank_pid(c.pid(), 1)) > 0; }, 10));
    ::kill(pid, sig);
    const int rc = c.wait(60);
    const std::string log = read_text(dir / "run.log");
    CHECK_MESSAGE(rc == code, log);
    CHECK_MESSAGE(contains(log, "not restarting: the ranks stopped on a signal sent to a rank"),
                  log);
    CHECK(contains(log, "rank 0 stopped: exit status " + std::to_string(code)));
    CHECK_FALSE(contains(log, "failed"));
    CHECK_FALSE(contains(log, "restart 1 of 2"));
  }
}

TEST_CASE("SIGTERM to one rank of dtrain launch (2 fsdp ranks, gRPC): both stop at one step") {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string args = "launch --nproc 2 " + cfg + " --set distributed.strategy=fsdp";
  const std::string ref = dir / "ref", cut = dir / "cut";
  const auto r0 = run_cmd(kBin + " " + args + " --out " + ref + " --log-level warn");
  REQUIRE_MESSAGE(r0.exit_code == 0, r0.output);

  // --max-restarts: a preemption is no failure to restart from.
  Child c(
      "DTRAIN_FAULT=delay:rank=0:ms=3 exec " + kBin + " " + args + " --max-restarts 2 --out " + cut,
      dir / "cut.log");
  REQUIRE(wait_until([&] { return lines_in(cut + "/metrics.jsonl") >= 3; }, 60));
  pid_t pid = -1;
  REQUIRE(wait_until([&] { return (pid = rank_pid(c.pid(), 1)) > 0; }, 10));
  ::kill(pid, SIGTERM);  // rank 1 alone: rank 0 learns of it through the stop vote
  const int rc = c.wait(60);
  const std::string log = read_text(dir / "cut.log");
  CHECK_MESSAGE(rc == kExitPreempted, log);  // the ranks' code passes through the launcher
  CHECK_MESSAGE(contains(log, "SIGTERM (preemption): stopping after step"), log);
  CHECK_MESSAGE(contains(log, "rank 1 stopped: exit status 75"), log);
  CHECK_FALSE_MESSAGE(contains(log, "failed"), log);
  CHECK_FALSE_MESSAGE(contains(log, "restart 1 of"), log);
  // Rank 1's own log says why it stopped (it said nothing: only rank 0's log had the stop).
  const std::string r1 = read_text(cut + "/logs/rank-1.log");
  CHECK_MESSAGE(contains(r1, "[info] received SIGTERM: the run stops at the next step"), r1);
  const auto s = nlohmann::json::parse(read_text(cut + "/summary.json"));
  CHECK(s["status"] == "interrupted");
  CHECK(s["preempted"] == true);
  const int64_t step = s["steps"].get<int64_t>();
  CHECK_MESSAGE(contains(log, "preempted at step " + std::to_string(step)), log);
  // Rank 0 wrote the manifest: both shards of that step are there and it is `latest`.
  CHECK(latest_of(cut) == "step-" + std::to_string(step));
  CHECK(fs::exists(cut + "/checkpoints/step-" + std::to_string(step) + "/manifest.json"));
  resume_matches(args, ref, cut, step);
}

TEST_CASE(
    "SIGTERM to rank 0 of dtrain launch during a slow save: the launcher's copy never kills it") {
  // Rank 1 stops first (it learned of the stop through the vote, with less to write); the
  // launcher then sends rank 0 the same signal, which rank 0, still saving 1 s later, took as
  // a second one and died by: the trace parts were never merged and the last line was lost.
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string cut = dir / "cut", trace = dir / "t.json";
  Child c("DTRAIN_FAULT=delay:rank=0:ms=3,slow_save:rank=0:ms=1000 exec " + kBin +
              " launch --nproc 2 " + cfg + " --out " + cut + " --trace " + trace,
          dir / "cut.log");
  REQUIRE(wait_until([&] { return lines_in(cut + "/metrics.jsonl") >= 3; }, 60));
  pid_t pid = -1;
  REQUIRE(wait_until([&] { return (pid = rank_pid(c.pid(), 0)) > 0; }, 10));
  ::kill(pid, SIGTERM);
  const int rc = c.wait(60);
  const std::string log = read_text(dir / "cut.log");
  CHECK_MESSAGE(rc == kExitPreempted, log);
  CHECK_MESSAGE(contains(log, "preempted at step"), log);
  CHECK_MESSAGE(fs::exists(trace), log);  // merged by rank 0 at its end
  CHECK_FALSE(fs::exists(dir / "t.rank-0.json"));
  CHECK(nlohmann::json::parse(read_text(cut + "/summary.json"))["preempted"] == true);
}

TEST_CASE("train.preempt_signal USR1: USR1 preempts (exit 75), SIGTERM stays an interrupt") {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string args =
      "run " + cfg + " --set distributed.world_size=2 --set train.preempt_signal=USR1";
  const std::string ref = dir / "ref";
  const auto r0 = run_cmd(kBin + " " + args + " --out " + ref + " --log-level warn");
  REQUIRE_MESSAGE(r0.exit_code == 0, r0.output);
  for (const int sig : {SIGUSR1, SIGTERM}) {
    CAPTURE(sig);
    const std::string cut = dir / ("cut" + std::to_string(sig));
    const auto [rc, log] = signal_mid_run(dir, args, cut, sig);
    const auto s = nlohmann::json::parse(read_text(cut + "/summary.json"));
    const int64_t step = s["steps"].get<int64_t>();
    if (sig == SIGUSR1) {
      CHECK_MESSAGE(rc == kExitPreempted, log);
      CHECK(s["preempted"] == true);
      CHECK(s["interrupted_by"] == "SIGUSR1");
      CHECK_MESSAGE(contains(log, "preempted at step " + std::to_string(step)), log);
    } else {
      CHECK_MESSAGE(rc == 128 + SIGTERM, log);
      CHECK(s["preempted"] == false);
      CHECK_MESSAGE(contains(log, "interrupted at step " + std::to_string(step)), log);
    }
    CHECK(contains(latest_of(cut), "step-" + std::to_string(step)));
    resume_matches(args, ref, cut, step);
  }
}

TEST_CASE("SIGHUP and SIGUSR1 (not the preemption signal) stop a run with a checkpoint too") {
  // `dtrain launch` forwards both to its ranks; their default action would kill the rank with
  // neither checkpoint nor summary.
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  for (const int sig : {SIGHUP, SIGUSR1}) {
    CAPTURE(sig);
    const std::string cut = dir / ("cut" + std::to_string(sig));
    const auto [rc, log] =
        signal_mid_run(dir, "run " + cfg + " --set distributed.world_size=2", cut, sig);
    CHECK_MESSAGE(rc == 128 + sig, log);
    const auto s = nlohmann::json::parse(read_text(cut + "/summary.json"));
    CHECK(s["status"] == "interrupted");
    CHECK(s["preempted"] == false);
    CHECK(s["interrupted_by"] == (sig == SIGHUP ? "SIGHUP" : "SIGUSR1"));
    CHECK(contains(latest_of(cut), "step-" + std::to_string(s["steps"].get<int64_t>())));
  }
}

// The signal arrives while a checkpoint is being written (DTRAIN_FAULT slow_save holds every
// write 2.5 s after its shard is on disk): the save completes, the next step is the agreed one,
// its checkpoint is written too.
void signal_during_save(bool async) {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string args = "run " + cfg +
                           " --set distributed.world_size=2 --set distributed.strategy=fsdp" +
                           (async ? " --set train.checkpoint.async=true" : "");
  const std::string ref = dir / "ref", cut = dir / "cut";
  const auto r0 = run_cmd(kBin + " " + args + " --out " + ref + " --log-level warn");
  REQUIRE_MESSAGE(r0.exit_code == 0, r0.output);
  Child c("DTRAIN_FAULT=slow_save:rank=1:ms=2500 exec " + kBin + " " + args +
              " --set train.checkpoint.keep_last=4 --no-progress --out " + cut,
          dir / "cut.log");
  REQUIRE(wait_until(
      [&] { return contains(read_text(dir / "cut.log"), "in the checkpoint of step 20"); }, 60));
  c.signal(SIGTERM);
  const int rc = c.wait(60);
  const std::string log = read_text(dir / "cut.log");
  REQUIRE_MESSAGE(rc == kExitPreempted, log);
  const auto s = nlohmann::json::parse(read_text(cut + "/summary.json"));
  const int64_t step = s["steps"].get<int64_t>();
  CHECK(s["preempted"] == true);
  CHECK(step > 20);
  if (!async) CHECK(step == 21);  // the save held training: the stop is the next step
  CHECK(latest_of(cut) == "step-" + std::to_string(step));
  CHECK(fs::exists(cut + "/checkpoints/step-20/manifest.json"));  // the one being written
  resume_matches(args, ref, cut, step);
}

TEST_CASE("SIGTERM during a synchronous checkpoint save: both saves complete, bitwise resume") {
  signal_during_save(false);
}

TEST_CASE("SIGTERM during an asynchronous checkpoint write: both complete, bitwise resume") {
  signal_during_save(true);
}

TEST_CASE("train.preempt_save_timeout_s: a save that overruns exits 75, the previous stays") {
  for (const std::string strategy : {"ddp", "fsdp"}) {
    CAPTURE(strategy);
    TempDir dir;
    const std::string cfg = dir.write("cfg.yaml", kCfg);
    const std::string args = "run " + cfg + " --set distributed.world_size=2 " +
                             "--set distributed.strategy=" + strategy;
    const std::string ref = dir / "ref", cut = dir / "cut";
    const auto r0 = run_cmd(kBin + " " + args + " --out " + ref + " --log-level warn");
    REQUIRE_MESSAGE(r0.exit_code == 0, r0.output);
    // Every save of rank 0 takes 2 s: the one at step 20 holds training (synchronous saves);
    // the preemption's, right after it, cannot be done within the 0.5 s deadline.
    // 50 ms steps: the signal surely comes before the next save, at step 40 (1 s later).
    Child c("DTRAIN_FAULT=slow_save:rank=0:ms=2000,delay:rank=0:ms=50 exec " + kBin + " " + args +
                " --set train.preempt_save_timeout_s=0.5 --no-progress --out " + cut,
            dir / "cut.log");
    REQUIRE(wait_until([&] { return fs::exists(cut + "/checkpoints/latest"); }, 60));
    const auto t0 = std::chrono::steady_clock::now();
    c.signal(SIGTERM);
    const int rc = c.wait(60);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string log = read_text(dir / "cut.log");
    REQUIRE_MESSAGE(rc == kExitPreempted, log);
    CHECK_FALSE(c.signaled());
    CHECK_MESSAGE(took < 1.9, took);  // the deadline, not the 2 s save, ended it
    CHECK_MESSAGE(contains(log, "was not on disk within train.preempt_save_timeout_s = 0.5 s"),
                  log);
    CHECK_MESSAGE(contains(log, "the newest complete checkpoint is step-20"), log);
    CHECK_FALSE(fs::exists(cut + "/summary.json"));
    CHECK(contains(latest_of(cut), "step-20"));
    resume_matches(args, ref, cut, 20);
  }
}

TEST_CASE("preempt_save_timeout_s in a launched ddp job: rank 0's deadline ends the job with 75") {
  // Rank 0 alone writes a ddp checkpoint; rank 1, with nothing to write, waited in the summary's
  // collective, lost rank 0 when its deadline ended it, and exited 1: the launcher then exited
  // 143 (the ranks' codes differed), and a requeue keyed on 75 did not happen.
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string cut = dir / "cut";
  Child c("DTRAIN_FAULT=slow_save:rank=0:ms=2000,delay:rank=0:ms=50 exec " + kBin +
              " launch --nproc 2 " + cfg +
              " --set distributed.backend=grpc --set train.preempt_save_timeout_s=0.5 --out " + cut,
          dir / "cut.log");
  REQUIRE(wait_until([&] { return fs::exists(cut + "/checkpoints/latest"); }, 60));
  c.signal(SIGTERM);
  const int rc = c.wait(60);
  const std::string log = read_text(dir / "cut.log") + read_text(cut + "/logs/rank-1.log");
  CHECK_MESSAGE(rc == kExitPreempted, log);
  CHECK_MESSAGE(!contains(log, "exit status 1"), log);
  CHECK(contains(latest_of(cut), "step-20"));
}

TEST_CASE("SIGKILL in the middle of an asynchronous write: the previous checkpoint is latest") {
  for (const std::string strategy : {"ddp", "fsdp"}) {
    CAPTURE(strategy);
    TempDir dir;
    const std::string cfg = dir.write("cfg.yaml", kCfg);
    const std::string args = "run " + cfg + " --set distributed.world_size=2 " +
                             "--set distributed.strategy=" + strategy +
                             " --set train.checkpoint.async=true";
    const std::string ref = dir / "ref", cut = dir / "cut";
    const auto r0 = run_cmd(kBin + " " + args + " --out " + ref + " --log-level warn");
    REQUIRE_MESSAGE(r0.exit_code == 0, r0.output);
    // Rank 0 (ddp: the only writer) or rank 1 (an fsdp shard) dies by SIGKILL on the writer
    // thread once its part of step 40 is on disk, before the checkpoint is committed.
    const std::string victim = strategy == "fsdp" ? "1" : "0";
    const auto r = run_cmd("DTRAIN_FAULT=kill_in_save:rank=" + victim + ":step=40 " + kBin + " " +
                           args + " --no-progress --out " + cut);
    const bool killed = r.signal == SIGKILL || r.exit_code == 128 + SIGKILL;
    CHECK_MESSAGE(killed, r.output);
    CHECK_MESSAGE(contains(r.output, "wrote its part of the checkpoint of step 40"), r.output);
    CHECK(contains(latest_of(cut), "step-20"));
    CHECK_FALSE(fs::exists(cut + "/checkpoints/step-40/manifest.json"));
    resume_matches(args, ref, cut, 20);
  }
}

namespace {

// Processes whose environment names `launcher` as their launcher (DTRAIN_LAUNCHER_PID).
std::vector<int> ranks_of_launcher(int launcher) {
  std::vector<int> pids;
  const std::string want = std::string("DTRAIN_LAUNCHER_PID=") + std::to_string(launcher);
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    // (dtrain processes only: a sanitizer's llvm-symbolizer, a rank's child, inherits the variable)
    std::ifstream comm(e.path() / "comm");
    if (std::string c; !std::getline(comm, c) || c != "dtrain") continue;
    std::ifstream f(e.path() / "environ", std::ios::binary);
    std::string var;
    while (std::getline(f, var, '\0'))
      if (var == want) pids.push_back(std::stoi(name));
  }
  return pids;
}

}  // namespace

TEST_CASE("ranks whose dtrain launch is SIGKILLed stop instead of training on orphaned") {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string out = dir / "run";
  // 50 ms steps: 1000 steps would take 50 s.
  Child c("DTRAIN_FAULT=delay:rank=0:ms=50,delay:rank=1:ms=50 exec " + kBin + " launch --nproc 2 " +
              cfg + " --set distributed.world_size=2 --out " + out,
          dir / "launch.log");
  REQUIRE(wait_until([&] { return fs::exists(out + "/checkpoints/latest"); }, 60));
  const std::vector<int> ranks = ranks_of_launcher(c.pid());
  REQUIRE_MESSAGE(ranks.size() == 2, read_text(dir / "launch.log"));
  c.signal(SIGKILL);
  CHECK(c.wait(10) == 128 + SIGKILL);
  // The kernel's SIGTERM stops both ranks as a preemption would: at one step, soon.
  CHECK_MESSAGE(wait_until([&] { return ranks_of_launcher(c.pid()).empty(); }, 20),
                read_text(out + "/logs/rank-1.log"));
  // Rank 0 (its console pipes led to the dead launcher) wrote its summary and checkpoint.
  REQUIRE(fs::exists(out + "/summary.json"));
  const auto s = nlohmann::json::parse(read_text(out + "/summary.json"));
  CHECK(s["interrupted_by"] == "SIGTERM");
  // ... taken as SIGTERM, and said to be the launcher's loss (no log of rank 0's has it: its
  // output went through the launcher)
  CHECK(s["launcher_lost"] == true);
  CHECK(latest_of(out) == "step-" + std::to_string(s["steps"].get<int64_t>()) + ".safetensors");
}

TEST_CASE("a SIGKILLed launcher's ranks keep its output folder locked until they have exited") {
  // The lock was the launcher's alone: a second job was accepted into the folder while the
  // orphaned ranks still wrote their preemption checkpoint there, and the two runs' checkpoints,
  // latest and summary.json were mixed.
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string out = dir / "run";
  // Rank 0's saves take 3 s: the orphans' preemption checkpoint keeps them alive that long.
  Child c("DTRAIN_FAULT=slow_save:rank=0:ms=3000,delay:rank=0:ms=20 exec " + kBin +
              " launch --nproc 2 " + cfg + " --out " + out,
          dir / "launch.log");
  REQUIRE(wait_until([&] { return fs::exists(out + "/checkpoints/latest"); }, 60));
  REQUIRE(ranks_of_launcher(c.pid()).size() == 2);
  c.signal(SIGKILL);
  CHECK(c.wait(10) == 128 + SIGKILL);
  REQUIRE(!ranks_of_launcher(c.pid()).empty());
  const auto second = run_cmd(kBin + " launch --nproc 2 " + cfg + " --out " + out +
                              " --resume auto --log-level warn 2>&1");
  const bool orphans_were_alive = !ranks_of_launcher(c.pid()).empty();
  CHECK_MESSAGE(second.exit_code == 2, second.output);
  CHECK_MESSAGE(contains(second.output, "is in use by another dtrain run"), second.output);
  CHECK(orphans_were_alive);
  // Once they are gone, the folder is free and the run continues from their checkpoint.
  REQUIRE(wait_until([&] { return ranks_of_launcher(c.pid()).empty(); }, 30));
  const auto third = run_cmd(kBin + " launch --nproc 2 " + cfg + " --out " + out +
                             " --resume auto --set train.max_steps=100 --log-level warn 2>&1");
  CHECK_MESSAGE(third.exit_code == 0, third.output);
}

namespace {

// The dtrain processes whose parent is `parent` (a script's ranks, not its tail of a log).
std::vector<int> dtrain_children(int parent) {
  std::vector<int> pids;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "stat");
    std::string stat;
    std::getline(f, stat);
    const size_t close = stat.rfind(')');
    if (close == std::string::npos || stat.find("(dtrain)") == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    int ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) pids.push_back(std::stoi(name));
  }
  return pids;
}

}  // namespace

TEST_CASE("scripts/launch_local.sh passes its ranks' preemption code through") {
  // SIGTERM to the script, which forwards it (it exited 143), or to one rank alone (a node's
  // preemption notice reaching its process; the script counted its 75 as a failure, exit 1):
  // the ranks agree, checkpoint and exit 75 each, which the script passes on, as dtrain launch
  // does.
  for (const bool one_rank : {false, true}) {
    CAPTURE(one_rank);
    TempDir dir;
    const std::string cfg = dir.write("cfg.yaml", kCfg);
    const std::string out = dir / "run";
    Child c("DTRAIN_BIN=" + kBin +
                " DTRAIN_FAULT=delay:rank=0:ms=50 exec " DTRAIN_SOURCE_DIR
                "/scripts/launch_local.sh 2 " +
                cfg + " --set distributed.backend=grpc --out " + out,
            dir / "launch.log");
    REQUIRE(wait_until([&] { return fs::exists(out + "/checkpoints/latest"); }, 60));
    if (one_rank) {
      const std::vector<int> ranks = dtrain_children(c.pid());
      REQUIRE(ranks.size() == 2);
      ::kill(ranks[1], SIGTERM);
    } else {
      c.signal(SIGTERM);
    }
    const int rc = c.wait(60);
    const std::string log = read_text(dir / "launch.log");
    CHECK_MESSAGE(rc == kExitPreempted, log);
    if (one_rank) CHECK(contains(log, "the ranks stop at the step they agreed on"));
    CHECK(nlohmann::json::parse(read_text(out + "/summary.json"))["preempted"] == true);
  }
}

TEST_CASE("Ctrl-C at the terminal of scripts/launch_local.sh checkpoints, run alone or with &") {
  // The terminal signals the whole process group: the script (unless it runs as a background
  // job, which starts with SIGINT ignored) and its ranks. The ranks ignored SIGINT (background
  // jobs of the script) and got its SIGTERM; once they caught it, the script's copy came as a
  // second signal. Both are one request: the ranks checkpoint and exit 130.
  for (const bool background : {false, true}) {
    CAPTURE(background);
    TempDir dir;
    const std::string cfg = dir.write("cfg.yaml", kCfg);
    const std::string out = dir / "run";
    Child c(std::string(background ? "trap '' INT; " : "") + "DTRAIN_BIN=" + kBin +
                " DTRAIN_FAULT=delay:rank=0:ms=50 exec " DTRAIN_SOURCE_DIR
                "/scripts/launch_local.sh 2 " +
                cfg + " --set distributed.backend=grpc --out " + out,
            dir / "launch.log");
    REQUIRE(wait_until([&] { return fs::exists(out + "/checkpoints/latest"); }, 60));
    ::kill(-c.pid(), SIGINT);  // (the Child leads its own process group)
    const int rc = c.wait(60);
    const std::string log = read_text(dir / "launch.log");
    CHECK_MESSAGE(rc == 128 + SIGINT, log);
    CHECK_FALSE(contains(log, "killing the ranks"));
    const auto s = nlohmann::json::parse(read_text(out + "/summary.json"));
    CHECK(s["status"] == "interrupted");
    CHECK(s["interrupted_by"] == "SIGINT");
    CHECK(contains(read_text(out + "/checkpoints/latest"),
                   "step-" + std::to_string(s["steps"].get<int64_t>())));
  }
}

TEST_CASE("scripts/launch_local.sh exits 2 when a rank refuses its input, as dtrain launch does") {
  // A folder that already holds a run, given without --resume or --overwrite: every rank exits 2
  // (bad input), which the script reported as 1, a failure a restart could fix.
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string out = dir / "run";
  CmdResult r =
      run_cmd(kBin + " run " + cfg + " --out " + out + " --set train.max_steps=2 --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  r = run_cmd("DTRAIN_BIN=" + kBin + " " DTRAIN_SOURCE_DIR "/scripts/launch_local.sh 2 " + cfg +
              " --set distributed.backend=grpc --set train.max_steps=2 --out " + out);
  CHECK_MESSAGE(r.exit_code == 2, r.output);
}

TEST_CASE("scripts/launch_local.sh stopped while it starts its ranks stops those it started") {
  // Its handlers were set after the start: a signal then ended the script alone and left the
  // ranks it had started running. The ranks here are a stand-in that sleeps (the script only
  // starts and signals them), 60 of them so that the signal comes while they start.
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string nap = "47." + std::to_string(::getpid());  // (this run's stand-ins alone)
  const std::string fake = dir.write("fake-dtrain", "#!/bin/sh\nexec sleep " + nap + "\n");
  fs::permissions(fake, fs::perms::owner_all);
  const std::string out = dir / "run";
  Child c("DTRAIN_BIN=" + fake + " exec " DTRAIN_SOURCE_DIR "/scripts/launch_local.sh 60 " + cfg +
              " --out " + out,
          dir / "launch.log");
  REQUIRE(wait_until([&] { return fs::exists(out + "/logs/rank-0.log"); }, 30));
  c.signal(SIGTERM);
  const int rc = c.wait(30);
  const std::string log = read_text(dir / "launch.log");
  INFO(log);
  CHECK(rc == 128 + SIGTERM);
  CHECK(contains(log, "got SIGTERM: stopping the ranks"));
  // Every stand-in got SIGTERM (sleep ends on it): none is left. ([p]: not pgrep's own shell)
  CHECK(wait_until([&] { return run_cmd("pgrep -f 'slee[p] " + nap + "'").exit_code != 0; }, 10));
}
