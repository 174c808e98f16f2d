#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "dtrain/cli.h"
#include "tensor/blas.h"

int main(int argc, char** argv) {
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
  std::_Exit(rc);
}
