#include <fcntl.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "dtrain/cli.h"
#include "tensor/blas.h"

#if defined(__SANITIZE_ADDRESS__)
#define DTRAIN_LEAK_CHECK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DTRAIN_LEAK_CHECK 1
#endif
#endif
#ifdef DTRAIN_LEAK_CHECK
#include <sanitizer/lsan_interface.h>
#endif

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
  const int rc = dtrain::cli_main(argc, argv);
  // Everything dtrain owns is closed by now (scoped). The libraries' exit handlers are skipped:
  // OpenBLAS's joins its worker threads, and one stuck retrying a buffer it cannot map (an
  // address-space limit, ulimit -v) never returns, so the process hung after its last word.
  std::cout.flush();
  std::cerr.flush();
  if (auto logger = spdlog::default_logger()) logger->flush();
  std::fflush(nullptr);
#ifdef DTRAIN_LEAK_CHECK
  __lsan_do_leak_check();  // (LeakSanitizer's own check runs at exit, which _Exit skips)
#endif
  std::_Exit(rc);
}
