// `dtrain bench ...`: micro-benchmarks that bound what a training step can cost.
#pragma once

#include <cstdint>
#include <vector>

namespace dtrain {

// Times the GEMMs of one training step of an MLP (forward y = x W^T; backward dW = dy^T x and
// dx = dy W, skipping the first layer's dx, exactly as the Linear layer issues them) with
// `threads` BLAS threads, and prints the median step time, GFLOP/s and the samples/s bound.
int bench_gemm(const std::vector<int64_t>& widths, int64_t batch, int threads, int iters);

}  // namespace dtrain
