#include "tensor/blas.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>

#include <algorithm>
#include <cctype>
#include <limits>
#include <thread>

#include "util/cgroup_limits.h"
#include "util/check.h"
#include "util/strings.h"

namespace dtrain {

namespace {
thread_local GemmRecorder* t_recorder = nullptr;  // this thread's innermost recorder
}  // namespace

GemmRecorder::GemmRecorder() : outer_(t_recorder) {
  t_recorder = this;
}

GemmRecorder::~GemmRecorder() {
  DT_CHECK_MSG(t_recorder == this, "GemmRecorder destroyed out of order or on another thread");
  t_recorder = outer_;
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  DT_CHECK_GE(m, 0);
  DT_CHECK_GE(n, 0);
  DT_CHECK_GE(k, 0);
  if (m == 0 || n == 0) return;
  // (OpenBLAS takes 32-bit sizes here: a larger one would be cut to garbage)
  constexpr int64_t kMax = std::numeric_limits<blasint>::max();
  DT_CHECK_MSG(m <= kMax && n <= kMax && k <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax,
               "gemm sizes " << m << " x " << n << " x " << k << " (lda " << lda << ", ldb " << ldb
                             << ", ldc " << ldc << ") pass the BLAS's 32-bit limit");
  if (t_recorder != nullptr)
    t_recorder->add({trans_a, trans_b, m, n, k, alpha, beta, reinterpret_cast<uintptr_t>(a),
                     reinterpret_cast<uintptr_t>(b), reinterpret_cast<uintptr_t>(c), lda, ldb,
                     ldc});
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

int hardware_cores() {
  return usable_cores();
}

void set_blas_threads(int threads) {
  DT_CHECK_GE(threads, 0);
  openblas_set_num_threads(threads == 0 ? hardware_cores() : threads);
}

int blas_threads() {
  return openblas_get_num_threads();
}

std::string blas_core() {
  const char* c = openblas_get_corename();
  return c != nullptr ? std::string(c) : std::string("unknown");
}

namespace {

// Vector level of a kernel set or CPU: 0 SSE, 1 AVX, 2 AVX2 + FMA, 3 AVX-512.
int core_level(std::string name) {
  name = ascii_lower(name);
  for (const char* n : {"skylakex", "cooperlake", "sapphirerapids"})
    if (name == n) return 3;
  for (const char* n : {"haswell", "zen", "skylake"})
    if (name == n) return 2;
  if (name == "sandybridge") return 1;
  return 0;
}

int cpu_level() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512cd"))
    return 3;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
  if (__builtin_cpu_supports("avx")) return 1;
#endif
  return 0;
}

}  // namespace

std::string better_blas_coretype() {
  const int have = cpu_level();
  if (have <= core_level(blas_core())) return "";
  static const char* const kNames[] = {"", "Sandybridge", "Haswell", "SkylakeX"};
  return kNames[have];
}

}  // namespace dtrain

namespace dtrain {

void reexec_with_better_blas(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // the user's choice stands
  const std::string core = better_blas_coretype();
  if (core.empty() || ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  ::unsetenv("OPENBLAS_CORETYPE");  // exec failed: this process keeps the kernels it loaded
}

}  // namespace dtrain
