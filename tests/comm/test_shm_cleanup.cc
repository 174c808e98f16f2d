// Shared-memory segments left by killed ranks: removed when the next job starts, or by the
// launcher that reaps the rank, or by the rank itself when a signal ends it at once; never those
// of a process that is alive.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "comm/shm_ring.h"
#include "test_util.h"
#include "util/interrupt.h"

using namespace dtrain;
using dtrain::testing::contains;

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

namespace {

// This process's PID namespace, as segment names carry it.
std::string own_ns() {
  struct stat st {};
  REQUIRE(::stat("/proc/self/ns/pid", &st) == 0);
  return std::to_string(st.st_ino);
}

}  // namespace

TEST_CASE(
    "shm: segments named with their PID namespace are judged by pid there, by lock elsewhere") {
  // Containers sharing /dev/shm number their processes from 1 each: a pid that is gone here may
  // be a live rank there. A rank removed another container's live segments (its peers fell back
  // to TCP, or found no segment).
  dtrain::testing::TempDir dir;
  const pid_t child = fork();
  if (child == 0) _exit(0);
  REQUIRE(child > 0);
  int status = 0;
  waitpid(child, &status, 0);
  const std::string ns = own_ns(), other_ns = "1" + ns;
  const std::string dead = dir / ("dtrain-" + std::to_string(child) + "." + ns + "-0123abcd");
  const std::string alive = dir / ("dtrain-" + std::to_string(getpid()) + "." + ns + "-4567ef01");
  // Another namespace's: pid `child` is gone here, which says nothing there.
  const std::string locked = dir / ("dtrain-" + std::to_string(child) + "." + other_ns + "-aa");
  const std::string free = dir / ("dtrain-" + std::to_string(child) + "." + other_ns + "-bb");
  for (const auto& p : {dead, alive, locked, free}) std::ofstream(p) << "x";
  const int held = ::open(locked.c_str(), O_RDONLY);
  REQUIRE(held >= 0);
  REQUIRE(::flock(held, LOCK_EX) == 0);  // its creator lives (elsewhere)
  // Young segments of another namespace are kept even when free: their creator may not hold the
  // lock yet.
  CHECK(sweep_orphaned_segments(dir.path()) == 1);
  CHECK_FALSE(std::filesystem::exists(dead));
  for (const auto& p : {alive, locked, free}) CHECK(std::filesystem::exists(p));
  CHECK(sweep_orphaned_segments(dir.path(), 0) == 1);  // past the grace: the free one goes
  CHECK_FALSE(std::filesystem::exists(free));
  CHECK(std::filesystem::exists(locked));
  CHECK(std::filesystem::exists(alive));
  ::close(held);  // its creator ends without removing it
  CHECK(sweep_orphaned_segments(dir.path(), 0) == 1);
  CHECK_FALSE(std::filesystem::exists(locked));
  CHECK(std::filesystem::exists(alive));
}

TEST_CASE("shm: a segment's creator holds its lock while it maps the segment") {
  auto seg = ShmSegment::create(0, 2, 4096);
  const std::string path = "/dev/shm" + seg->name();
  CHECK(contains(seg->name(), "." + own_ns() + "-"));
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  CHECK(::flock(fd, LOCK_EX | LOCK_NB) != 0);
  CHECK(errno == EWOULDBLOCK);
  seg.reset();  // unmapped (and its name removed)
  CHECK(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  ::close(fd);
  CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE("shm: a launcher removes exactly the segments of the rank it reaps") {
  dtrain::testing::TempDir dir;
  const std::string mine1 = dir / "dtrain-4242-0123abcd";
  const std::string mine2 = dir / "dtrain-4242-feedbeef";
  const std::string prefix_of_other = dir / "dtrain-42420-0123abcd";  // pid 42420, not 4242
  const std::string other = dir / "dtrain-4243-0123abcd";
  const std::string foreign = dir / "psm_4242";
  const std::string mine3 = dir / ("dtrain-4242." + own_ns() + "-0123abcd");
  // Pid 4242 of another PID namespace (a container sharing /dev/shm): another process.
  const std::string other_ns = dir / ("dtrain-4242.1" + own_ns() + "-0123abcd");
  for (const auto& p : {mine1, mine2, mine3, prefix_of_other, other, foreign, other_ns})
    std::ofstream(p) << "x";
  std::vector<std::string> removed = remove_segments_of(4242, dir.path());
  std::sort(removed.begin(), removed.end());
  std::vector<std::string> want{mine1, mine2, mine3};
  std::sort(want.begin(), want.end());
  CHECK(removed == want);
  for (const auto& p : {prefix_of_other, other, foreign, other_ns})
    CHECK(std::filesystem::exists(p));
  CHECK(remove_segments_of(4242, dir.path()).empty());
}

namespace {

// The /dev/shm names of process pid's segments.
std::vector<std::string> segments_of(pid_t pid) {
  std::vector<std::string> out;
  const std::string prefix = "dtrain-" + std::to_string(pid) + "." + own_ns() + "-";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().string());
  return out;
}

// A child that creates its segment, then is ended at once by signals (`at_once`: one signal
// while it has nothing to save, as at the rendezvous; else the second of two): the handler
// removes the segment the skipped destructor would have. Returns the child's pid and status.
std::pair<pid_t, int> end_child_at_once(bool at_once, int sig) {
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  const pid_t child = fork();
  if (child == 0) {
    StopRequest req;
    InterruptGuard guard(req);
    req.at_once.store(at_once);
    auto seg = ShmSegment::create(0, 2, 4096);
    const char c = 1;
    (void)!write(ready[1], &c, 1);
    for (;;) pause();  // the signals end it
  }
  REQUIRE(child > 0);
  char c = 0;
  REQUIRE(read(ready[0], &c, 1) == 1);
  close(ready[0]);
  close(ready[1]);
  CHECK(segments_of(child).size() == 1);
  kill(child, sig);
  if (!at_once) {
    usleep(2000 * 1000);  // well past the second in which another signal is the same request
    kill(child, sig);
  }
  int status = 0;
  waitpid(child, &status, 0);
  return {child, status};
}

}  // namespace

TEST_CASE("shm: a signal that ends a rank at once leaves no segment behind") {
  {
    const auto [pid, status] = end_child_at_once(true, SIGTERM);  // the preemption signal
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == kExitPreempted);
    CHECK(segments_of(pid).empty());
  }
  {
    const auto [pid, status] = end_child_at_once(true, SIGINT);  // its default action
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGINT);
    CHECK(segments_of(pid).empty());
  }
  {
    const auto [pid, status] = end_child_at_once(false, SIGINT);  // the second of two
    CHECK(WIFSIGNALED(status));
    CHECK(segments_of(pid).empty());
  }
}
