// The training loops keep their documented promises (issue 19): distributed.timeout_s bounds
// in-process waits, a skipped non-finite step skips only its update, pipelines write every
// documented output, and DDP buckets respect their cap.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>

#include <spdlog/spdlog.h>

#include "comm/inproc.h"
#include "log_capture.h"
#include "nn/model.h"
#include "test_util.h"
#include "train/sharding.h"
#include "train/stop.h"
#include "train/trainer.h"
#include "util/check.h"
#include "util/trace.h"

using namespace dtrain;
using dtrain::testing::TempDir;

namespace fs = std::filesystem;

namespace {

// 200 samples: 160 train rows, so 2 ranks with batch 8 (or 1 pipeline replica with batch 16)
// finish an epoch at step 10.
const char* kSmall = R"(
seed: 3
model: {hidden: [12, 8]}
data:
  format: synthetic
  synthetic: {samples: 200, features: 6, classes: 3}
  batch_size: 8
optimizer: {type: adam, lr: 0.01}
train: {epochs: 0, max_steps: 12, log_every: 5}
runtime: {threads: 1}
)";

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

const nlohmann::json* record(const std::vector<nlohmann::json>& recs, const std::string& kind,
                             int64_t step) {
  for (const auto& r : recs)
    if (r["kind"] == kind && r["step"] == step) return &r;
  return nullptr;
}

std::set<std::string> keys_of(const nlohmann::json& j) {
  std::set<std::string> k;
  for (const auto& [key, v] : j.items()) k.insert(key);
  return k;
}

}  // namespace

TEST_CASE("distributed.timeout_s bounds the waits of in-process ranks, ddp and pipeline") {
  spdlog::set_level(spdlog::level::off);
  for (const char* strategy : {"ddp", "pipeline"}) {
    CAPTURE(strategy);
    TempDir dir;
    RunOptions o;
    o.out_dir = dir / "run";
    // Rank 1 sleeps 1 s after every step: rank 0 waits for it longer than timeout_s 0.2.
    o.faults = parse_faults("delay:rank=1:ms=1000", 0);
    const Config c = parse_config(
        kSmall, "t.yaml",
        {"distributed.world_size=2", "train.max_steps=4",
         std::string("distributed.strategy=") + strategy, "distributed.timeout_s=0.2"});
    CHECK_THROWS_WITH(run_training(c, o), doctest::Contains("timed out"));
    // With the default timeout the same run completes.
    o.out_dir = dir / "patient";
    o.faults = parse_faults("delay:rank=1:ms=100", 0);
    CHECK(run_training(parse_config(kSmall, "t.yaml",
                                    {"distributed.world_size=2", "train.max_steps=2",
                                     std::string("distributed.strategy=") + strategy}),
                       o)["steps"] == 2);
  }
}

TEST_CASE("train.nonfinite skip drops only the update: the step's record, eval, checkpoint, sync") {
  spdlog::set_level(spdlog::level::off);
  struct Case {
    std::vector<std::string> sets;
    bool same_collectives;  // a skipped step runs exactly the collectives of a normal one
  };
  // Every case finishes an epoch at step 10 (160 rows, global batch 16).
  const std::vector<Case> cases = {
      {{"distributed.world_size=2"}, true},
      {{"distributed.world_size=2", "distributed.strategy=zero2"}, false},  // no all-gather
      {{"distributed.world_size=2", "distributed.strategy=local_sgd",
        "distributed.local_sgd.sync_every=5"},
       true},
      {{"distributed.world_size=2", "distributed.strategy=pipeline", "data.batch_size=16"}, true},
  };
  for (const auto& c : cases) {
    const std::string tag = c.sets.size() > 1 ? c.sets[1] : "ddp";
    CAPTURE(tag);
    TempDir dir;
    auto sets = c.sets;
    sets.insert(sets.end(), {"train.nonfinite=skip", "train.checkpoint.every_steps=10",
                             "train.checkpoint.keep_last=5"});
    RunOptions o;
    o.out_dir = dir / "skip";
    o.faults = parse_faults("nan:rank=0:step=10", 0);
    const auto s = run_training(parse_config(kSmall, "n.yaml", sets), o);
    CHECK(s["skipped_steps"] == 1);
    CHECK(s["steps"] == 12);
    const fs::path ck = fs::path(o.out_dir) / "checkpoints";
    CHECK((fs::exists(ck / "step-10.safetensors") || fs::exists(ck / "step-10/manifest.json")));
    const auto recs = read_jsonl(o.out_dir + "/metrics.jsonl");
    const nlohmann::json* train10 = record(recs, "train", 10);
    REQUIRE(train10 != nullptr);
    // Steps 6..9 trained: the record's loss is theirs, finite.
    REQUIRE((*train10)["loss"].is_number());
    CHECK(std::isfinite((*train10)["loss"].get<double>()));
    CHECK(record(recs, "eval", 10) != nullptr);  // the epoch ended at step 10
    CHECK(record(recs, "train", 5) != nullptr);
    CHECK(record(recs, "eval", 12) != nullptr);
    if (c.same_collectives) {
      RunOptions clean;
      clean.out_dir = dir / "clean";
      const auto t = run_training(parse_config(kSmall, "n.yaml", sets), clean);
      CHECK(t["skipped_steps"] == 0);
      CHECK(s["comm_bytes_sent"] == t["comm_bytes_sent"]);
    }
  }
}

TEST_CASE("zero2 and fsdp hold a few units' full gradients during backward, not the model's") {
  // 8 layers of 32 x 32 (1056 parameters each) and the first and last: every unit (an fsdp
  // layer, a zero2 bucket of one layer) reduce-scattered as its backward ends. All of them were
  // kept until the end of backward: the whole model's gradient on every rank.
  spdlog::set_level(spdlog::level::off);
  for (const char* strategy : {"fsdp", "zero2"}) {
    CAPTURE(strategy);
    TempDir dir;
    RunOptions o;
    o.out_dir = dir / "run";
    const auto s = run_training(
        parse_config(kSmall, "u.yaml",
                     {"model.hidden=[32, 32, 32, 32, 32, 32, 32, 32]", "distributed.world_size=2",
                      std::string("distributed.strategy=") + strategy,
                      "distributed.ddp.bucket_mb=0.001", "train.max_steps=3"}),
        o);
    const int64_t layer_bytes = (32 * 32 + 32) * 4;
    CHECK(s["peak_unit_grad_bytes"].get<int64_t>() > 0);
    CHECK(s["peak_unit_grad_bytes"].get<int64_t>() <=
          static_cast<int64_t>(ShardedState::kUnitsInFlight + 1) * layer_bytes);
  }
}

TEST_CASE("pipeline and data-parallel runs write the same summary keys and record keys") {
  spdlog::set_level(spdlog::level::off);
  TempDir dir;
  RunOptions o;
  o.out_dir = dir / "ddp";
  const auto d = run_training(parse_config(kSmall, "k.yaml", {"distributed.world_size=2"}), o);
  o.out_dir = dir / "pipe";
  const auto p = run_training(
      parse_config(kSmall, "k.yaml", {"distributed.world_size=4", "distributed.strategy=pipeline"}),
      o);
  std::set<std::string> pk = keys_of(p);
  CHECK(pk.erase("stages") == 1);
  CHECK(pk == keys_of(d));
  // Values: rank 0 is stage 0 (layers 0 and 1: 6*12+12 = 84 parameters); Adam keeps two moments.
  CHECK(p["param_bytes"] == 84 * 4);
  CHECK(p["grad_bytes"] == 84 * 4);
  CHECK(p["optim_bytes"] == 2 * 84 * 4);
  CHECK(p["peak_gathered_bytes"] == 0);
  CHECK(p["peak_unit_grad_bytes"] == 0);
  // (straggler_warnings is timing: a rank thread descheduled on a loaded machine is one.)
  CHECK(p["straggler_warnings"].is_number_integer());
  CHECK(p["comm_s"].get<double>() > 0.0);
  CHECK(p["exposed_comm_s"].get<double>() > 0.0);  // 2 replicas all-reduce, stages wait
  CHECK(p["compute_s"].get<double>() > 0.0);
  CHECK(p["compute_s"].get<double>() + p["exposed_comm_s"].get<double>() ==
        doctest::Approx(p["train_s"].get<double>()));
  // Train records: the same keys (idle_s, the waits for neighbouring stages, is 0 without a
  // pipeline).
  const auto dr = read_jsonl(dir / "ddp/metrics.jsonl");
  const auto pr = read_jsonl(dir / "pipe/metrics.jsonl");
  const nlohmann::json* a = record(dr, "train", 5);
  const nlohmann::json* b = record(pr, "train", 5);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(keys_of(*b) == keys_of(*a));
  CHECK((*a)["idle_s"] == 0.0);
  CHECK((*b)["idle_s"].get<double>() > 0.0);
  CHECK(p["layout"] == nlohmann::json({{"dp", 2}, {"pp", 2}, {"tp", 1}}));
  CHECK(d["layout"] == nlohmann::json({{"dp", 2}, {"pp", 1}, {"tp", 1}}));
  CHECK((*b)["comm_s"].get<double>() > 0.0);
}

TEST_CASE("DDP buckets never exceed bucket_mb unless one layer alone does") {
  ModelConfig mc;
  mc.hidden = {512, 512};
  const Model m = build_mlp(mc, 784, 10);  // Fashion-MNIST: layers of 401,920, 262,656, 5,130
  auto sizes = [&](int64_t cap) {
    std::vector<int64_t> out;
    for (const Bucket& b : make_buckets(m, cap)) out.push_back(b.end - b.begin);
    return out;
  };
  // 1 MiB = 262,144 floats: the two big layers are each over it alone, the last is not merged
  // with the one before (that would make 267,786 floats).
  CHECK(sizes(262144) == std::vector<int64_t>{5130, 262656, 401920});
  CHECK(sizes(267786) == std::vector<int64_t>{267786, 401920});
  CHECK(sizes(1 << 30) == std::vector<int64_t>{669706});
  CHECK(sizes(1) == std::vector<int64_t>{5130, 262656, 401920});
  // bucket_mb to floats: MiB of 4-byte floats; a huge value is one bucket, not an overflow.
  CHECK(bucket_cap_floats(1.0) == 262144);
  CHECK(bucket_cap_floats(1e-9) == 1);
  for (const double mb : {4e13, 1e15, 1e300})
    CHECK(sizes(bucket_cap_floats(mb)) == std::vector<int64_t>{669706});
  // Any model and cap: buckets tile the layout from the end, each within the cap or a single
  // layer, and each as large as the cap allows (adding the next layer would exceed it).
  ModelConfig deep;
  deep.hidden = {24, 16, 40, 8, 30};
  deep.layer_norm = true;
  const Model d = build_mlp(deep, 10, 3);
  for (int64_t cap : {1, 50, 200, 300, 500, 700, 1000, 1500, 5000}) {
    CAPTURE(cap);
    const std::vector<Bucket> bs = make_buckets(d, cap);
    int64_t expect_end = d.param_count();
    for (size_t k = 0; k < bs.size(); ++k) {
      const Bucket& b = bs[k];
      CHECK(b.end == expect_end);
      CHECK(b.begin == d.layer_begin(b.first_layer));
      const bool one_layer = b.end == d.layer_end(b.first_layer);
      CHECK((b.end - b.begin <= cap || one_layer));
      if (k + 1 < bs.size()) {
        size_t top = b.first_layer;
        while (top-- > 0 && d.layer_end(top) == d.layer_begin(top)) {
        }
        CHECK(b.end - d.layer_begin(top) > cap);
      }
      expect_end = b.begin;
    }
    CHECK(expect_end == 0);
  }
}

TEST_CASE("a resumed run's records and skip count continue the uninterrupted run's") {
  spdlog::set_level(spdlog::level::off);
  // Records every 3 steps, checkpoints every 4, a skipped step at 2: resumed from step 4, the
  // record at step 6 must average steps 4-6 (the saved record in progress carries step 4) and the
  // summary count the skip before the checkpoint. Before, the record averaged steps 5-6 and
  // skipped_steps restarted at 0. Ranks whose loss is per rank (pipeline, zero2, fsdp) continue
  // their own sums: the records are bitwise equal (the saved all-ranks total, rounded through
  // float32 as the records sum it, gave a last-bit difference after some resumes).
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{},
        {"distributed.world_size=2"},
        {"distributed.world_size=2", "distributed.strategy=pipeline", "data.batch_size=16"},
        {"distributed.world_size=3", "distributed.strategy=fsdp"},
        {"distributed.world_size=2", "distributed.strategy=zero2"}}) {
    CAPTURE(layout.size());
    TempDir dir;
    auto sets = layout;
    sets.insert(sets.end(), {"train.nonfinite=skip", "train.log_every=3",
                             "train.checkpoint.every_steps=4", "train.checkpoint.keep_last=5"});
    RunOptions full;
    full.out_dir = dir / "full";
    full.faults = parse_faults("nan:rank=0:step=2", 0);
    const auto f = run_training(parse_config(kSmall, "r.yaml", sets), full);
    CHECK(f["skipped_steps"] == 1);
    const fs::path ck = fs::path(full.out_dir) / "checkpoints";
    RunOptions res;
    res.out_dir = dir / "res";
    res.resume = fs::exists(ck / "step-4.safetensors") ? (ck / "step-4.safetensors").string()
                                                       : (ck / "step-4").string();
    const auto r = run_training(parse_config(kSmall, "r.yaml", sets), res);
    CHECK(r["skipped_steps"] == 1);
    CHECK(r["steps_this_run"] == 8);
    const auto a = read_jsonl(full.out_dir + "/metrics.jsonl");
    const auto b = read_jsonl(res.out_dir + "/metrics.jsonl");
    for (const int64_t step : {6, 9, 12}) {
      CAPTURE(step);
      const nlohmann::json* ra = record(a, "train", step);
      const nlohmann::json* rb = record(b, "train", step);
      REQUIRE(ra != nullptr);
      REQUIRE(rb != nullptr);
      CHECK((*rb)["loss"].get<double>() == (*ra)["loss"].get<double>());
    }
    CHECK(r["final_train_loss"].get<double>() == f["final_train_loss"].get<double>());
  }
}

TEST_CASE("resumed from any step, sharded ranks' records are bitwise the uninterrupted run's") {
  // Each rank's loss sum continues from its own (interval_ranks): the saved all-ranks total,
  // rounded through float32 as the records sum it, then added to rank 0's own, ended a last bit
  // off in some resumes (a tester: 7 of 17 fsdp resumes on Fashion-MNIST).
  spdlog::set_level(spdlog::level::off);
  const std::vector<std::string> sets = {"distributed.world_size=3",
                                         "distributed.strategy=fsdp",
                                         "train.log_every=12",
                                         "train.max_steps=24",
                                         "train.checkpoint.every_steps=1",
                                         "train.checkpoint.keep_last=30"};
  TempDir dir;
  RunOptions full;
  full.out_dir = dir / "full";
  const auto f = run_training(parse_config(kSmall, "r.yaml", sets), full);
  const auto a = read_jsonl(full.out_dir + "/metrics.jsonl");
  for (int64_t from = 1; from < 12; ++from) {
    CAPTURE(from);
    RunOptions res;
    res.out_dir = dir / ("res" + std::to_string(from));
    res.resume =
        (fs::path(full.out_dir) / "checkpoints" / ("step-" + std::to_string(from))).string();
    const auto r = run_training(parse_config(kSmall, "r.yaml", sets), res);
    const auto b = read_jsonl(res.out_dir + "/metrics.jsonl");
    const nlohmann::json* ra = record(a, "train", 12);
    const nlohmann::json* rb = record(b, "train", 12);
    REQUIRE(ra != nullptr);
    REQUIRE(rb != nullptr);
    CHECK((*rb)["loss"].get<double>() == (*ra)["loss"].get<double>());
    CHECK(r["final_train_loss"].get<double>() == f["final_train_loss"].get<double>());
  }
}

TEST_CASE(
    "an interrupted run's final_train_loss is the mean over the steps since its last record") {
  spdlog::set_level(spdlog::level::off);
  // Records every step give each step's loss; the same run interrupted after step 7 with records
  // every 5 must report the mean of steps 6-7 (equal batches), not the step-5 record's. Before,
  // it reported the step-5 record's.
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{},
        {"distributed.world_size=2", "distributed.strategy=pipeline", "data.batch_size=16"}}) {
    CAPTURE(layout.size());
    TempDir dir;
    auto every = layout;
    every.push_back("train.log_every=1");
    RunOptions a;
    a.out_dir = dir / "every";
    run_training(parse_config(kSmall, "r.yaml", every), a);
    const auto recs = read_jsonl(a.out_dir + "/metrics.jsonl");
    RunOptions b;
    b.out_dir = dir / "cut";
    StopRequest stop;
    b.stop = &stop;
    b.after_step = [&stop](int rank, int64_t step, double, int64_t) {
      if (rank == 0 && step == 6) stop.signal = SIGINT;  // seen by the vote of step 7
    };
    const auto s = run_training(parse_config(kSmall, "r.yaml", layout), b);
    REQUIRE(s["status"] == "interrupted");
    // (A pipeline votes at the end of a step: it stops after step 6.)
    const int64_t last = s["steps"].get<int64_t>();
    REQUIRE(last >= 6);
    REQUIRE(last <= 7);
    double want = 0;
    for (int64_t step = 6; step <= last; ++step) {
      const nlohmann::json* r = record(recs, "train", step);
      REQUIRE(r != nullptr);
      want += (*r)["loss"].get<double>() / static_cast<double>(last - 5);
    }
    CHECK(s["final_train_loss"].get<double>() == doctest::Approx(want).epsilon(1e-6));
  }
}

TEST_CASE("final_train_loss is null when every step since the last record was skipped") {
  // It kept the record before's mean (summary.json and the done line quoted it as final).
  spdlog::set_level(spdlog::level::off);
  TempDir dir;
  RunOptions o;
  o.out_dir = dir / "skip";
  o.evaluate = false;
  o.faults = parse_faults("nan:rank=0:step=11,nan:rank=0:step=12", 0);
  const auto s = run_training(
      parse_config(kSmall, "n.yaml", {"train.nonfinite=skip", "train.log_every=2"}), o);
  CHECK(s["skipped_steps"] == 2);
  CHECK(s["final_train_loss"].is_null());
  const auto recs = read_jsonl(o.out_dir + "/metrics.jsonl");
  REQUIRE(record(recs, "train", 12) != nullptr);
  CHECK((*record(recs, "train", 12))["loss"].is_null());
}

TEST_CASE("finishing a run that ended before its summary: the last evaluation, not a second one") {
  // A run lost after its final evaluation (summary.json missing) is finished by --resume auto:
  // it evaluated the final step again (a second eval record) and, stopped again before any
  // evaluation, a resumed run reported test_loss null though metrics.jsonl held one.
  spdlog::set_level(spdlog::level::off);
  TempDir dir;
  RunOptions o;
  o.out_dir = dir / "run";
  const Config cfg = parse_config(kSmall, "n.yaml", {"train.checkpoint.every_steps=6"});
  const auto first = run_training(cfg, o);
  REQUIRE(first["test_loss"].is_number());
  fs::remove(o.out_dir + "/summary.json");
  RunOptions again = o;
  again.resume = "auto";
  const auto s = run_training(cfg, again);
  const auto recs = read_jsonl(o.out_dir + "/metrics.jsonl");
  CHECK(std::count_if(recs.begin(), recs.end(), [](const nlohmann::json& r) {
          return r["kind"] == "eval" && r["step"] == 12;
        }) == 1);
  CHECK(s["test_loss"] == first["test_loss"]);
  CHECK(s["test_accuracy"] == first["test_accuracy"]);
  CHECK(s["checkpoint"].is_string());  // (the resumed step's own)
  // --no-eval reports no test figures, whatever the folder's records hold.
  fs::remove(o.out_dir + "/summary.json");
  again.evaluate = false;
  const auto quiet = run_training(cfg, again);
  CHECK(quiet["test_loss"].is_null());
  CHECK(quiet["test_accuracy"].is_null());
}

TEST_CASE("RunOptions::final_save false: no checkpoint at the end (dtrain bench step's runs)") {
  spdlog::set_level(spdlog::level::off);
  TempDir dir;
  RunOptions o;
  o.out_dir = dir / "run";
  o.evaluate = false;
  o.final_save = false;
  const auto s = run_training(parse_config(kSmall, "n.yaml", {}), o);
  CHECK(s["steps"] == 12);
  CHECK_FALSE(fs::exists(fs::path(o.out_dir) / "checkpoints" / "latest"));
  CHECK_FALSE(fs::exists(fs::path(o.out_dir) / "checkpoints" / "step-12.safetensors"));
  CHECK(s["checkpoint"].is_null());  // (it named the file that was never written)
}

TEST_CASE(
    "local_sgd: a stop after the last synchronisation but one ends the run at its last, "
    "interrupted") {
  // With no multiple of sync_every left, the stop was announced ("at the next Local SGD
  // synchronisation") and dropped: the run went on to its final evaluation, status completed,
  // exit 0. Its last step synchronises (end_step's `last`), so it is where the stop takes effect.
  spdlog::set_level(spdlog::level::off);
  for (const auto& layout : std::vector<std::vector<std::string>>{
           {"distributed.world_size=2"},
           {"distributed.world_size=4", "distributed.pipeline.stages=2", "data.batch_size=16"}}) {
    CAPTURE(layout.size());
    TempDir dir;
    auto sets = layout;
    sets.insert(sets.end(),
                {"distributed.strategy=local_sgd", "distributed.local_sgd.sync_every=100"});
    RunOptions o;
    o.out_dir = dir / "run";
    StopRequest stop;
    o.stop = &stop;
    o.after_step = [&stop](int rank, int64_t step, double, int64_t) {
      if (rank == 0 && step == 4) stop.signal = SIGINT;
    };
    const auto s = run_training(parse_config(kSmall, "l.yaml", sets), o);
    CHECK(s["status"] == "interrupted");
    CHECK(s["steps"] == 12);
    CHECK(s["interrupted_by"] == "SIGINT");
  }
  spdlog::set_level(spdlog::level::info);
}

TEST_CASE("local_sgd: a synchronisation that makes the parameters non-finite ends the run") {
  // The non-finite guard judges a step before its synchronisation: an fp16 change that
  // overflowed passed it, and under train.nonfinite skip every later step was skipped and the
  // run completed, exit 0, with NaN weights in its final checkpoint.
  spdlog::set_level(spdlog::level::off);
  for (const char* nonfinite : {"train.nonfinite=skip", "train.nonfinite=abort"}) {
    CAPTURE(nonfinite);
    TempDir dir;
    RunOptions o;
    o.out_dir = dir / "run";
    const Config cfg =
        parse_config(kSmall, "l.yaml",
                     {"distributed.world_size=2", "distributed.strategy=local_sgd",
                      "distributed.local_sgd.sync_every=4", "distributed.compression.type=fp16",
                      "optimizer.type=sgd", "optimizer.lr=1000", nonfinite});
    CHECK_THROWS_WITH(run_training(cfg, o),
                      doctest::Contains("the Local SGD synchronisation at step 4 made"));
  }
  spdlog::set_level(spdlog::level::info);
}

TEST_CASE("a trace that cannot be written is said, and does not fail the finished run") {
  // (it failed it: exit 1 after the run's results were saved, which `dtrain launch
  // --max-restarts` answered by restarting the finished job)
  TempDir dir;
  auto group = make_inproc_group(1);
  Communicator comm(std::move(group[0]));
  Tracer tracer(true, 0);
  { TraceScope s(&tracer, "step", "train"); }
  RunOptions opts;
  opts.trace = (dir / "gone/trace.json");  // (a folder that does not exist: every write fails)
  dtrain::testing::LogCapture cap;
  CHECK_NOTHROW(finish_trace(opts, comm, tracer));
  CHECK_MESSAGE(dtrain::testing::contains(cap.text(), "trace: could not write '" + opts.trace),
                cap.text());
  CHECK(dtrain::testing::contains(cap.text(), "the run's results are saved"));
}
