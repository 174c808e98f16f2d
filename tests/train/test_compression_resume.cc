// Compression state in checkpoints (train/compression_state.h): a resumed compressed run ends
// bitwise where the uninterrupted one ends, for every compression type, DDP and Local SGD; the
// resume rule for another world size or type; compression at world size 1.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "checkpoint/safetensors.h"
#include "comm/inproc.h"
#include "test_util.h"
#include "train/compression_state.h"
#include "train/train_test_util.h"
#include "train/trainer.h"

using namespace dtrain;
using dtrain::testing::checkpoint_rel_diff;
using dtrain::testing::LogCapture;
using dtrain::testing::TempDir;

namespace fs = std::filesystem;

namespace {

// SGD with momentum over 2 ranks; 24 steps with a checkpoint at step 10 (and 20, 24).
const char* kCfg = R"(
seed: 6
model: {hidden: [24, 16]}
data:
  format: synthetic
  synthetic: {samples: 600, features: 10, classes: 3, noise: 0.6}
  batch_size: 8
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 0, max_steps: 24, log_every: 8, checkpoint: {every_steps: 10, keep_last: 5}}
distributed: {world_size: 2}
runtime: {threads: 1}
)";

const std::vector<std::string> kTypes = {"fp16", "bf16", "int8", "topk", "powersgd"};

std::vector<std::string> type_sets(const std::string& type) {
  std::vector<std::string> s = {"distributed.compression.type=" + type};
  if (type == "topk") s.push_back("distributed.compression.ratio=0.05");
  if (type == "powersgd") s.push_back("distributed.compression.rank=2");
  return s;
}

nlohmann::json run(const Config& cfg, const std::string& out, const std::string& resume = "") {
  RunOptions o;
  o.out_dir = out;
  o.resume = resume;
  return run_training(cfg, o);
}

// Every tensor of a and b bitwise equal (same names).
bool same_tensors(const StFile& a, const StFile& b) {
  if (a.tensors.size() != b.tensors.size()) return false;
  for (const auto& [name, t] : a.tensors) {
    auto it = b.tensors.find(name);
    if (it == b.tensors.end() || it->second.data != t.data) return false;
  }
  return true;
}

// `src` rewritten as a checkpoint without compression state: format version 1, as a dtrain
// before checkpoint format 2 wrote it.
void write_as_version_1(const std::string& src, const std::string& dst) {
  const StFile f = read_safetensors(src);
  std::vector<StTensorRef> refs;
  for (const auto& [name, t] : f.tensors)
    if (name.rfind("comp.", 0) != 0) refs.push_back({name, t.shape, t.data.data()});
  auto md = f.metadata;
  for (const char* k : {"compression", "compression_world_size", "compression_residual_floats",
                        "compression_q_floats", "compression_rng"})
    md.erase(k);
  md["format_version"] = "1";
  write_safetensors(dst, refs, md);
}

}  // namespace

TEST_CASE(
    "a compressed run resumed from a checkpoint ends bitwise equal to the uninterrupted run") {
  spdlog::set_level(spdlog::level::warn);
  struct Case {
    std::string strategy;
    int world;
  };
  // DDP at world 2 (gradients) and 1 (the round trip alone); Local SGD (parameter moves).
  const std::vector<Case> cases = {{"ddp", 2}, {"ddp", 1}, {"local_sgd", 2}};
  for (const auto& c : cases) {
    for (const std::string& type : kTypes) {
      if (c.world == 1 && type != "int8" && type != "powersgd") continue;  // CI time
      CAPTURE(c.strategy);
      CAPTURE(c.world);
      CAPTURE(type);
      TempDir dir;
      auto sets = type_sets(type);
      sets.push_back("distributed.strategy=" + c.strategy);
      sets.push_back("distributed.world_size=" + std::to_string(c.world));
      // Local SGD: the optimizer state is averaged too, so every rank holds rank 0's at the
      // checkpoint (only the compression residuals are per rank).
      if (c.strategy == "local_sgd")
        sets.insert(sets.end(), {"distributed.local_sgd.sync_every=2",
                                 "distributed.local_sgd.sync_optimizer_state=true"});
      const Config cfg = parse_config(kCfg, "c.yaml", sets);
      run(cfg, dir / "full");
      const std::string ck10 = dir / "full/checkpoints/step-10.safetensors";
      const StFile saved = read_safetensors(ck10);
      // The layout of the compression state.
      CHECK(saved.metadata.at("format_version") == "2");
      CHECK(saved.metadata.at("compression") == type);
      CHECK(saved.metadata.at("compression_world_size") == std::to_string(c.world));
      for (int r = 0; r < c.world; ++r)
        CHECK(saved.tensors.count("comp.residual.rank" + std::to_string(r)) == 1);
      CHECK(saved.tensors.count("comp.residual.rank" + std::to_string(c.world)) == 0);
      CHECK(saved.tensors.count("comp.q") == (type == "powersgd" ? 1u : 0u));

      const auto s = run(cfg, dir / "res", ck10);
      CHECK(s["steps_this_run"] == 14);
      const StFile a = read_safetensors(dir / "full/checkpoints/step-24.safetensors");
      const StFile b = read_safetensors(dir / "res/checkpoints/step-24.safetensors");
      CHECK(same_tensors(a, b));
      // Without the compression state (a format-1 copy of the same checkpoint) the resumed run
      // differs: the comparison above can fail.
      write_as_version_1(ck10, dir / "v1.safetensors");
      run(cfg, dir / "v1", dir / "v1.safetensors");
      const double rel = checkpoint_rel_diff(dir / "full/checkpoints/step-24.safetensors",
                                             dir / "v1/checkpoints/step-24.safetensors");
      MESSAGE(c.strategy, " W=", c.world, " ", type,
              ": resumed without compression state differs by ", rel, " (max relative)");
      CHECK(rel > 0.0);
    }
  }
}

TEST_CASE("compression state resume rule: residuals need the same type, strategy and world") {
  spdlog::set_level(spdlog::level::info);
  TempDir dir;
  const Config int8 = parse_config(kCfg, "c.yaml", type_sets("int8"));
  run(int8, dir / "full");
  const std::string ck10 = dir / "full/checkpoints/step-10.safetensors";
  auto resume_log = [&](const std::vector<std::string>& sets, const std::string& out,
                        const std::string& from) {
    LogCapture cap;
    run(parse_config(kCfg, "c.yaml", sets), dir / out, from);
    return cap.text();
  };
  // Same everything: restored.
  std::string log = resume_log(type_sets("int8"), "same", ck10);
  CHECK(
      dtrain::testing::contains(log, "compression state restored: error-feedback residuals of 2"));
  // Another world size, another type: dropped, with a warning naming both layouts.
  auto w3 = type_sets("int8");
  w3.push_back("distributed.world_size=3");
  log = resume_log(w3, "w3", ck10);
  CHECK(dtrain::testing::contains(
      log, "residuals are for int8 compression with strategy ddp at world size 2"));
  CHECK(dtrain::testing::contains(log, "this run uses int8 with ddp at world size 3"));
  CHECK(dtrain::testing::contains(log, "and the world size differs: residuals dropped"));
  log = resume_log(type_sets("fp16"), "fp16", ck10);
  CHECK(dtrain::testing::contains(log, "this run uses fp16 with ddp at world size 2"));
  CHECK(dtrain::testing::contains(log, "and the compression type differs"));
  // A checkpoint of an uncompressed run (or format 1) resumed with compression: fresh state.
  const Config plain = parse_config(kCfg, "c.yaml");
  run(plain, dir / "plain");
  log = resume_log(type_sets("powersgd"), "psgd", dir / "plain/checkpoints/step-10.safetensors");
  CHECK(dtrain::testing::contains(log, "holds no compression state"));
  CHECK(dtrain::testing::contains(log, "PowerSGD's Q starts from the run seed"));
  // The uncompressed run's checkpoint records that it holds none.
  CHECK(
      read_safetensors(dir / "plain/checkpoints/step-10.safetensors").metadata.at("compression") ==
      "none");
  spdlog::set_level(spdlog::level::warn);
}

namespace {

// Runs `fn(comm)` on `world` in-process ranks and waits for them.
template <typename Fn>
void on_ranks(int world, Fn fn) {
  auto transports = make_inproc_group(world);
  std::vector<std::thread> th;
  for (int r = 0; r < world; ++r)
    th.emplace_back([&, r] {
      Communicator comm(std::move(transports[static_cast<size_t>(r)]));
      fn(comm);
    });
  for (auto& t : th) t.join();
}

}  // namespace

TEST_CASE("compression state: PowerSGD's Q is kept at another world size, residuals are not") {
  spdlog::set_level(spdlog::level::err);
  // 20 x 12 weight and 12 biases: the weight is compressed at rank 2.
  const std::vector<ParamEntry> params = {{"w", {20, 12}, 0, 240}, {"b", {12}, 240, 12}};
  CompressionConfig cc;
  cc.type = CompressionType::kPowersgd;
  cc.rank = 2;
  // A state as a 2-rank run saves it, with recognisable values.
  CompressionState saved;
  saved.type = "powersgd";
  saved.strategy = "ddp";
  saved.world_size = 2;
  const auto fresh = PowerSgd(cc, params, 252, 1).export_state();
  REQUIRE(fresh.residual.size() == 240);
  REQUIRE(fresh.q.size() == 24);
  saved.residuals = {std::vector<float>(240, 0.5f), std::vector<float>(240, -0.25f)};
  saved.q = std::vector<float>(24, 3.0f);
  Rng other(77);
  saved.rng = other.to_string();
  // Same world size: each rank gets its own residual, and the global Q and RNG.
  std::vector<GradReducer::State> got(2);
  on_ranks(2, [&](Communicator& comm) {
    PowerSgd p(cc, params, 252, 1);
    restore_compression_state(comm, p, CompressionType::kPowersgd, StrategyKind::kDdp, saved);
    got[static_cast<size_t>(comm.rank())] = p.export_state();
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(got[static_cast<size_t>(r)].residual == saved.residuals[static_cast<size_t>(r)]);
    CHECK(got[static_cast<size_t>(r)].q == saved.q);
    CHECK(got[static_cast<size_t>(r)].rng == saved.rng);
  }
  // The round trip through gather_compression_state gives the same state back on rank 0.
  CompressionState again;
  on_ranks(2, [&](Communicator& comm) {
    PowerSgd p(cc, params, 252, 1);
    p.import_state(got[static_cast<size_t>(comm.rank())]);
    CompressionState s = gather_compression_state(comm, p, CompressionType::kPowersgd);
    if (comm.rank() == 0) again = std::move(s);
  });
  CHECK(again.residuals == saved.residuals);
  CHECK(again.q == saved.q);
  CHECK(again.rng == saved.rng);
  CHECK(again.world_size == 2);
  // World size 1 (and 3): Q and RNG kept, residuals dropped (start at zero).
  for (int world : {1, 3}) {
    CAPTURE(world);
    std::vector<GradReducer::State> g(static_cast<size_t>(world));
    on_ranks(world, [&](Communicator& comm) {
      PowerSgd p(cc, params, 252, 1);
      restore_compression_state(comm, p, CompressionType::kPowersgd, StrategyKind::kDdp, saved);
      g[static_cast<size_t>(comm.rank())] = p.export_state();
    });
    for (const auto& st : g) {
      CHECK(st.q == saved.q);
      CHECK(st.rng == saved.rng);
      CHECK(st.residual == fresh.residual);
    }
  }
  // Another rank (another Q size, another factor layout): Q starts from the seed and the
  // residuals are dropped, though the world size and the residual size match.
  cc.rank = 3;
  on_ranks(2, [&](Communicator& comm) {
    PowerSgd p(cc, params, 252, 1);
    const auto before = p.export_state();
    CHECK(before.residual.size() == 240);
    restore_compression_state(comm, p, CompressionType::kPowersgd, StrategyKind::kDdp, saved);
    CHECK(p.export_state().q == before.q);
    CHECK(p.export_state().residual == before.residual);
  });
}

TEST_CASE("compression applies at world size 1: top-1% differs from no compression") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  auto w1 = [&](std::vector<std::string> sets, const std::string& out) {
    sets.push_back("distributed.world_size=1");
    sets.push_back("train.max_steps=20");
    run(parse_config(kCfg, "c.yaml", sets), dir / out);
    return dir / (out + "/checkpoints/step-20.safetensors");
  };
  const std::string none = w1({}, "none");
  const std::string topk = w1({"distributed.compression.type=topk"}, "topk");
  const std::string noef =
      w1({"distributed.compression.type=topk", "distributed.compression.error_feedback=false"},
         "noef");
  const std::string f16 = w1({"distributed.compression.type=fp16"}, "fp16");
  const double d_topk = checkpoint_rel_diff(none, topk);
  const double d_f16 = checkpoint_rel_diff(none, f16);
  MESSAGE("world 1, relative difference from uncompressed: topk 1% ", d_topk, ", fp16 ", d_f16);
  CHECK(d_topk > 1e-3);  // 1% of the gradient per step, the rest delayed
  CHECK(d_f16 > 0.0);    // fp16 rounding alone
  CHECK(d_f16 < 1e-2);
  CHECK(checkpoint_rel_diff(topk, noef) > 1e-3);  // error feedback acts at world size 1 too
  // Local SGD at world size 1 never synchronises: compression is unused, and says so.
  LogCapture cap;
  w1({"distributed.compression.type=int8", "distributed.strategy=local_sgd",
      "distributed.local_sgd.sync_every=2"},
     "local");
  CHECK(dtrain::testing::contains(cap.text(), "local_sgd at world size 1 never synchronises"));
}
