// The real binary with a pipeline whose replicas run fsdp, over gRPC: bitwise equal to the same
// layout's in-process ranks (the grid, the strategies and the executors do not depend on the
// transport).
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "cli/cli_util.h"
#include "test_util.h"

using namespace dtrain::testing;

namespace {
const std::string kBin = DTRAIN_BIN;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read ", path);
  return nlohmann::json::parse(in);
}
}  // namespace

TEST_CASE("pp2 x dp2 fsdp over gRPC equals the same layout in-process, bitwise") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", R"(seed: 5
model: {hidden: [16, 12, 8]}
data:
  format: synthetic
  synthetic: {samples: 500, features: 8, classes: 3}
  batch_size: 12
optimizer: {type: adam, lr: 0.01}
train: {epochs: 0, max_steps: 20}
distributed:
  strategy: fsdp
  timeout_s: 30
  pipeline: {stages: 2, micro_batches: 3, schedule: 1f1b}
runtime: {threads: 1}
)");
  auto r =
      run_cmd(kBin + " launch --nproc 4 " + cfg + " --out " + dir / "grpc" + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  r = run_cmd(kBin + " run " + cfg + " --set distributed.world_size=4 --out " + dir / "inproc" +
              " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto s = nlohmann::json::parse(read_text(dir / "grpc/summary.json"));
  CHECK(s["backend"] == "grpc");
  CHECK(s["layout"] == nlohmann::json({{"dp", 2}, {"pp", 2}, {"tp", 1}}));
  check_same_state(latest_run_state(kBin, dir / "grpc"), latest_run_state(kBin, dir / "inproc"),
                   "pp2 x dp2 fsdp");
}

TEST_CASE("clipping a gradient norm above 1.8e19: every sharded layout clips as ddp does") {
  // The squared norm's partial sums crossed ranks as floats: past 3.4e38 they were inf, the clip
  // factor 0, and zero1/zero2/fsdp/pipelines zeroed every gradient (the model never moved) while
  // ddp, which sums locally in double, clipped and trained.
  TempDir dir;
  std::string csv;
  uint64_t x = 12345;
  for (int i = 0; i < 60; ++i) {
    for (int j = 0; j < 4; ++j) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      csv += std::to_string(static_cast<double>(x >> 40) * 1e13) + ",";
    }
    csv += std::to_string(i % 2) + "\n";
  }
  dir.write("big.csv", csv);
  const std::string cfg = dir.write("big.yaml", R"(seed: 3
model: {type: mlp, hidden: [8], activation: relu}
data: {format: csv, train: {path: big.csv}, test_fraction: 0.2, normalize: none, batch_size: 6}
optimizer: {type: sgd, lr: 0.1, clip_grad_norm: 1.0}
train: {epochs: 2}
distributed: {world_size: 2}
runtime: {threads: 1}
)");
  const auto test_loss = [&](const std::string& name, const std::string& sets) {
    const CmdResult r = run_cmd(kBin + " run " + cfg + " --out " + dir / name +
                                " --log-level warn --no-progress" + sets);
    INFO(name << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    return read_json(dir / name + "/summary.json")["test_loss"].get<double>();
  };
  const double untrained = test_loss("init", " --set optimizer.lr=1e-30");
  const double ddp = test_loss("ddp", "");
  CHECK(std::abs(ddp - untrained) > 1e-3 * std::abs(untrained));  // clipping let it train
  for (const char* s : {" --set distributed.strategy=zero1", " --set distributed.strategy=fsdp",
                        " --set distributed.pipeline.stages=2 --set data.batch_size=12"}) {
    CAPTURE(s);
    CHECK(std::abs(test_loss("s", std::string(s) + " --overwrite") - ddp) <= 1e-4 * std::abs(ddp));
  }
}
