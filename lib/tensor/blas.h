// Thin wrappers over OpenBLAS. All matrices are float32, row-major.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {

// C[M,N] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T; lda/ldb/ldc are row strides of the
// matrices as stored. M, N or K of 0 is a no-op on C scaled by beta (BLAS semantics).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// One gemm() call as issued: its arguments, with the operands' addresses as numbers (where they
// were, so a replay can reproduce which calls share memory; never dereferenced).
struct GemmCall {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  uintptr_t a = 0, b = 0, c = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * k; }
};

// Records every gemm() the constructing thread issues while the recorder lives (the calls still
// run). Thread-local, not process-wide: N ranks run as threads, and each records only its own
// calls. Recorders nest (the innermost records); destroy them in reverse order of creation, on
// the thread that made them (a scope object).
class GemmRecorder {
 public:
  GemmRecorder();
  ~GemmRecorder();
  GemmRecorder(const GemmRecorder&) = delete;
  GemmRecorder& operator=(const GemmRecorder&) = delete;
  const std::vector<GemmCall>& calls() const { return calls_; }
  void add(const GemmCall& c) { calls_.push_back(c); }

 private:
  GemmRecorder* outer_;
  std::vector<GemmCall> calls_;
};

// OpenBLAS threads for this process. 0 means all cores. Process-wide: OpenBLAS has one pool.
void set_blas_threads(int threads);
int blas_threads();
// The cores this process may use (util/cgroup_limits.h usable_cores: affinity, CPU quota).
int hardware_cores();

// The OpenBLAS kernel set in use ("SkylakeX", "Haswell", "Prescott", ...: openblas_get_corename).
std::string blas_core();

// OpenBLAS chooses its kernels by CPU model when the library loads. A model newer than the
// library knows -- the Xeons of this project's machines with Debian 12's OpenBLAS 0.3.21 -- falls
// back to "Prescott" (SSE3 only), whose sgemm is 4-6x slower than the AVX-512 one on the same
// CPU. Returns the OPENBLAS_CORETYPE value that this CPU's instruction set supports
// ("SkylakeX" for AVX-512 F/BW/DQ/VL/CD, "Haswell" for AVX2 + FMA, "Sandybridge" for AVX) when it
// is better than the kernels in use, else "". The choice only takes effect in a process that
// loads OpenBLAS with the variable set: apps/dtrain/main.cc re-executes itself once with it,
// unless the user set OPENBLAS_CORETYPE (then theirs is used as it is).
std::string better_blas_coretype();

// For main(): when OPENBLAS_CORETYPE is unset and better_blas_coretype() names better kernels,
// sets it and re-executes this program (/proc/self/exe) with the same arguments, so OpenBLAS
// loads them; returns only when there is nothing to do or the exec failed (the program then
// goes on with the kernels it has). Children inherit the variable, so it happens once per job.
void reexec_with_better_blas(char** argv);

}  // namespace dtrain
