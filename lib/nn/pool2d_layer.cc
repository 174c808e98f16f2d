// MaxPool2d and AvgPool2d as Layers, over the pooling kernels (nn/kernels/pool2d.h), and Flatten.
#include <cstring>

#include "nn/image_layers.h"
#include "nn/kernels/pool2d.h"
#include "nn/layer_util.h"
#include "util/check.h"

namespace dtrain {
namespace {

using nn_detail::batch_of;
using nn_detail::resize_batch;

Pool2dGeometry geometry(const Shape& in_shape, const Pool2dSpec& s, int64_t batch) {
  return pool2d_geometry(batch, in_shape[0], in_shape[1], in_shape[2], s.kernel, s.stride);
}

class Pool2d final : public Layer {
 public:
  Pool2d(const Shape& in_shape, const Pool2dSpec& s, const Pool2dGeometry& g, bool max)
      : Layer(in_shape, {g.channels, g.out_height(), g.out_width()}), spec_(s), max_(max) {}

  std::string kind() const override { return max_ ? "max_pool2d" : "avg_pool2d"; }
  double flops_per_sample() const override {
    return static_cast<double>(out_features()) * static_cast<double>(spec_.kernel * spec_.kernel);
  }
  // Max pooling's argmax per output value.
  double state_values_per_sample() const override {
    return max_ ? static_cast<double>(out_features()) : 0.0;
  }

  void forward(const float* p, const Tensor& x, Tensor& y, LayerState& st,
               const LayerCtx& ctx) const override {
    (void)p, (void)ctx;
    const int64_t batch = batch_of(x, in_features());
    resize_batch(y, batch, out_shape());
    const Pool2dGeometry g = geometry(in_shape(), spec_, batch);
    if (!max_) {
      avg_pool2d_forward(g, x.data(), y.data());
      return;
    }
    // resize() within the capacity of earlier calls does not allocate.
    st.index.resize(static_cast<size_t>(y.numel()));
    max_pool2d_forward(g, x.data(), y.data(), st.index.data());
  }

  void backward(const float* p, float* g, const Tensor& x, const Tensor& y, const LayerState& st,
                const Tensor& dy, Tensor* dx, const LayerCtx& ctx) const override {
    (void)p, (void)g, (void)y, (void)ctx;
    const int64_t batch = batch_of(x, in_features());
    DT_CHECK_EQ(dy.numel(), batch * out_features());
    if (dx == nullptr) return;
    resize_batch(*dx, batch, in_shape());
    const Pool2dGeometry geo = geometry(in_shape(), spec_, batch);
    if (!max_) {
      avg_pool2d_backward(geo, dy.data(), dx->data());
      return;
    }
    DT_CHECK_EQ(static_cast<int64_t>(st.index.size()), dy.numel());  // from this forward
    max_pool2d_backward(geo, dy.data(), st.index.data(), dx->data());
  }

 private:
  Pool2dSpec spec_;
  bool max_;
};

class Flatten final : public Layer {
 public:
  explicit Flatten(const Shape& in_shape) : Layer(in_shape, {shape_numel(in_shape)}) {}

  std::string kind() const override { return "flatten"; }
  double flops_per_sample() const override { return 0.0; }

  void forward(const float* p, const Tensor& x, Tensor& y, LayerState& st,
               const LayerCtx& ctx) const override {
    (void)p, (void)st, (void)ctx;
    resize_batch(y, batch_of(x, in_features()), out_shape());
    if (x.numel() > 0)
      std::memcpy(y.data(), x.data(), static_cast<size_t>(x.numel()) * sizeof(float));
  }

  void backward(const float* p, float* g, const Tensor& x, const Tensor& y, const LayerState& st,
                const Tensor& dy, Tensor* dx, const LayerCtx& ctx) const override {
    (void)p, (void)g, (void)y, (void)st, (void)ctx;
    const int64_t batch = batch_of(x, in_features());
    DT_CHECK_EQ(dy.numel(), x.numel());
    if (dx == nullptr) return;
    resize_batch(*dx, batch, in_shape());
    if (dy.numel() > 0)
      std::memcpy(dx->data(), dy.data(), static_cast<size_t>(dy.numel()) * sizeof(float));
  }
};

std::unique_ptr<Layer> make_pool(const Shape& in_shape, const Pool2dSpec& spec, bool max) {
  const std::string e = pool2d_error(in_shape, spec);
  DT_CHECK_MSG(e.empty(), e);
  return std::make_unique<Pool2d>(in_shape, spec, geometry(in_shape, spec, 1), max);
}

}  // namespace

std::string pool2d_error(const Shape& in_shape, const Pool2dSpec& spec) {
  if (in_shape.size() != 3) return "expects a [C, H, W] input, got " + shape_str(in_shape);
  return pool2d_geometry_error(geometry(in_shape, spec, 1));
}

std::unique_ptr<Layer> make_max_pool2d(const Shape& in_shape, const Pool2dSpec& spec) {
  return make_pool(in_shape, spec, true);
}

std::unique_ptr<Layer> make_avg_pool2d(const Shape& in_shape, const Pool2dSpec& spec) {
  return make_pool(in_shape, spec, false);
}

std::unique_ptr<Layer> make_flatten(const Shape& in_shape) {
  DT_CHECK(!in_shape.empty());
  return std::make_unique<Flatten>(in_shape);
}

}  // namespace dtrain
