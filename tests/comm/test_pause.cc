// Deadlines do not count time the process was stopped (comm/deadline.h): a Ctrl-Z of a whole
// job longer than distributed.timeout_s must not fail the collectives in flight. Each case
// stops a forked child with SIGSTOP from the parent, as a shell or `dtrain launch` does.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <string>
#include <thread>
#include <vector>

#include "comm/deadline.h"
#include "comm_test_util.h"

using namespace dtrain;
using dtrain::testing::run_ranks;
using namespace std::chrono_literals;

namespace {

struct Pipe {
  int fd[2] = {-1, -1};
  Pipe() { REQUIRE(pipe(fd) == 0); }
  ~Pipe() {
    for (int f : fd)
      if (f >= 0) close(f);
  }
  int r() const { return fd[0]; }
  int w() const { return fd[1]; }
};

void put(int fd, const void* p, size_t n) {
  if (write(fd, p, n) != static_cast<ssize_t>(n)) _exit(3);
}

bool get(int fd, void* p, size_t n) {
  return read(fd, p, n) == static_cast<ssize_t>(n);
}

// Stops `pid` for `stopped`, then continues it; returns the seconds between the two signals.
double suspend(pid_t pid, std::chrono::milliseconds stopped) {
  REQUIRE(kill(pid, SIGSTOP) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(stopped);
  REQUIRE(kill(pid, SIGCONT) == 0);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int exit_code(pid_t pid) {
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

double secs(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

TEST_CASE("pause clock: time the process ran is not a pause") {
  PauseClock clock;
  const Deadline d = Deadline::in(0.5, &clock);
  std::this_thread::sleep_for(1500ms);
  CHECK(secs(clock.paused()) == 0.0);
  CHECK(d.passed(std::chrono::steady_clock::now()));
  CHECK(d.when() == d.at);
}

TEST_CASE("pause clock: a SIGSTOP of 2 s is counted, and moves a deadline by as much") {
  Pipe p;
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    PauseClock clock;
    const Deadline d = Deadline::in(1.0, &clock);
    put(p.w(), "r", 1);
    std::this_thread::sleep_for(3s);  // the parent stops this process for 2 s of these
    const double paused = secs(clock.paused());
    const double moved = secs(d.when() - d.at);
    put(p.w(), &paused, sizeof paused);
    put(p.w(), &moved, sizeof moved);
    _exit(0);
  }
  char c = 0;
  REQUIRE(get(p.r(), &c, 1));
  std::this_thread::sleep_for(300ms);
  const double stopped = suspend(pid, 2000ms);
  double paused = -1, moved = -1;
  REQUIRE(get(p.r(), &paused, sizeof paused));
  REQUIRE(get(p.r(), &moved, sizeof moved));
  CHECK(exit_code(pid) == 0);
  // At most a tick of the pause goes uncounted; nothing that ran is counted (the margins: the
  // child stops and wakes a moment after its signals, on a loaded machine).
  CAPTURE(stopped);
  CHECK(paused >= stopped - 0.3);
  CHECK(paused <= stopped + 0.3);
  CHECK(moved == doctest::Approx(paused));
}

// Rank 0 enters an allreduce; the process is stopped for 5 s, past distributed.timeout_s (3);
// rank 1 joins only after the process continues. Without the pause clock rank 0's receive times
// out at once when it wakes.
void allreduce_across_a_stop(const std::string& backend) {
  Pipe ready, go, result;
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    CommOptions o;
    o.timeout_s = 3;
    std::vector<float> sums(2, 0.0f);
    const auto errors = run_ranks(
        2,
        [&](Communicator& comm) {
          std::vector<float> v(4096, static_cast<float>(comm.rank() + 1));
          if (comm.rank() == 0) {
            put(ready.w(), "r", 1);
          } else {
            char c = 0;
            if (!get(go.r(), &c, 1)) _exit(4);
          }
          comm.allreduce(v.data(), v.size());
          sums[static_cast<size_t>(comm.rank())] = v[4095];
        },
        o, backend);
    std::string text = errors[0] + "|" + errors[1];
    text += "|" + std::to_string(sums[0]) + "," + std::to_string(sums[1]);
    put(result.w(), text.data(), text.size());
    _exit(0);
  }
  close(result.w());
  result.fd[1] = -1;
  char c = 0;
  REQUIRE(get(ready.r(), &c, 1));
  std::this_thread::sleep_for(300ms);  // rank 0 waits for rank 1's data by now
  suspend(pid, 5000ms);
  // Rank 0 wakes first and judges its deadline (without the pause clock: long passed).
  std::this_thread::sleep_for(300ms);
  put(go.w(), "g", 1);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(result.r(), buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
  CHECK(exit_code(pid) == 0);
  CHECK_MESSAGE(text == "||3.000000,3.000000", text);
}

TEST_CASE("pause: an allreduce survives a stop longer than timeout_s, in-process") {
  allreduce_across_a_stop("inproc");
}

TEST_CASE("pause: an allreduce survives a stop longer than timeout_s, over shared memory") {
  allreduce_across_a_stop("shm");
}

TEST_CASE("pause: an allreduce survives a stop longer than timeout_s, over TCP") {
  allreduce_across_a_stop("tcp");
}
