#include "util/pid1_init.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "util/fs.h"

extern char** environ;

namespace dtrain {
namespace {

// The child once started (0 before): the handlers pass signals on to it.
std::atomic<pid_t> g_child{0};
// Signals that came before the child was started, passed on once it is.
std::atomic<bool> g_pending[NSIG];
// Written to by the SIGCHLD handler: wakes the reaping loop.
int g_wake_fd = -1;

// Signals the init keeps to itself: SIGCHLD, which it acts on; those a fault of its own raises
// (never meant for the child); SIGKILL and SIGSTOP, which cannot be caught; terminal job-control
// reads and writes.
bool passed_on(int sig) {
  switch (sig) {
    case SIGCHLD:
    case SIGFPE:
    case SIGILL:
    case SIGSEGV:
    case SIGBUS:
    case SIGABRT:
    case SIGTRAP:
    case SIGSYS:
    case SIGKILL:
    case SIGSTOP:
    case SIGTTIN:
    case SIGTTOU:
      return false;
    default:
      return true;
  }
}

// Async-signal-safe. Runs in whichever thread the kernel picks: OpenBLAS starts its threads
// before main, so a signal blocked in the main thread alone would reach one of them, where PID
// 1's default action drops it (a lost SIGCHLD left the init waiting for ever; a lost SIGTERM left
// a pod to its grace period's SIGKILL). Handlers are the process's, whoever runs them.
void on_signal(int sig) {
  const int saved = errno;
  if (sig == SIGCHLD) {
    const char b = 0;
    (void)!::write(g_wake_fd, &b, 1);
  } else if (const pid_t child = g_child.load(); child > 0) {
    ::kill(child, sig);
  } else {
    g_pending[sig].store(true);
  }
  errno = saved;
}

// The binary to start: this one by its path, so that the child's process name and `ps` line are
// dtrain's; /proc/self/exe when that path no longer names it (removed since).
std::string child_binary() {
  const OwnBinary b = own_binary();
  return b.path.empty() || b.removed ? "/proc/self/exe" : b.path;
}

[[noreturn]] void exit_as(int status) {
  if (WIFEXITED(status)) ::_exit(WEXITSTATUS(status));
  ::_exit(128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0));
}

}  // namespace

void become_init_if_pid1(char** argv) {
  if (::getpid() != 1) return;
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) return;
  g_wake_fd = wake[1];
  // Handlers for every signal not ignored on entry (one ignored stays so, in the child too: a
  // handler would be reset to the default at its exec).
  std::vector<std::pair<int, struct sigaction>> saved;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGCHLD && !passed_on(sig)) continue;
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) continue;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigfillset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
    if (::sigaction(sig, &sa, nullptr) == 0) saved.emplace_back(sig, old);
  }
  // The child leads a process group of its own and, when this process runs in a terminal's
  // foreground, takes the terminal's foreground: a terminal's signals (Ctrl-C, Ctrl-Z, a window
  // change) reach it alone, and a signal sent to this process's group (`timeout`, a shell's
  // hang-up) reaches this process alone, which passes it on once. (tini does so too.)
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (::isatty(STDIN_FILENO) && ::tcgetpgrp(STDIN_FILENO) == ::getpgrp())
    posix_spawn_file_actions_addtcsetpgrp_np(&fa, STDIN_FILENO);
  const std::string bin = child_binary();
  pid_t child = -1;
  const int rc = ::posix_spawn(&child, bin.c_str(), &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    for (const auto& [sig, old] : saved) ::sigaction(sig, &old, nullptr);
    ::close(wake[0]);
    ::close(wake[1]);
    std::fprintf(stderr,
                 "dtrain: warning: as PID 1, cannot start itself under an init of its own (%s: "
                 "%s); running as PID 1, which reaps no orphaned process (docker run --init "
                 "does)\n",
                 bin.c_str(), std::strerror(rc));
    return;
  }
  g_child.store(child);
  for (int sig = 1; sig < NSIG; ++sig)
    if (g_pending[sig].exchange(false)) ::kill(child, sig);
  for (;;) {
    // Every child that ended is reaped, the dtrain child's status ending the init. A wake-up
    // each second besides SIGCHLD's: nothing is left waiting on a lost wake-up.
    int status = 0;
    for (pid_t p; (p = ::waitpid(-1, &status, WNOHANG)) > 0;)
      if (p == child) exit_as(status);
    pollfd pf{wake[0], POLLIN, 0};
    ::poll(&pf, 1, 1000);
    char buf[64];
    while (::read(wake[0], buf, sizeof buf) > 0) {
    }
  }
}

}  // namespace dtrain
