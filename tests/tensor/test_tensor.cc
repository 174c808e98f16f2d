#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <thread>
#include <vector>

#include "tensor/blas.h"
#include "tensor/tensor.h"
#include "util/check.h"
#include "util/rng.h"

using namespace dtrain;

TEST_CASE("Tensor owning, view, copy and move semantics") {
  Tensor a({2, 3});
  CHECK(a.numel() == 6);
  CHECK(a.rows() == 2);
  CHECK(a.cols() == 3);
  CHECK(a.owns());
  a.at(1, 2) = 5.0f;
  Tensor b = a;  // deep copy
  b.at(1, 2) = 7.0f;
  CHECK(a.at(1, 2) == 5.0f);
  std::vector<float> buf(6, 1.0f);
  Tensor v = Tensor::view(buf.data(), {3, 2});
  CHECK_FALSE(v.owns());
  Tensor v2 = v;  // copies the pointer
  v2[0] = 9.0f;
  CHECK(buf[0] == 9.0f);
  Tensor m = std::move(b);
  CHECK(m.at(1, 2) == 7.0f);
  CHECK(m.data() != nullptr);
  m.resize({1, 2});
  CHECK(m.numel() == 2);
  Tensor e({0, 4});
  CHECK(e.numel() == 0);
  CHECK(shape_str({2, 3}) == "[2, 3]");
}

static void naive(bool ta, bool tb, int m, int n, int k, float alpha, const std::vector<float>& A,
                  const std::vector<float>& B, float beta, std::vector<float>& C) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) {
        const float a = ta ? A[p * m + i] : A[i * k + p];
        const float b = tb ? B[j * k + p] : B[p * n + j];
        s += static_cast<double>(a) * b;
      }
      C[i * n + j] = static_cast<float>(alpha * s + beta * C[i * n + j]);
    }
}

TEST_CASE("gemm matches a naive product for every transpose combination") {
  Rng r(1);
  set_blas_threads(1);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [m, n, k] : std::vector<std::array<int, 3>>{
               {1, 1, 1}, {3, 5, 7}, {17, 9, 33}, {4, 0, 3}, {2, 3, 0}}) {
        std::vector<float> A(m * k), B(k * n), C(m * n), R(m * n);
        for (auto& x : A) x = r.normal();
        for (auto& x : B) x = r.normal();
        for (size_t i = 0; i < C.size(); ++i) C[i] = R[i] = r.normal();
        gemm(ta, tb, m, n, k, 0.5f, A.data(), ta ? m : k, B.data(), tb ? k : n, 2.0f, C.data(), n);
        naive(ta, tb, m, n, k, 0.5f, A, B, 2.0f, R);
        for (size_t i = 0; i < C.size(); ++i) REQUIRE(C[i] == doctest::Approx(R[i]).epsilon(1e-4));
      }
}

TEST_CASE("gemm from several threads at once (in-process ranks) gives the serial results") {
  // In-process ranks call OpenBLAS concurrently with 1 BLAS thread each; every call must compute
  // exactly what it computes alone.
  set_blas_threads(1);
  const int m = 128, n = 256, k = 300;
  Rng r(5);
  std::vector<float> A(m * k), B(k * n);
  for (auto& x : A) x = r.normal();
  for (auto& x : B) x = r.normal();
  std::vector<float> ref(m * n);
  gemm(false, false, m, n, k, 1.0f, A.data(), k, B.data(), n, 0.0f, ref.data(), n);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      std::vector<float> C(m * n);
      for (int it = 0; it < 50; ++it) {
        gemm(false, false, m, n, k, 1.0f, A.data(), k, B.data(), n, 0.0f, C.data(), n);
        if (C != ref) bad++;
      }
    });
  for (auto& t : threads) t.join();
  CHECK(bad.load() == 0);
}

TEST_CASE(
    "sizes past what int64 or the BLAS's 32-bit sizes hold are broken invariants, not garbage") {
  // [2^32, 2^32] wrapped to 0 elements.
  CHECK_THROWS_AS(shape_numel({int64_t{1} << 32, int64_t{1} << 32}), InternalError);
  CHECK(shape_numel({int64_t{1} << 31, 2}) == int64_t{1} << 32);
  // A GEMM dimension past 2^31 - 1 was cast to a negative or small blasint (nothing is read:
  // the check comes first).
  float x = 0;
  CHECK_THROWS_AS(gemm(false, false, int64_t{1} << 31, 1, 1, 1.0f, &x, 1, &x, 1, 0.0f, &x, 1),
                  InternalError);
}
