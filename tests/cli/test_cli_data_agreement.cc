// Ranks that are processes load their own data: the same files on every rank, or a refusal
// (exit 2 on every rank) naming the rank whose data differs. Same-sized files of other contents
// (each machine's own copy) trained in silence, each rank sampling its own dataset.
#include <doctest/doctest.h>

#include <string>

#include "launch/launcher.h"
#include "test_util.h"

using dtrain::testing::contains;
using dtrain::testing::read_text;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;

}  // namespace

TEST_CASE("ranks whose data files differ in content are refused, exit 2 on every rank") {
  // Two ranks read the same path; rank 1's mount namespace puts another file of as many rows
  // there, as another machine's copy would be.
  if (run_cmd("unshare -m true").exit_code != 0) {
    MESSAGE("skipped: cannot make a mount namespace here (unshare -m needs root)");
    return;
  }
  TempDir dir;
  std::string a = "x,y,label\n", b = a;
  for (int i = 0; i < 40; ++i) {
    a += std::to_string(i) + "," + std::to_string(i % 5) + "," + std::to_string(i % 2) + "\n";
    b += std::to_string(i) + "," + std::to_string(i % 7) + "," + std::to_string(i % 2) + "\n";
  }
  const std::string data = dir.write("d.csv", a);
  dir.write("other.csv", b);
  const std::string cfg = dir.write(
      "c.yaml", "model: {hidden: [4]}\ndata: {format: csv, train: {path: " + data +
                    "}, batch_size: 4}\ntrain: {epochs: 0, max_steps: 4}\n"
                    "distributed: {backend: grpc, world_size: 2, rendezvous_timeout_s: 30}\n"
                    "runtime: {threads: 1}\n");
  const std::string env =
      "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(dtrain::pick_free_port()) +
      " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 ";
  const std::string rank = kBin + " run " + cfg + " --out " + dir / "r";
  const auto r =
      run_cmd("RANK=0 LOCAL_RANK=0 " + env + rank + " > " + dir / "r0.log" + " 2>&1 & p=$!; " +
              "unshare -m sh -c 'mount --bind " + dir / "other.csv" + " " + data +
              " && exec env RANK=1 " + "LOCAL_RANK=1 " + env + rank + "' > " + dir / "r1.log" +
              " 2>&1; r1=$?; wait $p; " + "echo \"rc $? $r1\"");
  const std::string r0 = read_text(dir / "r0.log"), r1 = read_text(dir / "r1.log");
  INFO(r0, "\n---\n", r1);
  CHECK_MESSAGE(contains(r.output, "rc 2 2"), r.output);
  for (const std::string& log : {r0, r1})
    CHECK(contains(log,
                   "rank 1's training data differs from rank 0's (40 rows against 40, other "
                   "contents): every rank must read the same files"));
  // The same file on both: trains.
  const std::string env2 =
      "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(dtrain::pick_free_port()) +
      " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 ";
  const auto same =
      run_cmd("RANK=0 LOCAL_RANK=0 " + env2 + rank + " --overwrite > " + dir / "s0.log" +
              " 2>&1 & p=$!; RANK=1 LOCAL_RANK=1 " + env2 + rank + " --overwrite > " +
              dir / "s1.log" + " 2>&1; r1=$?; wait $p; " + "echo \"rc $? $r1\"");
  CHECK_MESSAGE(contains(same.output, "rc 0 0"), read_text(dir / "s0.log"));
}
