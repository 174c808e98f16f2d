// Shared-memory segments left by killed ranks: removed when the next job starts, or by the
// launcher that reaps the rank; never those of a process that is alive.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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

TEST_CASE("shm: a launcher removes exactly the segments of the rank it reaps") {
  dtrain::testing::TempDir dir;
  const std::string mine1 = dir / "dtrain-4242-0123abcd";
  const std::string mine2 = dir / "dtrain-4242-feedbeef";
  const std::string prefix_of_other = dir / "dtrain-42420-0123abcd";  // pid 42420, not 4242
  const std::string other = dir / "dtrain-4243-0123abcd";
  const std::string foreign = dir / "psm_4242";
  for (const auto& p : {mine1, mine2, prefix_of_other, other, foreign}) std::ofstream(p) << "x";
  std::vector<std::string> removed = remove_segments_of(4242, dir.path());
  std::sort(removed.begin(), removed.end());
  CHECK(removed == std::vector<std::string>{mine1, mine2});
  for (const auto& p : {prefix_of_other, other, foreign}) CHECK(std::filesystem::exists(p));
  CHECK(remove_segments_of(4242, dir.path()).empty());
}
