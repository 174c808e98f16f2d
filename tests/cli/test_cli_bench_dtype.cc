// `dtrain bench comm --dtype int64` times the int64 collectives (allreduce, allgather,
// broadcast) and refuses the reduce-scatter it does not have.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "test_util.h"

using dtrain::testing::contains;
using dtrain::testing::run_cmd;

namespace {
const std::string kBin = DTRAIN_BIN;
}  // namespace

TEST_CASE("bench comm --dtype int64 times int64 collectives and refuses reduce_scatter") {
  for (const std::string op : {"allreduce", "allgather", "broadcast"}) {
    INFO(op);
    const auto r = run_cmd(kBin + " bench comm --nproc 3 --dtype int64 --op " + op +
                           " --sizes 8,1K --iters 3 --json");
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.output, "\"op\": \"" + op + "\", \"dtype\": \"int64\""));
    CHECK(contains(r.output, "\"bytes\": 1024"));
  }
  const auto f = run_cmd(kBin + " bench comm --nproc 2 --sizes 8 --iters 3 --json");
  CHECK(f.exit_code == 0);
  CHECK(contains(f.output, "\"dtype\": \"float32\""));
  const auto bad = run_cmd(kBin + " bench comm --dtype int64 --op reduce_scatter");
  INFO(bad.output);
  CHECK(bad.exit_code == 2);
  CHECK(contains(bad.output, "--dtype int64 has no reduce_scatter"));
}

TEST_CASE("bench comm refuses what it cannot time: 100000 ranks, a 3-byte size, --iters -1, nan") {
  for (const std::string args :
       {"--nproc 100000 --sizes 1K --iters 1", "--sizes 3", "--sizes 0", "--iters -1 --sizes 4K",
        "--sizes nan", "--sizes nanK", "--sizes 4K,nan", "--sizes inf", "--segment nan",
        // Not rounded to whole floats (or int64s) silently: 7 bytes were timed as 4.
        "--sizes 7", "--sizes 4K,6", "--sizes 1.5", "--dtype int64 --sizes 12",
        // gRPC's data paths are no choice of in-process ranks (it was accepted, doing nothing).
        "--no-shm --sizes 4K", "--no-tcp --sizes 4K"}) {
    const auto r = run_cmd(kBin + " bench comm " + args);
    INFO(args << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.starts_with("error: "));
  }
  const auto seg = run_cmd(kBin + " bench comm --segment 0 --sizes 4K");
  CHECK(seg.exit_code == 2);
  CHECK_MESSAGE(contains(seg.output, "--segment: "), seg.output);  // was "bad size '0'" alone
}

TEST_CASE("bench comm --backend grpc stopped by SIGTERM: its code, no rank-log folder left") {
  // It exited 1 ("rank logs kept in /tmp/dtrain-bench-...") and left the folder, in /tmp whatever
  // $TMPDIR said. Now the stop's code (75: SIGTERM is the preemption signal, as dtrain launch
  // exits), the folder under $TMPDIR, removed.
  dtrain::testing::TempDir dir;
  const std::string tmp = dir / "tmp";
  std::filesystem::create_directories(tmp);
  const auto r = run_cmd(dtrain::testing::sigterm_once_in_tmp(
      kBin + " --log-level warn bench comm --backend grpc --nproc 2 --sizes 4K --iters 2000000",
      tmp, 1.0));
  CHECK_MESSAGE(contains(r.output, "rc 75 seen yes"), r.output);
  CHECK_MESSAGE(contains(r.output, "left: 0"), r.output);
}
