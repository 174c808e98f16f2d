// The real binary with a pipeline whose replicas run fsdp, over gRPC: bitwise equal to the same
// layout's in-process ranks (the grid, the strategies and the executors do not depend on the
// transport).
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "cli/cli_util.h"
#include "test_util.h"

using namespace dtrain::testing;

namespace {
const std::string kBin = DTRAIN_BIN;
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
