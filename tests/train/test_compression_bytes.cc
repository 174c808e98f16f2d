// End-to-end bytes of compressed runs, exact by arithmetic from the message sizes compression.h
// documents: a compressed run sends what the uncompressed one sends, less DDP's gradient
// all-reduce, plus the compressed exchange, every step (every synchronisation for Local SGD).
#include <doctest/doctest.h>

#include <fstream>

#include <spdlog/spdlog.h>

#include "test_util.h"
#include "train/trainer.h"

using namespace dtrain;
using dtrain::testing::TempDir;

namespace {

// 12-32-32-4 MLP: P = 12*32+32 + 32*32+32 + 32*4+4 = 1604 parameters; 2 ranks, 20 steps.
const char* kCfg = R"(
seed: 5
model: {hidden: [32, 32]}
data:
  format: synthetic
  synthetic: {samples: 2000, features: 12, classes: 4, noise: 0.5}
  batch_size: 32
optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
train: {epochs: 0, max_steps: 20, log_every: 10}
distributed: {world_size: 2}
runtime: {threads: 1}
)";
constexpr int64_t kP = 1604, kSteps = 20;

struct Sent {
  int64_t summary = 0, at_step_10 = 0;  // summary.json and the train record of step 10
};

Sent run_sent(const TempDir& dir, const std::vector<std::string>& sets, const std::string& out) {
  RunOptions o;
  o.out_dir = dir / out;
  const auto s = run_training(parse_config(kCfg, "b.yaml", sets), o);
  Sent r;
  r.summary = s["comm_bytes_sent"].get<int64_t>();
  std::ifstream in(dir / (out + "/metrics.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train" && j["step"] == 10) r.at_step_10 = j["comm_bytes_sent"].get<int64_t>();
  }
  REQUIRE(r.at_step_10 > 0);
  return r;
}

}  // namespace

TEST_CASE("compressed DDP sends exactly the documented message bytes per step") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  // The ring all-reduce of n floats sends n floats per rank for 2 ranks (one half in the
  // reduce-scatter, the other in the all-gather), in any bucket split.
  const int64_t ddp_step = 4 * kP;
  const Sent none = run_sent(dir, {}, "none");
  struct Case {
    std::string type;
    int64_t per_step;  // bytes rank 0 sends per step for its gradient, W = 2
  };
  const std::vector<Case> cases = {
      {"fp16", 2 * kP},                       // 2n
      {"bf16", 2 * kP},                       // 2n
      {"int8", kP + 4 * ((kP + 255) / 256)},  // n + 4 ceil(n/256) = 1604 + 28
      {"topk", 8 * 17},                       // 8k, k = ceil(0.01 n) = 17
      // 8 (W-1)/W (r (sum n + sum m) + d) = 4 (2 (68 + 76) + 68): factors of the three weights
      // (rows 32+32+4, columns 12+32+32) at rank 2, and the 68 bias floats exact.
      {"powersgd", 4 * (2 * (68 + 76) + 68)},
  };
  for (const auto& c : cases) {
    CAPTURE(c.type);
    std::vector<std::string> sets = {"distributed.compression.type=" + c.type};
    if (c.type == "powersgd") sets.push_back("distributed.compression.rank=2");
    const Sent got = run_sent(dir, sets, c.type);
    CHECK(got.summary == none.summary - kSteps * (ddp_step - c.per_step));
    CHECK(got.at_step_10 == none.at_step_10 - 10 * (ddp_step - c.per_step));
  }
  // One process sends nothing, with compression too.
  const Sent w1 = [&] {
    RunOptions o;
    o.out_dir = dir / "w1";
    return Sent{run_training(
                    parse_config(kCfg, "b.yaml",
                                 {"distributed.world_size=1", "distributed.compression.type=int8"}),
                    o)["comm_bytes_sent"]
                    .get<int64_t>(),
                0};
  }();
  CHECK(w1.summary == 0);
}

TEST_CASE("compressed Local SGD sends exactly one int8 message per synchronisation") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  const std::vector<std::string> local = {"distributed.strategy=local_sgd",
                                          "distributed.local_sgd.sync_every=4"};
  const Sent plain = run_sent(dir, local, "plain");
  auto sets = local;
  sets.push_back("distributed.compression.type=int8");
  const Sent int8 = run_sent(dir, sets, "int8");
  // Synchronisations at steps 4, 8, 12, 16, 20 (2 by step 10): a dense all-reduce of the
  // parameters (4n bytes per rank) replaced by one int8 message of the parameter move.
  const int64_t saved = 4 * kP - (kP + 4 * ((kP + 255) / 256));
  CHECK(int8.summary == plain.summary - 5 * saved);
  CHECK(int8.at_step_10 == plain.at_step_10 - 2 * saved);
}
