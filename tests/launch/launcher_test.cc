// launch_local runs in a forked child of the test (its stdout/stderr captured to files), so its
// signal handling and any failure stay out of the test process. The ranks are small /bin/sh
// scripts that record their pids, so the tests can check nothing is left running. Timing checks
// are generous upper bounds only (a loaded 2-core machine).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "launch/launcher.h"
#include "test_util.h"
#include "util/check.h"
#include "util/interrupt.h"

using namespace dtrain;
using dtrain::testing::contains;
using dtrain::testing::read_text;
using dtrain::testing::TempDir;
using Clock = std::chrono::steady_clock;

namespace {

struct Launched {
  int exit_code = -1;  // launch_local's return value; 99 when it threw
  int signal = 0;      // non-zero if the launcher process itself was killed
  std::string out, err;
  double seconds = 0;
};

// Runs launch_local(o) in a forked child; `during(pid)` runs in the test meanwhile.
// `sigint_ignored`: the child starts as a script's background job does, SIGINT ignored.
Launched run_launcher(const LaunchOptions& o, const TempDir& dir,
                      const std::function<void(pid_t)>& during = {}, bool sigint_ignored = false) {
  const std::string out_path = dir / "launcher.out", err_path = dir / "launcher.err";
  std::fflush(stdout);
  std::fflush(stderr);
  const auto t0 = Clock::now();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0) ::_exit(97);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    if (sigint_ignored) ::signal(SIGINT, SIG_IGN);
    int rc = 98;
    try {
      rc = launch_local(o);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "exception: %s\n", e.what());
      rc = 99;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(rc);
  }
  if (during) during(pid);
  int status = 0;
  bool done = false;
  while (Clock::now() - t0 < std::chrono::seconds(60)) {
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      done = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Launched r;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!done) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL("the launcher did not return within 60 s");
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.out = read_text(out_path);
  r.err = read_text(err_path);
  return r;
}

bool wait_for_files(const std::vector<std::string>& paths, double timeout_s = 30) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (Clock::now() < deadline) {
    bool all = true;
    for (const auto& p : paths) all = all && std::filesystem::exists(p);
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// The pid a script wrote to `path`, or -1 when it never got that far.
pid_t read_pid(const std::string& path) {
  const std::string text = read_text(path);
  try {
    return text.empty() ? -1 : static_cast<pid_t>(std::stol(text));
  } catch (...) {
    return -1;
  }
}

// True once the process no longer exists or is a zombie (dead, waiting for init to reap it).
bool gone(pid_t pid, double timeout_s = 10) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
    const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
    const size_t paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z')
      return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Every pid recorded in dir/<prefix>-<rank> is gone.
void check_all_gone(const TempDir& dir, int nproc) {
  for (const char* prefix : {"pid", "sleep"}) {
    for (int r = 0; r < nproc; ++r) {
      const pid_t pid = read_pid(dir / (std::string(prefix) + "-" + std::to_string(r)));
      if (pid <= 0) continue;
      INFO(prefix, " of rank ", r, " (pid ", pid, ")");
      CHECK(gone(pid));
    }
  }
}

// "K=V K=V ..." on the line of `text` that starts with "RANK=".
std::map<std::string, std::string> env_line(const std::string& text) {
  std::map<std::string, std::string> kv;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("RANK=", 0) != 0) continue;
    std::istringstream words(line);
    std::string w;
    while (words >> w) {
      const size_t eq = w.find('=');
      if (eq != std::string::npos) kv[w.substr(0, eq)] = w.substr(eq + 1);
    }
    break;
  }
  return kv;
}

LaunchOptions sh_options(const TempDir& dir, int nproc, const std::string& script) {
  LaunchOptions o;
  o.nproc = nproc;
  o.child_argv = {"/bin/sh", "-c", "D=" + dir.path() + "\n" + script};
  o.log_dir = dir / "logs";
  return o;
}

const char* kPrintEnv =
    "echo \"RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK "
    "LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT "
    "DTRAIN_JOB_TOKEN=$DTRAIN_JOB_TOKEN GROUP_RANK=$GROUP_RANK GROUP_WORLD_SIZE=$GROUP_WORLD_SIZE "
    "ROLE_NAME=$ROLE_NAME ROLE_RANK=$ROLE_RANK ROLE_WORLD_SIZE=$ROLE_WORLD_SIZE "
    "TORCHELASTIC_RESTART_COUNT=$TORCHELASTIC_RESTART_COUNT "
    "TORCHELASTIC_MAX_RESTARTS=$TORCHELASTIC_MAX_RESTARTS "
    "TORCHELASTIC_RUN_ID=$TORCHELASTIC_RUN_ID\"\n"
    "echo \"stderr-of-rank-$RANK\" >&2\n"
    "read line || echo \"stdin-of-rank-$RANK-is-empty\"\n";

}  // namespace

TEST_CASE("launch_local gives every rank the torchrun environment and its own log") {
  TempDir dir;
  const Launched r = run_launcher(sh_options(dir, 3, kPrintEnv), dir);
  INFO("launcher stdout:\n", r.out, "\nlauncher stderr:\n", r.err);
  CHECK(r.exit_code == 0);

  std::string port, token, run_id;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string log = read_text(dir / ("logs/rank-" + std::to_string(rank) + ".log"));
    INFO("rank ", rank, " log:\n", log);
    const auto kv = env_line(log);
    CHECK(kv.count("RANK") == 1);
    if (kv.count("RANK") == 0) continue;
    CHECK(kv.at("RANK") == std::to_string(rank));
    CHECK(kv.at("WORLD_SIZE") == "3");
    CHECK(kv.at("LOCAL_RANK") == std::to_string(rank));
    CHECK(kv.at("LOCAL_WORLD_SIZE") == "3");
    CHECK(kv.at("MASTER_ADDR") == "127.0.0.1");
    CHECK(!kv.at("MASTER_PORT").empty());
    CHECK(kv.at("DTRAIN_JOB_TOKEN").size() == 32);
    // The rest of torchrun's worker environment: one node, one role, attempt 0.
    CHECK(kv.at("GROUP_RANK") == "0");
    CHECK(kv.at("GROUP_WORLD_SIZE") == "1");
    CHECK(kv.at("ROLE_NAME") == "default");
    CHECK(kv.at("ROLE_RANK") == std::to_string(rank));
    CHECK(kv.at("ROLE_WORLD_SIZE") == "3");
    CHECK(kv.at("TORCHELASTIC_RESTART_COUNT") == "0");
    CHECK(kv.at("TORCHELASTIC_MAX_RESTARTS") == "0");
    // A random run id of its own (as torchrun --standalone), never the secret token.
    CHECK(kv.at("TORCHELASTIC_RUN_ID").size() == 32);
    CHECK(kv.at("TORCHELASTIC_RUN_ID") != kv.at("DTRAIN_JOB_TOKEN"));
    if (rank == 0) {
      port = kv.at("MASTER_PORT");
      token = kv.at("DTRAIN_JOB_TOKEN");
      run_id = kv.at("TORCHELASTIC_RUN_ID");
    }
    CHECK(kv.at("MASTER_PORT") == port);
    CHECK(kv.at("DTRAIN_JOB_TOKEN") == token);
    CHECK(kv.at("TORCHELASTIC_RUN_ID") == run_id);
    CHECK(contains(log, "stderr-of-rank-" + std::to_string(rank)));
    CHECK(contains(log, "stdin-of-rank-" + std::to_string(rank) + "-is-empty"));
    CHECK(contains(log, "==== dtrain launch "));
  }
  CHECK(std::stoi(port) > 0);
  CHECK(std::stoi(port) <= 65535);
  // Rank 0 is also on the console, stdout to stdout and stderr to stderr; the others are not.
  CHECK(contains(r.out, "RANK=0 "));
  CHECK(contains(r.err, "stderr-of-rank-0"));
  CHECK_FALSE(contains(r.out + r.err, "RANK=1 "));
  CHECK_FALSE(contains(r.out + r.err, "stderr-of-rank-2"));
  // The start line names the rank count, the port and the log folder.
  CHECK(contains(r.out + r.err, "launching 3 rank(s)"));
  CHECK(contains(r.out + r.err, "127.0.0.1:" + port));
  CHECK(contains(r.out + r.err, dir / "logs"));
}

TEST_CASE("launch_local uses the given port and token and appends to the logs") {
  TempDir dir;
  LaunchOptions o = sh_options(dir, 2, kPrintEnv);
  o.master_port = pick_free_port();
  o.token = "tok-42";
  o.run_id = "job-7";
  for (int i = 0; i < 2; ++i) CHECK(run_launcher(o, dir).exit_code == 0);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string log = read_text(dir / ("logs/rank-" + std::to_string(rank) + ".log"));
    const auto kv = env_line(log);
    REQUIRE(kv.count("MASTER_PORT") == 1);
    CHECK(kv.at("MASTER_PORT") == std::to_string(o.master_port));
    CHECK(kv.at("DTRAIN_JOB_TOKEN") == "tok-42");
    CHECK(kv.at("TORCHELASTIC_RUN_ID") == "job-7");
    size_t runs = 0;
    for (size_t p = log.find("==== dtrain launch"); p != std::string::npos;
         p = log.find("==== dtrain launch", p + 1))
      ++runs;
    CHECK(runs == 2);
  }
}

TEST_CASE("a failing rank stops the others and the launcher reports it") {
  TempDir dir;
  const Launched r = run_launcher(sh_options(dir, 3,
                                             "echo $$ > $D/pid-$RANK\n"
                                             "if [ \"$RANK\" = 1 ]; then exit 3; fi\n"
                                             "sleep 30 & echo $! > $D/sleep-$RANK\n"
                                             "wait\n"),
                                  dir);
  INFO("launcher stdout:\n", r.out, "\nlauncher stderr:\n", r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.seconds < 20);  // the others sleep 30 s unless stopped
  CHECK(contains(r.out + r.err, "rank 1 failed: exit status 3"));
  CHECK(contains(r.out + r.err, "rank 0 stopped: killed by signal SIGTERM"));
  CHECK(contains(r.out + r.err, "rank 2 stopped: killed by signal SIGTERM"));
  check_all_gone(dir, 3);
}

TEST_CASE("a rank killed by a signal is reported as such") {
  TempDir dir;
  const Launched r = run_launcher(sh_options(dir, 2,
                                             "echo $$ > $D/pid-$RANK\n"
                                             "if [ \"$RANK\" = 1 ]; then kill -9 $$; fi\n"
                                             "sleep 30 & echo $! > $D/sleep-$RANK\n"
                                             "wait\n"),
                                  dir);
  INFO("launcher stdout:\n", r.out, "\nlauncher stderr:\n", r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.seconds < 20);
  CHECK(contains(r.out + r.err, "rank 1 failed: killed by signal SIGKILL"));
  check_all_gone(dir, 2);
}

TEST_CASE("ranks that ignore SIGTERM are SIGKILLed after the grace period") {
  TempDir dir;
  // Rank 1 fails only once the others ignore SIGTERM (they and their sleeps, which inherit it).
  LaunchOptions o = sh_options(dir, 3,
                               "echo $$ > $D/pid-$RANK\n"
                               "if [ \"$RANK\" = 1 ]; then\n"
                               "  while [ ! -e $D/ready-0 ] || [ ! -e $D/ready-2 ]; do sleep 0.05; "
                               "done\n"
                               "  exit 4\n"
                               "fi\n"
                               "trap '' TERM\n"
                               "sleep 30 & echo $! > $D/sleep-$RANK\n"
                               "touch $D/ready-$RANK\n"
                               "wait\n");
  o.grace_s = 1;
  const Launched r = run_launcher(o, dir);
  INFO("launcher stdout:\n", r.out, "\nlauncher stderr:\n", r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.seconds >= 0.9);  // the grace period was granted
  CHECK(r.seconds < 20);
  CHECK(contains(r.out + r.err, "rank 1 failed: exit status 4"));
  CHECK(contains(r.out + r.err, "sending SIGKILL"));
  CHECK(contains(r.out + r.err, "rank 0 stopped: killed by signal SIGKILL"));
  CHECK(contains(r.out + r.err, "rank 2 stopped: killed by signal SIGKILL"));
  check_all_gone(dir, 3);
}

TEST_CASE("a stopped launcher does not stop rank 0 at once: its console pipe holds 1 MiB") {
  // Rank 0's output goes through a pipe the launcher reads. Stopped (Ctrl-Z, SIGSTOP), it reads
  // nothing: with the default 64 KiB pipe rank 0 blocked after 64 KiB of log, mid-step, and its
  // peers timed out. Rank 0 writes 700 KB (stdout and stderr) while the launcher is stopped.
  TempDir dir;
  const LaunchOptions o = sh_options(dir, 1,
                                     "touch $D/started\n"
                                     "head -c 400000 /dev/zero | tr '\\0' Q\n"
                                     "head -c 300000 /dev/zero | tr '\\0' J >&2\n"
                                     "touch $D/written\n");
  bool written_while_stopped = false;
  const Launched r = run_launcher(o, dir, [&](pid_t launcher) {
    REQUIRE(wait_for_files({dir / "started"}));
    ::kill(launcher, SIGSTOP);
    written_while_stopped = wait_for_files({dir / "written"}, 20);
    ::kill(launcher, SIGCONT);
  });
  CHECK(written_while_stopped);
  CHECK(r.exit_code == 0);
  // Nothing was lost: every byte reached the console and the log, in order.
  CHECK(contains(r.out, std::string(400000, 'Q')));
  CHECK(contains(r.err, std::string(300000, 'J')));
  const std::string log = read_text(dir / "logs/rank-0.log");
  CHECK(contains(log, std::string(400000, 'Q')));
  CHECK(contains(log, std::string(300000, 'J')));
}

TEST_CASE("launch_local gives every rank inherit_fd as its descriptor 3, and nothing else") {
  // dtrain launch passes its output folder's lock this way, so the folder stays locked while any
  // rank lives (before, a killed launcher took the lock with it while its ranks still wrote).
  TempDir dir;
  LaunchOptions o = sh_options(dir, 2,
                               "readlink /proc/$$/fd/3 > $D/fd3-$RANK\n"
                               "ls /proc/$$/fd > $D/fds-$RANK\n");
  const std::string held = dir / "held";
  std::filesystem::create_directories(held);
  // A high descriptor, and descriptor 3 in the launcher too (where a plain dup2(3, 3) would
  // have kept close-on-exec set).
  const int fd = ::open(held.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  for (const bool as_fd3 : {false, true}) {
    CAPTURE(as_fd3);
    int use = ::fcntl(fd, F_DUPFD_CLOEXEC, 20);
    if (as_fd3) {
      ::close(use);
      use = fd == 3 ? 3 : ::fcntl(3, F_GETFD) == -1 ? ::dup3(fd, 3, O_CLOEXEC) : -1;
      if (use != 3) continue;  // 3 is taken here by something else: the first case stands
    }
    REQUIRE(use >= 0);
    o.inherit_fd = use;
    const Launched r = run_launcher(o, dir);
    CHECK(r.exit_code == 0);
    for (int rank = 0; rank < 2; ++rank) {
      CHECK(read_text(dir / ("fd3-" + std::to_string(rank))) == held + "\n");
      // stdin, stdout, stderr, 3, and the descriptor ls reads /proc with.
      std::istringstream fds(read_text(dir / ("fds-" + std::to_string(rank))));
      int n = 0;
      for (std::string line; std::getline(fds, line);) ++n;
      CHECK(n <= 5);
    }
    if (use != fd) ::close(use);
  }
  ::close(fd);
}

TEST_CASE("SIGTERM to the launcher is forwarded to the ranks") {
  TempDir dir;
  // The trap exits explicitly: a SIGTERM that lands between `touch` and `wait` would otherwise
  // make the argument-less `wait` return 0 (its children are gone), and every rank exit 0.
  const LaunchOptions o = sh_options(dir, 2,
                                     "trap 'echo got > $D/term-$RANK; exit 143' TERM\n"
                                     "echo $$ > $D/pid-$RANK\n"
                                     "sleep 30 & echo $! > $D/sleep-$RANK\n"
                                     "touch $D/ready-$RANK\n"
                                     "wait\n");
  const Launched r = run_launcher(o, dir, [&](pid_t launcher) {
    // Once the ranks run, the launcher's handlers are in place.
    CHECK(wait_for_files({dir / "ready-0", dir / "ready-1"}));
    ::kill(launcher, SIGTERM);
  });
  INFO("launcher stdout:\n", r.out, "\nlauncher stderr:\n", r.err);
  CHECK(r.signal == 0);
  CHECK(r.exit_code == 128 + SIGTERM);
  CHECK(r.seconds < 20);
  CHECK(contains(r.out + r.err, "received SIGTERM"));
  // The ranks' trap ran: they got the signal from the launcher.
  CHECK(contains(read_text(dir / "term-0"), "got"));
  CHECK(contains(read_text(dir / "term-1"), "got"));
  check_all_gone(dir, 2);
}

TEST_CASE("SIGINT to the launcher is forwarded and leftovers of the ranks are killed") {
  // Also with SIGINT ignored at the launcher's start (a script's `dtrain launch ... &`: Ctrl-C at
  // the terminal ended the script and left the launcher and its ranks training), and with a
  // SIGTERM at once after it (the script's trap passing the Ctrl-C on): the same request, not a
  // second one that kills the ranks without their checkpoint.
  for (const bool ignored : {false, true}) {
    CAPTURE(ignored);
    TempDir dir;
    // A background job of a non-interactive shell ignores SIGINT: the sleeps outlive their rank
    // unless the launcher clears each rank's process group.
    const LaunchOptions o = sh_options(dir, 2,
                                       "trap 'echo got > $D/int-$RANK; exit 5' INT\n"
                                       "echo $$ > $D/pid-$RANK\n"
                                       "sleep 30 & echo $! > $D/sleep-$RANK\n"
                                       "touch $D/ready-$RANK\n"
                                       "wait\n");
    const Launched r = run_launcher(
        o, dir,
        [&](pid_t launcher) {
          CHECK(wait_for_files({dir / "ready-0", dir / "ready-1"}));
          ::kill(launcher, SIGINT);
          if (!ignored) return;
          // (a moment later, as a script's trap runs: two signals sent at one instant may be
          // taken by two threads in either order, and the first taken is the one forwarded)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          ::kill(launcher, SIGTERM);
        },
        ignored);
    INFO("launcher stdout:\n", r.out, "\nlauncher stderr:\n", r.err);
    // Stopped by a signal: the ranks' common exit status passes through (dtrain run's interrupt
    // or requeue code); 128 + SIGINT only when they disagree or die by a signal.
    CHECK(r.exit_code == 5);
    CHECK(r.seconds < 20);
    CHECK(contains(r.out + r.err, "rank 0 stopped: exit status 5"));
    CHECK_FALSE(contains(r.out + r.err, "killing the ranks now"));
    CHECK(contains(read_text(dir / "int-0"), "got"));
    CHECK(contains(read_text(dir / "int-1"), "got"));
    check_all_gone(dir, 2);
  }
}

TEST_CASE("launch_local refuses bad options and unstartable commands") {
  TempDir dir;
  LaunchOptions o = sh_options(dir, 2, "true");
  o.nproc = 0;
  CHECK_THROWS_AS(launch_local(o), UserError);
  o = sh_options(dir, 2, "true");
  o.child_argv.clear();
  CHECK_THROWS_AS(launch_local(o), UserError);
  o = sh_options(dir, 2, "true");
  o.master_port = 70000;
  CHECK_THROWS_AS(launch_local(o), UserError);
  o = sh_options(dir, 2, "true");
  o.log_dir.clear();
  CHECK_THROWS_AS(launch_local(o), UserError);
  o = sh_options(dir, 2, "true");
  o.grace_s = -1;
  CHECK_THROWS_AS(launch_local(o), UserError);

  // Runs in this process: the handlers it installs must be restored afterwards.
  struct sigaction before {
  }, after{};
  ::sigaction(SIGTERM, nullptr, &before);
  o = sh_options(dir, 2, "true");
  o.child_argv = {dir / "no-such-program"};
  CHECK_THROWS_AS(launch_local(o), std::runtime_error);
  ::sigaction(SIGTERM, nullptr, &after);
  const bool same_handler = before.sa_handler == after.sa_handler;
  CHECK(same_handler);
}

TEST_CASE("describe_wait_status and pick_free_port") {
  CHECK(describe_wait_status(3 << 8) == "exit status 3");
  CHECK(describe_wait_status(0) == "exit status 0");
  CHECK(describe_wait_status(SIGKILL) == "killed by signal SIGKILL");
  CHECK(describe_wait_status(SIGSEGV | 0x80) == "killed by signal SIGSEGV (core dumped)");
  const int port = pick_free_port();
  CHECK(port > 0);
  CHECK(port <= 65535);
}

TEST_CASE("pick_free_port: outside the ephemeral range, and free") {
  int lo = 32768, hi = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lo >> hi;
  for (int i = 0; i < 20; ++i) {
    const int port = pick_free_port();
    INFO("port ", port, ", ephemeral range ", lo, "-", hi);
    if (lo > 10000 || hi < 65535) CHECK((port < lo || port > hi));
    // Free: a listening socket can take it at once.
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(s >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    CHECK(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    CHECK(::listen(s, 1) == 0);
    ::close(s);
  }
}

namespace {

// Each attempt of each rank records its environment in $D/env-<rank>-<attempt>; rank 1 exits 3
// in attempts below $FAILS (every attempt when FAILS is unset), the others wait to be stopped.
// $1 is the command's tag: "first" for child_argv, "restart-<a>" for restart_argv(a).
LaunchOptions restart_options(const TempDir& dir, int nproc, int fails) {
  LaunchOptions o = sh_options(dir, nproc,
                               "N=$DTRAIN_RESTART_COUNT\n"
                               "echo \"TAG=$1 PORT=$MASTER_PORT TOKEN=$DTRAIN_JOB_TOKEN\" > "
                               "$D/env-$RANK-$N\n"
                               "echo $$ > $D/pid-$RANK\n"
                               "if [ \"$RANK\" = 1 ] && [ \"$N\" -lt " +
                                   std::to_string(fails) +
                                   " ]; then exit 3; fi\n"
                                   "if [ \"$RANK\" = 1 ]; then exit 0; fi\n"
                                   "sleep 0.5 & echo $! > $D/sleep-$RANK\n"
                                   "wait\n");
  o.child_argv.push_back("sh");
  o.child_argv.push_back("first");
  const std::vector<std::string> base = o.child_argv;
  o.restart_argv = [base](int attempt) {
    std::vector<std::string> argv = base;
    argv.back() = "restart-" + std::to_string(attempt);
    return argv;
  };
  return o;
}

std::map<std::string, std::string> kv_of(const std::string& line) {
  std::map<std::string, std::string> kv;
  std::istringstream words(line);
  std::string w;
  while (words >> w) {
    const size_t eq = w.find('=');
    if (eq != std::string::npos) kv[w.substr(0, eq)] = w.substr(eq + 1);
  }
  return kv;
}

}  // namespace

TEST_CASE("a failed attempt is restarted with a fresh port, the same token and the restart count") {
  TempDir dir;
  LaunchOptions o = restart_options(dir, 3, /*fails=*/2);
  o.max_restarts = 3;
  const Launched r = run_launcher(o, dir);
  INFO("launcher stdout:\n", r.out, "\nlauncher stderr:\n", r.err);
  CHECK(r.exit_code == 0);
  // Attempts 0 and 1 failed, attempt 2 succeeded, attempt 3 never ran.
  CHECK(contains(r.out + r.err, "restart 1 of 3: rank 1 failed (exit status 3); starting all 3"));
  CHECK(contains(r.out + r.err, "restart 2 of 3: rank 1 failed (exit status 3)"));
  CHECK_FALSE(contains(r.out + r.err, "restart 3 of 3"));
  CHECK(contains(r.out + r.err, "all 3 rank(s) finished after 2 restart(s)"));
  std::vector<std::string> ports;
  std::string token;
  for (int attempt = 0; attempt < 3; ++attempt) {
    for (int rank = 0; rank < 3; ++rank) {
      const auto kv =
          kv_of(read_text(dir / ("env-" + std::to_string(rank) + "-" + std::to_string(attempt))));
      INFO("rank ", rank, " attempt ", attempt);
      REQUIRE(kv.count("PORT") == 1);
      CHECK(kv.at("TAG") == (attempt == 0 ? "first" : "restart-" + std::to_string(attempt)));
      if (rank == 0) ports.push_back(kv.at("PORT"));
      CHECK(kv.at("PORT") == ports.back());
      if (token.empty()) token = kv.at("TOKEN");
      CHECK(kv.at("TOKEN") == token);
    }
  }
  CHECK(token.size() == 32);
  CHECK(ports[0] != ports[1]);
  CHECK(ports[1] != ports[2]);
  CHECK_FALSE(std::filesystem::exists(dir / "env-0-3"));
  // One separator per attempt in every log, the restarts numbered.
  const std::string log = read_text(dir / "logs/rank-2.log");
  CHECK(contains(log, "rank 2 of 3 ===="));
  CHECK(contains(log, "rank 2 of 3, restart 1 of 3 ===="));
  CHECK(contains(log, "rank 2 of 3, restart 2 of 3 ===="));
  check_all_gone(dir, 3);
}

TEST_CASE("restarts stop when they are used up, and are off by default") {
  for (int max_restarts : {0, 2}) {
    TempDir dir;
    LaunchOptions o = restart_options(dir, 2, /*fails=*/100);
    o.max_restarts = max_restarts;
    const Launched r = run_launcher(o, dir);
    INFO("max_restarts ", max_restarts, "\nlauncher stdout:\n", r.out, "\nlauncher stderr:\n",
         r.err);
    CHECK(r.exit_code == 1);
    for (int attempt = 0; attempt <= max_restarts; ++attempt)
      CHECK(std::filesystem::exists(dir / ("env-1-" + std::to_string(attempt))));
    CHECK_FALSE(std::filesystem::exists(dir / ("env-1-" + std::to_string(max_restarts + 1))));
    CHECK(contains(r.out + r.err, "rank 1 failed: exit status 3"));
    if (max_restarts == 0) {
      CHECK_FALSE(contains(r.out + r.err, "restart"));
    } else {
      CHECK(contains(r.out + r.err, "restart 2 of 2"));
      CHECK(contains(r.out + r.err,
                     "giving up: rank 1 failed (exit status 3) in attempt 3, and all 2 restart(s) "
                     "are used"));
    }
    check_all_gone(dir, 2);
  }
}

TEST_CASE("a rank failing on bad input (exit 2) is not restarted") {
  TempDir dir;
  LaunchOptions o = sh_options(dir, 2,
                               "echo x > $D/env-$RANK-$DTRAIN_RESTART_COUNT\n"
                               "if [ \"$RANK\" = 1 ]; then exit 2; fi\n"
                               "sleep 30 & wait\n");
  o.max_restarts = 3;
  const Launched r = run_launcher(o, dir);
  INFO("launcher stdout:\n", r.out, "\nlauncher stderr:\n", r.err);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.out + r.err, "not restarting: a rank failed on bad input"));
  CHECK(std::filesystem::exists(dir / "env-1-0"));
  CHECK_FALSE(std::filesystem::exists(dir / "env-1-1"));
}

TEST_CASE("a rank killed by a stop signal sent to it alone is stopped, not restarted") {
  // A second SIGTERM or SIGINT to a rank ends it at once by that signal (util/interrupt.h): the
  // launcher took it for a crash and restarted the job its user was stopping.
  for (const char* sig : {"TERM", "INT"}) {
    CAPTURE(sig);
    TempDir dir;
    LaunchOptions o = sh_options(dir, 2,
                                 "echo x > $D/env-$RANK-$DTRAIN_RESTART_COUNT\n"
                                 "if [ \"$RANK\" = 1 ]; then trap - INT; kill -" +
                                     std::string(sig) +
                                     " $$; fi\n"
                                     "sleep 30 & echo $! > $D/sleep-$RANK; wait\n");
    o.max_restarts = 2;
    const Launched r = run_launcher(o, dir);
    INFO("launcher stdout:\n", r.out, "\nlauncher stderr:\n", r.err);
    CHECK(r.exit_code == 128 + (std::string(sig) == "TERM" ? SIGTERM : SIGINT));
    CHECK(contains(r.out + r.err, "rank 1 stopped: killed by signal SIG" + std::string(sig) +
                                      ", sent to it and not to the launcher"));
    CHECK(std::filesystem::exists(dir / "env-1-0"));
    CHECK_FALSE(std::filesystem::exists(dir / "env-1-1"));
    check_all_gone(dir, 2);
  }
}

TEST_CASE("SIGTERM to a launcher with restarts left stops everything without restarting") {
  // Ranks that the forwarded SIGTERM kills (here: shell scripts without a handler, like a dtrain
  // rank still starting) stopped as their handler would have made them: 75 when SIGTERM is the
  // ranks' preemption signal (the default), else 143.
  for (const int preempt : {SIGUSR1, SIGTERM}) {
    CAPTURE(preempt);
    TempDir dir;
    LaunchOptions o = sh_options(dir, 2,
                                 "echo $$ > $D/pid-$RANK\n"
                                 "echo x > $D/env-$RANK-$DTRAIN_RESTART_COUNT\n"
                                 "sleep 30 & echo $! > $D/sleep-$RANK\n"
                                 "touch $D/ready-$RANK\n"
                                 "wait\n");
    o.max_restarts = 5;
    o.preempt_signal = preempt;
    const Launched r = run_launcher(o, dir, [&](pid_t launcher) {
      CHECK(wait_for_files({dir / "ready-0", dir / "ready-1"}));
      ::kill(launcher, SIGTERM);
      ::kill(launcher, SIGTERM);  // the same request delivered twice (timeout(1) does): not "again"
    });
    INFO("launcher stdout:\n", r.out, "\nlauncher stderr:\n", r.err);
    CHECK(r.exit_code == (preempt == SIGTERM ? kExitPreempted : 128 + SIGTERM));
    CHECK(r.seconds < 20);
    CHECK_FALSE(contains(r.out + r.err, "restart 1"));
    CHECK_FALSE(contains(r.out + r.err, "killing the ranks now"));
    CHECK_FALSE(std::filesystem::exists(dir / "env-0-1"));
    CHECK_FALSE(std::filesystem::exists(dir / "env-1-1"));
    check_all_gone(dir, 2);
  }
}

TEST_CASE("Ctrl-C while a failed attempt's ranks are being stopped: no restart") {
  // The signal came while the launcher waited out the grace of ranks that ignore SIGTERM: it
  // killed them, and the restart that followed took the signal for nothing.
  TempDir dir;
  LaunchOptions o = sh_options(dir, 3,
                               "echo $$ > $D/pid-$RANK\n"
                               "echo x > $D/env-$RANK-$DTRAIN_RESTART_COUNT\n"
                               "if [ \"$RANK\" = 1 ]; then\n"
                               "  while [ ! -e $D/ready-0 ] || [ ! -e $D/ready-2 ]; do sleep 0.05; "
                               "done\n"
                               "  touch $D/failing\n"
                               "  exit 4\n"
                               "fi\n"
                               "trap '' TERM\n"
                               "sleep 30 & echo $! > $D/sleep-$RANK\n"
                               "touch $D/ready-$RANK\n"
                               "wait\n");
  o.grace_s = 10;
  o.max_restarts = 3;
  const Launched r = run_launcher(o, dir, [&](pid_t launcher) {
    CHECK(wait_for_files({dir / "failing"}));
    // (past the second the launcher waits for other failures, in the grace of its SIGTERM)
    std::this_thread::sleep_for(std::chrono::milliseconds(2000));
    ::kill(launcher, SIGINT);
  });
  INFO("launcher stdout:\n", r.out, "\nlauncher stderr:\n", r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.seconds < 10);  // not the 10 s grace
  CHECK(contains(r.out + r.err, "killing the ranks now"));
  CHECK(contains(r.out + r.err, "not restarting"));
  CHECK_FALSE(contains(r.out + r.err, "restart 1"));
  CHECK_FALSE(std::filesystem::exists(dir / "env-0-1"));
  check_all_gone(dir, 3);
}

TEST_CASE("the rank that refused its input is blamed, not a peer that relayed its abort first") {
  // Rank 2 exits 1 at once ("rank 0 aborted: ..."), rank 0 exits 2 a moment later: the launch
  // failed on rank 0's bad input (it blamed rank 2, "exit status 1", in 7 of 15 real runs).
  TempDir dir;
  LaunchOptions o = sh_options(dir, 3,
                               "if [ \"$RANK\" = 2 ]; then exit 1; fi\n"
                               "if [ \"$RANK\" = 0 ]; then sleep 0.3; exit 2; fi\n"
                               "sleep 30 & wait\n");
  o.max_restarts = 2;
  const Launched r = run_launcher(o, dir);
  INFO("launcher stdout:\n", r.out, "\nlauncher stderr:\n", r.err);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.out + r.err, "not restarting: a rank failed on bad input"));
  CHECK(contains(r.out + r.err, "rank 0 failed (exit status 2)"));
  CHECK_FALSE(contains(r.out + r.err, "rank 2 failed (exit status 1)"));
}
