// Multi-process runs as users start them: `dtrain launch`, and ranks started by hand with
// torchrun's environment. Failures must end every rank non-zero, never hang.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "cli/cli_util.h"
#include "launch/error_file.h"
#include "launch/launcher.h"
#include "test_util.h"

using dtrain::testing::check_same_state;
using dtrain::testing::contains;
using dtrain::testing::read_text;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;
const std::string kSrc = DTRAIN_SOURCE_DIR;

// Environment prefix for rank r of w, by hand as a user's script would set it.
std::string rank_env(int r, int w, int port, const std::string& token) {
  return "RANK=" + std::to_string(r) + " WORLD_SIZE=" + std::to_string(w) +
         " LOCAL_RANK=" + std::to_string(r) + " LOCAL_WORLD_SIZE=" + std::to_string(w) +
         " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
         " DTRAIN_JOB_TOKEN=" + token + " ";
}

const char* kLong = R"(seed: 3
model: {hidden: [64]}
data:
  format: synthetic
  synthetic: {samples: 20000, features: 16, classes: 4}
  batch_size: 16
optimizer: {type: sgd, lr: 0.05}
train: {epochs: 50, log_every: 50}
distributed: {backend: grpc, world_size: 2, timeout_s: 20, rendezvous_timeout_s: 6}
runtime: {threads: 1}
)";

// The newest checkpoint of a run folder as one file's tensors (cli_util.h).
dtrain::StFile latest_state(const std::string& run) {
  return dtrain::testing::latest_run_state(kBin, run);
}

}  // namespace

TEST_CASE("dtrain launch --nproc 2 trains the smoke config over gRPC as CI runs it") {
  TempDir dir;
  const auto r = run_cmd(kBin + " launch --nproc 2 " + kSrc + "/configs/smoke.yaml --out " +
                         dir / "smoke --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto s = nlohmann::json::parse(read_text(dir / "smoke/summary.json"));
  CHECK(s["world_size"] == 2);
  CHECK(s["backend"] == "grpc");
  CHECK(s["test_accuracy"].get<double>() > 0.9);
  CHECK(s["comm_bytes_sent"].get<double>() > 0);
  CHECK(std::filesystem::exists(dir / "smoke/logs/rank-1.log"));
}

TEST_CASE("a distributed.bind that is no address of this host is named, exit 2, not restarted") {
  // Was: rank 0 blamed its rendezvous port ("port in use?"), exit 1, and only rank 1's log
  // named the address.
  TempDir dir;
  const auto r =
      run_cmd(kBin + " launch --nproc 2 --max-restarts 1 " + kSrc + "/configs/smoke.yaml --out " +
              dir / "b" + " --set distributed.bind=not-an-address");
  CHECK_MESSAGE(r.exit_code == 2, r.output);
  CHECK_MESSAGE(contains(r.output,
                         "distributed.bind 'not-an-address' is not an address of this "
                         "host"),
                r.output);
  CHECK_FALSE(contains(r.output, "restart 1 of 1"));
}

TEST_CASE("gRPC ranks and in-process ranks compute the same parameters, W = 2, 3, 4") {
  // In-process ranks equal one process with batch W*b (tests/train); equal parameters here
  // carry that fidelity over to the gRPC backend. Adam and an uneven last batch included.
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
  for (int world : {2, 3, 4}) {
    const std::string w = std::to_string(world);
    auto r = run_cmd(kBin + " launch --nproc " + w + " " + cfg + " --out " + dir / ("grpc" + w) +
                     " --log-level warn");
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    r = run_cmd(kBin + " run " + cfg + " --set distributed.world_size=" + w + " --out " +
                dir / ("inproc" + w) + " --log-level warn");
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    // Same algorithm over another transport: bitwise equal tensors (the metadata differs: the
    // backend is part of the config hash).
    const auto a =
        dtrain::read_safetensors(dir / ("grpc" + w) + "/checkpoints/step-20.safetensors");
    const auto b =
        dtrain::read_safetensors(dir / ("inproc" + w) + "/checkpoints/step-20.safetensors");
    REQUIRE(a.tensors.size() == b.tensors.size());
    for (const auto& [name, t] : a.tensors)
      CHECK_MESSAGE(t.data == b.tensors.at(name).data, "world ", world, " ", name);
  }
}

TEST_CASE("a SIGKILLed rank is detected within heartbeat_s, well before the deadline") {
  TempDir dir;
  const std::string cfg = dir.write("long.yaml", kLong);
  const int port = dtrain::pick_free_port();
  // heartbeat_s 2 against timeout_s 30: detection must come from the closed connection or the
  // missing heartbeats (within heartbeat_s plus shutdown), never from the deadline.
  const std::string set = " --set distributed.heartbeat_s=2 --set distributed.timeout_s=30";
  // Rank 1 is killed once rank 0 has written its first metrics line (training is under way).
  const std::string script =
      "set -u; " + rank_env(0, 2, port, "tok") + kBin + " run " + cfg + set + " --out " +
      dir / "run" + " > " + dir / "r0.log 2>&1 & p0=$!; " + rank_env(1, 2, port, "tok") + kBin +
      " run " + cfg + set + " --out " + dir / "run" + " > " + dir / "r1.log 2>&1 & p1=$!; " +
      "for i in $(seq 600); do [ -s " + dir / "run/metrics.jsonl" +
      " ] && break; sleep 0.1; done; kill -9 $p1; start=$(date +%s%N); wait $p0; rc=$?; " +
      "echo rank0_exit=$rc elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))";
  const auto r = run_cmd("bash -c '" + script + "'");
  INFO(r.output, read_text(dir / "r0.log"));
  CHECK(contains(r.output, "rank0_exit=1"));
  const size_t at = r.output.find("elapsed_ms=");
  REQUIRE(at != std::string::npos);
  const long ms = std::stol(r.output.substr(at + 11));
  CHECK(ms < 2000 + 4000);  // heartbeat_s plus slack and shutdown, against timeout_s 30
  CHECK(contains(read_text(dir / "r0.log"), "rank 1"));
}

TEST_CASE("a frozen (SIGSTOPped) rank is detected within heartbeat_s, not at the deadline") {
  TempDir dir;
  const std::string cfg = dir.write("long.yaml", kLong);
  const int port = dtrain::pick_free_port();
  const std::string set = " --set distributed.heartbeat_s=1 --set distributed.timeout_s=300";
  // Rank 1 is stopped once training is under way; its process and sockets stay, so only the
  // missing heartbeats tell rank 0. Rank 1 is killed after rank 0 has exited.
  const std::string script =
      "set -u; " + rank_env(0, 2, port, "tok") + kBin + " run " + cfg + set + " --out " +
      dir / "run" + " > " + dir / "r0.log 2>&1 & p0=$!; " + rank_env(1, 2, port, "tok") + kBin +
      " run " + cfg + set + " --out " + dir / "run" + " > " + dir / "r1.log 2>&1 & p1=$!; " +
      "for i in $(seq 600); do [ -s " + dir / "run/metrics.jsonl" +
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
  CHECK(ms < 6000);  // heartbeat_s 1 plus slack and shutdown, against timeout_s 300
  CHECK(contains(log, "no heartbeat from rank 1 for "));
  CHECK(contains(log, "frozen or unreachable"));
  // Rank 0's desync table, with rank 1's last reported position, said to be as old as it is.
  CHECK(contains(log, "where each rank is"));
  CHECK(contains(log, "a rank that died or froze since shows where it was then"));
}

TEST_CASE("a rank with another config or a wrong token is refused at rendezvous") {
  TempDir dir;
  const std::string cfg = dir.write("long.yaml", kLong);
  int port = dtrain::pick_free_port();
  auto pair = [&](const std::string& env1, const std::string& extra1) {
    const std::string script =
        rank_env(0, 2, port, "tok") + kBin + " run " + cfg + " --out " + dir / "a" + " > " +
        dir / "a0.log 2>&1 & p0=$!; " + env1 + kBin + " run " + cfg + " --out " + dir / "b" +
        extra1 + " > " + dir / "a1.log 2>&1; rc1=$?; wait $p0; rc0=$?; echo rc0=$rc0 rc1=$rc1";
    return run_cmd("bash -c '" + script + "'");
  };
  auto r = pair(rank_env(1, 2, port, "tok"), " --set optimizer.lr=0.07");
  std::string logs = read_text(dir / "a0.log") + read_text(dir / "a1.log");
  INFO(r.output, logs);
  // Bad input, exit 2 on both (which launchers do not restart: a restart would repeat it).
  CHECK(contains(r.output, "rc0=2 rc1=2"));
  CHECK(contains(logs, "config hash"));
  // ... naming the key (two hashes told nothing about which --set differed)
  CHECK(contains(logs, "the keys that differ (rank 0's -> rank 1's): optimizer.lr: "));
  // Keys config_hash leaves out but the collectives depend on (here when saves happen): refused
  // at the rendezvous, naming them, rather than failing later with mismatched collectives.
  port = dtrain::pick_free_port();
  r = pair(rank_env(1, 2, port, "tok"), " --set train.checkpoint.every_steps=7");
  logs = read_text(dir / "a0.log") + read_text(dir / "a1.log");
  INFO(r.output, logs);
  CHECK_FALSE(contains(r.output, "rc1=0"));
  CHECK(contains(logs, "checkpoint.every_steps 7"));
  // (the two hashes are equal there: said, and the key is named, as for a hashed key)
  CHECK(contains(logs, "rank 1's run plan differs from rank 0's (the same config hash "));
  CHECK(contains(logs,
                 "the keys that differ (rank 0's -> rank 1's): train.checkpoint.every_steps: "));
  CHECK_FALSE(contains(logs, "mismatched calls"));
  // Flags given to one rank only that change its collectives likewise (they trained to the end
  // and failed in the evaluation's, or the trace's, collectives: exit 1, after all the work).
  for (const auto& [flag, named] :
       {std::pair{" --no-eval", "--no-eval on"}, std::pair{" --trace x.json", "--trace on"}}) {
    port = dtrain::pick_free_port();
    r = pair(rank_env(1, 2, port, "tok"), flag);
    logs = read_text(dir / "a0.log") + read_text(dir / "a1.log");
    INFO(r.output, logs);
    CHECK(contains(r.output, "rc0=2 rc1=2"));
    CHECK(contains(logs, named));
    const std::string key = std::string(named).substr(0, std::string(named).find(' '));
    CHECK(
        contains(logs, "the keys that differ (rank 0's -> rank 1's): " + key + ": false -> true"));
  }

  port = dtrain::pick_free_port();
  r = pair(rank_env(1, 2, port, "wrong-token"), "");
  logs = read_text(dir / "a0.log") + read_text(dir / "a1.log");
  INFO(r.output, logs);
  CHECK_FALSE(contains(r.output, "rc1=0"));
  CHECK_FALSE(contains(r.output, "rc0=0"));
  CHECK(contains(logs, "token"));
}

TEST_CASE("dtrain run with backend grpc but no launcher says how to start it") {
  TempDir dir;
  const std::string cfg = dir.write("g.yaml", kLong);
  const auto r =
      run_cmd("env -u RANK -u WORLD_SIZE " + kBin + " run " + cfg + " --out " + dir / "x");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "MASTER_PORT"));
}

TEST_CASE("dtrain launch exits 2 naming the rank when the ranks fail on bad data") {
  TempDir dir;
  // A data file that exists (a missing one is refused by the launcher before any rank starts)
  // but does not parse (line 3).
  dir.write("bad.csv", "a,b,label\n1,2,0\n3,x,1\n");
  const std::string cfg = dir.write("bad.yaml", "data:\n  format: csv\n  train: {path: bad.csv}\n");
  const auto r = run_cmd(kBin + " launch --nproc 2 " + cfg + " --out " + dir / "run");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  // Whichever rank failed first, its error reaches the console (rank 0's output is shown, the
  // end of another rank's log is printed when it fails).
  CHECK(contains(r.output, "bad.csv"));
  CHECK(contains(r.output, "failed: exit status 2"));
}

TEST_CASE("dtrain launch refuses a rank count the rank grid cannot use before starting ranks") {
  TempDir dir;
  for (const auto& [config, sets] : std::vector<std::pair<std::string, std::string>>{
           {"lm_jargon.yaml", "--nproc 3 --set distributed.tensor_parallel.size=2"},
           {"smoke.yaml", "--nproc 2 --set distributed.pipeline.stages=3"}}) {
    CAPTURE(sets);
    const auto r = run_cmd(kBin + " launch " + kSrc + "/configs/" + config + " " + sets +
                           " --set distributed.backend=grpc --out " + dir / "run" + " 2>&1");
    CHECK_MESSAGE(r.exit_code == 2, r.output);
    CHECK_MESSAGE(contains(r.output, "must divide the number of ranks"), r.output);
    CHECK_FALSE(contains(r.output, "launching"));  // no rank started
  }
}

TEST_CASE("zero1, zero2 and fsdp over gRPC compute the same parameters as in-process ranks") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", R"(seed: 5
model: {hidden: [16, 8]}
data:
  format: synthetic
  synthetic: {samples: 500, features: 9, classes: 3}
  batch_size: 10
optimizer: {type: adam, lr: 0.01}
train: {epochs: 0, max_steps: 20}
distributed: {ddp: {bucket_mb: 0.0005}}
runtime: {threads: 1}
)");
  for (const char* strategy : {"zero1", "zero2", "fsdp"}) {
    for (int world : {2, 3}) {
      const std::string w = std::to_string(world);
      const std::string tag = std::string(strategy) + w;
      const std::string set = std::string(" --set distributed.strategy=") + strategy;
      auto r = run_cmd(kBin + " launch --nproc " + w + " " + cfg + set + " --out " +
                       dir / ("grpc" + tag) + " --log-level warn");
      REQUIRE_MESSAGE(r.exit_code == 0, r.output);
      r = run_cmd(kBin + " run " + cfg + set + " --set distributed.world_size=" + w + " --out " +
                  dir / ("inproc" + tag) + " --log-level warn");
      REQUIRE_MESSAGE(r.exit_code == 0, r.output);
      check_same_state(latest_state(dir / ("grpc" + tag)), latest_state(dir / ("inproc" + tag)),
                       tag);
    }
  }
}

TEST_CASE("a crash while saving a sharded checkpoint leaves the previous one valid") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", R"(seed: 5
model: {hidden: [16]}
data:
  format: synthetic
  synthetic: {samples: 500, features: 8, classes: 3}
  batch_size: 10
optimizer: {type: adam, lr: 0.01}
train: {epochs: 0, max_steps: 30, checkpoint: {every_steps: 10, keep_last: 3}}
distributed: {world_size: 2, strategy: fsdp}
runtime: {threads: 1}
)");
  const std::string run = dir / "run";
  // Rank 0 dies after writing its shard of step 20, before the manifest.
  auto r = run_cmd("DTRAIN_FAULT=kill_in_save:rank=0:step=20 " + kBin + " run " + cfg + " --out " +
                   run + " --log-level warn");
  REQUIRE(r.exit_code != 0);
  CHECK(contains(r.output, "DTRAIN_FAULT"));
  CHECK(read_text(run + "/checkpoints/latest") == "step-10\n");
  CHECK(std::filesystem::exists(run + "/checkpoints/step-20/rank-0.safetensors"));
  CHECK_FALSE(std::filesystem::exists(run + "/checkpoints/step-20/manifest.json"));
  // The incomplete folder is refused by name; resume picks step 10 and ends where an
  // uninterrupted run ends, bit for bit.
  r = run_cmd(kBin + " eval " + cfg + " --checkpoint " + run + "/checkpoints/step-20");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "without manifest.json"));
  r = run_cmd(kBin + " run " + cfg + " --out " + run + " --resume auto --log-level info");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output, "resumed from " + run + "/checkpoints/step-10 at step 10"));
  r = run_cmd(kBin + " run " + cfg + " --out " + dir / "straight" + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  check_same_state(latest_state(run), latest_state(dir / "straight"), "resumed vs straight");
  // A malformed fault spec is a user error.
  r = run_cmd("DTRAIN_FAULT=kill:rank=x " + kBin + " run " + cfg + " --out " + dir / "bad");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "DTRAIN_FAULT"));
}

TEST_CASE("pipelines over gRPC compute the same parameters as in-process ranks") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", R"(seed: 5
model: {hidden: [16, 12, 8]}
data:
  format: synthetic
  synthetic: {samples: 500, features: 9, classes: 3}
  batch_size: 10
optimizer: {type: adam, lr: 0.01}
train: {epochs: 0, max_steps: 20}
distributed: {strategy: pipeline, pipeline: {stages: 2, micro_batches: 3}}
runtime: {threads: 1}
)");
  // 2 stages x 2 replicas (1f1b), and 3 stages (gpipe, activation checkpointing).
  const std::vector<std::pair<int, std::string>> cases = {
      {4, ""},
      {3,
       " --set distributed.pipeline.stages=3 --set distributed.pipeline.schedule=gpipe --set "
       "distributed.pipeline.activation_checkpointing=true"}};
  for (const auto& [world, extra] : cases) {
    const std::string w = std::to_string(world);
    auto r = run_cmd(kBin + " launch --nproc " + w + " " + cfg + extra + " --out " +
                     dir / ("grpc" + w) + " --log-level warn");
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    r = run_cmd(kBin + " run " + cfg + extra + " --set distributed.world_size=" + w + " --out " +
                dir / ("inproc" + w) + " --log-level warn");
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    check_same_state(latest_state(dir / ("grpc" + w)), latest_state(dir / ("inproc" + w)),
                     "world " + w);
  }
  // A launch whose world size the stages do not divide is refused before its ranks start.
  const auto r =
      run_cmd(kBin + " launch --nproc 3 " + cfg + " --out " + dir / "bad" + " --log-level warn");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "must divide the number of ranks"));
}

TEST_CASE("--trace writes one Chrome trace with events from every rank") {
  TempDir dir;
  const std::string trace = dir / "t.json";
  auto r = run_cmd(kBin + " launch --nproc 2 " + kSrc + "/configs/smoke.yaml --set train.epochs=1" +
                   " --out " + dir / "run" + " --trace " + trace + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto j = nlohmann::json::parse(read_text(trace));
  std::map<int, std::set<std::string>> names;
  for (const auto& e : j.at("traceEvents"))
    if (e.at("ph") == "X") names[e.at("pid").get<int>()].insert(e.at("name").get<std::string>());
  REQUIRE(names.size() == 2);
  for (const auto& [pid, n] : names) {
    CAPTURE(pid);
    for (const char* want : {"forward", "backward", "allreduce", "optimizer", "step"})
      CHECK(n.count(want) == 1);
  }
  // The per-rank files were merged and removed.
  CHECK_FALSE(std::filesystem::exists(dir / "t.rank-1.json"));
}

TEST_CASE("--trace: the axes' collectives are in it, a failed run leaves its part, inputs kept") {
  TempDir dir;
  const std::string cfg = kSrc + "/configs/smoke.yaml";
  // pp2 x dp2 fsdp in process: the data axis's reduce-scatters and all-gathers were missing
  // (only the world communicator recorded).
  const std::string trace = dir / "t.json";
  auto r = run_cmd(kBin + " run " + cfg + " --out " + dir / "run" + " --trace " + trace +
                   " --log-level warn --set train.epochs=0 --set train.max_steps=3"
                   " --set distributed.world_size=4 --set distributed.strategy=fsdp"
                   " --set distributed.pipeline.stages=2");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  std::set<std::string> names, tracks;
  const auto j = nlohmann::json::parse(read_text(trace));
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") == "X") names.insert(e.at("name").get<std::string>());
    if (e.at("ph") == "M" && e.at("name") == "thread_name")
      tracks.insert(e.at("args").at("name").get<std::string>());
  }
  CHECK(names.count("reduce_scatter") == 1);
  CHECK(names.count("allgather") == 1);
  // Each axis's collectives on a track of its own (the world's: "comm").
  CHECK_MESSAGE(tracks.count("comm dp") == 1, j.dump().substr(0, 2000));
  // A failed run: each rank's part up to the failure, not nothing.
  r = run_cmd("DTRAIN_FAULT=nan:rank=1:step=2 " + kBin + " run " + cfg + " --out " + dir / "f" +
              " --trace " + dir / "f.json" + " --set distributed.world_size=2");
  CHECK(r.exit_code == 1);
  CHECK_MESSAGE(contains(r.output, "trace of the failed run"), r.output);
  CHECK(std::filesystem::exists(dir / "f.failed.rank-0.json"));
  // What the run reads or writes itself is refused before training, exit 2.
  const std::string copy = dir.write("c.yaml", read_text(cfg));
  for (const std::string& bad :
       {copy, dir / "o", dir / "o/metrics.jsonl", dir / "o/summary.json"}) {
    r = run_cmd(kBin + " run " + copy + " --out " + dir / "o" + " --trace " + bad);
    CAPTURE(bad);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "--trace '"));
  }
  CHECK(read_text(copy) == read_text(cfg));
  // A trace inside an --out not created yet is fine.
  r = run_cmd(kBin + " run " + copy + " --out " + dir / "new/" + " --trace " +
              dir / "new/trace.json" +
              " --log-level warn --set train.epochs=0 "
              "--set train.max_steps=2");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(std::filesystem::exists(dir / "new/trace.json"));
}

TEST_CASE("--trace: each step's checkpoint comes before its evaluation, the final one too") {
  // An evaluation that fails (out of memory) must lose no training: the final checkpoint is
  // written first, also when the last step ends an epoch (where the loop used to evaluate first).
  TempDir dir;
  const std::string trace = dir / "t.json";
  const auto r = run_cmd(kBin + " run " + kSrc + "/configs/smoke.yaml --out " + dir / "r" +
                         " --trace " + trace +
                         " --log-level warn --set train.epochs=2 --set train.max_steps=0"
                         " --set train.checkpoint.every_steps=0");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  double last_ckpt = -1, last_eval = -1;
  const auto j = nlohmann::json::parse(read_text(trace));  // (kept: the loop reads into it)
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph").get<std::string>() != "X") continue;
    const double ts = e.at("ts").get<double>();
    const std::string name = e.at("name").get<std::string>();
    if (name == "checkpoint") last_ckpt = std::max(last_ckpt, ts);
    if (name == "eval") last_eval = std::max(last_eval, ts);
  }
  REQUIRE(last_ckpt >= 0);
  REQUIRE(last_eval >= 0);
  CHECK(last_ckpt < last_eval);
}

TEST_CASE("--trace: the ranks' parts never replace a file that is not a trace") {
  // Each rank writes FILE.rank-<r>.json (FILE.failed.rank-<r>.json on failure) next to FILE and
  // the merge deletes them: a config or data file of such a name was overwritten, then deleted.
  TempDir dir;
  const std::string cfg = kSrc + "/configs/smoke.yaml";
  const std::string mine = dir.write("c.rank-0.json", read_text(cfg));  // the run's own config
  const std::string notes = dir.write("n.failed.rank-3.json", "notes\n");
  for (const std::string trace : {"c.json", "n.json"}) {
    const auto r = run_cmd(kBin + " run " + mine + " --out " + dir / "o" + " --trace " +
                           dir / trace + " --set train.max_steps=2");
    CAPTURE(trace);
    CHECK_MESSAGE(r.exit_code == 2, r.output);
    CHECK(contains(r.output, "is not a dtrain trace"));
  }
  CHECK(read_text(mine) == read_text(cfg));
  CHECK(read_text(notes) == "notes\n");
  // A part a killed run left is a trace: replaced, then merged and deleted as usual.
  auto r = run_cmd(kBin + " run " + cfg + " --out " + dir / "p" + " --trace " + dir / "t.json" +
                   " --log-level warn --set train.max_steps=2 --set distributed.world_size=2");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  std::filesystem::copy_file(dir / "t.json", dir / "t.rank-1.json");
  r = run_cmd(kBin + " run " + cfg + " --out " + dir / "q" + " --trace " + dir / "t.json" +
              " --log-level warn --set train.max_steps=2");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  // FILE itself: an earlier trace (t.json, just above) or an empty file is replaced; weights
  // named by mistake are not (they were silently overwritten).
  const std::string weights = dir / "model.safetensors";
  std::filesystem::copy_file(dir / "p/checkpoints/step-2.safetensors", weights);
  const std::string before = read_text(weights);
  r = run_cmd(kBin + " run " + cfg + " --out " + dir / "w" + " --trace " + weights +
              " --set train.max_steps=2");
  CHECK_MESSAGE(r.exit_code == 2, r.output);
  CHECK(contains(r.output, "exists and is not a dtrain trace"));
  CHECK(read_text(weights) == before);
  const std::string empty = dir.write("empty.json", "");
  r = run_cmd(kBin + " run " + cfg + " --out " + dir / "e" + " --trace " + empty +
              " --log-level warn --set train.max_steps=2");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(read_text(empty), "traceEvents"));
  // A FIFO is refused up front: the finished run blocked on it without a word, nobody reading.
  const std::string fifo = dir / "fifo.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  r = run_cmd("timeout 60 " + kBin + " run " + cfg + " --out " + dir / "f" + " --trace " + fifo +
              " --set train.max_steps=2");
  CHECK_MESSAGE(r.exit_code == 2, r.output);
  CHECK(contains(r.output, "is not a regular file (a FIFO or a device)"));
}

namespace {

using dtrain::testing::kRestartCfg;

// The final parameters and optimizer state of a run folder, as one checkpoint file.
// (A sharded checkpoint is consolidated first.)
dtrain::StFile final_state(const std::string& run) {
  REQUIRE(read_text(run + "/checkpoints/latest").rfind("step-30", 0) == 0);
  return latest_state(run);
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE(
    "a rank that dies mid-run is restarted from the last checkpoint and ends as if it had not") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kRestartCfg);
  struct Case {
    std::string strategy, fault;
    int max_restarts;
  };
  // Step 15 lies between the checkpoints of steps 10 and 20: the restart redoes steps 11..15.
  const std::vector<Case> cases = {{"ddp", "kill:rank=1:step=15", 1},
                                   {"fsdp", "kill:rank=1:step=15", 3},
                                   {"ddp", "drop:rank=1:step=15", 1}};
  std::map<std::string, dtrain::StFile> straight;
  for (const auto& c : cases) {
    const std::string set = " --set distributed.strategy=" + c.strategy;
    if (!straight.count(c.strategy)) {
      const auto r = run_cmd(kBin + " launch --nproc 2 " + cfg + set + " --out " +
                             dir / ("straight-" + c.strategy) + " --log-level warn");
      REQUIRE_MESSAGE(r.exit_code == 0, r.output);
      straight[c.strategy] = final_state(dir / ("straight-" + c.strategy));
    }
    const std::string run = dir / (c.strategy + "-" + c.fault.substr(0, 4));
    const auto r = run_cmd("DTRAIN_FAULT=" + c.fault + " " + kBin + " launch --nproc 2 " +
                           "--max-restarts " + std::to_string(c.max_restarts) + " " + cfg + set +
                           " --out " + run + " --log-level info");
    const std::string log1 = read_text(run + "/logs/rank-1.log");
    INFO(c.strategy, " ", c.fault, "\n", r.output, "\nrank 1:\n", log1);
    REQUIRE(r.exit_code == 0);
    // The restart names rank 1, also when rank 0 noticed the closed peer first (its error file
    // names rank 1). The fault fired in the first attempt only: one restart, however many were
    // allowed.
    CHECK(contains(r.output, "restart 1 of " + std::to_string(c.max_restarts) + ": rank 1"));
    CHECK(count_of(r.output, "; starting all 2 rank(s) again") == 1);
    if (c.fault[0] == 'k') {
      CHECK(contains(r.output, "rank 1 failed: killed by signal SIGKILL"));
    }
    CHECK(contains(r.output, "all 2 rank(s) finished after 1 restart(s)"));
    CHECK(contains(log1, "DTRAIN_FAULT"));
    CHECK(contains(log1, "rank 1 reached step 15"));
    CHECK(contains(log1, "restart attempt 1: DTRAIN_FAULT is ignored"));
    CHECK(contains(r.output, "resumed from " + run + "/checkpoints/step-10"));
    const auto s = nlohmann::json::parse(read_text(run + "/summary.json"));
    CHECK(s["steps"] == 30);
    const auto a = final_state(run);
    const auto& b = straight[c.strategy];
    REQUIRE(a.tensors.size() == b.tensors.size());
    CHECK(a.tensors.size() > 4);  // parameters and Adam's state
    for (const auto& [name, t] : a.tensors)
      CHECK_MESSAGE(t.data == b.tensors.at(name).data, c.strategy, " ", c.fault, " ", name);
  }
}

TEST_CASE("without --max-restarts a killed or dropped rank fails the launch, named") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kRestartCfg);
  auto r = run_cmd("DTRAIN_FAULT=kill:rank=1:step=15 " + kBin + " launch --nproc 2 " + cfg +
                   " --out " + dir / "kill");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "rank 1 failed: killed by signal SIGKILL"));
  CHECK_FALSE(contains(r.output, "restart 1"));
  CHECK(read_text(dir / "kill/checkpoints/latest") == "step-10.safetensors\n");

  // drop: rank 1 closes its connections; rank 0 hears of it from the transport, not a timeout.
  const auto t0 = std::chrono::steady_clock::now();
  r = run_cmd("DTRAIN_FAULT=drop:rank=1:step=5 " + kBin + " launch --nproc 2 " + cfg + " --out " +
              dir / "drop");
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string log1 = read_text(dir / "drop/logs/rank-1.log");
  INFO(r.output, "\nrank 1:\n", log1);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "failed: exit status 1"));
  // Rank 0 (on the console) names the peer it lost.
  CHECK((contains(r.output, "connection to rank 1 lost") ||
         contains(r.output, "rank 1 aborted: DTRAIN_FAULT: drop")));
  CHECK(contains(log1, "DTRAIN_FAULT: drop: rank 1 reached step 5: closing its connections"));
  CHECK(el < 15.0);  // timeout_s is 20
  // The launch names rank 1 whichever rank it reaped first: rank 0's error file names rank 1
  // (it said "rank 0 failed" in about 1 run of 3).
  CHECK(contains(r.output, "launch failed: rank 1 failed (exit status 1)"));

  // A shard write that fails on rank 1: every rank leaves at that step with exit 1, and rank 0's
  // error names rank 1 (the launch blamed rank 0 in 6 runs of 7).
  // The launcher's own TORCHELASTIC_ERROR_FILE (set by its caller) gets the blamed rank's record.
  r = run_cmd("TORCHELASTIC_ERROR_FILE=" + dir / "parent.json" +
              " DTRAIN_FAULT=fail_in_save:rank=1:step=10 " + kBin + " launch --nproc 2 " + cfg +
              " --set distributed.strategy=fsdp --out " + dir / "save");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "launch failed: rank 1 failed (exit status 1)"));
  // torchrun's error-file contract: each failed rank's record, with the cause it names.
  const auto rec0 = dtrain::read_error_file(dir / "save/logs/rank-0.error.json");
  const auto rec1 = dtrain::read_error_file(dir / "save/logs/rank-1.error.json");
  REQUIRE(rec0);
  REQUIRE(rec1);
  CHECK(rec0->caused_by == 1);
  CHECK(rec1->caused_by == -1);
  CHECK(rec1->exit_code == 1);
  const auto parent = dtrain::read_error_file(dir / "parent.json");
  REQUIRE(parent);
  CHECK(parent->message == rec1->message);
}

TEST_CASE("DTRAIN_FAULT delay slows its rank at every step, in the first attempt only") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", R"(seed: 5
model: {hidden: [8]}
data:
  format: synthetic
  synthetic: {samples: 200, features: 4, classes: 2}
  batch_size: 10
optimizer: {type: sgd, lr: 0.1}
train: {epochs: 0, max_steps: 10}
runtime: {threads: 1}
)");
  auto train_s = [&](const std::string& env, const std::string& out) {
    const auto r = run_cmd(env + " " + kBin + " run " + cfg + " --out " + dir / out);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return std::make_pair(
        nlohmann::json::parse(read_text(dir / (out + "/summary.json")))["train_s"].get<double>(),
        r.output);
  };
  // 10 steps x 200 ms: at least 2 s of training, which these 10 tiny steps never need alone.
  const auto slow = train_s("DTRAIN_FAULT=delay:rank=0:ms=200", "slow");
  CHECK(slow.first >= 2.0);
  const auto again = train_s("DTRAIN_FAULT=delay:rank=0:ms=200 DTRAIN_RESTART_COUNT=1", "again");
  CHECK(again.first < 2.0);
  CHECK(contains(again.second, "DTRAIN_FAULT is ignored"));
  const auto r = run_cmd("DTRAIN_RESTART_COUNT=x " + kBin + " run " + cfg + " --out " + dir / "x");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "DTRAIN_RESTART_COUNT"));
}

TEST_CASE("a restart before the job's first checkpoint starts fresh, as the first attempt did") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kRestartCfg);
  const std::string run = dir / "run";
  auto r = run_cmd(kBin + " launch --nproc 2 " + cfg + " --out " + run + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto straight = final_state(run);
  // The same folder again with --overwrite: rank 1 dies at step 5, before this job's first
  // checkpoint; the restart starts fresh (the failed attempt's metrics cleared), as the first
  // attempt did.
  r = run_cmd("DTRAIN_FAULT=kill:rank=1:step=5 " + kBin + " launch --nproc 2 --max-restarts 1 " +
              cfg + " --out " + run + " --overwrite --log-level info");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.output, "restart 1 of 1: rank "));
  CHECK_FALSE(contains(r.output, "resumed from"));
  const auto s = nlohmann::json::parse(read_text(run + "/summary.json"));
  CHECK(s["steps_this_run"] == 30);
  const auto a = final_state(run);
  for (const auto& [name, t] : a.tensors)
    CHECK_MESSAGE(t.data == straight.tensors.at(name).data, name);
}

TEST_CASE("a job run again over its --out: rank 0's --overwrite or --resume decides for all") {
  // Whether the folder's run is replaced or continued is rank 0's call (README); rank 1, given
  // neither flag, refused the folder's old run and ended the job, exit 2 on every rank.
  TempDir dir;
  const std::string cfg = dir.write("short.yaml", R"(seed: 3
model: {hidden: [8]}
data: {format: synthetic, synthetic: {samples: 200, features: 4, classes: 2}, batch_size: 8}
optimizer: {type: sgd, lr: 0.05}
train: {epochs: 0, max_steps: 4, checkpoint: {every_steps: 2}}
distributed: {backend: grpc, world_size: 2, timeout_s: 20, rendezvous_timeout_s: 20}
runtime: {threads: 1}
)");
  const std::string out = dir / "out";
  auto job = [&](const std::string& rank0_flags, const std::string& both = "") {
    const int port = dtrain::pick_free_port();
    const std::string script =
        rank_env(0, 2, port, "tok") + kBin + " run " + cfg + " --out " + out + both + rank0_flags +
        " > " + dir / "r0.log 2>&1 & p0=$!; " + rank_env(1, 2, port, "tok") + kBin + " run " + cfg +
        " --out " + out + both + " > " + dir / "r1.log 2>&1; rc1=$?; wait $p0; rc0=$?; " +
        "echo rc0=$rc0 rc1=$rc1";
    const auto r = run_cmd("bash -c '" + script + "'");
    INFO(rank0_flags, r.output, read_text(dir / "r0.log"), read_text(dir / "r1.log"));
    CHECK(contains(r.output, "rc0=0 rc1=0"));
  };
  job("");
  job(" --overwrite");
  job(" --resume auto", " --set train.max_steps=6");
  CHECK(nlohmann::json::parse(read_text(out + "/summary.json"))["steps"] == 6);
}
