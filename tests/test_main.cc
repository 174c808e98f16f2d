// doctest's main, after the same OpenBLAS kernel choice the dtrain binary makes (tensor/blas.h),
// so library tests compute with the kernels the binary uses.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "tensor/blas.h"

int main(int argc, char** argv) {
  dtrain::reexec_with_better_blas(argv);
  return doctest::Context(argc, argv).run();
}
