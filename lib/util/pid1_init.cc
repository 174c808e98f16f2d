#include "util/pid1_init.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

extern char** environ;

namespace dtrain {
namespace {

// Signals the init keeps to itself: SIGCHLD, which it acts on; the ones a fault of its own
// raises (never meant for the child); and terminal job-control reads and writes.
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
    case SIGTTIN:
    case SIGTTOU:
      return false;
    default:
      return true;
  }
}

// The binary to start: this one by its path, so that the child's process name and `ps` line are
// dtrain's; /proc/self/exe when that path no longer names it (removed or replaced since).
std::string own_binary() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0 || n == static_cast<ssize_t>(sizeof buf - 1)) return "/proc/self/exe";
  const std::string path(buf, static_cast<size_t>(n));
  static constexpr char kDeleted[] = " (deleted)";
  if (path.size() > sizeof kDeleted - 1 &&
      path.compare(path.size() - (sizeof kDeleted - 1), std::string::npos, kDeleted) == 0)
    return "/proc/self/exe";
  return path;
}

[[noreturn]] void exit_as(int status) {
  if (WIFEXITED(status)) ::_exit(WEXITSTATUS(status));
  ::_exit(128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0));
}

}  // namespace

void become_init_if_pid1(char** argv) {
  if (::getpid() != 1) return;
  // Every signal is blocked before the child starts, so none sent in between is lost (the
  // kernel would drop it: PID 1 without a handler), and taken one at a time by sigwaitinfo.
  sigset_t all, before;
  sigfillset(&all);
  ::sigprocmask(SIG_BLOCK, &all, &before);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setsigmask(&attr, &before);  // the child starts with the mask dtrain got
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  const std::string bin = own_binary();
  pid_t child = -1;
  const int rc = ::posix_spawn(&child, bin.c_str(), nullptr, &attr, argv, environ);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    ::sigprocmask(SIG_SETMASK, &before, nullptr);
    std::fprintf(stderr,
                 "dtrain: warning: as PID 1, cannot start itself under an init of its own (%s: "
                 "%s); running as PID 1, which reaps no orphaned process (docker run --init "
                 "does)\n",
                 bin.c_str(), std::strerror(rc));
    return;
  }
  for (;;) {
    siginfo_t info{};
    const int sig = ::sigwaitinfo(&all, &info);
    if (sig < 0) continue;  // (EINTR)
    if (sig == SIGCHLD) {
      int status = 0;
      for (pid_t p; (p = ::waitpid(-1, &status, WNOHANG)) > 0;)
        if (p == child) exit_as(status);
      continue;
    }
    // A terminal's signals (SI_KERNEL) reached the child too: it is in this foreground group.
    if (passed_on(sig) && info.si_code != SI_KERNEL) ::kill(child, sig);
  }
}

}  // namespace dtrain
