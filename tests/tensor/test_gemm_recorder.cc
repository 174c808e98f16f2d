// GemmRecorder (tensor/blas.h): records the calling thread's gemm() calls in a scope, nests,
// and sees nothing of other threads (ranks run as threads).
#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include "tensor/blas.h"

using dtrain::gemm;
using dtrain::GemmRecorder;

namespace {

// C[2, 3] = A[2, 4] B[4, 3] (B given transposed when tb).
void small_gemm(std::vector<float>& a, std::vector<float>& b, std::vector<float>& c, bool tb,
                float beta) {
  gemm(false, tb, 2, 3, 4, 0.5f, a.data(), 4, b.data(), tb ? 4 : 3, beta, c.data(), 3);
}

}  // namespace

TEST_CASE("GemmRecorder records this thread's calls in its scope, innermost first") {
  std::vector<float> a(8, 1.0f), b(12, 1.0f), c(6, 0.0f);
  small_gemm(a, b, c, false, 0.0f);  // before any recorder: not recorded anywhere
  GemmRecorder outer;
  small_gemm(a, b, c, false, 0.0f);
  {
    GemmRecorder inner;
    small_gemm(a, b, c, true, 1.0f);
    gemm(false, false, 0, 3, 4, 1.0f, a.data(), 4, b.data(), 3, 0.0f, c.data(), 3);  // no-op
    REQUIRE(inner.calls().size() == 1);
    const dtrain::GemmCall& g = inner.calls()[0];
    CHECK(!g.trans_a);
    CHECK(g.trans_b);
    CHECK(g.m == 2);
    CHECK(g.n == 3);
    CHECK(g.k == 4);
    CHECK(g.alpha == 0.5f);
    CHECK(g.beta == 1.0f);
    CHECK(g.a == reinterpret_cast<uintptr_t>(a.data()));
    CHECK(g.b == reinterpret_cast<uintptr_t>(b.data()));
    CHECK(g.c == reinterpret_cast<uintptr_t>(c.data()));
    CHECK(g.lda == 4);
    CHECK(g.ldb == 4);
    CHECK(g.ldc == 3);
    CHECK(g.flops() == 2.0 * 2 * 3 * 4);
  }
  // The calls ran: C = 0.5 * 4 (the first) and then + 0.5 * 4 again (beta 1).
  CHECK(c[0] == 4.0f);
  small_gemm(a, b, c, false, 0.0f);
  CHECK(outer.calls().size() == 2);  // the inner scope's call went to the inner recorder only

  std::thread other([&] {
    std::vector<float> a2(8, 1.0f), b2(12, 1.0f), c2(6, 0.0f);
    small_gemm(a2, b2, c2, false, 0.0f);
  });
  other.join();
  CHECK(outer.calls().size() == 2);
}
