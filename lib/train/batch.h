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

// Copies the model inputs of rows `idx` of d into x [n, d.input_features()]: the features, or a
// window's first T tokens.
inline void gather_inputs(const Dataset& d, const std::vector<int64_t>& idx, Tensor& x) {
  const int64_t n = static_cast<int64_t>(idx.size());
  const int64_t f = d.input_features();
  if (x.ndim() != 2 || x.dim(0) != n || x.dim(1) != f) x.resize({n, f});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = idx[static_cast<size_t>(i)];
    float* out = x.data() + i * f;
    if (d.kind == SampleKind::kFeatures) {
      std::copy(d.row(r), d.row(r) + f, out);
    } else {
      const uint8_t* w = d.window(r);
      for (int64_t j = 0; j < f; ++j) out[j] = static_cast<float>(w[j]);
    }
  }
}

// The targets of rows `idx`, n * d.targets_per_row() of them in row order: the labels, or each
// window's last T tokens (the next token of every input position).
inline void gather_targets(const Dataset& d, const std::vector<int64_t>& idx,
                           std::vector<int32_t>& y) {
  const int64_t n = static_cast<int64_t>(idx.size());
  const int64_t t = d.targets_per_row();
  y.resize(static_cast<size_t>(n * t));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = idx[static_cast<size_t>(i)];
    if (d.kind == SampleKind::kFeatures) {
      y[static_cast<size_t>(i)] = d.y[static_cast<size_t>(r)];
      continue;
    }
    const uint8_t* w = d.window(r) + 1;
    for (int64_t j = 0; j < t; ++j) y[static_cast<size_t>(i * t + j)] = w[j];
  }
}

// A micro-batch: model inputs [n, input features] and n * targets-per-row targets.
struct Batch {
  Tensor x;
  std::vector<int32_t> targets;
};

inline void gather_batch(const Dataset& d, const std::vector<int64_t>& idx, Batch& b) {
  gather_inputs(d, idx, b.x);
  gather_targets(d, idx, b.targets);
}

// idx = [start, start + n): evaluation reads consecutive rows.
inline void consecutive_rows(int64_t start, int64_t n, std::vector<int64_t>& idx) {
  idx.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = start + i;
}

// Loss sum over out's rows (model.loss: mse on one-hot targets, or cross entropy); when
// grad != null, also the gradient with respect to out, scaled by `scale`.
inline double loss_and_grad(Loss loss, const Tensor& out, const int32_t* labels, Tensor* grad,
                            float scale) {
  if (loss == Loss::kMse) return mse_onehot(out, labels, grad, scale);
  return softmax_cross_entropy(out, labels, grad, scale);
}

}  // namespace dtrain
