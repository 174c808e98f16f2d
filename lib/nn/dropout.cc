// Inverted dropout: in training, y = x * m with m in {0, 1 / (1 - p)} drawn per element and kept in
// the state's saved[0], so evaluation needs no rescaling. In eval mode or with p == 0 it is the
// identity, draws nothing, and leaves the state empty (backward then passes dy through).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "nn/layer.h"
#include "nn/layer_util.h"
#include "util/check.h"

namespace dtrain {
namespace {

using nn_detail::batch_of;
using nn_detail::resize_batch;
using nn_detail::saved_slot;

class Dropout final : public Layer {
 public:
  Dropout(const Shape& shape, double p)
      : Layer(shape, shape), features_(shape_numel(shape)), p_(p) {
    DT_CHECK_GT(features_, 0);
    DT_CHECK_MSG(p >= 0.0 && p < 1.0, "dropout probability " << p << " not in [0, 1)");
    // An element is dropped when a uniform 32-bit draw is below threshold_ = p * 2^32.
    threshold_ = static_cast<uint32_t>(p * 4294967296.0);
    scale_ = static_cast<float>(1.0 / (1.0 - p));
  }

  std::string kind() const override { return "dropout"; }

  void forward(const float* p, const Tensor& x, Tensor& y, LayerState& st,
               const LayerCtx& ctx) const override {
    (void)p;
    const int64_t batch = batch_of(x, features_);
    const int64_t n = x.numel();
    resize_batch(y, batch, out_shape());
    if (!ctx.training || p_ == 0.0) {
      if (!st.saved.empty()) nn_detail::clear(st.saved[0]);
      if (n > 0) std::memcpy(y.data(), x.data(), static_cast<size_t>(n) * sizeof(float));
      return;
    }
    DT_CHECK_MSG(ctx.rng != nullptr, "dropout in training mode needs LayerCtx::rng");
    Tensor& saved = saved_slot(st, 0);
    resize_batch(saved, batch, in_shape());
    float* m = saved.data();
    // Draws go to a small buffer first, then the mask is computed in a branch-free loop: drops are
    // random, so a per-element branch would mispredict often. Two 32-bit draws per 64-bit word.
    Rng& rng = *ctx.rng;
    const uint32_t threshold = threshold_;  // locals: stores to m cannot alias them
    const float scale = scale_;
    constexpr int64_t kChunk = 256;  // even: the pair loop may fill draws[len] when len is odd
    uint32_t draws[kChunk];
    for (int64_t begin = 0; begin < n; begin += kChunk) {
      const int64_t len = std::min(kChunk, n - begin);
      for (int64_t k = 0; k < len; k += 2) {
        const uint64_t r = rng.next_u64();
        draws[k] = static_cast<uint32_t>(r);
        draws[k + 1] = static_cast<uint32_t>(r >> 32);
      }
      float* mc = m + begin;
      for (int64_t k = 0; k < len; ++k) mc[k] = draws[k] < threshold ? 0.0f : scale;
    }
    const float* xd = x.data();
    float* yd = y.data();
    for (int64_t j = 0; j < n; ++j) yd[j] = xd[j] * m[j];
  }

  void backward(const float* p, float* g, const Tensor& x, const Tensor& y, const LayerState& st,
                const Tensor& dy, Tensor* dx, const LayerCtx& ctx) const override {
    (void)p, (void)g, (void)y, (void)ctx;
    const int64_t batch = batch_of(x, features_);
    const int64_t n = x.numel();
    DT_CHECK_EQ(dy.numel(), n);
    if (dx == nullptr) return;
    resize_batch(*dx, batch, in_shape());
    if (st.saved.empty() ||
        st.saved[0].numel() == 0) {  // identity forward (eval, p == 0, or B == 0)
      if (n > 0) std::memcpy(dx->data(), dy.data(), static_cast<size_t>(n) * sizeof(float));
      return;
    }
    DT_CHECK_EQ(st.saved[0].numel(), n);
    const float* m = st.saved[0].data();
    const float* dyd = dy.data();
    float* dxd = dx->data();
    for (int64_t j = 0; j < n; ++j) dxd[j] = dyd[j] * m[j];
  }

 private:
  int64_t features_;
  double p_;
  uint32_t threshold_ = 0;
  float scale_ = 1.0f;
};

}  // namespace

std::unique_ptr<Layer> make_dropout(const Shape& shape, double p) {
  return std::make_unique<Dropout>(shape, p);
}

}  // namespace dtrain
