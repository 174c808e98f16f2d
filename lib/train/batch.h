// Small helpers shared by the training loop and the sharded engine.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "nn/loss.h"
#include "nn/options.h"
#include "tensor/tensor.h"

namespace dtrain {

// Copies rows `idx` of d into x [n, F] and their labels into y.
inline void gather_rows(const Dataset& d, const std::vector<int64_t>& idx, Tensor& x,
                        std::vector<int32_t>& y) {
  const int64_t n = static_cast<int64_t>(idx.size());
  x.resize({n, d.features});
  y.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = idx[static_cast<size_t>(i)];
    std::copy(d.row(r), d.row(r) + d.features, x.data() + i * d.features);
    y[static_cast<size_t>(i)] = d.y[static_cast<size_t>(r)];
  }
}

// Loss sum over out's rows (model.loss: mse on one-hot targets, or cross entropy); when
// grad != null, also the gradient with respect to out, scaled by `scale`.
inline double loss_and_grad(Loss loss, const Tensor& out, const int32_t* labels, Tensor* grad,
                            float scale) {
  if (loss == Loss::kMse) return mse_onehot(out, labels, grad, scale);
  return softmax_cross_entropy(out, labels, grad, scale);
}

}  // namespace dtrain
