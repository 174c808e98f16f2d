// Small helpers shared by the layer and loss implementations (not part of the nn API).
#pragma once

#include <cstdint>

#include "nn/layer.h"
#include "tensor/tensor.h"
#include "util/check.h"

namespace dtrain::nn_detail {

// Resizes t to [batch, sample...]. Tensor::resize takes a Shape, a heap-allocated vector;
// skipping it when the shape is already right keeps steady-state steps free of allocations.
inline void resize_batch(Tensor& t, int64_t batch, const Shape& sample) {
  bool same = t.ndim() == sample.size() + 1 && t.dim(0) == batch;
  for (size_t i = 0; same && i < sample.size(); ++i) same = t.dim(i + 1) == sample[i];
  if (same) return;
  Shape s;
  s.reserve(sample.size() + 1);
  s.push_back(batch);
  s.insert(s.end(), sample.begin(), sample.end());
  t.resize(std::move(s));
}

inline void resize_2d(Tensor& t, int64_t rows, int64_t cols) {
  if (t.ndim() == 2 && t.dim(0) == rows && t.dim(1) == cols) return;
  t.resize({rows, cols});
}

inline void resize_1d(Tensor& t, int64_t n) {
  if (t.ndim() == 1 && t.dim(0) == n) return;
  t.resize({n});
}

// The ReLU rule: x < 0 ? 0 : x, which keeps NaN visible downstream (as PyTorch does).
inline float relu(float x) {
  return x < 0.0f ? 0.0f : x;
}

// Marks "nothing saved" (numel 0) without allocating when already empty.
inline void clear(Tensor& t) {
  if (t.numel() != 0) t.resize({0});
}

// The batch size B of x, read as [B, per_sample elements]; B may be 0 (then x may be [0] or
// [0, ...]). x.dim(0) is B; the rest of x's shape only has to hold per_sample elements.
inline int64_t batch_of(const Tensor& x, int64_t per_sample) {
  DT_CHECK_GE(x.ndim(), 1u);
  const int64_t b = x.dim(0);
  DT_CHECK_EQ(x.numel(), b * per_sample);
  return b;
}

// Fills m [batch * per_row] with an inverted-dropout mask: 0 with probability p, else
// 1 / (1 - p), p in [0, 1). Training mode only. Keyed (ctx.rows set): row b's mask comes from
// the stream of (ctx.mask_key, ctx.rows[b], ctx.site, sub); a layer with several dropout sites
// gives each its own sub (0..255). Sequential otherwise: batch * per_row draws from *ctx.rng.
void dropout_mask(const LayerCtx& ctx, int sub, double p, int64_t batch, int64_t per_row, float* m);

// x[i] *= m[i] for i < n (applying a mask, forward and backward alike).
inline void mul_into(float* x, const float* m, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= m[i];
}

// State slot k of st.saved, growing the list on first use (later calls do not allocate).
inline Tensor& saved_slot(LayerState& st, size_t k) {
  if (st.saved.size() <= k) st.saved.resize(k + 1);
  return st.saved[k];
}

// out = a + b, elementwise (out may alias a or b): a block's residual adds.
inline void add_into(const Tensor& a, const Tensor& b, Tensor& out) {
  DT_CHECK_EQ(a.numel(), b.numel());
  DT_CHECK_EQ(out.numel(), a.numel());
  const float* pa = a.data();
  const float* pb = b.data();
  float* po = out.data();
  for (int64_t i = 0; i < a.numel(); ++i) po[i] = pa[i] + pb[i];
}

// y[r, :] += b for every row r of y [rows, n] (a bias added after a row-parallel all-reduce).
inline void add_rows(float* y, const float* b, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) y[r * n + j] += b[j];
}

// gb += the column sums of d [rows, n] (that bias's gradient).
inline void sum_rows(const float* d, float* gb, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) gb[j] += d[r * n + j];
}

}  // namespace dtrain::nn_detail
