// Thin wrappers over OpenBLAS. All matrices are float32, row-major.
#pragma once

#include <cstdint>

namespace dtrain {

// C[M,N] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T; lda/ldb/ldc are row strides of the
// matrices as stored. M, N or K of 0 is a no-op on C scaled by beta (BLAS semantics).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// OpenBLAS threads for this process. 0 means all cores. Process-wide: OpenBLAS has one pool.
void set_blas_threads(int threads);
int blas_threads();
int hardware_cores();

}  // namespace dtrain
