// Inverted dropout: in training, y = x * m with m in {0, 1 / (1 - p)} drawn per element
// (nn_detail::dropout_mask: keyed on the sample, or sequential) and kept in the state's saved[0],
// so evaluation needs no rescaling. In eval mode or with p == 0 it is the
// identity, draws nothing, and leaves the state empty (backward then passes dy through).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "nn/layer.h"
#include "nn/layer_util.h"
#include "util/check.h"

namespace dtrain {

uint64_t dropout_step_key(uint64_t seed, int64_t step) {
  return mix64(mix64(seed ^ 0xd50f0a7eULL) + static_cast<uint64_t>(step));
}

namespace nn_detail {
namespace {

// n mask entries from rng: an element is dropped when a uniform 32-bit draw is below p * 2^32.
// Draws go to a small buffer first, then the mask is computed in a branch-free loop: drops are
// random, so a per-element branch would mispredict often. Two 32-bit draws per 64-bit word.
void fill_mask(Rng& rng, double p, int64_t n, float* m) {
  const auto threshold = static_cast<uint32_t>(p * 4294967296.0);
  const auto scale = static_cast<float>(1.0 / (1.0 - p));
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
}

}  // namespace

void dropout_mask(const LayerCtx& ctx, int sub, double p, int64_t batch, int64_t per_row,
                  float* m) {
  DT_CHECK_MSG(p >= 0.0 && p < 1.0, "dropout probability " << p << " not in [0, 1)");
  DT_CHECK_MSG(sub >= 0 && sub < 256, "dropout sub-site " << sub);
  if (ctx.rows == nullptr) {
    DT_CHECK_MSG(ctx.rng != nullptr, "dropout in training mode needs LayerCtx::rng or rows");
    fill_mask(*ctx.rng, p, batch * per_row, m);
    return;
  }
  const uint64_t site = static_cast<uint64_t>(ctx.site) << 8 | static_cast<uint64_t>(sub);
  for (int64_t b = 0; b < batch; ++b) {
    Rng rng(mix64(ctx.mask_key ^ mix64(static_cast<uint64_t>(ctx.rows[b]))), site);
    fill_mask(rng, p, per_row, m + b * per_row);
  }
}

}  // namespace nn_detail

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
  }

  std::string kind() const override { return "dropout"; }
  double state_values_per_sample() const override {  // the mask
    return static_cast<double>(features_);
  }

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
    Tensor& saved = saved_slot(st, 0);
    resize_batch(saved, batch, in_shape());
    float* m = saved.data();
    nn_detail::dropout_mask(ctx, 0, p_, batch, features_, m);
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
};

}  // namespace

std::unique_ptr<Layer> make_dropout(const Shape& shape, double p) {
  return std::make_unique<Dropout>(shape, p);
}

}  // namespace dtrain
