// Helpers for the CLI tests that compare runs of the real binary: a run's newest state as one
// file, bitwise comparison of two states, and a dtrain child process to signal.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "checkpoint/safetensors.h"
#include "test_util.h"

extern char** environ;

namespace dtrain::testing {

// The newest checkpoint of a run folder as one file's tensors: a checkpoint file is read as it
// is, a sharded folder through `dtrain checkpoint consolidate` (run with `bin`).
inline StFile latest_run_state(const std::string& bin, const std::string& run) {
  std::string latest = read_text(run + "/checkpoints/latest");
  while (!latest.empty() && latest.back() == '\n') latest.pop_back();
  if (latest.size() > 12 && latest.substr(latest.size() - 12) == ".safetensors")
    return read_safetensors(run + "/checkpoints/" + latest);
  const std::string file = run + "/final.safetensors";
  const auto r = run_cmd(bin + " checkpoint consolidate " + run + " -o " + file);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  return read_safetensors(file);
}

// Adam and dropout: a resume must restore the optimizer state and every rank's RNG (and the
// compression state, when set) to be exact. Checkpoints at steps 10, 20, 30.
inline const char* kRestartCfg = R"(seed: 5
model: {hidden: [16, 8], dropout: 0.1}
data:
  format: synthetic
  synthetic: {samples: 500, features: 9, classes: 3}
  batch_size: 10
optimizer: {type: adam, lr: 0.01}
train: {epochs: 0, max_steps: 30, checkpoint: {every_steps: 10, keep_last: 3}}
distributed: {timeout_s: 20, ddp: {bucket_mb: 0.0005}}
runtime: {threads: 1}
)";

// Both hold the same tensors, bit for bit.
inline void check_same_state(const StFile& a, const StFile& b, const std::string& what) {
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    REQUIRE_MESSAGE(b.tensors.count(name) == 1, what, " ", name);
    CHECK_MESSAGE(t.data == b.tensors.at(name).data, what, " ", name);
  }
}

// `sh -c cmd` as a child with stdout and stderr to `log` and SIGINT/SIGTERM at their default
// actions (a test runner may have them ignored), so the test can signal it as a terminal or a
// cluster scheduler would. `exec` in cmd makes the signalled process dtrain itself. The child
// leads a process group of its own, and the destructor kills that whole group, so a test that
// fails midway leaves no launcher's ranks behind.
class Child {
 public:
  Child(const std::string& cmd, const std::string& log) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    sigset_t def;
    sigemptyset(&def);
    sigaddset(&def, SIGINT);
    sigaddset(&def, SIGTERM);
    posix_spawnattr_setsigdefault(&at, &def);
    posix_spawnattr_setpgroup(&at, 0);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
    const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
    const int rc = posix_spawn(&pid_, "/bin/sh", &fa, &at, const_cast<char* const*>(argv), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    REQUIRE_MESSAGE(rc == 0, "posix_spawn failed");
  }
  ~Child() {
    if (pid_ > 0) ::kill(-pid_, SIGKILL);  // the group outlives its leader while members live
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  void signal(int sig) { ::kill(pid_, sig); }
  pid_t pid() const { return pid_; }
  // After wait(): whether the child ended by a signal rather than by exiting.
  bool signaled() const { return signaled_; }
  // Waits at most timeout_s for the child; returns its exit code, 128 + N when killed by signal
  // N, or -1 on timeout (the child is then killed by the destructor).
  int wait(double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      int st = 0;
      const pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        signaled_ = WIFSIGNALED(st);
        if (WIFEXITED(st)) return WEXITSTATUS(st);
        if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false, signaled_ = false;
};

// Waits until `pred` holds, polling every 20 ms, at most timeout_s; returns whether it did.
template <typename Pred>
bool wait_until(Pred pred, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

}  // namespace dtrain::testing
