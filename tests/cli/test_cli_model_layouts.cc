// The real binary with the two real models over gRPC: bitwise equal to the same layout's
// in-process ranks (a CNN under ddp on 2 ranks; a tied GPT on two pipeline stages x two fsdp
// replicas; both with compressed gradients), so the in-process fidelity figures of
// tests/train/test_model_layouts.cc hold for launched runs too.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "test_util.h"
#include "train/real_data.h"

using namespace dtrain::testing;

namespace {

const std::string kBin = DTRAIN_BIN;

// Runs `cfg` with `sets` as `nproc` launched gRPC ranks and as in-process ranks; checks that both
// end in the same state, bit for bit, and that the gRPC run had the expected layout.
void check_grpc_equals_inproc(const TempDir& dir, const std::string& cfg, int nproc,
                              const std::vector<std::string>& sets, const nlohmann::json& layout,
                              const std::string& what) {
  std::string args;
  for (const std::string& s : sets) args += " --set " + s;
  auto r = run_cmd(kBin + " launch --nproc " + std::to_string(nproc) + " " + cfg + args +
                   " --out " + dir / "grpc" + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  r = run_cmd(kBin + " run " + cfg + args + " --set distributed.world_size=" +
              std::to_string(nproc) + " --out " + dir / "inproc" + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto s = nlohmann::json::parse(read_text(dir / "grpc/summary.json"));
  CHECK(s["backend"] == "grpc");
  CHECK(s["steps"] == 20);
  CHECK(s["layout"] == layout);
  check_same_state(latest_run_state(kBin, dir / "grpc"), latest_run_state(kBin, dir / "inproc"),
                   what);
}

// The small CNN's config over a Fashion-MNIST subset in `dir`, or "" (with a skip message) when
// the dataset is not installed. The same for the tied GPT over a slice of the Jargon File.
std::string cnn_cfg_or_skip(const TempDir& dir) {
  if (!write_fmnist_subset(dir.path(), 1280)) {
    MESSAGE("Fashion-MNIST not installed; skipped");
    return "";
  }
  return dir.write("cnn.yaml", small_cnn_cfg(dir.path()));
}

std::string gpt_cfg_or_skip(const TempDir& dir) {
  if (!write_jargon_slice(dir / "jargon.txt", kJargonSliceBytes)) {
    MESSAGE("jargon-text not installed; skipped");
    return "";
  }
  return dir.write("gpt.yaml", tiny_gpt_cfg(dir / "jargon.txt", true));
}

}  // namespace

TEST_CASE("cnn ddp on 2 ranks over gRPC equals the same layout in-process, bitwise") {
  TempDir dir;
  const std::string cfg = cnn_cfg_or_skip(dir);
  if (cfg.empty()) return;
  check_grpc_equals_inproc(dir, cfg, 2, {"data.batch_size=12"}, {{"dp", 2}, {"pp", 1}, {"tp", 1}},
                           "cnn ddp W=2");
}

TEST_CASE("gpt (tied) pp2 x dp2 fsdp over gRPC equals the same layout in-process, bitwise") {
  TempDir dir;
  const std::string cfg = gpt_cfg_or_skip(dir);
  if (cfg.empty()) return;
  check_grpc_equals_inproc(
      dir, cfg, 4,
      {"data.batch_size=12", "distributed.strategy=fsdp", "distributed.pipeline.stages=2",
       "distributed.pipeline.micro_batches=3"},
      {{"dp", 2}, {"pp", 2}, {"tp", 1}}, "gpt (tied) pp2 x dp2 fsdp");
}

TEST_CASE("cnn and gpt with compressed gradients over gRPC equal the same layout in-process") {
  // Compression (with error feedback: per-rank state carried across steps) on both real models:
  // PowerSGD's factors on the CNN's convolution and linear weights, int8 on the tied GPT.
  SUBCASE("cnn, powersgd rank 2") {
    TempDir dir;
    const std::string cfg = cnn_cfg_or_skip(dir);
    if (cfg.empty()) return;
    check_grpc_equals_inproc(
        dir, cfg, 2,
        {"data.batch_size=12", "distributed.compression.type=powersgd",
         "distributed.compression.rank=2", "distributed.compression.error_feedback=true"},
        {{"dp", 2}, {"pp", 1}, {"tp", 1}}, "cnn ddp W=2 powersgd");
  }
  SUBCASE("gpt (tied), int8") {
    TempDir dir;
    const std::string cfg = gpt_cfg_or_skip(dir);
    if (cfg.empty()) return;
    check_grpc_equals_inproc(dir, cfg, 2,
                             {"data.batch_size=12", "distributed.compression.type=int8",
                              "distributed.compression.error_feedback=true"},
                             {{"dp", 2}, {"pp", 1}, {"tp", 1}}, "gpt (tied) ddp W=2 int8");
  }
}
