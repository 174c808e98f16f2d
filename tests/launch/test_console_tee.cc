// Rank 0's output on its way to a console nobody reads: the launcher's supervisor loop must not
// block in write(2) (it then forwarded no signal and reaped no rank), and the log keeps all.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

#include "launch/process.h"
#include "test_util.h"

using dtrain::launch_detail::Fd;
using dtrain::launch_detail::Tee;
using dtrain::launch_detail::write_console;

namespace {

// A pipe whose write end is blocking (as a console inherited from a shell is) and full.
struct FullPipe {
  Fd r, w;
  FullPipe() {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    r = Fd(p[0]);
    w = Fd(p[1]);
    const int flags = ::fcntl(p[1], F_GETFL);
    ::fcntl(p[1], F_SETFL, flags | O_NONBLOCK);
    const std::string chunk(4096, 'x');
    while (::write(p[1], chunk.data(), chunk.size()) > 0) {
    }
    ::fcntl(p[1], F_SETFL, flags);  // blocking again
  }
  std::string drain() {
    const int flags = ::fcntl(r.get(), F_GETFL);
    ::fcntl(r.get(), F_SETFL, flags | O_NONBLOCK);
    std::string out;
    char buf[65536];
    for (ssize_t n; (n = ::read(r.get(), buf, sizeof buf)) > 0;)
      out.append(buf, static_cast<size_t>(n));
    ::fcntl(r.get(), F_SETFL, flags);
    return out;
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("write_console gives up on a full blocking pipe instead of blocking") {
  FullPipe full;
  const std::string line(10000, 'a');
  bool failed = false;
  const auto t0 = std::chrono::steady_clock::now();
  const auto soon = [] { return std::chrono::steady_clock::now() + std::chrono::milliseconds(50); };
  CHECK(write_console(full.w.get(), line.data(), line.size(), soon(), &failed) == 0);
  CHECK(seconds_since(t0) < 5.0);  // (would block forever)
  CHECK_FALSE(failed);
  full.drain();
  CHECK(write_console(full.w.get(), line.data(), line.size(), soon(), &failed) == line.size());
  CHECK(full.drain() == line);
}

TEST_CASE("a console that stays full loses rank 0's output, the log keeps it, a line says so") {
  dtrain::testing::TempDir dir;
  FullPipe console;
  int src[2];
  REQUIRE(::pipe(src) == 0);
  Fd src_w(src[1]);
  const std::string log_path = dir / "rank-0.log";
  Fd log(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  Tee t;
  t.src = Fd(src[0]);
  ::fcntl(src[0], F_SETFL, O_NONBLOCK);
  t.log_fd = log.get();
  t.console = console.w.get();
  t.log_path = log_path;

  const std::string first = "step 1 loss 2.3\n", second = "step 2 loss 2.1\n";
  REQUIRE(::write(src_w.get(), first.data(), first.size()) == static_cast<ssize_t>(first.size()));
  const auto t0 = std::chrono::steady_clock::now();
  t.pump(16);
  CHECK(seconds_since(t0) < 5.0);
  CHECK(t.console_ok);
  CHECK(t.console_dropped == first.size());
  console.drain();  // the console takes output again
  REQUIRE(::write(src_w.get(), second.data(), second.size()) ==
          static_cast<ssize_t>(second.size()));
  t.pump(16);
  CHECK(t.console_dropped == 0);
  const std::string shown = console.drain();
  CHECK(shown.find("16 bytes of rank 0's output did not fit the console") != std::string::npos);
  CHECK(shown.find(log_path + " has them") != std::string::npos);
  // With the last whole lines it missed (the missed output here is one whole line).
  CHECK(shown.find("[dtrain launch] the last of it:\n" + first) != std::string::npos);
  CHECK(shown.ends_with(second));
  std::ifstream in(log_path);
  std::stringstream all;
  all << in.rdbuf();
  CHECK(all.str() == first + second);

  // Output the console missed at the end of an attempt is said then (rank 0 writes no more).
  Tee last;
  FullPipe console2;
  last.console = console2.w.get();
  last.log_path = log_path;
  last.console_dropped = 100;
  last.dropped_tail = "step 99 loss 0.1\ndone: test accuracy 91.2%\n";
  const auto in_1s = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(1); };
  const auto t1 = std::chrono::steady_clock::now();
  last.note_dropped(in_1s(), -1);  // still full: nothing, and no wait past its bound
  CHECK(seconds_since(t1) < 5.0);
  CHECK(last.console_dropped == 100);
  // A signal (readable wake descriptor) ends the wait at once, however long it may be.
  int wake[2];
  REQUIRE(::pipe(wake) == 0);
  Fd wake_r(wake[0]), wake_w(wake[1]);
  REQUIRE(::write(wake_w.get(), "x", 1) == 1);
  const auto t2 = std::chrono::steady_clock::now();
  last.note_dropped(std::chrono::steady_clock::now() + std::chrono::seconds(60), wake_r.get());
  CHECK(seconds_since(t2) < 5.0);
  CHECK(last.console_dropped == 100);
  console2.drain();
  last.note_dropped(in_1s(), -1);
  CHECK(last.console_dropped == 0);
  const std::string end = console2.drain();
  CHECK(end.find("100 bytes of rank 0's output") != std::string::npos);
  CHECK(end.ends_with("[dtrain launch] the last of it:\ndone: test accuracy 91.2%\n"));
}
