// Small helpers shared by the layer and loss implementations (not part of the nn API).
#pragma once

#include <cstdint>

#include "tensor/tensor.h"
#include "util/check.h"

namespace dtrain::nn_detail {

// Tensor::resize takes a Shape, a heap-allocated vector; skipping it when the shape is already
// right keeps steady-state steps free of allocations.
inline void resize_2d(Tensor& t, int64_t rows, int64_t cols) {
  if (t.ndim() == 2 && t.dim(0) == rows && t.dim(1) == cols) return;
  t.resize({rows, cols});
}

// Marks "nothing saved" (numel 0) without allocating when already empty.
inline void clear(Tensor& t) {
  if (t.numel() != 0) t.resize({0});
}

// Rows of x viewed as [B, features]; B may be 0 (Tensor::cols() is 0 then, so check numel).
inline int64_t batch_rows(const Tensor& x, int64_t features) {
  DT_CHECK_GE(x.ndim(), 1u);
  const int64_t b = x.rows();
  DT_CHECK_EQ(x.numel(), b * features);
  return b;
}

}  // namespace dtrain::nn_detail
