// Shared-memory segments left by killed ranks: removed when the next job starts, never those of a
// process that is alive.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "comm/shm_ring.h"
#include "test_util.h"

using namespace dtrain;

TEST_CASE("shm: segments of dead processes are swept, those of live ones are kept") {
  dtrain::testing::TempDir dir;
  // A pid that surely is dead: a child that has exited and been reaped.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  REQUIRE(child > 0);
  int status = 0;
  waitpid(child, &status, 0);
  const std::string dead = dir / ("dtrain-" + std::to_string(child) + "-0123abcd");
  const std::string alive = dir / ("dtrain-" + std::to_string(getpid()) + "-4567ef01");
  const std::string other = dir / "dtrain-notapid-89ab";
  const std::string foreign = dir / ("psm_" + std::to_string(child));
  for (const auto& p : {dead, alive, other, foreign}) std::ofstream(p) << "x";
  CHECK(sweep_orphaned_segments(dir.path()) == 1);
  CHECK_FALSE(std::filesystem::exists(dead));
  CHECK(std::filesystem::exists(alive));
  CHECK(std::filesystem::exists(other));
  CHECK(std::filesystem::exists(foreign));
  CHECK(sweep_orphaned_segments(dir.path()) == 0);
}
