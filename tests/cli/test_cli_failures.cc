// Failure handling as users see it through the binary (issue 19): in-process deadlines,
// straggler warnings at two ranks, the bucket log, the default heartbeat, and a rank killed
// mid-save.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "launch/launcher.h"
#include "test_util.h"
#include "util/fs.h"
#include "util/interrupt.h"

using dtrain::testing::check_same_state;
using dtrain::testing::Child;
using dtrain::testing::contains;
using dtrain::testing::HeldPort;
using dtrain::testing::latest_run_state;
using dtrain::testing::read_text;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;

const char* kSmall = R"(seed: 5
model: {hidden: [16]}
data:
  format: synthetic
  synthetic: {samples: 500, features: 8, classes: 3}
  batch_size: 10
optimizer: {type: adam, lr: 0.01}
train: {epochs: 0, max_steps: 20, log_every: 4}
runtime: {threads: 1}
)";

nlohmann::json summary_of(const std::string& run) {
  return nlohmann::json::parse(read_text(run + "/summary.json"));
}

// A small fsdp run with a checkpoint every 10 steps (world size from the launcher or --set).
const char* kShardedCfg = R"(seed: 5
model: {hidden: [16]}
data:
  format: synthetic
  synthetic: {samples: 500, features: 8, classes: 3}
  batch_size: 10
optimizer: {type: adam, lr: 0.01}
train: {epochs: 0, max_steps: 30, checkpoint: {every_steps: 10, keep_last: 3}}
distributed: {strategy: fsdp, timeout_s: 20}
runtime: {threads: 1}
)";

}  // namespace

TEST_CASE("dtrain run: distributed.timeout_s holds for in-process ranks as under launch") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kSmall);
  const auto r = run_cmd("DTRAIN_FAULT=delay:rank=1:ms=1500 " + kBin + " run " + cfg +
                         " --set distributed.world_size=2 --set distributed.timeout_s=0.2" +
                         " --set train.max_steps=4 --out " + dir / "run");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "timed out"));
  CHECK_FALSE(std::filesystem::exists(dir / "run/summary.json"));
}

TEST_CASE("with 2 ranks the slower one is warned about as a straggler, by its rank") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kSmall);
  for (int slow : {1, 0}) {
    const std::string run = dir / ("slow" + std::to_string(slow));
    const auto r =
        run_cmd("DTRAIN_FAULT=delay:rank=" + std::to_string(slow) + ":ms=15 " + kBin + " run " +
                cfg + " --set distributed.world_size=2 --out " + run + " --log-level warn");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    // Records at steps 4, 8, ..., 20: the second running warns, and every one after it.
    CHECK(summary_of(run)["straggler_warnings"].get<int64_t>() >= 3);
    CHECK(contains(r.output, "straggler: rank " + std::to_string(slow) + " computes"));
    CHECK_FALSE(contains(r.output, "straggler: rank " + std::to_string(1 - slow) + " computes"));
  }
  // (No check that an undelayed run stays silent: on a loaded machine a rank descheduled in two
  // records running is a straggler too, and timed tests keep generous bounds only.)
}

TEST_CASE("the DDP bucket log lists buckets within bucket_mb, or one layer over it alone") {
  TempDir dir;
  // mlp-ref's shape (784-512-512-10): layers of 1.53, 1.00 and 0.02 MiB; one step is enough.
  const std::string cfg = dir.write("c.yaml", R"(model: {hidden: [512, 512]}
data:
  format: synthetic
  synthetic: {samples: 100, features: 784, classes: 10}
  batch_size: 8
train: {epochs: 0, max_steps: 1}
distributed: {world_size: 2}
runtime: {threads: 1}
)");
  auto r = run_cmd(kBin + " run " + cfg + " --out " + dir / "a");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output,
                 "ddp: 3 gradient bucket(s) of at most 1 MiB (a layer larger than "
                 "that is a bucket of its own): 0.02, 1.00, 1.53 MiB"));
  r = run_cmd(kBin + " run " + cfg + " --set distributed.ddp.bucket_mb=2 --out " + dir / "b");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output,
                 "ddp: 2 gradient bucket(s) of at most 2 MiB (a layer larger than "
                 "that is a bucket of its own): 1.02, 1.53 MiB"));
}

TEST_CASE("with the default heartbeat_s (10) a frozen rank is detected in about 10 s") {
  TempDir dir;
  const std::string cfg = dir.write("long.yaml", R"(seed: 3
model: {hidden: [64]}
data:
  format: synthetic
  synthetic: {samples: 20000, features: 16, classes: 4}
  batch_size: 16
optimizer: {type: sgd, lr: 0.05}
train: {epochs: 50, log_every: 50}
distributed: {backend: grpc, world_size: 2, timeout_s: 120, rendezvous_timeout_s: 6}
runtime: {threads: 1}
)");
  const int port = dtrain::pick_free_port();
  auto env = [&](int r) {
    return "RANK=" + std::to_string(r) + " WORLD_SIZE=2 LOCAL_RANK=" + std::to_string(r) +
           " LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
           " DTRAIN_JOB_TOKEN=tok ";
  };
  // Rank 1 is stopped once training is under way; only its missing heartbeats tell rank 0.
  const std::string script =
      "set -u; " + env(0) + kBin + " run " + cfg + " --out " + dir / "run" + " > " +
      dir / "r0.log" + " 2>&1 & p0=$!; " + env(1) + kBin + " run " + cfg + " --out " + dir / "run" +
      " > " + dir / "r1.log" + " 2>&1 & p1=$!; for i in $(seq 600); do [ -s " +
      dir / "run/metrics.jsonl" +
      " ] && break; sleep 0.1; done; kill -STOP $p1; start=$(date +%s%N); wait $p0; rc=$?; " +
      "echo rank0_exit=$rc elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 )); kill -9 $p1; " +
      "wait $p1";
  const auto r = run_cmd("bash -c '" + script + "'");
  const std::string log = read_text(dir / "r0.log");
  INFO(r.output, log);
  CHECK(contains(r.output, "rank0_exit=1"));
  const size_t at = r.output.find("elapsed_ms=");
  REQUIRE(at != std::string::npos);
  const long ms = std::stol(r.output.substr(at + 11));
  // Rank 1's last heartbeat left 0 to heartbeat_s / 3 before the stop (a little more if it got
  // no CPU just before); the silence is judged 10 s after it: about 6.7 to 11 s after the
  // stop, plus shutdown. Far from timeout_s 120 either way.
  CHECK(ms >= 5500);
  CHECK(ms <= 18000);
  CHECK(contains(log, "no heartbeat from rank 1 for 1"));
  CHECK(contains(log, "frozen or unreachable"));
}

TEST_CASE("ranks that cannot resolve each other's advertised host name say so, not only silence") {
  // Pods whose bare hostname the others cannot resolve (no distributed.bind): each rank saw only
  // "no heartbeat from rank R: frozen or unreachable" of a peer that was neither.
  if (run_cmd("unshare -u true").exit_code != 0) {
    MESSAGE("skipped: cannot make a UTS namespace here (unshare -u needs root)");
    return;
  }
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", R"(seed: 7
model: {type: mlp, hidden: [8]}
data:
  format: synthetic
  synthetic: {samples: 400, features: 4, classes: 3}
  batch_size: 20
optimizer: {type: sgd, lr: 0.1}
train: {epochs: 1}
distributed: {backend: grpc, world_size: 2, heartbeat_s: 1, rendezvous_timeout_s: 20, timeout_s: 20}
runtime: {threads: 1}
)");
  const std::string port = std::to_string(dtrain::pick_free_port());
  const std::string run = kBin + " run " + cfg + " --out " + dir / "r" +
                          " --set distributed.bind=0.0.0.0 --set distributed.shm=false";
  const auto r = run_cmd(
      "unshare -u sh -c 'hostname dtrain-test-unresolvable.invalid; export "
      "MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
      port + " WORLD_SIZE=2 DTRAIN_JOB_TOKEN=t; RANK=1 " + run + " > " + dir / "r1.log" +
      " 2>&1 & RANK=0 " + run + "; rc=$?; wait; exit $rc'");
  const std::string log = r.output + read_text(dir / "r1.log");
  CHECK(r.exit_code == 1);
  CHECK_MESSAGE(contains(log,
                         "beats sent to it fail: DNS resolution failed for "
                         "dtrain-test-unresolvable.invalid:"),
                log);
  CHECK(contains(log, "does not resolve here: give every rank distributed.bind"));
}

TEST_CASE(
    "dtrain launch: a rank killed between its shard and the manifest leaves the previous "
    "checkpoint latest, and resume ends bitwise as an uninterrupted run") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kShardedCfg);
  const std::string run = dir / "run";
  // Rank 1 (not the manifest writer) dies after writing its shard of step 20.
  auto r = run_cmd("DTRAIN_FAULT=kill_in_save:rank=1:step=20 " + kBin + " launch --nproc 2 " + cfg +
                   " --out " + run + " --log-level warn");
  INFO(r.output);
  REQUIRE(r.exit_code != 0);
  CHECK(contains(r.output, "rank 1 failed: killed by signal SIGKILL"));
  CHECK(read_text(run + "/checkpoints/latest") == "step-10\n");
  CHECK(std::filesystem::exists(run + "/checkpoints/step-20/rank-1.safetensors"));
  CHECK_FALSE(std::filesystem::exists(run + "/checkpoints/step-20/manifest.json"));
  CHECK(contains(read_text(run + "/logs/rank-1.log"), "DTRAIN_FAULT"));
  r = run_cmd(kBin + " launch --nproc 2 " + cfg + " --out " + run +
              " --resume auto --log-level info");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output, "resumed from " + run + "/checkpoints/step-10 at step 10"));
  CHECK(summary_of(run)["steps_this_run"] == 20);
  r = run_cmd(kBin + " launch --nproc 2 " + cfg + " --out " + dir / "straight" +
              " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto a = latest_run_state(kBin, run);
  CHECK(a.tensors.size() > 2);  // parameters and Adam's moments
  check_same_state(a, latest_run_state(kBin, dir / "straight"), "resumed vs uninterrupted");
}

TEST_CASE(
    "rewriting a sharded checkpoint of an abandoned timeline keeps latest on a complete one") {
  // A run to step 20 (latest step-20), resumed from step-10: its step 20 replaces the folder
  // latest names. A crash in the middle of that rewrite must leave latest on a complete
  // checkpoint (step-10), not on the half-written folder.
  TempDir dir;
  // Two in-process ranks, to step 20: the config file and its --set overrides, for every command.
  const std::string cfg =
      dir.write("c.yaml", kShardedCfg) +
      " --set distributed.world_size=2 --set train.max_steps=20 --set train.checkpoint.keep_last=5";
  const std::string run = dir / "run", ck = run + "/checkpoints";
  auto r = run_cmd(kBin + " run " + cfg + " --out " + run + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  REQUIRE(read_text(ck + "/latest") == "step-20\n");
  r = run_cmd("DTRAIN_FAULT=kill_in_save:rank=1:step=20 " + kBin + " run " + cfg + " --out " + run +
              " --resume " + ck + "/step-10 --log-level warn");
  REQUIRE(r.exit_code != 0);
  CHECK(read_text(ck + "/latest") == "step-10\n");
  r = run_cmd(kBin + " eval " + cfg + " --checkpoint " + run + " --log-level warn");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  r = run_cmd(kBin + " run " + cfg + " --out " + run + " --resume auto --log-level warn");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(read_text(ck + "/latest") == "step-20\n");
}

TEST_CASE("dtrain launch removes the shared memory of a rank killed before its peers attached") {
  // Rank 1 dies right after the rendezvous: its segment is created and advertised, but no peer
  // has attached, so nobody unlinks it. The launcher removes it as it reaps the rank.
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kSmall);
  const auto r =
      run_cmd("DTRAIN_FAULT=kill_in_connect:rank=1:at=joined " + kBin + " launch --nproc 2 " + cfg +
              " --set distributed.heartbeat_s=2 --out " + dir / "k" + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  const std::string key = "rank 1: removed the shared memory it left (";
  const size_t at = r.output.find(key);
  REQUIRE(at != std::string::npos);
  const size_t begin = at + key.size();
  const std::string seg = r.output.substr(begin, r.output.find(')', begin) - begin);
  CHECK(seg.rfind("/dev/shm/dtrain-", 0) == 0);
  CHECK_FALSE(std::filesystem::exists(seg));
}

TEST_CASE(
    "a resume from an earlier checkpoint that crashes is resumed from there, not the old end") {
  // A run to step 20 (checkpoints 10, 15, 20 kept), then a resume from step 10 under another
  // learning rate killed at step 12, before its first checkpoint: `latest` still named step 20,
  // so `--resume auto` (what a requeue script runs) continued the abandoned timeline and
  // reported nothing to train.
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kSmall);
  const std::string run = dir / "r";
  const std::string sets = " --set train.checkpoint.every_steps=5 --log-level warn";
  auto r = run_cmd(kBin + " run " + cfg + " --out " + run + sets);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  REQUIRE(contains(read_text(run + "/checkpoints/latest"), "step-20"));
  const std::string lr = " --set optimizer.lr=0.001";
  r = run_cmd("DTRAIN_FAULT=kill:rank=0:step=12 " + kBin + " run " + cfg + " --out " + run + sets +
              lr + " --resume " + run + "/checkpoints/step-10.safetensors");
  REQUIRE(r.exit_code != 0);
  CHECK(contains(read_text(run + "/checkpoints/latest"), "step-10.safetensors"));
  r = run_cmd(kBin + " run " + cfg + " --out " + run + sets + lr + " --resume auto");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(summary_of(run).at("steps").get<int64_t>() == 20);
  CHECK_FALSE(contains(r.output, "nothing to train"));
  // It trained steps 11-20 again, under the new learning rate.
  CHECK(contains(read_text(run + "/checkpoints/latest"), "step-20"));
}

TEST_CASE("a file named checkpoints in --out is refused before training, exit 2") {
  // Was "filesystem error: cannot create directories: Not a directory", exit 1, and
  // --resume auto read the file as a checkpoint.
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kSmall);
  std::filesystem::create_directories(dir / "a");
  dir.write("a/checkpoints", "mine\n");
  for (const std::string extra : {"", " --resume auto"}) {
    const auto r = run_cmd(kBin + " run " + cfg + " --out " + dir / "a" + extra);
    CAPTURE(extra);
    CHECK_MESSAGE(r.exit_code == 2, r.output);
    CHECK(contains(r.output, "checkpoints' is not a folder"));
  }
  CHECK(read_text(dir / "a/checkpoints") == "mine\n");
  // --out naming another run's checkpoints folder.
  auto r = run_cmd(kBin + " run " + cfg + " --out " + dir / "b" + " --set train.max_steps=2");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  r = run_cmd(kBin + " run " + cfg + " --out " + dir / "b/checkpoints");
  CHECK_MESSAGE(r.exit_code == 2, r.output);
  CHECK(contains(r.output, "is a checkpoints folder"));
  CHECK_FALSE(std::filesystem::exists(dir / "b/checkpoints/summary.json"));
  // --out inside it (a step-<N> name, which b's keep_last would delete with the run in it, or
  // deeper), for run, launch and verify; and a sharded checkpoint's folder.
  for (const std::string cmd : {" run ", " launch --nproc 1 ", " verify "})
    for (const std::string sub : {"b/checkpoints/step-99", "b/checkpoints/x/y"}) {
      CAPTURE(cmd);
      CAPTURE(sub);
      r = run_cmd(kBin + cmd + cfg + " --out " + dir / sub);
      CHECK_MESSAGE(r.exit_code == 2, r.output);
      CHECK_MESSAGE(
          contains(r.output, "' is inside a checkpoint folder ('" + (dir / "b/checkpoints") + "')"),
          r.output);
      CHECK_FALSE(std::filesystem::exists(dir / sub));
    }
  // Another tool's `latest` file above an --out (DeepSpeed writes one) is no checkpoints folder.
  dir.write("ds/latest", "global_step100\n");
  r = run_cmd(kBin + " run " + cfg + " --out " + dir / "ds/run" + " --set train.max_steps=2");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  r = run_cmd(kBin + " run " + cfg + " --out " + dir / "s" +
              " --set train.max_steps=2 --set distributed.world_size=2 "
              "--set distributed.strategy=fsdp");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  std::filesystem::remove(dir / "s/checkpoints/latest");
  r = run_cmd(kBin + " run " + cfg + " --out " + dir / "s/checkpoints/step-2");
  CHECK_MESSAGE(r.exit_code == 2, r.output);
  CHECK_MESSAGE(contains(r.output, "step-2' is a checkpoint folder"), r.output);
}

TEST_CASE("a checkpoint carries the evaluation due at its step and the last record's loss") {
  // A checkpoint is written before its step's evaluation: a run that died in between lost that
  // evaluation for good (a resume started with nothing due), and a run finished by a resume
  // after its final checkpoint reported final_train_loss null.
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kSmall);
  const std::string run = dir / "r";
  const std::string sets =
      " --set train.eval_every=10 --set train.checkpoint.every_steps=10 --log-level warn";
  auto r = run_cmd(kBin + " run " + cfg + " --out " + run + sets);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const nlohmann::json first = summary_of(run);
  const auto evals_at_10 = [&] {
    int n = 0;
    std::istringstream lines(read_text(run + "/metrics.jsonl"));
    for (std::string line; std::getline(lines, line);) {
      const auto rec = nlohmann::json::parse(line);
      if (rec.at("kind") == "eval" && rec.at("step") == 10) ++n;
    }
    return n;
  };
  // A resume from step 10, whose evaluation the folder's records hold: not evaluated twice.
  r = run_cmd(kBin + " run " + cfg + " --out " + run + sets + " --resume " + run +
              "/checkpoints/step-10.safetensors");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(evals_at_10() == 1);
  // As if the run had died after step 10's checkpoint, before its evaluation (no record of it):
  // the resume evaluates step 10 first.
  std::string kept;
  {
    std::istringstream lines(read_text(run + "/metrics.jsonl"));
    for (std::string line; std::getline(lines, line);) {
      const auto rec = nlohmann::json::parse(line);
      if (rec.at("step").get<int64_t>() <= 10 &&
          !(rec.at("kind") == "eval" && rec.at("step") == 10))
        kept += line + "\n";
    }
  }
  dtrain::write_file_atomic(run + "/metrics.jsonl", kept);
  r = run_cmd(kBin + " run " + cfg + " --out " + run + sets + " --resume " + run +
              "/checkpoints/step-10.safetensors");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(evals_at_10() == 1);
  // As if the run had died after its final checkpoint, before its evaluation and summary.
  std::filesystem::remove(run + "/summary.json");
  r = run_cmd(kBin + " run " + cfg + " --out " + run + sets + " --resume auto");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const nlohmann::json s = summary_of(run);
  REQUIRE(s.at("final_train_loss").is_number());
  CHECK(s.at("final_train_loss").get<double>() == first.at("final_train_loss").get<double>());
  CHECK(s.at("test_loss").get<double>() == first.at("test_loss").get<double>());
}

TEST_CASE(
    "ranks started by hand: rank 0 refusing --out (it holds a run) stops every rank with its "
    "message, exit 2, not after the rendezvous timeout") {
  // Only rank 0 checks the folder; rank 1, which skips the check, once waited out its
  // rendezvous_timeout_s (60 here) for a rank 0 that had exited.
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kSmall);
  const std::string out = dir / "run";
  const auto first = run_cmd(kBin + " run " + cfg + " --out " + out + " --log-level warn");
  REQUIRE_MESSAGE(first.exit_code == 0, first.output);
  const std::string summary = read_text(out + "/summary.json");
  const int port = dtrain::pick_free_port();
  auto rank = [&](int r) {
    return "RANK=" + std::to_string(r) + " WORLD_SIZE=2 LOCAL_RANK=" + std::to_string(r) +
           " LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
           " DTRAIN_JOB_TOKEN=tok exec " + kBin + " run " + cfg + " --out " + out +
           " --set distributed.rendezvous_timeout_s=60";
  };
  const auto t0 = std::chrono::steady_clock::now();
  Child r0(rank(0), dir / "r0.log");
  // Rank 1 comes later: rank 0 waits for it to join before refusing, so it hears why.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  Child r1(rank(1), dir / "r1.log");
  const int rc1 = r1.wait(40), rc0 = r0.wait(10);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string log0 = read_text(dir / "r0.log"), log1 = read_text(dir / "r1.log");
  INFO(log0, "\n---\n", log1);
  CHECK(rc0 == 2);
  CHECK(rc1 == 2);
  CHECK(took < 30);
  for (const std::string* log : {&log0, &log1}) {
    CHECK(
        contains(*log, "rank 0 refused the job: output folder '" + out + "' already holds a run"));
  }
  CHECK(read_text(out + "/summary.json") == summary);  // the old run as it was
}

TEST_CASE(
    "ranks started by hand: an --out every rank refuses ends every rank at once, and a refusal "
    "reaches the ranks that joined when one never does") {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kSmall);
  const std::string afile = dir.write("afile", "not a folder");
  const int port = dtrain::pick_free_port();
  auto rank = [&](int r, int world, const std::string& out, const std::string& extra) {
    return "RANK=" + std::to_string(r) + " WORLD_SIZE=" + std::to_string(world) +
           " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
           " DTRAIN_JOB_TOKEN=tok exec " + kBin + " run " + cfg + " --out " + out + extra;
  };
  {
    // A file: every rank checks that itself, so rank 0 does not wait to tell them (it waited
    // out rendezvous_timeout_s, 60 here, for ranks that had exited).
    const auto t0 = std::chrono::steady_clock::now();
    Child r0(rank(0, 2, afile, " --set distributed.rendezvous_timeout_s=60"), dir / "a0.log");
    Child r1(rank(1, 2, afile, " --set distributed.rendezvous_timeout_s=60"), dir / "a1.log");
    CHECK(r0.wait(30) == 2);
    CHECK(r1.wait(10) == 2);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
    CHECK(contains(read_text(dir / "a0.log"), "is a file, not a folder"));
  }
  {
    // A folder that holds a run, world 3, rank 2 never starts: rank 1 hears rank 0's refusal at
    // the timeout (it heard only the timeout, exit 1).
    const std::string out = dir / "run";
    REQUIRE(run_cmd(kBin + " run " + cfg + " --out " + out + " --log-level warn").exit_code == 0);
    const std::string t = " --set distributed.rendezvous_timeout_s=3";
    Child r0(rank(0, 3, out, t), dir / "b0.log");
    Child r1(rank(1, 3, out, t), dir / "b1.log");
    CHECK(r0.wait(30) == 2);
    CHECK(r1.wait(30) == 2);
    const std::string log1 = read_text(dir / "b1.log");
    INFO(log1);
    CHECK(contains(log1, "rank 0 refused the job: output folder"));
    CHECK(contains(log1, "rank 2 never joined within 3 s"));
  }
}

TEST_CASE(
    "ranks started by hand: a rank given another job token exits 2 at once, and rank 0's timeout "
    "names the refused calls") {
  // The rank exited 1 (a failure, which a launcher may restart); rank 0 said only that rank 1
  // never joined.
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kSmall);
  const int port = dtrain::pick_free_port();
  auto rank = [&](int r, const std::string& token) {
    return "RANK=" + std::to_string(r) +
           " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
           " DTRAIN_JOB_TOKEN=" + token + " exec " + kBin + " run " + cfg + " --out " +
           (dir / "run") + " --set distributed.rendezvous_timeout_s=3";
  };
  Child r0(rank(0, "tok"), dir / "t0.log");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Child r1(rank(1, "another"), dir / "t1.log");
  const int rc1 = r1.wait(20), rc0 = r0.wait(30);
  const std::string log0 = read_text(dir / "t0.log"), log1 = read_text(dir / "t1.log");
  INFO(log0, "\n---\n", log1);
  CHECK(rc1 == 2);
  CHECK(contains(log1,
                 "refused this rank's job token (rank 1): every rank needs the job's "
                 "DTRAIN_JOB_TOKEN"));
  CHECK(rc0 == 1);
  CHECK(contains(log0, "rank 1 never joined; "));
  CHECK(contains(log0, " call(s) with a wrong or missing job token were refused, the last from"));
  // The folder rank 0 created for a job that never started is removed, as a single process's
  // (it stayed, empty).
  CHECK(!std::filesystem::exists(dir / "run"));
}

TEST_CASE("Ctrl-Z suspends dtrain launch with its ranks, and SIGCONT continues them all") {
  // The ranks (each in its own process group) trained on while the launcher was stopped; rank
  // 0 blocked once its console pipe filled, and rank 1 failed at its collective timeout. Now the
  // ranks stop with the launcher, their heartbeats (3 s) judge afresh when they continue, and
  // the collectives in flight do not count the 10 s suspension against their 8 s timeout_s.
  TempDir dir;
  const std::string cfg = dir.write(
      "c.yaml", std::string(kSmall) +
                    "distributed: {backend: grpc, world_size: 2, timeout_s: 8, heartbeat_s: 3}\n");
  Child launch("DTRAIN_FAULT=delay:rank=0:ms=20 exec " + kBin + " launch --nproc 2 " + cfg +
                   " --out " + dir / "l" + " --set train.max_steps=150 --set train.log_every=1",
               dir / "l.log");
  REQUIRE(dtrain::testing::wait_until(
      [&] { return std::filesystem::exists(dir / "l/metrics.jsonl"); }, 60));
  launch.signal(SIGTSTP);
  const std::string ranks = "pgrep -P " + std::to_string(launch.pid());
  const auto stopped = [&] {
    const auto r = run_cmd("for p in $(" + ranks + "); do cut -d' ' -f3 /proc/$p/stat; done");
    return r.output == "T\nT\n";
  };
  CHECK_MESSAGE(dtrain::testing::wait_until(stopped, 10), read_text(dir / "l.log"));
  std::this_thread::sleep_for(std::chrono::seconds(10));  // past heartbeat_s and timeout_s
  CHECK(stopped());
  launch.signal(SIGCONT);
  const int rc = launch.wait(120);
  const std::string log = read_text(dir / "l.log");
  CHECK_MESSAGE(rc == 0, log);
  CHECK(contains(log, "received SIGTSTP: suspending the ranks and this launcher"));
  CHECK_FALSE(contains(log, "timed out"));
}

TEST_CASE("the peers of a rank that refused its input exit 2 too, relaying why") {
  // Rank 0 alone reads a --resume checkpoint; one of another model is bad input (exit 2), which
  // its peers relayed with exit 1, a failure a scheduler retries.
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kSmall);
  auto r = run_cmd(kBin + " run " + cfg + " --out " + dir / "a" + " --set train.max_steps=2");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  r = run_cmd(kBin + " launch --nproc 2 " + cfg + " --out " + dir / "b" + " --resume " + dir / "a" +
              " --set model.hidden=[8] 2>&1");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "rank 1 failed: exit status 2"), r.output);
  CHECK(contains(read_text(dir / "b/logs/rank-1.log"),
                 "rank 0 aborted: rank 0 failed on bad input: checkpoint"));
}

TEST_CASE("a stop signal is acknowledged at once, though the step it stops after is seconds away") {
  // The loop says so where the ranks agree, at a step's end: a checkpoint write (4 s here) or a
  // long evaluation put that far away, and a second Ctrl-C meanwhile ended the run without its
  // checkpoint.
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kSmall);
  Child run("DTRAIN_FAULT=slow_save:rank=0:ms=4000 exec " + kBin + " run " + cfg + " --out " +
                dir / "r" + " --set train.checkpoint.every_steps=10 --no-progress",
            dir / "r.log");
  REQUIRE(dtrain::testing::wait_until(
      [&] { return contains(read_text(dir / "r.log"), "sleeps 4000 ms"); }, 60));
  run.signal(SIGTERM);
  CHECK(dtrain::testing::wait_until(
      [&] {
        return contains(read_text(dir / "r.log"),
                        "received SIGTERM: the run stops at the next step");
      },
      2));
  CHECK_FALSE(contains(read_text(dir / "r.log"), "stopping after step"));  // (the loop's, later)
  CHECK(run.wait(60) == dtrain::kExitPreempted);
}

TEST_CASE("dtrain launch --master-port on a port another process holds is exit 2 at once") {
  // Its ranks found it out apart: rank 0 could not listen (exit 1), rank 1 reached the other
  // job's rank 0 and was refused its token (exit 2), and the launch blamed rank 1.
  const HeldPort held;
  const int port = held.port();
  TempDir dir;
  const auto r = run_cmd(kBin + " launch --nproc 2 --master-port " + std::to_string(port) + " " +
                         std::string(DTRAIN_SOURCE_DIR) + "/configs/smoke.yaml --out " +
                         dir / "run" + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "--master-port " + std::to_string(port) + ": port " +
                               std::to_string(port) + " is taken on this host"));
  CHECK_FALSE(contains(r.output, "rank 1"));
}

TEST_CASE("one gRPC rank with a malformed MASTER_ADDR is exit 2 at once") {
  // It waited out the rendezvous timeout, then exited 1 (two or more ranks were refused already).
  TempDir dir;
  const auto r = run_cmd("RANK=0 WORLD_SIZE=1 MASTER_ADDR='a b' MASTER_PORT=" +
                         std::to_string(dtrain::testing::free_port()) + " timeout 60 " + kBin +
                         " run " + std::string(DTRAIN_SOURCE_DIR) +
                         "/configs/smoke.yaml --set distributed.backend=grpc "
                         "--set distributed.rendezvous_timeout_s=30 --out " +
                         dir / "run" + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "MASTER_ADDR 'a b' holds whitespace"));
}

TEST_CASE(
    "a console that reads late still gets rank 0's result line and a word on what it missed") {
  // `dtrain launch ... 2>&1 | (sleep 40; cat)`: the launcher drops what a full console does not
  // take (it must go on supervising), and the `done:` line went with it, unsaid.
  TempDir dir;
  const std::string cfg = dir.write(
      "c.yaml",
      "model: {hidden: [8]}\ndata: {format: synthetic, synthetic: {samples: 200, features: 4, "
      "classes: 3}, batch_size: 8}\ntrain: {epochs: 0, max_steps: 2000, log_every: 1}\n"
      "distributed: {backend: grpc, world_size: 2}\nruntime: {threads: 1}\n");
  // (the reader starts once rank 0 has finished: its log holds the done line)
  const auto r = run_cmd(kBin + " launch --nproc 2 " + cfg + " --out " + dir / "run" +
                         " 2>&1 | (until grep -qs '^done:' " + dir / "run/logs/rank-0.log" +
                         "; do sleep 0.2; done; cat > " + dir / "console" + ")");
  const std::string console = read_text(dir / "console");
  CHECK_MESSAGE(contains(console, "of rank 0's output did not fit the console"), console.size());
  CHECK_MESSAGE(contains(console, "[dtrain launch] the last of it:\n"), console.size());
  CHECK_MESSAGE(contains(console, "\ndone: test accuracy"), console.size());
}

TEST_CASE("a peer's collective that times out while rank 0 writes a checkpoint says so") {
  // A synchronous save longer than distributed.timeout_s failed rank 1 with "recv timed out ...
  // from rank 0" alone: rank 0 says what it does with its heartbeats, and the error quotes it.
  TempDir dir;
  const std::string cfg = dir.write(
      "c.yaml",
      "model: {hidden: [8]}\ndata: {format: synthetic, synthetic: {samples: 200, features: 4, "
      "classes: 3}, batch_size: 8}\ntrain: {epochs: 0, max_steps: 20, checkpoint: {every_steps: "
      "10}}\ndistributed: {backend: grpc, world_size: 2, timeout_s: 3, heartbeat_s: 1.5}\n"
      "runtime: {threads: 1}\n");
  const auto r = run_cmd("DTRAIN_FAULT=slow_save:rank=0:ms=8000 " + kBin + " launch --nproc 2 " +
                         cfg + " --out " + dir / "run" + " 2>&1");
  CHECK(r.exit_code == 1);
  CHECK_MESSAGE(contains(r.output, "(distributed.timeout_s) (rank 0 said, "), r.output);
  CHECK_MESSAGE(contains(r.output, " ago: writing the checkpoint of step 10)"), r.output);
}
