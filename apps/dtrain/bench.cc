#include "dtrain/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "tensor/blas.h"
#include "util/check.h"
#include "util/rng.h"

namespace dtrain {

int bench_gemm(const std::vector<int64_t>& widths, int64_t batch, int threads, int iters) {
  if (widths.size() < 2) throw UserError("bench gemm: --widths needs at least two sizes");
  if (batch < 1 || iters < 1) throw UserError("bench gemm: --batch and --iters must be >= 1");
  set_blas_threads(threads);
  const size_t L = widths.size() - 1;
  Rng rng(1);
  auto filled = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = rng.normal() * 0.05f;
    return v;
  };
  std::vector<std::vector<float>> W, dW, act, grad;
  for (size_t l = 0; l < L; ++l) {
    W.push_back(filled(widths[l + 1] * widths[l]));
    dW.push_back(filled(widths[l + 1] * widths[l]));
  }
  for (size_t l = 0; l <= L; ++l) {
    act.push_back(filled(batch * widths[l]));
    grad.push_back(filled(batch * widths[l]));
  }
  double flops = 0;
  for (size_t l = 0; l < L; ++l) {
    const double mk = static_cast<double>(widths[l]) * static_cast<double>(widths[l + 1]);
    flops += 2.0 * static_cast<double>(batch) * mk * (l == 0 ? 2 : 3);
  }
  auto step = [&] {
    for (size_t l = 0; l < L; ++l)
      gemm(false, true, batch, widths[l + 1], widths[l], 1.0f, act[l].data(), widths[l],
           W[l].data(), widths[l], 0.0f, act[l + 1].data(), widths[l + 1]);
    for (size_t l = L; l-- > 0;) {
      gemm(true, false, widths[l + 1], widths[l], batch, 1.0f, grad[l + 1].data(), widths[l + 1],
           act[l].data(), widths[l], 1.0f, dW[l].data(), widths[l]);
      if (l > 0)
        gemm(false, false, batch, widths[l], widths[l + 1], 1.0f, grad[l + 1].data(), widths[l + 1],
             W[l].data(), widths[l], 0.0f, grad[l].data(), widths[l]);
    }
  };
  for (int i = 0; i < std::max(3, iters / 10); ++i) step();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  const double med = t[t.size() / 2];
  std::printf(
      "gemm-only step (batch %lld, %d BLAS thread(s)): median %.3f ms, %.1f GFLOP/s, "
      "bound %.0f samples/s\n",
      static_cast<long long>(batch), blas_threads(), med * 1e3, flops / med * 1e-9,
      static_cast<double>(batch) / med);
  std::printf("{\"gemm_step_ms\": %.4f, \"gflops\": %.2f, \"bound_samples_per_s\": %.1f}\n",
              med * 1e3, flops / med * 1e-9, static_cast<double>(batch) / med);
  return 0;
}

}  // namespace dtrain
