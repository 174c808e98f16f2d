// Losses over rows of scores: the last dimension holds the classes, so [B, C] is B rows and
// [B, T, C] is B * T rows (a language model's positions), with one label per row. Each returns the
// SUM of per-row losses and, when `grad` is not null, writes grad = d(sum * grad_scale)/d(input).
// The caller picks grad_scale = 1 / (samples in the optimizer step, over all ranks and
// micro-batches), so summing gradients across ranks and micro-batches gives exactly the gradient of
// the mean loss, even for uneven batches.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace dtrain {

// Softmax cross-entropy fused with its gradient: softmax(logits) - onehot(label), computed with
// the max subtracted, so it is finite for any finite logits. logits [..., C]; labels in [0, C),
// one per row.
double softmax_cross_entropy(const Tensor& logits, const int32_t* labels, Tensor* grad,
                             float grad_scale);

// Mean squared error against one-hot targets: per row sum_c (pred_c - onehot_c)^2 / C.
double mse_onehot(const Tensor& pred, const int32_t* labels, Tensor* grad, float grad_scale);

// Number of rows whose argmax equals the label.
int64_t count_correct(const Tensor& logits, const int32_t* labels);

// Row-wise softmax into probs (resized to logits' shape).
void softmax_rows(const Tensor& logits, Tensor& probs);

}  // namespace dtrain
