#include <doctest/doctest.h>

#include <limits>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <spdlog/spdlog.h>

#include "checkpoint/safetensors.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "nn/registry.h"
#include "test_util.h"
#include "train/train_test_util.h"
#include "train/trainer.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/interrupt.h"

using namespace dtrain;
using dtrain::testing::checkpoint_rel_diff;
using dtrain::testing::read_text;
using dtrain::testing::TempDir;

namespace fs = std::filesystem;

namespace {

const char* kSynthetic = R"(
seed: 5
model: {hidden: [32, 32], activation: relu}
data:
  format: synthetic
  synthetic: {samples: 2000, features: 12, classes: 4, noise: 0.5}
  batch_size: 32
optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
train: {epochs: 4, log_every: 10}
runtime: {threads: 1}
)";

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST_CASE("end to end: a synthetic run learns and writes metrics, summary and checkpoints") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  const Config cfg = parse_config(kSynthetic, "synthetic.yaml");
  RunOptions opts;
  opts.out_dir = dir / "run";
  const nlohmann::json s = run_training(cfg, opts);
  CHECK(s["status"] == "completed");
  CHECK(s["test_accuracy"].get<double>() > 0.9);  // chance is 0.25
  CHECK(s["world_size"] == 1);
  CHECK(s["steps"] == 4 * 50);  // 1600 train samples / 32
  CHECK(s["comm_bytes_sent"] == 0);
  for (const char* key : {"final_train_loss", "test_loss", "wall_s", "train_samples_per_s",
                          "peak_rss_mb", "config_hash", "epochs", "strategy"})
    CHECK_MESSAGE(s.contains(key), key);

  const auto recs = read_jsonl(dir / "run/metrics.jsonl");
  int train = 0, eval = 0;
  double first_loss = -1, last_loss = -1;
  for (const auto& r : recs) {
    if (r["kind"] == "train") {
      ++train;
      for (const char* k : {"step", "epoch", "loss", "lr", "samples_per_s"}) REQUIRE(r.contains(k));
      if (first_loss < 0) first_loss = r["loss"];
      last_loss = r["loss"];
    } else {
      REQUIRE(r["kind"] == "eval");
      ++eval;
      for (const char* k : {"step", "epoch", "test_loss", "test_accuracy"}) REQUIRE(r.contains(k));
      CHECK(r["test_accuracy"].get<double>() >= 0.0);
      CHECK(r["test_accuracy"].get<double>() <= 1.0);
    }
  }
  CHECK(train == 20);
  CHECK(eval == 4);  // one per epoch
  CHECK(last_loss < first_loss * 0.5);
  CHECK(read_text(dir / "run/checkpoints/latest") == "step-200.safetensors\n");
  const StFile f = read_safetensors(dir / "run/checkpoints/step-200.safetensors");
  CHECK(f.tensors.count("layers.0.weight") == 1);
  CHECK(f.tensors.count("optim.momentum.layers.0.weight") == 1);
  CHECK(f.metadata.at("step") == "200");
  const auto summary = nlohmann::json::parse(read_text(dir / "run/summary.json"));
  CHECK(summary["steps"] == 200);
}

TEST_CASE("resume from a mid-run checkpoint ends bitwise equal to the uninterrupted run") {
  spdlog::set_level(spdlog::level::warn);
  // Adam, dropout, cosine with warmup, gradient accumulation, clipping, an epoch boundary between
  // the checkpoint and the end: every piece of state a resume must restore.
  const std::string yaml = R"(
seed: 9
model: {hidden: [16], activation: gelu, dropout: 0.2, layer_norm: true}
data:
  format: synthetic
  synthetic: {samples: 250, features: 6, classes: 3, noise: 0.7}
  batch_size: 16
optimizer:
  type: adamw
  lr: 0.01
  weight_decay: 0.01
  clip_grad_norm: 1.0
  schedule: {type: cosine, warmup_steps: 5}
train: {epochs: 6, log_every: 5, grad_accum_steps: 2, checkpoint: {every_steps: 7, keep_last: 10}}
runtime: {threads: 1}
)";
  TempDir dir;
  const Config cfg = parse_config(yaml, "resume.yaml");
  RunOptions full;
  full.out_dir = dir / "full";
  const nlohmann::json s_full = run_training(cfg, full);
  const int64_t steps = s_full["steps"];
  REQUIRE(steps > 14);

  // Stop after step 7 (the state of that checkpoint), then resume in a new folder.
  fs::create_directories(dir / "resumed/checkpoints");
  fs::copy_file(dir / "full/checkpoints/step-7.safetensors",
                dir / "resumed/checkpoints/step-7.safetensors");
  std::ofstream(dir / "resumed/checkpoints/latest") << "step-7.safetensors\n";
  RunOptions res;
  res.out_dir = dir / "resumed";
  res.resume = "auto";
  const nlohmann::json s_res = run_training(cfg, res);
  CHECK(s_res["steps"] == steps);
  CHECK(s_res["steps_this_run"] == steps - 7);

  const std::string last = "/checkpoints/step-" + std::to_string(steps) + ".safetensors";
  const StFile a = read_safetensors(dir / "full" + last);
  const StFile b = read_safetensors(dir / "resumed" + last);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    REQUIRE(b.tensors.count(name) == 1);
    CHECK_MESSAGE(t.data == b.tensors.at(name).data, name);  // bitwise
  }
  CHECK(a.metadata.at("rng") == b.metadata.at("rng"));

  // A fresh (un-resumed) run with a different seed does differ: the comparison can fail.
  Config other = cfg;
  other.seed = 10;
  RunOptions o;
  o.out_dir = dir / "other";
  run_training(other, o);
  const StFile c = read_safetensors(dir / "other" + last);
  CHECK(c.tensors.at("layers.0.weight").data != a.tensors.at("layers.0.weight").data);
}

TEST_CASE("max_steps stops early, keep_last prunes") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  Config cfg = parse_config(
      kSynthetic, "s.yaml",
      {"train.max_steps=30", "train.checkpoint.every_steps=10", "train.checkpoint.keep_last=2"});
  RunOptions opts;
  opts.out_dir = dir / "run";
  const auto s = run_training(cfg, opts);
  CHECK(s["steps"] == 30);
  std::set<std::string> files;
  for (auto& e : fs::directory_iterator(dir / "run/checkpoints")) files.insert(e.path().filename());
  CHECK(files == std::set<std::string>{"latest", "step-20.safetensors", "step-30.safetensors"});
}

TEST_CASE("a model shape that contradicts the data is a user error") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  RunOptions opts;
  opts.out_dir = dir / "run";
  // Labels 0..3: the first above num_classes 3 is named by its place in the generated data, not
  // in the shuffled split.
  CHECK_THROWS_WITH_AS(
      run_training(parse_config(kSynthetic, "s.yaml", {"model.num_classes=3"}), opts),
      doctest::Contains("the training data (data.train) has label 3 (the first out of range in "
                        "generated sample "),
      UserError);
  // A CSV file's row, counted after the header (it was "label 7 of sample 7": an index into the
  // split the held-out rows were taken from).
  std::string csv = "a,b,label\n";
  for (int i = 0; i < 20; ++i)
    csv += std::to_string(i) + ",1," + (i == 15 ? "7" : std::to_string(i % 2)) + "\n";
  const std::string file = dir.write("lab.csv", csv);
  const std::string want = "(the first out of range in data row 16 of '" + file + "')";
  CHECK_THROWS_WITH_AS(
      run_training(parse_config("data: {format: csv, train: {path: " + file +
                                    "}, test_fraction: 0.5}\nmodel: {num_classes: 3}\n",
                                "c.yaml", {}),
                   opts),
      doctest::Contains(want.c_str()), UserError);
  CHECK_THROWS_AS(
      run_training(parse_config(kSynthetic, "s.yaml", {"model.input_features=13"}), opts),
      UserError);
}

TEST_CASE("W in-process ranks with batch b equal one process with batch W*b") {
  spdlog::set_level(spdlog::level::warn);
  // 301 training samples, b = 8: for W = 2, 3 and 4 the epoch ends in a short global batch of
  // 13 samples (7/6, 5/4/4, 4/3/3/3 across the ranks) before step 25, checked below.
  const std::string base = R"(
seed: 21
model: {hidden: [24, 16], activation: tanh}
data:
  format: synthetic
  synthetic: {samples: 376, features: 10, classes: 3, noise: 0.8}
  batch_size: 8
train: {epochs: 0, max_steps: 25, log_every: 5}
runtime: {threads: 1}
)";
  for (const char* optim : {"{type: sgd, lr: 0.05, momentum: 0.9}", "{type: adam, lr: 0.003}"}) {
    for (int world : {2, 3, 4}) {
      TempDir dir;
      const Config single = parse_config(
          base, "fid.yaml",
          {std::string("optimizer=") + optim, "data.batch_size=" + std::to_string(8 * world)});
      const Config multi = parse_config(
          base, "fid.yaml",
          {std::string("optimizer=") + optim, "distributed.world_size=" + std::to_string(world)});
      {
        // The run passes the epoch's last global batch, and the ranks split it unevenly.
        const DataSplits data = load_data(multi.data, multi.seed);
        const Sampler sm(data.train.rows, 8, world, 0, true, false, 21);
        CHECK(sm.batches_per_epoch() <= 25);
        CHECK(sm.global_batch_size(sm.batches_per_epoch() - 1) % world != 0);
      }
      RunOptions o1, o2;
      o1.out_dir = dir / "single";
      o2.out_dir = dir / "multi";
      run_training(single, o1);
      const auto s = run_training(multi, o2);
      CHECK(s["world_size"] == world);
      CHECK(s["comm_bytes_sent"].get<uint64_t>() > 0);
      const double rel = checkpoint_rel_diff(dir / "single/checkpoints/step-25.safetensors",
                                             dir / "multi/checkpoints/step-25.safetensors");
      INFO("optimizer ", std::string(optim), " world ", world, " relative difference ", rel);
      CHECK(rel < 1e-5);
      if (world == 3) {
        // Many small DDP buckets (each all-reduce launched from inside backward) give the same.
        Config bucketed = multi;
        bucketed.distributed.ddp.bucket_mb = 0.001;  // 262 floats: a bucket per layer
        RunOptions ob;
        ob.out_dir = dir / "bucketed";
        run_training(bucketed, ob);
        CHECK(checkpoint_rel_diff(dir / "single/checkpoints/step-25.safetensors",
                                  dir / "bucketed/checkpoints/step-25.safetensors") < 1e-5);
      }
      // And the comparison can fail: a different learning rate is far off.
      if (world == 2) {
        Config other = multi;
        other.optimizer.lr *= 1.5;
        RunOptions o3;
        o3.out_dir = dir / "other";
        run_training(other, o3);
        CHECK(checkpoint_rel_diff(dir / "single/checkpoints/step-25.safetensors",
                                  dir / "other/checkpoints/step-25.safetensors") > 1e-3);
      }
    }
  }
}

TEST_CASE("resume of an in-process 2-rank run with dropout is bitwise exact") {
  spdlog::set_level(spdlog::level::warn);
  const std::string yaml = R"(
seed: 4
model: {hidden: [16], dropout: 0.3}
data:
  format: synthetic
  synthetic: {samples: 300, features: 6, classes: 3}
  batch_size: 8
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 0, max_steps: 24, checkpoint: {every_steps: 10, keep_last: 5}}
distributed: {world_size: 2}
runtime: {threads: 1}
)";
  TempDir dir;
  const Config cfg = parse_config(yaml, "r.yaml");
  RunOptions full;
  full.out_dir = dir / "full";
  run_training(cfg, full);
  RunOptions res;
  res.out_dir = dir / "res";
  res.resume = dir / "full/checkpoints/step-10.safetensors";
  const auto s = run_training(cfg, res);
  CHECK(s["steps_this_run"] == 14);
  const StFile a = read_safetensors(dir / "full/checkpoints/step-24.safetensors");
  const StFile b = read_safetensors(dir / "res/checkpoints/step-24.safetensors");
  for (const auto& [name, t] : a.tensors) CHECK_MESSAGE(t.data == b.tensors.at(name).data, name);
  CHECK(a.metadata.at("rng").find(';') != std::string::npos);  // one state per rank
}

namespace {

// Equal shares per rank (drop_last): the average of the ranks' mean gradients is then the mean
// gradient of the global batch.
const char* kLocalSgdBase = R"(
seed: 8
model: {hidden: [20], activation: tanh}
data:
  format: synthetic
  synthetic: {samples: 500, features: 7, classes: 3}
  batch_size: 8
  drop_last: true
optimizer: {type: sgd, lr: 0.1}
train: {epochs: 0, max_steps: 20}
runtime: {threads: 1}
)";

// The relative difference of the states after `step` steps of kLocalSgdBase with `sets`,
// trained by DDP and by Local SGD with H = 1 (plain averaging, SGD without momentum).
double local_sgd_h1_vs_ddp(const std::vector<std::string>& sets, int step) {
  TempDir dir;
  RunOptions o1, o2;
  o1.out_dir = dir / "ddp";
  o2.out_dir = dir / "local";
  run_training(parse_config(kLocalSgdBase, "l.yaml", sets), o1);
  auto local = sets;
  local.insert(local.end(),
               {"distributed.strategy=local_sgd", "distributed.local_sgd.sync_every=1"});
  const auto s = run_training(parse_config(kLocalSgdBase, "l.yaml", local), o2);
  CHECK(s["strategy"] == "local_sgd");
  const std::string ck = "/checkpoints/step-" + std::to_string(step) + ".safetensors";
  return checkpoint_rel_diff(o1.out_dir + ck, o2.out_dir + ck);
}

}  // namespace

TEST_CASE("local_sgd with H = 1, plain SGD and plain averaging equals DDP") {
  spdlog::set_level(spdlog::level::warn);
  for (int world : {2, 3}) {
    INFO("world ", world);
    CHECK(local_sgd_h1_vs_ddp({"distributed.world_size=" + std::to_string(world)}, 20) < 1e-5);
  }
}

TEST_CASE(
    "local_sgd with H = 1 weights an uneven short batch as DDP does, a rank without rows too") {
  spdlog::set_level(spdlog::level::warn);
  // 403 training rows, global batch 16: step 26 is the epoch's short batch of 3 rows, split
  // 1, 1, 1, 0 over the 4 ranks. An unweighted parameter average counted the empty rank's
  // unchanged parameters as a quarter of the step (measured: 0.47 relative difference).
  CHECK(local_sgd_h1_vs_ddp(
            {"data.synthetic.samples=504", "data.batch_size=4", "data.drop_last=false",
             "distributed.world_size=4", "train.max_steps=30"},
            30) < 1e-5);
}

TEST_CASE("local_sgd with H = 4 sends about a quarter of DDP's bytes and still learns") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  const std::vector<std::string> common = {"distributed.world_size=2", "train.epochs=2"};
  RunOptions o1, o2, o3;
  o1.out_dir = dir / "ddp";
  o2.out_dir = dir / "local";
  o3.out_dir = dir / "outer";
  const auto ddp = run_training(parse_config(kSynthetic, "s.yaml", common), o1);
  auto lc = common;
  lc.push_back("distributed.strategy=local_sgd");
  lc.push_back("distributed.local_sgd.sync_every=4");
  const auto local = run_training(parse_config(kSynthetic, "s.yaml", lc), o2);
  const double ratio =
      local["comm_bytes_sent"].get<double>() / ddp["comm_bytes_sent"].get<double>();
  // 50 steps: synchronisations at steps 4, 8, ..., 48 and the final step 50 = 13 of DDP's 50
  // gradient all-reduces (plus a few floats for losses and evaluation on both sides).
  CHECK(ratio == doctest::Approx(13.0 / 50).epsilon(0.02));
  CHECK(local["test_accuracy"].get<double>() > 0.9);
  // DiLoCo-style outer Nesterov step with averaged optimizer state also trains.
  lc.push_back("distributed.local_sgd.outer_lr=0.7");
  lc.push_back("distributed.local_sgd.sync_optimizer_state=true");
  const auto outer = run_training(parse_config(kSynthetic, "s.yaml", lc), o3);
  CHECK(outer["test_accuracy"].get<double>() > 0.9);
  const StFile f = read_safetensors(dir / "outer/checkpoints/step-50.safetensors");
  CHECK(f.tensors.count("optim.outer_momentum.layers.0.weight") == 1);
  // Compressed synchronisation: int8 parameter moves (with error feedback) send about a quarter
  // of plain Local SGD's bytes and learn as well, with and without the outer step.
  for (const bool with_outer : {false, true}) {
    auto cc = common;
    cc.insert(cc.end(), {"distributed.strategy=local_sgd", "distributed.local_sgd.sync_every=4",
                         "distributed.compression.type=int8"});
    if (with_outer) cc.push_back("distributed.local_sgd.outer_lr=0.7");
    RunOptions oc;
    oc.out_dir = dir / (with_outer ? "int8_outer" : "int8");
    const auto c = run_training(parse_config(kSynthetic, "s.yaml", cc), oc);
    CAPTURE(with_outer);
    const double r = c["comm_bytes_sent"].get<double>() / local["comm_bytes_sent"].get<double>();
    CHECK(r < 0.3);
    CHECK(r > 0.2);
    CHECK(c["test_accuracy"].get<double>() > 0.9);
  }
}

TEST_CASE("compression none is DDP's exact all-reduce, and every compressed type is not") {
  spdlog::set_level(spdlog::level::warn);
  // The claim: with type none the gradients travel as float32 through the bucketed all-reduce,
  // so the run is DDP -- bitwise equal to DDP with other buckets (for 2 ranks the ring's sums
  // do not depend on the bucket split) and equal to one process with the global batch up to
  // float32 rounding -- while each compressed type changes the result measurably more.
  TempDir dir;
  const std::vector<std::string> base = {"train.epochs=0", "train.max_steps=20"};
  auto with = [&](std::vector<std::string> extra, const std::string& out) {
    auto o = base;
    o.insert(o.end(), extra.begin(), extra.end());
    RunOptions ro;
    ro.out_dir = dir / out;
    run_training(parse_config(kSynthetic, "s.yaml", o), ro);
    return dir / (out + "/checkpoints/step-20.safetensors");
  };
  const std::string w2 = "distributed.world_size=2";
  const std::string single = with({"data.batch_size=64"}, "single");  // the global batch
  const std::string none = with({w2, "distributed.compression.type=none"}, "none");
  // DDP with a bucket per layer, each all-reduce launched from inside backward.
  const std::string bucketed = with({w2, "distributed.ddp.bucket_mb=0.001"}, "bucketed");
  const StFile a = read_safetensors(none), b = read_safetensors(bucketed);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [name, t] : a.tensors) CHECK_MESSAGE(t.data == b.tensors.at(name).data, name);
  CHECK(a.metadata.at("config_hash") != b.metadata.at("config_hash"));
  const double d_none = checkpoint_rel_diff(single, none);
  CHECK(d_none < 1e-6);  // measured 1.4e-7; fp16, the lightest compression, 1.1e-5
  for (const std::string type : {"fp16", "bf16", "int8", "topk", "powersgd"}) {
    CAPTURE(type);
    const std::string c = with({w2, "distributed.compression.type=" + type}, type);
    const double d = checkpoint_rel_diff(single, c);
    MESSAGE(type, ": ", d, " from one process with the global batch (none: ", d_none, ")");
    CHECK(checkpoint_rel_diff(none, c) > 0.0);
    CHECK(d > 10 * d_none);
    if (type == "fp16") CHECK(d < 1e-3);  // the lightest one stays close
  }
}

TEST_CASE("powersgd compression trains as well as DDP on a quarter of the bytes") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  auto with = [&](std::vector<std::string> extra, const std::string& out) {
    std::vector<std::string> o = {"distributed.world_size=2"};
    o.insert(o.end(), extra.begin(), extra.end());
    RunOptions ro;
    ro.out_dir = dir / out;
    return run_training(parse_config(kSynthetic, "s.yaml", o), ro);
  };
  const auto ddp = with({}, "ddp");
  // 12-32-32-4 MLP at rank 2: all three weights as factors, 356 of 1604 floats per step.
  const auto psgd =
      with({"distributed.compression.type=powersgd", "distributed.compression.rank=2"}, "psgd");
  const double ratio = psgd["comm_bytes_sent"].get<double>() / ddp["comm_bytes_sent"].get<double>();
  INFO("bytes ratio ", ratio, ", accuracy ", psgd["test_accuracy"].get<double>(), " vs ",
       ddp["test_accuracy"].get<double>());
  CHECK(ratio < 0.25);
  CHECK(psgd["test_accuracy"].get<double>() > 0.9);
  CHECK(psgd["test_accuracy"].get<double>() > ddp["test_accuracy"].get<double>() - 0.02);
}

// A small synthetic run for the non-finite tests (DTRAIN_FAULT nan makes a rank's step NaN).
const char* const kNanBase = R"(
seed: 3
model: {hidden: [12, 8]}
data:
  format: synthetic
  synthetic: {samples: 400, features: 6, classes: 3}
  batch_size: 8
optimizer: {type: adam, lr: 0.01}
train: {epochs: 0, max_steps: 12, log_every: 4}
runtime: {threads: 1}
)";

TEST_CASE("a NaN in one rank's gradient aborts naming the step, or is skipped on every rank") {
  spdlog::set_level(spdlog::level::err);
  TempDir dir;
  const std::string base = kNanBase;
  struct Case {
    std::vector<std::string> sets;
    int rank;
  };
  const std::vector<Case> cases = {
      {{"distributed.world_size=2"}, 1},
      {{"distributed.world_size=3", "distributed.strategy=fsdp"}, 2},
      {{"distributed.world_size=2", "distributed.strategy=zero2"}, 0},
      {{"distributed.world_size=2", "distributed.strategy=local_sgd",
        "distributed.local_sgd.sync_every=2"},
       1},
      {{"distributed.world_size=2", "distributed.strategy=pipeline"}, 0},
      // Compression: int8 quantised a NaN block to zeros (the step passed as finite), and a
      // skip kept the NaN in the error-feedback residual or PowerSGD's warm start, so every
      // later step was skipped too.
      {{"distributed.world_size=2", "distributed.compression.type=int8"}, 1},
      {{"distributed.world_size=2", "distributed.compression.type=fp16"}, 1},
      {{"distributed.world_size=2", "distributed.compression.type=topk"}, 0},
      {{"distributed.world_size=2", "distributed.compression.type=powersgd",
        "distributed.compression.error_feedback=false"},
       0},
  };
  int k = 0;
  for (const auto& c : cases) {
    CAPTURE(c.sets.back());
    RunOptions o;
    o.out_dir = dir / ("abort" + std::to_string(k));
    o.faults = parse_faults("nan:rank=" + std::to_string(c.rank) + ":step=5", 0);
    const Config abort_cfg = parse_config(base, "n.yaml", c.sets);
    CHECK_THROWS_WITH(run_training(abort_cfg, o),
                      doctest::Contains("is not finite at step 5 (train.nonfinite: abort"));
    auto skip_sets = c.sets;
    skip_sets.push_back("train.nonfinite=skip");
    o.out_dir = dir / ("skip" + std::to_string(k++));
    const auto s = run_training(parse_config(base, "n.yaml", skip_sets), o);
    CHECK(s["skipped_steps"] == 1);
    CHECK(s["steps"] == 12);
    CHECK(std::isfinite(s["final_train_loss"].get<double>()));
    // (top-k sends a few percent of each gradient: 12 steps do not reach 50% with it.)
    if (c.sets.back() != "distributed.compression.type=topk")
      CHECK(s["test_accuracy"].get<double>() > 0.5);
  }
  // Without the fault nothing is skipped.
  RunOptions o;
  o.out_dir = dir / "clean";
  CHECK(run_training(parse_config(base, "n.yaml", {"distributed.world_size=2"}),
                     o)["skipped_steps"] == 0);
}

TEST_CASE("a non-finite loss with a stop vote in flight is the error of every rank, not an abort") {
  // As `dtrain run` trains (RunOptions::stop set, so a stop vote is in flight during each step):
  // with 4 or more in-process ranks, half the runs reported a peer's "a rank left training while
  // its stop vote was in flight" instead of the verdict every rank shared.
  spdlog::set_level(spdlog::level::off);
  TempDir dir;
  const std::string base = kNanBase;
  int k = 0;
  for (const int world : {4, 8})
    for (int rep = 0; rep < 5; ++rep) {
      CAPTURE(world);
      StopRequest stop;
      RunOptions o;
      o.stop = &stop;
      o.out_dir = dir / ("r" + std::to_string(k++));
      o.faults = parse_faults("nan:rank=" + std::to_string(rep % world) + ":step=5", 0);
      const Config cfg =
          parse_config(base, "n.yaml", {"distributed.world_size=" + std::to_string(world)});
      CHECK_THROWS_WITH(run_training(cfg, o),
                        doctest::Contains("is not finite at step 5 (train.nonfinite: abort"));
    }
  spdlog::set_level(spdlog::level::info);
}

TEST_CASE("a rank that is slower at every step is named as a straggler") {
  spdlog::set_level(spdlog::level::err);
  TempDir dir;
  RunOptions o;
  o.out_dir = dir / "slow";
  o.faults = parse_faults("delay:rank=1:ms=15", 0);
  const auto s = run_training(parse_config(kSynthetic, "s.yaml",
                                           {"distributed.world_size=3", "train.epochs=0",
                                            "train.max_steps=20", "train.log_every=4"}),
                              o);
  // Records at steps 4, 8, ..., 20: the second one running warns, and every one after.
  CHECK(s["straggler_warnings"].get<int64_t>() >= 3);
  // Local SGD too: its ranks wait for the slow one in the step's non-finite verdict, which
  // counted as compute (no warning, compute_s all of train_s) before that wait was timed.
  o.out_dir = dir / "slow_local";
  const auto l =
      run_training(parse_config(kSynthetic, "s.yaml",
                                {"distributed.world_size=3", "train.epochs=0", "train.max_steps=20",
                                 "train.log_every=4", "distributed.strategy=local_sgd"}),
                   o);
  CHECK(l["straggler_warnings"].get<int64_t>() >= 3);
  CHECK(l["exposed_comm_s"].get<double>() > 0.5 * l["train_s"].get<double>());
  // A slow replica of a pipeline's second stage (rank 3 of 2 stages x 2 replicas): its stage
  // warned in its own log, and summary.json (rank 0's, of stage 0) counted none.
  o.out_dir = dir / "slow_stage";
  o.faults = parse_faults("delay:rank=3:ms=15", 0);
  const auto p =
      run_training(parse_config(kSynthetic, "s.yaml",
                                {"distributed.world_size=4", "distributed.strategy=pipeline",
                                 "distributed.pipeline.stages=2", "train.epochs=0",
                                 "train.max_steps=20", "train.log_every=4"}),
                   o);
  CHECK(p["straggler_warnings"].get<int64_t>() >= 3);
}

TEST_CASE(
    "the memory check counts compression's buffers, Local SGD's copies and zero2/fsdp's units") {
  const std::string base =
      "data: {format: synthetic}\noptimizer: {type: sgd, lr: 0.1, momentum: 0.9}\n";
  const auto floats = [&](const std::vector<std::string>& sets, int replicas = 2, double unit = 0) {
    return training_state_floats(parse_config(base, "m.yaml", sets), 1000, replicas, unit);
  };
  // ddp with SGD momentum: parameters, gradients, momentum.
  CHECK(floats({}) == 3000);
  // An error-feedback residual per gradient, and its copy through each step under skip; the
  // elementwise compressors' work and decoding (2000) and both ranks' messages (int8: 4 block
  // scales and 250 floats of bytes each; fp16: 500; topk 10%: 100 values and 100 indices, and
  // its order, 1000 int64s).
  CHECK(floats({"distributed.compression.type=int8"}) == 3000 + 1000 + 2000 + 2 * 254);
  CHECK(floats({"distributed.compression.type=int8", "train.nonfinite=skip"}) ==
        3000 + 2000 + 2000 + 2 * 254);
  CHECK(floats({"distributed.compression.type=fp16"}) == 3000 + 1000 + 2000 + 2 * 500);
  CHECK(floats({"distributed.compression.type=topk", "distributed.compression.ratio=0.1"}) ==
        3000 + 1000 + 2000 + 2 * 200 + 2000);
  CHECK(floats({"distributed.compression.type=powersgd", "train.nonfinite=skip"}) == 5000);
  CHECK(floats({"distributed.compression.type=int8", "distributed.compression.error_feedback=false",
                "train.nonfinite=skip"}) == 3000 + 2000 + 2 * 254);
  // Local SGD compresses at synchronisations, after the verdict: the residual but no copy; it
  // keeps the anchor and the delta it compresses (and DiLoCo's outer momentum).
  CHECK(floats({"distributed.strategy=local_sgd", "distributed.compression.type=int8",
                "train.nonfinite=skip"}) == 5000 + 1000 + 2000 + 2 * 254);
  CHECK(floats({"distributed.strategy=local_sgd", "distributed.local_sgd.outer_lr=0.7"}) == 5000);
  CHECK(floats({"distributed.strategy=local_sgd", "distributed.compression.type=powersgd"}) ==
        5000 + 1000);
  // Sharded strategies: ZeRO-2 keeps the parameters whole, gradients and momentum sharded, and
  // during backward the full gradients of 3 units; fsdp also gathers 2 units.
  CHECK(floats({"distributed.strategy=zero2"}, 2, 100) == 2000 + 300);
  CHECK(floats({"distributed.strategy=fsdp"}, 4, 100) == 750 + 300 + 200);
  // One unit, the whole model (fsdp.unit: model): gathered whole, its gradient whole.
  CHECK(floats({"distributed.strategy=fsdp"}, 4) == 750 + 1000 + 1000);
  // Without resharding after forward every unit stays gathered until the last backward.
  CHECK(floats({"distributed.strategy=fsdp", "distributed.fsdp.reshard_after_forward=false"}, 4,
               100) == 750 + 300 + 1000);
  // One replica shards nothing but gathers and reduce-scatters units all the same.
  CHECK(floats({"distributed.strategy=fsdp"}, 1, 100) == 3000 + 300 + 200);
}

TEST_CASE("a resume's full-model copies are counted at MemoryPlan::resume_params when given") {
  // Under tensor parallelism every rank reads the whole model's state, then keeps its slice: the
  // check counted the slice's parameters, T times too few. (The loop gives the whole model's
  // count: train/loop.cc's check_memory.)
  const int64_t avail = available_memory_bytes();
  if (avail < 0) return;
  const Config c = parse_config(
      "model: {type: mlp, hidden: [8]}\ndata: {format: synthetic}\n"
      "optimizer: {type: sgd, lr: 0.1, momentum: 0.9}\n",
      "m.yaml");
  const Model m = build_model(c.model, {{16}, 4});
  MemoryPlan plan{.stages = {{0, m.num_layers()}}, .resume = true, .train_rows = 8, .eval_rows = 0};
  check_training_memory(c, m, plan);  // the small model's own copies fit
  // Parameters and momentum, 8 bytes per parameter of the whole model: one more than fits.
  plan.resume_params = avail / 8 + 1;
  CHECK_THROWS_AS(check_training_memory(c, m, plan), UserError);
}

TEST_CASE("rank 0's process counts the Local SGD ranks' optimizer state it gathers") {
  // Without sync_optimizer_state rank 0 holds every other rank's momentum while it writes a
  // checkpoint (train/replica_state.h): (W - 1) x the state, in its process only.
  const int64_t avail = available_memory_bytes();
  if (avail < 0) return;
  const std::string yaml =
      "model: {type: mlp, hidden: [8]}\ndata: {format: synthetic}\n"
      "optimizer: {type: sgd, lr: 0.1, momentum: 0.9}\ndistributed: {strategy: local_sgd}\n";
  const Config c = parse_config(yaml, "m.yaml");
  const Model m = build_model(c.model, {{16}, 4});
  // Enough replicas that their momentum (4 bytes per parameter each) is more than fits.
  const int64_t w = avail / (4 * m.param_count()) + 2;
  REQUIRE(w < std::numeric_limits<int>::max());
  MemoryPlan plan{.stages = {{0, m.num_layers()}},
                  .replicas = static_cast<int>(w),
                  .gathered_share = 0.0,
                  .train_rows = 8,
                  .eval_rows = 0};
  check_training_memory(c, m, plan);  // another rank's process: its own state
  plan.gathered_share = 1.0;
  CHECK_THROWS_AS(check_training_memory(c, m, plan), UserError);
  // Averaged state is one state: nothing gathered.
  check_training_memory(
      parse_config(yaml, "m.yaml", {"distributed.local_sgd.sync_optimizer_state=true"}), m, plan);
}

TEST_CASE("the memory check counts the job's rank processes on this machine together") {
  // Each gRPC rank saw the whole machine's available memory as it started: two local ranks of a
  // model that fits once but not twice both passed, and the kernel killed one (train/loop.cc
  // gives LOCAL_WORLD_SIZE as processes_here).
  const int64_t machine = machine_memory_available_bytes();
  if (machine < 0 || address_space_limit_bytes() >= 0) return;
  const Config c = parse_config(
      "model: {type: mlp, hidden: [1024, 1024]}\ndata: {format: synthetic}\n"
      "optimizer: {type: sgd, lr: 0.1, momentum: 0.9}\n",
      "m.yaml");
  const Model m = build_model(c.model, {{784}, 10});
  // Parameters, gradients and momentum: 12 bytes per parameter, about 22 MB.
  const double need = 12.0 * static_cast<double>(m.param_count());
  MemoryPlan plan{.stages = {{0, m.num_layers()}}, .train_rows = 8, .eval_rows = 0};
  check_training_memory(c, m, plan);
  plan.processes_here = static_cast<int>(std::min<double>(1e6, 2.0 * machine / need) + 1);
  try {
    check_training_memory(c, m, plan);
    FAIL("accepted ", plan.processes_here, " processes of ", need, " bytes on ", machine);
  } catch (const UserError& e) {
    CHECK_MESSAGE(dtrain::testing::contains(e.what(), "rank processes (LOCAL_WORLD_SIZE)"),
                  e.what());
  }
}
