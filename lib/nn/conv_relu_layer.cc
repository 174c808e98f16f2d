// conv2d -> ReLU [-> max_pool2d] as one element (make_conv2d_relu, nn/image_layers.h).
//
// Why: run as three layers, cnn-ref's first block writes its [B, 32, 28, 28] convolution
// output (12.8 MB at batch 128), reads it back for the ReLU, writes the ReLU's output, reads
// that for the pool, and backward makes the same passes the other way: memory-bound passes that
// cost ~16% of a step (perf, 2026-12-02). Here the convolution output of kConv2dChunk samples at
// a time stays in a scratch block, in cache, in the GEMM's own layout [O, n OH OW] (no pass to
// reorder it into NCHW), while the bias is added, it is rectified and pooled; only the element's
// output (the pooled one, or the rectified one without a pool) and the pool's argmax are kept.
//
// Exactness: the same arithmetic in the same order as the three layers -- conv2d_forward and
// conv2d_backward run the same blocks of kConv2dChunk samples through the same GEMMs and add the
// bias to the same block values -- so outputs and gradients are bitwise those of the unfused
// layers (tested). Backward masks with the rule of the ReLU layer, dx = (y > 0 ? dy : 0) on its
// output y: with a pool, gradient reaches only argmax positions, where the ReLU's output is the
// pooled value, so the mask is applied to the pooled gradient before it is routed back (windows
// that share an argmax share its value, so they mask alike).
//
// State: index holds the argmax (pool only); work[0] the block of convolution outputs or their
// gradients, work[1] one plane's masked pooled gradient; scratch conv2d's im2col buffer.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "nn/image_layers.h"
#include "nn/kernels/conv2d.h"
#include "nn/kernels/pool2d.h"
#include "nn/kernels/torch_init.h"
#include "nn/layer_util.h"
#include "util/check.h"

namespace dtrain {
namespace {

using nn_detail::batch_of;
using nn_detail::relu;
using nn_detail::resize_1d;
using nn_detail::resize_batch;

Conv2dGeometry conv_geometry(const Shape& in, const Conv2dSpec& s) {
  return conv2d_geometry(1, in[0], in[1], in[2], s.out_channels, s.kernel, s.stride, s.padding);
}

// One channel plane of one sample: the pool runs plane by plane over the [O, n OH OW] block.
Pool2dGeometry pool_geometry(const Conv2dGeometry& c, const Pool2dSpec& p) {
  return pool2d_geometry(1, 1, c.out_height(), c.out_width(), p.kernel, p.stride);
}

Shape out_shape_of(const Conv2dGeometry& c, const std::optional<Pool2dSpec>& pool) {
  if (!pool) return {c.out_channels, c.out_height(), c.out_width()};
  const Pool2dGeometry p = pool_geometry(c, *pool);
  return {c.out_channels, p.out_height(), p.out_width()};
}

// y[i] = relu(c[i] + b), the conv2d layer's bias then the ReLU layer's rule (y may be c).
void bias_relu(const float* c, float b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = relu(c[i] + b);
}

// d[i] = y[i] > 0 ? dy[i] : 0, the ReLU layer's backward rule on its output y.
void relu_mask(const float* y, const float* dy, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

class Conv2dRelu final : public Layer {
 public:
  Conv2dRelu(const Shape& in_shape, const Conv2dSpec& c, const std::optional<Pool2dSpec>& pool)
      : Layer(in_shape, out_shape_of(conv_geometry(in_shape, c), pool)),
        g_(conv_geometry(in_shape, c)),
        pool_(pool) {
    if (pool_) pg_ = pool_geometry(g_, *pool_);
  }

  std::string kind() const override { return pool_ ? "conv2d+relu+max_pool2d" : "conv2d+relu"; }
  std::vector<ParamSpec> params() const override {
    return {{"weight", {g_.out_channels, g_.channels, g_.kernel_h, g_.kernel_w}},
            {"bias", {g_.out_channels}}};
  }
  // The three layers' figures (nn/conv2d_layer.cc, activations, pool2d_layer.cc) summed.
  double flops_per_sample() const override {
    double f = static_cast<double>(g_.out_sample()) * static_cast<double>(g_.patch() + 1);
    if (pool_) {
      f += static_cast<double>(g_.out_channels * pg_.out_sample() * pg_.kernel_h * pg_.kernel_w);
    }
    return f;
  }
  // The pool's argmax per output value.
  // col_scratch's block and work[0]'s (work[1], one plane, is small): conv2d's two buffers.
  double scratch_values() const override {
    Conv2dGeometry g = g_;
    g.batch = kConv2dChunk;
    return static_cast<double>(conv2d_scratch_floats(g));
  }
  double state_values_per_sample() const override {
    return pool_ ? static_cast<double>(out_features()) : 0.0;
  }

  void init(float* p, Rng& rng) const override {
    torch_default_init(p, g_.weight_count(), p + g_.weight_count(), g_.out_channels, g_.patch(),
                       rng);
  }

  void forward(const float* p, const Tensor& x, Tensor& y, LayerState& st,
               const LayerCtx& ctx) const override;
  void backward(const float* p, float* g, const Tensor& x, const Tensor& y, const LayerState& st,
                const Tensor& dy, Tensor* dx, const LayerCtx& ctx) const override;

 private:
  // The im2col buffer of a block of `chunk` samples, grown in `scratch` on first use.
  float* col_scratch(std::vector<float>& scratch, int64_t chunk) const {
    const auto floats = static_cast<size_t>(conv2d_col_floats(g_, chunk));
    if (scratch.size() < floats) scratch.resize(floats);
    return scratch.data();
  }

  // Samples per block for a batch of `batch`: the kernels' blocking (conv2d_block_samples), so
  // the fused layer stays bitwise equal to them.
  int64_t block_samples(int64_t batch) const {
    Conv2dGeometry g = g_;
    g.batch = batch;
    return conv2d_block_samples(g);
  }

  Conv2dGeometry g_;  // batch 1: the per-sample sizes (the block kernels take n samples)
  std::optional<Pool2dSpec> pool_;
  Pool2dGeometry pg_;  // one plane (batch 1, channels 1); set when pool_ is
};

void Conv2dRelu::forward(const float* p, const Tensor& x, Tensor& y, LayerState& st,
                         const LayerCtx& ctx) const {
  (void)ctx;
  const int64_t batch = batch_of(x, in_features());
  resize_batch(y, batch, out_shape());
  if (batch == 0) return;
  const float* w = p;
  const float* b = p + g_.weight_count();
  const int64_t in = g_.in_sample(), out = out_features(), chunk = block_samples(batch);
  const int64_t o_ch = g_.out_channels, ohw = g_.out_height() * g_.out_width();
  const int64_t plane_out = pool_ ? pg_.out_sample() : ohw;  // per channel
  if (st.work.empty()) st.work.resize(2);
  resize_1d(st.work[0], o_ch * chunk * ohw);
  float* c = st.work[0].data();
  float* col = col_scratch(st.scratch, chunk);
  // resize() within the capacity of earlier calls does not allocate.
  if (pool_) st.index.resize(static_cast<size_t>(batch * out));
  for (int64_t s0 = 0; s0 < batch; s0 += chunk) {
    const int64_t n = std::min(chunk, batch - s0), len = n * ohw;
    conv2d_forward_block(g_, x.data() + s0 * in, n, w, c, col);
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t o = 0; o < o_ch; ++o) {
        float* plane = c + o * len + s * ohw;
        const int64_t at = (s0 + s) * out + o * plane_out;
        if (!pool_) {
          bias_relu(plane, b[o], y.data() + at, ohw);
          continue;
        }
        bias_relu(plane, b[o], plane, ohw);
        max_pool2d_forward(pg_, plane, y.data() + at, st.index.data() + at);
      }
    }
  }
}

void Conv2dRelu::backward(const float* p, float* g, const Tensor& x, const Tensor& y,
                          const LayerState& st, const Tensor& dy, Tensor* dx,
                          const LayerCtx& ctx) const {
  (void)ctx;
  const int64_t batch = batch_of(x, in_features());
  DT_CHECK_EQ(dy.numel(), batch * out_features());
  DT_CHECK_EQ(y.numel(), dy.numel());
  if (dx != nullptr) resize_batch(*dx, batch, in_shape());
  if (batch == 0) return;
  const int64_t in = g_.in_sample(), out = out_features(), chunk = block_samples(batch);
  const int64_t o_ch = g_.out_channels, ohw = g_.out_height() * g_.out_width();
  const int64_t plane_out = pool_ ? pg_.out_sample() : ohw;
  if (pool_) DT_CHECK_EQ(static_cast<int64_t>(st.index.size()), dy.numel());  // this forward's
  if (st.work.size() < 2) st.work.resize(2);
  resize_1d(st.work[0], o_ch * chunk * ohw);
  if (pool_) resize_1d(st.work[1], plane_out);
  float* dc = st.work[0].data();
  float* col = col_scratch(st.scratch, chunk);
  for (int64_t s0 = 0; s0 < batch; s0 += chunk) {
    const int64_t n = std::min(chunk, batch - s0), len = n * ohw;
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t o = 0; o < o_ch; ++o) {
        float* plane = dc + o * len + s * ohw;
        const int64_t at = (s0 + s) * out + o * plane_out;
        if (!pool_) {
          relu_mask(y.data() + at, dy.data() + at, plane, ohw);
          continue;
        }
        float* dp = st.work[1].data();
        relu_mask(y.data() + at, dy.data() + at, dp, plane_out);
        max_pool2d_backward(pg_, dp, st.index.data() + at, plane);
      }
    }
    conv2d_backward_block(g_, x.data() + s0 * in, n, p, dc, g, g + g_.weight_count(),
                          dx != nullptr ? dx->data() + s0 * in : nullptr, col);
  }
}

}  // namespace

std::unique_ptr<Layer> make_conv2d_relu(const Shape& in_shape, const Conv2dSpec& conv,
                                        const std::optional<Pool2dSpec>& max_pool) {
  const std::string e = conv2d_error(in_shape, conv);
  DT_CHECK_MSG(e.empty(), e);
  if (max_pool) {
    const Conv2dGeometry g = conv_geometry(in_shape, conv);
    const std::string pe = pool2d_error({g.out_channels, g.out_height(), g.out_width()}, *max_pool);
    DT_CHECK_MSG(pe.empty(), pe);
  }
  return std::make_unique<Conv2dRelu>(in_shape, conv, max_pool);
}

}  // namespace dtrain
