// Preemption seen by one rank of in-process ranks, and asynchronous checkpoints
// (train.checkpoint.async): the same files and results as synchronous saves, keep_last, the
// background write's error on the training thread, and a stop agreed from one rank's request.
#include <doctest/doctest.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/inproc.h"
#include "test_util.h"
#include "train/stop.h"
#include "train_test_util.h"
#include "util/fault.h"

using dtrain::testing::as_file;
using dtrain::testing::checkpoint_rel_diff;
using dtrain::testing::contains;
using dtrain::testing::read_text;
using dtrain::testing::TempDir;
using dtrain::testing::train_yaml;

using namespace dtrain;
namespace fs = std::filesystem;

namespace {

// Adam and dropout (the optimizer state and every rank's RNG must be written exactly), a
// checkpoint every 5 steps, 3 kept.
const char* kCfg = R"(seed: 11
model: {hidden: [24, 16], dropout: 0.1}
data:
  format: synthetic
  synthetic: {samples: 600, features: 10, classes: 3, noise: 0.5}
  batch_size: 12
optimizer: {type: adam, lr: 0.01}
train: {epochs: 0, max_steps: 40, log_every: 5, checkpoint: {every_steps: 5, keep_last: 3}}
runtime: {threads: 1}
)";

std::vector<std::string> step_entries(const std::string& run) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(fs::path(run) / "checkpoints"))
    if (e.path().filename().string().rfind("step-", 0) == 0) v.push_back(e.path().string());
  return v;
}

std::string latest_of(const std::string& run) {
  std::string l = read_text(run + "/checkpoints/latest");
  while (!l.empty() && l.back() == '\n') l.pop_back();
  return l;
}

// Runs `sets` with synchronous and with asynchronous saves and compares every checkpoint kept.
void async_equals_sync(const std::vector<std::string>& sets) {
  TempDir dir;
  const std::string a = dir / "sync", b = dir / "async";
  std::vector<std::string> sa = sets, sb = sets;
  sb.push_back("train.checkpoint.async=true");
  const auto s1 = train_yaml(kCfg, a, sa);
  const auto s2 = train_yaml(kCfg, b, sb);
  CHECK(s1["final_train_loss"] == s2["final_train_loss"]);
  CHECK(s1["test_loss"] == s2["test_loss"]);
  CHECK(latest_of(a) == latest_of(b));
  // keep_last 3: steps 30, 35, 40 remain in both.
  CHECK(step_entries(a).size() == 3);
  CHECK(step_entries(b).size() == 3);
  for (int64_t step : {30, 35, 40})
    CHECK_MESSAGE(checkpoint_rel_diff(as_file(a, step), as_file(b, step)) == 0.0, "step ", step);
}

}  // namespace

TEST_CASE("async checkpoints: 2 ddp ranks write the same files as synchronous saves") {
  async_equals_sync({"distributed.world_size=2"});
}

TEST_CASE("async checkpoints: 3 fsdp ranks write the same sharded checkpoints") {
  async_equals_sync({"distributed.world_size=3", "distributed.strategy=fsdp"});
}

TEST_CASE("async checkpoints: a 2-stage pipeline writes the same sharded checkpoints") {
  async_equals_sync({"distributed.world_size=2", "distributed.pipeline.stages=2"});
}

TEST_CASE("async checkpoints: the background write's error fails the run, the previous stays") {
  for (const std::string strategy : {"ddp", "fsdp"}) {
    CAPTURE(strategy);
    TempDir dir;
    const std::string out = dir / "run";
    RunOptions o;
    o.out_dir = out;
    // Rank 1 holds a shard with fsdp; with ddp only rank 0 writes.
    o.faults = parse_faults(
        std::string("fail_in_save:rank=") + (strategy == "fsdp" ? "1" : "0") + ":step=15", 0);
    const Config cfg = parse_config(kCfg, "t.yaml",
                                    {"distributed.world_size=2", "distributed.strategy=" + strategy,
                                     "train.checkpoint.async=true"});
    std::string what;
    try {
      run_training(cfg, o);
    } catch (const std::exception& e) {
      what = e.what();
    }
    // The failing rank's own error, not its peer's "another rank failed".
    CHECK_MESSAGE(contains(what, "fail_in_save: rank"), what);
    CHECK_MESSAGE(contains(what, "step 15"), what);
    // The write failed before its commit: `latest` names step 10, which is complete.
    CHECK(contains(latest_of(out), "step-10"));
    CHECK(checkpoint_rel_diff(as_file(out, 10), as_file(out, 10)) == 0.0);
  }
}

// A synchronous sharded save that fails on one rank of 4: every rank learns it in the commit's
// all-reduce, none aborts the group (the stop vote in flight is settled), so the run reports the
// failing rank's own error every time -- not a peer's abort or its "rank 3 failed" -- and the
// peers' errors name the rank that failed.
TEST_CASE("sharded checkpoints: a rank's failed write is the error reported, every time") {
  for (int rep = 0; rep < 12; ++rep) {
    CAPTURE(rep);
    TempDir dir;
    RunOptions o;
    o.out_dir = dir / "run";
    o.faults = parse_faults("fail_in_save:rank=3:step=10", 0);
    StopRequest stop;  // a stop vote in flight in every step, as `dtrain run` has
    o.stop = &stop;
    const Config cfg =
        parse_config(kCfg, "t.yaml", {"distributed.world_size=4", "distributed.strategy=fsdp"});
    std::string what;
    try {
      run_training(cfg, o);
    } catch (const std::exception& e) {
      what = e.what();
    }
    REQUIRE_MESSAGE(contains(what, "fail_in_save: rank 3"), what);
    CHECK(contains(latest_of(o.out_dir), "step-5"));
  }
}

// One rank's stop request (as when a scheduler's signal reaches one process of a job): every
// rank stops after the same step, the checkpoint of that step is complete, and a resume ends
// bitwise equal to the uninterrupted run.
void one_rank_preempted(const std::vector<std::string>& sets) {
  TempDir dir;
  const std::string ref = dir / "ref", cut = dir / "cut";
  std::vector<std::string> s = sets;
  s.push_back("train.max_steps=300");
  s.push_back("train.checkpoint.every_steps=0");
  const Config cfg = parse_config(kCfg, "t.yaml", s);
  train_yaml(kCfg, ref, s);

  const int W = static_cast<int>(cfg.distributed.world_size);
  auto transports = make_inproc_group(W);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (auto& t : transports) comms.push_back(std::make_unique<Communicator>(std::move(t)));
  std::vector<StopRequest> reqs(static_cast<size_t>(W));
  std::vector<RunOptions> opts(static_cast<size_t>(W));
  std::vector<nlohmann::json> sums(static_cast<size_t>(W));
  std::vector<std::string> errs(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) {
    opts[r].out_dir = cut;
    opts[r].stop = &reqs[r];
    opts[r].final_run = true;  // as dtrain run's
    opts[r].faults = parse_faults("delay:rank=" + std::to_string(r) + ":ms=2", 0);
  }
  std::vector<std::thread> th;
  for (int r = 0; r < W; ++r)
    th.emplace_back([&, r] {
      try {
        sums[r] = train_rank(cfg, opts[r], *comms[r]);
      } catch (const std::exception& e) {
        errs[r] = e.what();
        for (auto& c : comms) c->abort(e.what());
      }
    });
  // The last rank alone sees the preemption signal, once the run is under way.
  const std::string metrics = cut + "/metrics.jsonl";
  for (int i = 0; i < 3000; ++i) {
    if (fs::exists(metrics) && contains(read_text(metrics), "\"step\":15")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  reqs[static_cast<size_t>(W - 1)].signal = SIGTERM;
  for (auto& t : th) t.join();
  for (int r = 0; r < W; ++r) REQUIRE_MESSAGE(errs[r].empty(), errs[r]);
  const int64_t step = sums[0]["steps"].get<int64_t>();
  CHECK(step >= 15);
  CHECK(step < 300);
  for (int r = 0; r < W; ++r) {
    CHECK(sums[r]["steps"] == step);
    CHECK(sums[r]["status"] == "interrupted");
    CHECK(sums[r]["preempted"] == true);
  }
  // The lead rank's results are saved: a second signal from here on exits 75 (ranks that are
  // threads of one process leave it to the lead).
  CHECK(reqs[0].done_code.load() == kExitPreempted);
  for (int r = 1; r < W; ++r) CHECK(reqs[static_cast<size_t>(r)].done_code.load() == -1);
  CHECK(latest_of(cut) == (fs::exists(cut + "/checkpoints/" + checkpoint_file_name(step))
                               ? checkpoint_file_name(step)
                               : sharded_checkpoint_name(step)));
  const auto s1 = train_yaml(kCfg, cut, s, "auto");
  CHECK(s1["steps_this_run"] == 300 - step);
  CHECK(checkpoint_rel_diff(as_file(ref, 300), as_file(cut, 300)) == 0.0);
}

TEST_CASE("preemption seen by one of 3 in-process fsdp ranks: one step, complete, bitwise resume") {
  one_rank_preempted({"distributed.world_size=3", "distributed.strategy=fsdp"});
}

TEST_CASE("preemption seen by one of 2 ddp ranks with async checkpoints: bitwise resume") {
  one_rank_preempted({"distributed.world_size=2", "train.checkpoint.async=true"});
}

// What two ranks agree on when they have seen s0 and s1 and take p0 and p1 for the preemption
// signal: per rank, the agreed signal and whether it is a preemption.
struct Votes {
  int got0 = 0, got1 = 0;
  bool pre0 = false, pre1 = false;
};
Votes vote_with(int s0, int p0, int s1, int p1) {
  auto t = make_inproc_group(2);
  Communicator c0(std::move(t[0])), c1(std::move(t[1]));
  StopRequest r0, r1;
  r0.signal = s0;
  r1.signal = s1;
  Votes out;
  std::thread a([&] {
    StopAgreement v(&r0, c0, p0);
    v.begin_step();
    out.got0 = v.end_step();
    out.pre0 = v.preempted();
  });
  StopAgreement v(&r1, c1, p1);
  v.begin_step();
  out.got1 = v.end_step();
  out.pre1 = v.preempted();
  a.join();
  return out;
}

// The signal two ranks agree on when they have seen s0 and s1, with SIGUSR1 as the preemption
// signal.
std::pair<int, int> vote(int s0, int s1) {
  const Votes v = vote_with(s0, SIGUSR1, s1, SIGUSR1);
  return {v.got0, v.got1};
}

TEST_CASE("a preemption outranks an interrupt in the stop vote") {
  CHECK(vote(SIGINT, SIGUSR1) == std::pair<int, int>(SIGUSR1, SIGUSR1));
  CHECK(vote(SIGTERM, SIGUSR1) == std::pair<int, int>(SIGUSR1, SIGUSR1));
  CHECK(vote(SIGUSR1, 0) == std::pair<int, int>(SIGUSR1, SIGUSR1));
  // Without a preemption signal among the requests, the largest signal number wins as before.
  CHECK(vote(SIGINT, SIGTERM) == std::pair<int, int>(SIGTERM, SIGTERM));
  CHECK(vote(0, 0) == std::pair<int, int>(0, 0));
}

TEST_CASE("whether the agreed stop is a preemption is agreed too, whatever each rank's signal") {
  // train.preempt_signal is per host: rank 0 takes SIGTERM for a preemption, rank 1 SIGUSR1.
  // Rank 0's SIGTERM stops both as a preemption (both exit 75), rank 1's as an interrupt there.
  const auto agree = [](int s0, int s1) {
    const Votes v = vote_with(s0, SIGTERM, s1, SIGUSR1);
    CHECK(v.got0 == v.got1);
    CHECK(v.pre0 == v.pre1);
    return std::pair<int, bool>(v.got1, v.pre1);
  };
  CHECK(agree(SIGTERM, 0) == std::pair<int, bool>(SIGTERM, true));
  CHECK(agree(0, SIGUSR1) == std::pair<int, bool>(SIGUSR1, true));
  CHECK(agree(0, SIGTERM) == std::pair<int, bool>(SIGTERM, false));  // rank 1's: an interrupt
  CHECK(agree(SIGINT, 0) == std::pair<int, bool>(SIGINT, false));
  CHECK(agree(0, 0) == std::pair<int, bool>(0, false));
}
