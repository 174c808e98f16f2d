#include "dtrain/cli.h"
#include "tensor/blas.h"

int main(int argc, char** argv) {
  // OpenBLAS fixes its kernels when it loads, before main: start again with the ones this CPU
  // runs best if it fell back to slower ones (tensor/blas.h).
  dtrain::reexec_with_better_blas(argv);
  return dtrain::cli_main(argc, argv);
}
