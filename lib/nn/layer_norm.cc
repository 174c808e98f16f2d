// LayerNorm over the last dimension (a sample [..., F] is rows of F): y = (x - mean) * rstd * gamma
// + beta per row, with the biased variance and eps = 1e-5 (PyTorch's nn.LayerNorm defaults).
// Parameters: weight = gamma [F], bias = beta [F]. saved[0] is [rows, 2]: each row's mean and rstd
// = 1 / sqrt(var + eps).
#include <cmath>
#include <cstdint>

#include "nn/kernels/fast_math.h"
#include "nn/layer.h"
#include "nn/layer_util.h"
#include "util/check.h"

namespace dtrain {
namespace {

using nn_detail::batch_of;
using nn_detail::resize_2d;
using nn_detail::resize_batch;
using nn_detail::saved_slot;

constexpr float kEps = 1e-5f;
constexpr int kLanes = 8;

// sum_{j < n} term(j) with kLanes independent float accumulators: GCC vectorises the lane loop,
// whereas a single float accumulator stays scalar (strict FP ordering). Deterministic.
template <typename Term>
inline float lane_sum(int64_t n, Term term) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += term(j + l);
  }
  float s = 0.0f;
  for (; j < n; ++j) s += term(j);
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// The row loops are compute-bound: they get the SIMD clones (nn/kernels/fast_math.h).
// y and saved ([rows, 2]: mean, rstd) of `rows` rows of f features.
DT_SIMD_CLONES void layer_norm_rows(const float* x, const float* gamma, const float* beta, float* y,
                                    float* saved, int64_t rows, int64_t f) {
  const float inv_f = 1.0f / static_cast<float>(f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * f;
    float* yr = y + r * f;
    // Two passes (mean, then squared deviations): no cancellation for large means.
    const float mean = lane_sum(f, [xr](int64_t j) { return xr[j]; }) * inv_f;
    const float var = lane_sum(f,
                               [xr, mean](int64_t j) {
                                 const float d = xr[j] - mean;
                                 return d * d;
                               }) *
                      inv_f;
    const float rstd = 1.0f / std::sqrt(var + kEps);
    for (int64_t j = 0; j < f; ++j) yr[j] = (xr[j] - mean) * rstd * gamma[j] + beta[j];
    saved[2 * r] = mean;
    saved[2 * r + 1] = rstd;
  }
}

// With xhat = (x - mean) * rstd and dxhat = dy * gamma:
//   dgamma += sum_rows dy * xhat, dbeta += sum_rows dy,
//   dx = rstd * (dxhat - mean_j(dxhat) - xhat * mean_j(dxhat * xhat)) (dx null: not wanted).
DT_SIMD_CLONES void layer_norm_backward_rows(const float* x, const float* dy, const float* saved,
                                             const float* gamma, float* dgamma, float* dbeta,
                                             float* dx, int64_t rows, int64_t f) {
  const float inv_f = 1.0f / static_cast<float>(f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * f;
    const float* dyr = dy + r * f;
    const float mean = saved[2 * r];
    const float rstd = saved[2 * r + 1];
    for (int64_t j = 0; j < f; ++j) {
      dgamma[j] += dyr[j] * (xr[j] - mean) * rstd;
      dbeta[j] += dyr[j];
    }
    if (dx == nullptr) continue;
    const float mean_dxhat =
        lane_sum(f, [dyr, gamma](int64_t j) { return dyr[j] * gamma[j]; }) * inv_f;
    const float mean_dxhat_xhat =
        lane_sum(f, [=](int64_t j) { return dyr[j] * gamma[j] * ((xr[j] - mean) * rstd); }) * inv_f;
    float* dxr = dx + r * f;
    for (int64_t j = 0; j < f; ++j) {
      const float xhat = (xr[j] - mean) * rstd;
      dxr[j] = rstd * (dyr[j] * gamma[j] - mean_dxhat - xhat * mean_dxhat_xhat);
    }
  }
}

class LayerNorm final : public Layer {
 public:
  explicit LayerNorm(const Shape& shape)
      : Layer(shape, shape), f_(shape.back()), rows_per_sample_(shape_numel(shape) / f_) {
    DT_CHECK_GT(f_, 0);
  }

  std::string kind() const override { return "layer_norm"; }
  std::vector<ParamSpec> params() const override { return {{"weight", {f_}}, {"bias", {f_}}}; }
  // About eight flops per element (two reduction passes, normalise, affine).
  double flops_per_sample() const override {
    return 8.0 * static_cast<double>(f_ * rows_per_sample_);
  }

  double state_values_per_sample() const override {  // each row's mean and rstd
    return 2.0 * static_cast<double>(rows_per_sample_);
  }

  void init(float* p, Rng& rng) const override {
    (void)rng;
    for (int64_t j = 0; j < f_; ++j) p[j] = 1.0f;
    for (int64_t j = 0; j < f_; ++j) p[f_ + j] = 0.0f;
  }

  void forward(const float* p, const Tensor& x, Tensor& y, LayerState& st,
               const LayerCtx& ctx) const override {
    (void)ctx;
    const int64_t samples = batch_of(x, f_ * rows_per_sample_);
    const int64_t batch = samples * rows_per_sample_;  // rows normalised
    resize_batch(y, samples, out_shape());
    Tensor& saved = saved_slot(st, 0);
    resize_2d(saved, batch, 2);
    layer_norm_rows(x.data(), p, p + f_, y.data(), saved.data(), batch, f_);
  }

  // Gradients as layer_norm_backward_rows gives them.
  void backward(const float* p, float* g, const Tensor& x, const Tensor& y, const LayerState& st,
                const Tensor& dy, Tensor* dx, const LayerCtx& ctx) const override {
    (void)y, (void)ctx;
    const int64_t samples = batch_of(x, f_ * rows_per_sample_);
    const int64_t batch = samples * rows_per_sample_;
    DT_CHECK_EQ(dy.numel(), batch * f_);
    DT_CHECK_EQ(st.saved.size(), 1u);
    const Tensor& saved = st.saved[0];
    DT_CHECK_EQ(saved.numel(), batch * 2);
    if (dx != nullptr) resize_batch(*dx, samples, in_shape());
    layer_norm_backward_rows(x.data(), dy.data(), saved.data(), p, g, g + f_,
                             dx != nullptr ? dx->data() : nullptr, batch, f_);
  }

 private:
  int64_t f_;
  int64_t rows_per_sample_;
};

}  // namespace

std::unique_ptr<Layer> make_layer_norm(const Shape& shape) {
  return std::make_unique<LayerNorm>(shape);
}

}  // namespace dtrain
