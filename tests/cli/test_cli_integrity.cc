// Checkpoint integrity through the real binary (issue 16): a flipped bit in a run's checkpoint
// and a NaN weight are refused by eval, --resume and consolidate with exit 2, naming the tensor.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <filesystem>
#include <limits>
#include <string>
#include <utility>

#include "checkpoint/integrity_util.h"
#include "test_util.h"

using dtrain::testing::CmdResult;
using dtrain::testing::contains;
using dtrain::testing::flip_tensor_bit;
using dtrain::testing::run_cmd;
using dtrain::testing::set_tensor_value;
using dtrain::testing::TempDir;

namespace fs = std::filesystem;

namespace {

const std::string kBin = DTRAIN_BIN;

// Checkpoints at steps 10 and 20; `latest` names step 20.
const char* kCfg = R"(seed: 3
model: {hidden: [16]}
data:
  format: synthetic
  synthetic: {samples: 400, features: 8, classes: 3}
  batch_size: 10
optimizer: {type: adam, lr: 0.01}
train: {epochs: 0, max_steps: 20, checkpoint: {every_steps: 10, keep_last: 2}}
runtime: {threads: 1}
)";

// The zero1 layout of 2 ranks, whose checkpoints are sharded.
const std::string sharded = " --set distributed.world_size=2 --set distributed.strategy=zero1";

// Trains cfg in that layout into run (checkpoints at steps 10 and 20).
CmdResult train_sharded(const std::string& cfg, const std::string& run) {
  CmdResult r = run_cmd(kBin + " run " + cfg + sharded + " --out " + run + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  return r;
}

// eval and a resume of `run` (which trains on to step 30) both exit 2 with `want` in their
// message.
void check_refused(const std::string& cfg, const std::string& run, const std::string& extra,
                   const std::string& want) {
  auto r = run_cmd(kBin + " eval " + cfg + extra + " --checkpoint " + run + "/checkpoints");
  CHECK_MESSAGE(r.exit_code == 2, r.output);
  CHECK_MESSAGE(contains(r.output, want), r.output);
  r = run_cmd(kBin + " run " + cfg + extra + " --set train.max_steps=30 --out " + run +
              " --resume auto");
  CHECK_MESSAGE(r.exit_code == 2, r.output);
  CHECK_MESSAGE(contains(r.output, want), r.output);
  CHECK_FALSE(contains(r.output, "lower optimizer.lr"));
}

}  // namespace

TEST_CASE("dtrain eval and run --resume refuse a flipped bit and a NaN weight with exit 2") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kCfg);
  const std::string run = dir / "run";
  auto r = run_cmd(kBin + " run " + cfg + " --out " + run + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string ck = run + "/checkpoints/step-20.safetensors";
  const std::string pristine = dir / "pristine.safetensors";
  fs::copy_file(ck, pristine);

  flip_tensor_bit(ck, "layers.0.weight", 100, 6);
  check_refused(cfg, run, "", "tensor 'layers.0.weight' fails its CRC-32 check");

  fs::copy_file(pristine, ck, fs::copy_options::overwrite_existing);
  set_tensor_value(ck, "layers.2.weight", 7, std::numeric_limits<float>::quiet_NaN());
  check_refused(cfg, run, "", "tensor 'layers.2.weight' holds a non-finite value (nan) at index 7");

  // The untouched file still evaluates and resumes.
  fs::copy_file(pristine, ck, fs::copy_options::overwrite_existing);
  r = run_cmd(kBin + " eval " + cfg + " --checkpoint " + run + "/checkpoints");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK_FALSE(contains(r.output, "null"));
}

TEST_CASE("a flipped bit in one rank's shard is refused by resume and consolidate with exit 2") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kCfg);
  const std::string run = dir / "run";
  auto r = train_sharded(cfg, run);
  const std::string shard = run + "/checkpoints/step-20/rank-1.safetensors";
  REQUIRE(fs::exists(shard));
  flip_tensor_bit(shard, "params", 12, 1);
  check_refused(cfg, run, sharded, "rank-1.safetensors': tensor 'params' fails its CRC-32 check");
  r = run_cmd(kBin + " checkpoint consolidate " + run + "/checkpoints/step-20 -o " +
              (dir / "one.safetensors"));
  CHECK_MESSAGE(r.exit_code == 2, r.output);
  CHECK(contains(r.output, "tensor 'params' fails its CRC-32 check"));
  CHECK_FALSE(fs::exists(dir / "one.safetensors"));
}

TEST_CASE("a FIFO in place of a shard or a manifest is refused at once, not waited on") {
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kCfg);
  const std::string run = dir / "run";
  auto r = train_sharded(cfg, run);
  const std::string step = run + "/checkpoints/step-20";
  for (const auto& [name, want] :
       {std::pair<std::string, std::string>{"rank-1.safetensors", "not a regular file"},
        {"manifest.json", "a folder without manifest.json"}}) {
    CAPTURE(name);
    const std::string file = step + "/" + name;
    const std::string keep = file + ".kept";
    fs::rename(file, keep);
    REQUIRE(::mkfifo(file.c_str(), 0600) == 0);
    // timeout(1) ends a wait on the FIFO with 124: the check is that nothing waits.
    r = run_cmd("timeout 60 " + kBin + " eval " + cfg + sharded + " --checkpoint " + step);
    CHECK_MESSAGE(r.exit_code == 2, r.output);
    CHECK(contains(r.output, want));
    fs::remove(file);
    fs::rename(keep, file);
  }
  r = run_cmd(kBin + " eval " + cfg + sharded + " --checkpoint " + step);
  CHECK_MESSAGE(r.exit_code == 0, r.output);
}

TEST_CASE("a malformed RNG state in a checkpoint is refused naming the checkpoint, exit 2") {
  // Was "bad RNG state 'zzz'" alone, after the weights had been sent to every rank.
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kCfg);
  const std::string run = dir / "r";
  CmdResult r = run_cmd(kBin + " run " + cfg + " --out " + run + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string ck = run + "/checkpoints/step-10.safetensors";
  dtrain::testing::set_metadata(ck, "rng", "zzz");
  r = run_cmd(kBin + " run " + cfg + " --out " + dir / "s" + " --set train.max_steps=30" +
              " --set distributed.world_size=2 --resume " + ck);
  CHECK_MESSAGE(r.exit_code == 2, r.output);
  CHECK_MESSAGE(contains(r.output, "checkpoint '" + ck + "': rank 0's RNG state is malformed"),
                r.output);
}
