// dtrain as a container's entry point (PID 1 of its PID namespace, without an init: `docker run`
// without --init, a Kubernetes container): it reaps the orphans the kernel hands it, as an init
// does, passes the signals sent to it on (docker stop's SIGTERM is a preemption: 75), and exits
// with its run's status (util/pid1_init.h).
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_util.h"
#include "test_util.h"

using dtrain::testing::Child;
using dtrain::testing::contains;
using dtrain::testing::read_text;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;
using dtrain::testing::wait_until;

namespace {

const std::string kBin = DTRAIN_BIN;

const char* kCfg = R"(seed: 3
model: {type: mlp, hidden: [16]}
data:
  format: synthetic
  synthetic: {samples: 2000, features: 8, classes: 3}
  batch_size: 16
optimizer: {type: sgd, lr: 0.01}
train: {epochs: 100000, log_every: 50}
runtime: {threads: 1}
)";

// The children of `pid` and their states ('Z': a zombie), from /proc/<pid>/task/*/children
// and /proc/<child>/stat.
std::vector<std::pair<pid_t, char>> children_of(pid_t pid) {
  std::vector<std::pair<pid_t, char>> out;
  std::error_code ec;
  for (const auto& t :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(t.path() / "children");
    for (pid_t c; in >> c;) {
      const std::string stat = read_text("/proc/" + std::to_string(c) + "/stat");
      const size_t close = stat.rfind(')');
      out.emplace_back(
          c, close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?');
    }
  }
  return out;
}

int zombies(pid_t pid) {
  int n = 0;
  for (const auto& [c, state] : children_of(pid)) n += state == 'Z';
  return n;
}

}  // namespace

TEST_CASE("as a container's PID 1 dtrain reaps orphans and takes docker stop's SIGTERM") {
  if (run_cmd("unshare --pid --fork --mount-proc true && command -v nsenter").exit_code != 0) {
    MESSAGE("skipped: cannot make a PID namespace here (unshare --pid needs root) or no nsenter");
    return;
  }
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  for (const std::string cmd : {"run --no-progress", "launch --nproc 2"}) {
    CAPTURE(cmd);
    const std::string log = dir / "log";
    Child c("exec unshare --pid --fork --mount-proc " + kBin + " " + cmd + " " + cfg + " --out " +
                dir / "r" + " --overwrite",
            log);
    REQUIRE(wait_until([&] { return contains(read_text(log), "step 100 "); }, 60));
    const std::vector<std::pair<pid_t, char>> top = children_of(c.pid());
    REQUIRE(top.size() == 1);
    const pid_t init = top[0].first;  // PID 1 inside
    // Three orphans, as a `docker exec` session leaves them: their parent exits at once.
    for (int i = 0; i < 3; ++i)
      REQUIRE(run_cmd("nsenter -t " + std::to_string(init) + " -p -m sh -c 'sleep 0.2 & exit 0'")
                  .exit_code == 0);
    // (they end 0.2 s later: once they have, an init has reaped them; without one they stay)
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    CHECK_MESSAGE(wait_until([&] { return zombies(init) == 0; }, 5), zombies(init), " zombies");
    ::kill(init, SIGTERM);  // docker stop: to PID 1 alone
    CHECK_MESSAGE(c.wait(60) == 75, read_text(log));
    CHECK(contains(read_text(log), "continue with --resume auto"));
  }
}
