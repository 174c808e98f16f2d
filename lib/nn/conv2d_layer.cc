// Conv2d as a Layer: conv2d_forward / conv2d_backward (nn/kernels/conv2d.h) on the batch.
//
// Scratch: the im2col buffer (C k k x OH OW floats per sample: 225 KB for cnn-ref's second conv)
// lives in the call's LayerState::scratch, grown once and reused: not saved state (backward
// recomputes the columns), and not a member, because one layer object serves several ranks and
// pipeline micro-batches at once, each with its own state.
#include <vector>

#include "nn/image_layers.h"
#include "nn/kernels/conv2d.h"
#include "nn/kernels/torch_init.h"
#include "nn/layer_util.h"
#include "util/check.h"

namespace dtrain {
namespace {

using nn_detail::batch_of;
using nn_detail::resize_batch;

Conv2dGeometry geometry(const Shape& in_shape, const Conv2dSpec& s, int64_t batch) {
  return conv2d_geometry(batch, in_shape[0], in_shape[1], in_shape[2], s.out_channels, s.kernel,
                         s.stride, s.padding);
}

class Conv2d final : public Layer {
 public:
  Conv2d(const Shape& in_shape, const Conv2dSpec& s, const Conv2dGeometry& g)
      : Layer(in_shape, {g.out_channels, g.out_height(), g.out_width()}), spec_(s), g_(g) {}

  std::string kind() const override { return "conv2d"; }
  std::vector<ParamSpec> params() const override {
    return {{"weight", {g_.out_channels, g_.channels, g_.kernel_h, g_.kernel_w}},
            {"bias", {g_.out_channels}}};
  }
  double flops_per_sample() const override {
    return static_cast<double>(g_.out_sample()) * static_cast<double>(g_.patch());
  }
  double scratch_values() const override {
    Conv2dGeometry g = g_;
    g.batch = kConv2dChunk;  // (a smaller batch grows less)
    return static_cast<double>(conv2d_scratch_floats(g));
  }

  void init(float* p, Rng& rng) const override {
    torch_default_init(p, g_.weight_count(), p + g_.weight_count(), g_.out_channels, g_.patch(),
                       rng);
  }

  void forward(const float* p, const Tensor& x, Tensor& y, LayerState& st,
               const LayerCtx& ctx) const override {
    (void)ctx;
    const int64_t batch = batch_of(x, in_features());
    resize_batch(y, batch, out_shape());
    const Conv2dGeometry g = geometry(in_shape(), spec_, batch);
    conv2d_forward(g, x.data(), p, p + g.weight_count(), y.data(), st.scratch);
  }

  void backward(const float* p, float* g, const Tensor& x, const Tensor& y, const LayerState& st,
                const Tensor& dy, Tensor* dx, const LayerCtx& ctx) const override {
    (void)y, (void)ctx;
    const int64_t batch = batch_of(x, in_features());
    DT_CHECK_EQ(dy.numel(), batch * out_features());
    if (dx != nullptr) resize_batch(*dx, batch, in_shape());
    const Conv2dGeometry geo = geometry(in_shape(), spec_, batch);
    conv2d_backward(geo, x.data(), p, dy.data(), g, g + geo.weight_count(),
                    dx != nullptr ? dx->data() : nullptr, st.scratch);
  }

 private:
  Conv2dSpec spec_;
  Conv2dGeometry g_;  // batch 1: the per-sample sizes
};

}  // namespace

std::string conv2d_error(const Shape& in_shape, const Conv2dSpec& spec) {
  if (in_shape.size() != 3) return "expects a [C, H, W] input, got " + shape_str(in_shape);
  return conv2d_geometry_error(geometry(in_shape, spec, 1));
}

std::unique_ptr<Layer> make_conv2d(const Shape& in_shape, const Conv2dSpec& spec) {
  const std::string e = conv2d_error(in_shape, spec);
  DT_CHECK_MSG(e.empty(), e);
  return std::make_unique<Conv2d>(in_shape, spec, geometry(in_shape, spec, 1));
}

}  // namespace dtrain
