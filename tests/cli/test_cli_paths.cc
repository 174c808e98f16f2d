// Paths a user can give that the file system refuses or that JSON cannot hold: each is exit 2 with
// one line naming the option, before anything trains, and a command refused for bad input leaves
// no output folder behind that it created.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "test_util.h"

using dtrain::testing::CmdResult;
using dtrain::testing::contains;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;

const char* kTiny = R"(seed: 3
model: {hidden: [8]}
data:
  format: synthetic
  synthetic: {samples: 200, features: 4, classes: 3}
  batch_size: 20
optimizer: {type: sgd, lr: 0.1}
train: {epochs: 1, max_steps: 2}
runtime: {threads: 1}
)";

}  // namespace

TEST_CASE("a command refused for bad input leaves no output folder behind") {
  TempDir t;
  const std::string cfg = t.write("c.yaml", kTiny);
  for (const std::string& cmd :
       {"DTRAIN_FAULT=garbage " + kBin + " run " + cfg + " --out " + t / "a",
        "DTRAIN_RESTART_COUNT=-3 " + kBin + " run " + cfg + " --out " + t / "a",
        kBin + " launch --nproc 2 --max-restarts -1 " + cfg + " --out " + t / "a"}) {
    const CmdResult r = run_cmd(cmd);
    INFO(cmd << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK_FALSE(std::filesystem::exists(t / "a"));
  }
}

TEST_CASE("paths the file system refuses are exit 2 up front, naming the option") {
  TempDir t;
  const std::string cfg = t.write("c.yaml", kTiny);
  // A symbolic link to itself as --out (was "filesystem error: ... Too many levels", exit 1).
  std::filesystem::create_symlink("loopy", t / "loopy");
  CmdResult r = run_cmd(kBin + " run " + cfg + " --out " + t / "loopy");
  CHECK_MESSAGE(r.exit_code == 2, r.output);
  CHECK(contains(r.output, "--out '" + t / "loopy" + "'"));
  // A --trace name longer than a file name can be: refused before training (it trained, then
  // failed to write the trace, exit 1).
  const std::string long_name = std::string(300, 'a') + ".json";
  r = run_cmd(kBin + " run " + cfg + " --out " + t / "r" + " --trace " + t / long_name);
  CHECK_MESSAGE(r.exit_code == 2, r.output);
  CHECK(contains(r.output, "--trace"));
  CHECK(contains(r.output, "longer than the"));
  CHECK_FALSE(std::filesystem::exists(t / "r/summary.json"));
  // A name that fits whose ranks' parts (FILE.failed.rank-<r>.json) do not: the run trained,
  // then failed to write rank 0's part.
  r = run_cmd(kBin + " run " + cfg + " --out " + t / "r" + " --trace " +
              t / (std::string(245, 'b') + ".json"));
  CHECK_MESSAGE(r.exit_code == 2, r.output);
  CHECK(contains(r.output, "each rank writes its part next to it"));
  CHECK_FALSE(std::filesystem::exists(t / "r/summary.json"));
  // A legal name near the limit is written (its temp file's name is shortened, not the target's).
  r = run_cmd(kBin + " run " + cfg + " --out " + t / "r" + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string svg = std::string(248, 'p') + ".svg";  // 252 bytes
  r = run_cmd(kBin + " plot " + t / "r" + " -o " + t / svg);
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(std::filesystem::exists(t / svg));
  // An --out whose checkpoints' paths would pass PATH_MAX (20 folders of 200 bytes: 4,020 bytes
  // of path, relative): refused before training (it trained and failed at the checkpoint whose
  // step number made the path too long, exit 1, every resume alike).
  std::string deep;
  for (int i = 0; i < 20; ++i) deep += std::string(200, 'd') + "/";
  r = run_cmd("cd " + t.path() + " && " + kBin + " run " + cfg + " --out " + deep + "r");
  CHECK_MESSAGE(r.exit_code == 2, r.output);
  CHECK_MESSAGE(contains(r.output, "would pass the system's limit of 4096 bytes for a path"),
                r.output);
  CHECK_FALSE(std::filesystem::exists(t / std::string(200, 'd')));
}

TEST_CASE("a --resume path that is not UTF-8 is refused before training") {
  // summary.json records it as JSON text: the run trained, then failed writing the summary with
  // nlohmann's "invalid UTF-8 byte", exit 1, leaving no summary.
  TempDir t;
  const std::string cfg = t.write("c.yaml", kTiny);
  CmdResult r = run_cmd(kBin + " run " + cfg + " --out " + t / "r" + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string odd = t / "ck\xff";
  std::filesystem::create_directories(odd);
  std::filesystem::copy_file(t / "r/checkpoints/step-2.safetensors", odd + "/step-2.safetensors");
  r = run_cmd(kBin + " run " + cfg + " --out " + t / "s" + " --set train.max_steps=4 --resume '" +
              odd + "/step-2.safetensors'");
  CHECK_MESSAGE(r.exit_code == 2, r.output);
  CHECK(contains(r.output, "is not valid UTF-8"));
  CHECK_FALSE(std::filesystem::exists(t / "s/summary.json"));
}

TEST_CASE("dtrain launch --overwrite clears its ranks' logs only, not what else is in logs/") {
  // It removed all of OUT/logs: scripts/slurm.sbatch's launcher-<node>.log (open, being written
  // by the launcher's own srun) and any file a user kept there.
  TempDir dir;
  const std::string cfg = dir.write("c.yaml", kTiny);
  const std::string out = dir / "out";
  CmdResult r = run_cmd(kBin + " launch --nproc 2 " + cfg + " --out " + out + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  dir.write("out/logs/launcher-0.log", "the launcher's own output\n");
  dir.write("out/logs/notes.txt", "keep\n");
  dir.write("out/logs/rank-1.error.json", "{}");
  r = run_cmd(kBin + " launch --nproc 1 " + cfg + " --out " + out +
              " --overwrite --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(std::filesystem::exists(out + "/logs/launcher-0.log"));
  CHECK(std::filesystem::exists(out + "/logs/notes.txt"));
  CHECK(std::filesystem::exists(out + "/logs/rank-0.log"));        // this launch's
  CHECK_FALSE(std::filesystem::exists(out + "/logs/rank-1.log"));  // the old job's
  CHECK_FALSE(std::filesystem::exists(out + "/logs/rank-1.error.json"));
}

TEST_CASE("a run folder on a read-only file system is exit 2 up front, a resume in place too") {
  // A resume in place loaded the data and the checkpoint, then failed at its first write: exit 1
  // ("cannot create temp file"), which a restart repeats. Needs a private mount namespace
  // (unshare -m, as root): skipped where there is none.
  TempDir dir;
  const std::string cfg = dir.write("t.yaml", kTiny);
  const std::string mnt = dir / "mnt";
  std::filesystem::create_directories(mnt);
  const std::string script = "mount -t tmpfs -o size=8M tmpfs " + mnt + " || exit 99; " + kBin +
                             " run " + cfg + " --out " + mnt + "/r --log-level error || exit 98; " +
                             "mount -o remount,ro " + mnt + " || exit 99; " + kBin + " run " + cfg +
                             " --out " + mnt + "/r --resume auto --set train.max_steps=4";
  const CmdResult r = run_cmd("unshare -m bash -c '" + script + "' 2>&1");
  if (r.exit_code == 99 || contains(r.output, "unshare failed")) {
    MESSAGE("skipped: no private mount namespace here: " << r.output);
    return;
  }
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "cannot create files in '" + mnt + "/r': Read-only file system"));
}

TEST_CASE("a config file whose name starts with '-' runs under launch and verify as under run") {
  // `dtrain launch -- -c.yaml` passed the name to its ranks as it was, where it read as an option:
  // every rank failed with "config is required".
  TempDir t;
  t.write("-c.yaml", kTiny);
  const std::string in = "cd " + t.path() + " && ";
  for (const std::string& cmd :
       {kBin + " run --out r1 -- -c.yaml", kBin + " launch --nproc 2 --out r2 -- -c.yaml",
        kBin + " verify --set distributed.world_size=2 --backend grpc --steps 2 -- -c.yaml"}) {
    CAPTURE(cmd);
    const CmdResult r = run_cmd(in + cmd);
    CHECK_MESSAGE(r.exit_code == 0, r.output);
  }
}
