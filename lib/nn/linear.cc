// Linear layer: every matrix product is one gemm; the rest are single passes over contiguous rows.
#include <algorithm>
#include <cmath>

#include "nn/kernels/torch_init.h"
#include "nn/layer.h"
#include "nn/layer_util.h"
#include "tensor/blas.h"
#include "util/check.h"

namespace dtrain {
namespace {

using nn_detail::batch_of;
using nn_detail::resize_batch;

Shape with_last(Shape s, int64_t last) {
  DT_CHECK(!s.empty());
  s.back() = last;
  return s;
}

// Works on the last dimension: a sample of shape [..., in] is rows_per_sample rows of `in`.
class Linear final : public Layer {
 public:
  Linear(const Shape& in_shape, int64_t out, Init init, bool bias, double normal_std)
      : Layer(in_shape, with_last(in_shape, out)),
        in_(in_shape.back()),
        out_(out),
        rows_per_sample_(shape_numel(in_shape) / in_shape.back()),
        init_(init),
        bias_(bias),
        std_(normal_std) {
    DT_CHECK_GT(in_, 0);
    DT_CHECK_GT(out, 0);
  }

  std::string kind() const override { return "linear"; }
  std::vector<ParamSpec> params() const override {
    if (!bias_) return {{"weight", {out_, in_}}};
    return {{"weight", {out_, in_}}, {"bias", {out_}}};
  }
  double flops_per_sample() const override {
    return static_cast<double>(rows_per_sample_) * static_cast<double>(in_) * out_;
  }

  void init(float* p, Rng& rng) const override {
    if (init_ == Init::kTorch) {  // nn.Linear's reset_parameters (nn/kernels/torch_init.h)
      torch_default_init(p, in_ * out_, bias_ ? p + in_ * out_ : nullptr, bias_ ? out_ : 0, in_,
                         rng);
      return;
    }
    if (init_ == Init::kNormal) {  // nanoGPT: normal(0, std) weights, zero bias
      const float sd = static_cast<float>(std_);
      for (int64_t i = 0; i < in_ * out_; ++i) p[i] = sd * rng.normal();
      if (bias_) std::fill(p + in_ * out_, p + in_ * out_ + out_, 0.0f);
      return;
    }
    // Uniform bounds: Kaiming with the ReLU gain sqrt(2) gives sqrt(6 / fan_in); Xavier (gain 1)
    // gives sqrt(6 / (fan_in + fan_out)).
    const double bound = init_ == Init::kKaiming ? std::sqrt(6.0 / static_cast<double>(in_))
                                                 : std::sqrt(6.0 / static_cast<double>(in_ + out_));
    const float lo = static_cast<float>(-bound);
    const float width = static_cast<float>(2.0 * bound);
    const int64_t nw = in_ * out_;
    for (int64_t i = 0; i < nw; ++i) p[i] = lo + width * rng.uniform();
    if (bias_) std::fill(p + nw, p + nw + out_, 0.0f);
  }

  void forward(const float* p, const Tensor& x, Tensor& y, LayerState& st,
               const LayerCtx& ctx) const override {
    (void)ctx, (void)st;
    const int64_t samples = batch_of(x, in_ * rows_per_sample_);
    resize_batch(y, samples, out_shape());
    const int64_t batch = samples * rows_per_sample_;  // rows of the gemm
    if (batch == 0) return;
    const float* w = p;
    // Broadcast the bias, then y = 1 * x W^T + 1 * y: the bias costs one write pass, no extra read.
    float* yd = y.data();
    if (bias_) {
      const float* b = p + in_ * out_;
      for (int64_t r = 0; r < batch; ++r) {
        float* row = yd + r * out_;
        for (int64_t j = 0; j < out_; ++j) row[j] = b[j];
      }
    }
    gemm(false, true, batch, out_, in_, 1.0f, x.data(), in_, w, in_, bias_ ? 1.0f : 0.0f, yd, out_);
  }

  void backward(const float* p, float* g, const Tensor& x, const Tensor& y, const LayerState& st,
                const Tensor& dy, Tensor* dx, const LayerCtx& ctx) const override {
    (void)y, (void)st, (void)ctx;
    const int64_t samples = batch_of(x, in_ * rows_per_sample_);
    const int64_t batch = samples * rows_per_sample_;
    DT_CHECK_EQ(dy.numel(), batch * out_);
    if (dx != nullptr) resize_batch(*dx, samples, in_shape());
    if (batch == 0) return;
    const float* dyd = dy.data();
    float* gw = g;
    // dW[out, in] += dy^T x.
    gemm(true, false, out_, in_, batch, 1.0f, dyd, out_, x.data(), in_, 1.0f, gw, in_);
    // db += column sums of dy (row-wise accumulation keeps the inner loop contiguous).
    if (bias_) {
      float* gb = g + in_ * out_;
      for (int64_t r = 0; r < batch; ++r) {
        const float* row = dyd + r * out_;
        for (int64_t j = 0; j < out_; ++j) gb[j] += row[j];
      }
    }
    // dx = dy W, skipped when nobody needs it.
    if (dx != nullptr) {
      gemm(false, false, batch, in_, out_, 1.0f, dyd, out_, p, in_, 0.0f, dx->data(), in_);
    }
  }

 private:
  int64_t in_, out_;
  int64_t rows_per_sample_;
  Init init_;
  bool bias_;
  double std_;  // kNormal's standard deviation
};

}  // namespace

std::unique_ptr<Layer> make_linear(const Shape& in_shape, int64_t out, Init init, bool bias,
                                   double normal_std) {
  return std::make_unique<Linear>(in_shape, out, init, bias, normal_std);
}

}  // namespace dtrain
