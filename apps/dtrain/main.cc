#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <string_view>

#include "dtrain/cli.h"
#include "tensor/blas.h"
#include "util/pid1_init.h"
#include "util/quick_exit.h"

namespace {

// Whether standard stream `fd` was closed when dtrain started and a library's initialiser, which
// runs before main, took its number for a descriptor of its own (an eventfd: close-on-exec, an
// anonymous inode), so that reading "standard input" read that.
bool taken_before_main(int fd) {
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags == -1 || (flags & FD_CLOEXEC) == 0) return false;
  char link[64] = {};
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(proc.c_str(), link, sizeof link - 1);
  return n > 0 && std::string_view(link, static_cast<size_t>(n)).starts_with("anon_inode:");
}

}  // namespace

int main(int argc, char** argv) {
  // As a container's PID 1: under a minimal init of its own, which reaps orphans and passes
  // signals on (util/pid1_init.h); what follows runs in its child.
  dtrain::become_init_if_pid1(argv);
  // Standard streams closed by whoever started dtrain (`dtrain run ... >&- 2>&-`) are reopened
  // first: the next files opened would take their numbers (the log written to "stderr" went
  // into metrics.jsonl). Standard input and error on /dev/null (closed input reads as empty);
  // standard output on /dev/full, so that a command whose results go there says they could not
  // be written (cli_main) instead of losing them with exit 0 -- a run's console lines are a log,
  // lost without a word. A number a library took before main is given back the same way and the
  // process started again, where the library takes another (the exec closes its descriptor).
  // (once: the exec'd process does not exec again, whatever it finds)
  static constexpr char kReopened[] = "DTRAIN_STD_STREAMS_REOPENED";
  const bool reopened = std::getenv(kReopened) != nullptr;
  ::unsetenv(kReopened);
  bool again = false;
  for (int fd = 0; fd <= 2; ++fd) {
    const bool closed = ::fcntl(fd, F_GETFD) == -1 && errno == EBADF;
    const bool taken = !closed && taken_before_main(fd);
    if (!closed && !taken) continue;
    const int flags = fd == 0 ? O_RDONLY : O_WRONLY;
    int got = fd == 1 ? ::open("/dev/full", flags) : -1;
    if (got < 0) got = ::open("/dev/null", flags);  // (no /dev/full in a minimal chroot)
    bool replaced = got == fd;
    if (got > fd) {
      replaced = ::dup2(got, fd) == fd;
      ::close(got);
    }
    again = again || (taken && replaced);
  }
  if (again && !reopened) {
    ::setenv(kReopened, "1", 1);
    ::execv("/proc/self/exe", argv);  // (failed: go on; the library lost its descriptor)
    ::unsetenv(kReopened);
  }
  // OpenBLAS fixes its kernels when it loads, before main: start again with the ones this CPU
  // runs best if it fell back to slower ones (tensor/blas.h).
  dtrain::reexec_with_better_blas(argv);
  // Writes fail instead of signals ending the process with no word: past the file-size limit
  // (ulimit -f) with EFBIG, reported as any failed write is, its temp file removed; to a console
  // that went away (`dtrain run ... | tee log` when the ssh session dropped, `| head`) with EPIPE:
  // a run's log lines are lost, not the run before its stop checkpoint, and a command whose
  // results went there says so (cli_main: exit 1). (Caught, not ignored: a program dtrain starts
  // gets the default back at exec.)
  struct sigaction quiet {};
  quiet.sa_handler = [](int) {};
  sigemptyset(&quiet.sa_mask);
  quiet.sa_flags = SA_RESTART;
  ::sigaction(SIGXFSZ, &quiet, nullptr);
  ::sigaction(SIGPIPE, &quiet, nullptr);
  // Ends through _Exit, the libraries' exit handlers skipped (util/quick_exit.h says why);
  // everything dtrain owns is closed by now (scoped).
  dtrain::quick_exit_flushed(dtrain::cli_main(argc, argv));
}
