#include "tensor/blas.h"

#include <cblas.h>

#include <thread>

#include "util/check.h"

namespace dtrain {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  DT_CHECK_GE(m, 0);
  DT_CHECK_GE(n, 0);
  DT_CHECK_GE(k, 0);
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

int hardware_cores() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

void set_blas_threads(int threads) {
  DT_CHECK_GE(threads, 0);
  openblas_set_num_threads(threads == 0 ? hardware_cores() : threads);
}

int blas_threads() {
  return openblas_get_num_threads();
}

}  // namespace dtrain
