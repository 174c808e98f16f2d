#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include "dtrain/cli.h"
#include "tensor/blas.h"
#include "util/quick_exit.h"

int main(int argc, char** argv) {
  // Standard streams closed by whoever started dtrain (`dtrain run ... >&- 2>&-`) are reopened on
  // /dev/null first: the next files opened would take their numbers, and the log written to
  // "stderr" went into metrics.jsonl.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int got = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (got > fd) {
      ::dup2(got, fd);
      ::close(got);
    }
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
