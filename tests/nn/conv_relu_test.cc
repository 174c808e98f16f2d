// The fused conv2d -> ReLU [-> max_pool2d] element (make_conv2d_relu, lib/nn/conv_relu_layer.cc)
// against the three separate layers it replaces, bit for bit: output, weight and bias gradients
// and the input gradient, over strides, paddings, overlapping and non-overlapping pools, no pool,
// inputs with many ReLU zeros (ties in the pool windows), a NaN, and batches 0 to 9 (full and
// partial blocks of kConv2dChunk samples); then the
// sequential builder: which list entries it fuses, and that names, init and dropout sites are
// those of the unfused list.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "layer_spec_util.h"
#include "nn/image_layers.h"
#include "nn/layer.h"
#include "nn/model.h"
#include "nn/options.h"
#include "nn/registry.h"
#include "util/rng.h"

namespace dtrain {
namespace {

std::vector<uint32_t> bits(const float* p, int64_t n) {
  std::vector<uint32_t> b(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) b[static_cast<size_t>(i)] = std::bit_cast<uint32_t>(p[i]);
  return b;
}

// Uniform in [-1, 1) with a fraction of exact zeros; a NaN at `nan_at` if >= 0.
void fill(std::vector<float>& v, uint64_t seed, int64_t nan_at = -1) {
  Rng rng(seed, 5);
  for (float& x : v) {
    x = 2.0f * rng.uniform() - 1.0f;
    if (rng.uniform() < 0.1f) x = 0.0f;
  }
  if (nan_at >= 0) v[static_cast<size_t>(nan_at)] = std::numeric_limits<float>::quiet_NaN();
}

struct Result {
  std::vector<uint32_t> y, g, dx;
};

// Forward, then backward of dy, through `layers` in sequence (one Layer each), from params p.
Result run(const std::vector<const Layer*>& layers, const std::vector<float>& p,
           const std::vector<float>& x0, int64_t batch, const std::vector<float>& dy0) {
  Shape xs = {batch};
  for (int64_t d : layers.front()->in_shape()) xs.push_back(d);
  Tensor x(xs);
  std::copy(x0.begin(), x0.end(), x.data());
  std::vector<Tensor> out(layers.size()), grad(layers.size());
  std::vector<LayerState> st(layers.size());
  const LayerCtx ctx{true, nullptr};
  const Tensor* in = &x;
  for (size_t i = 0; i < layers.size(); ++i) {
    layers[i]->forward(p.data(), *in, out[i], st[i], ctx);
    in = &out[i];
  }
  Tensor dy(out.back().shape());
  std::copy(dy0.begin(), dy0.end(), dy.data());
  std::vector<float> g(p.size(), 0.5f);  // accumulated into: start from non-zero
  Tensor dx;
  const Tensor* gout = &dy;
  for (size_t i = layers.size(); i-- > 0;) {
    const Tensor& lin = i == 0 ? x : out[i - 1];
    Tensor* gin = i == 0 ? &dx : &grad[i];
    // Only the conv (layer 0) has parameters; the others get p and g unused.
    layers[i]->backward(p.data(), g.data(), lin, out[i], st[i], *gout, gin, ctx);
    gout = gin;
  }
  return {bits(out.back().data(), out.back().numel()),
          bits(g.data(), static_cast<int64_t>(g.size())), bits(dx.data(), dx.numel())};
}

void check_fused(const Shape& in, const Conv2dSpec& c, const std::optional<Pool2dSpec>& pool,
                 int64_t batch, int64_t nan_at, uint64_t seed) {
  INFO("in ", shape_str(in), " conv ", c.out_channels, " k", c.kernel, " s", c.stride, " p",
       c.padding, pool ? " pool k" + std::to_string(pool->kernel) : " no pool", " batch ", batch,
       " nan ", nan_at);
  auto conv = make_conv2d(in, c);
  auto act = make_activation(Activation::kRelu, conv->out_shape());
  std::unique_ptr<Layer> mp;
  std::vector<const Layer*> plain = {conv.get(), act.get()};
  if (pool) {
    mp = make_max_pool2d(act->out_shape(), *pool);
    plain.push_back(mp.get());
  }
  auto fused = make_conv2d_relu(in, c, pool);
  CHECK(fused->out_shape() == plain.back()->out_shape());
  CHECK(fused->param_count() == conv->param_count());
  CHECK(fused->flops_per_sample() ==
        doctest::Approx(conv->flops_per_sample() + act->flops_per_sample() +
                        (mp ? mp->flops_per_sample() : 0.0)));
  std::vector<float> p(static_cast<size_t>(conv->param_count()));
  Rng rng(seed, 1);
  conv->init(p.data(), rng);
  std::vector<float> x(static_cast<size_t>(batch * conv->in_features()));
  fill(x, seed + 1, nan_at < static_cast<int64_t>(x.size()) ? nan_at : -1);
  std::vector<float> dy(static_cast<size_t>(batch * fused->out_features()));
  fill(dy, seed + 2);
  const Result a = run(plain, p, x, batch, dy);
  const Result b = run({fused.get()}, p, x, batch, dy);
  CHECK(a.y == b.y);
  CHECK(a.g == b.g);
  CHECK(a.dx == b.dx);
}

TEST_CASE("conv2d+relu(+max_pool2d): bitwise the separate layers") {
  uint64_t seed = 10;
  // 9: two full blocks of kConv2dChunk (4) samples and a block of one.
  for (int64_t batch : {0, 1, 3, 9}) {
    check_fused({1, 28, 28}, {8, 3, 1, 1}, Pool2dSpec{2, std::nullopt}, batch, -1, ++seed);
    check_fused({3, 9, 7}, {4, 3, 2, 1}, Pool2dSpec{2, std::nullopt}, batch, -1, ++seed);
    check_fused({2, 10, 10}, {5, 3, 1, 0}, Pool2dSpec{3, 2}, batch, -1, ++seed);  // overlapping
    check_fused({2, 11, 9}, {3, 2, 1, 2}, Pool2dSpec{3, std::nullopt}, batch, -1, ++seed);
    check_fused({2, 6, 6}, {4, 3, 1, 1}, std::nullopt, batch, -1, ++seed);
    check_fused({1, 5, 8}, {2, 5, 1, 0}, std::nullopt, batch, -1, ++seed);
  }
  // A NaN pixel: NaN outputs propagate through ReLU and the pool, gradients masked to 0 alike.
  check_fused({1, 8, 8}, {3, 3, 1, 1}, Pool2dSpec{2, std::nullopt}, 2, 27, ++seed);
  check_fused({1, 8, 8}, {3, 3, 1, 1}, std::nullopt, 2, 70, ++seed);
}

TEST_CASE("conv2d+relu(+max_pool2d): all-negative windows get no gradient") {
  // Bias -1 and zero weights: every conv output is -1, every ReLU output 0, every pool window a
  // tie of zeros; the separate layers route nothing through ReLU, and neither may the fusion.
  auto fused = make_conv2d_relu({1, 4, 4}, {2, 3, 1, 1}, Pool2dSpec{2, std::nullopt});
  std::vector<float> p(static_cast<size_t>(fused->param_count()), 0.0f);
  p[p.size() - 1] = p[p.size() - 2] = -1.0f;
  Tensor x({1, 1, 4, 4}), y, dx;
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = 1.0f;
  LayerState st;
  const LayerCtx ctx{true, nullptr};
  fused->forward(p.data(), x, y, st, ctx);
  for (int64_t i = 0; i < y.numel(); ++i) CHECK(y.data()[i] == 0.0f);
  Tensor dy(y.shape());
  for (int64_t i = 0; i < dy.numel(); ++i) dy.data()[i] = 1.0f;
  std::vector<float> g(p.size(), 0.0f);
  fused->backward(p.data(), g.data(), x, y, st, dy, &dx, ctx);
  for (float v : g) CHECK(v == 0.0f);
  for (int64_t i = 0; i < dx.numel(); ++i) CHECK(dx.data()[i] == 0.0f);
}

TEST_CASE("sequential builder: fuses conv2d, relu[, max_pool2d], names, init, sites unchanged") {
  // cnn-ref's list, plus a conv2d + relu without a pool and a dropout after it.
  using K = LayerKind;
  using testing::L;
  const std::vector<LayerSpec> specs = {L(K::kConv2d, 8, 3, 1, 1),
                                        L(K::kRelu),
                                        L(K::kMaxPool2d, 0, 2),
                                        L(K::kConv2d, 6, 3, 1, 1),
                                        L(K::kRelu),
                                        L(K::kDropout),
                                        L(K::kConv2d, 4, 3, 1, 1),
                                        L(K::kAvgPool2d, 0, 2),
                                        L(K::kFlatten),
                                        L(K::kLinear, 10)};
  const Model m = build_sequential(specs, ModelInput{{1, 12, 12}, 10});
  REQUIRE(m.num_layers() == 7);
  CHECK(m.layer(0).kind() == "conv2d+relu+max_pool2d");
  CHECK(m.layer_prefix(0) == "layers.0");
  CHECK(m.layer(1).kind() == "conv2d+relu");
  CHECK(m.layer_prefix(1) == "layers.3");
  CHECK(m.layer(2).kind() == "dropout");
  CHECK(m.layer_prefix(2) == "layers.5");
  CHECK(m.layer(3).kind() == "conv2d");  // no relu after it: not fused
  CHECK(m.layer_prefix(6) == "layers.9");
  // The unfused model: one element per list entry, as Model(layers) names them.
  std::vector<std::unique_ptr<Layer>> layers;
  Shape s = {1, 12, 12};
  const auto add = [&](std::unique_ptr<Layer> l) {
    s = l->out_shape();
    layers.push_back(std::move(l));
  };
  add(make_conv2d(s, {8, 3, 1, 1}));
  add(make_activation(Activation::kRelu, s));
  add(make_max_pool2d(s, {2, std::nullopt}));
  add(make_conv2d(s, {6, 3, 1, 1}));
  add(make_activation(Activation::kRelu, s));
  add(make_dropout(s, 0.5));
  add(make_conv2d(s, {4, 3, 1, 1}));
  add(make_avg_pool2d(s, {2, std::nullopt}));
  add(make_flatten(s));
  add(make_linear(s, 10, Init::kTorch));
  const Model plain(std::move(layers));
  REQUIRE(m.params().size() == plain.params().size());
  for (size_t i = 0; i < m.params().size(); ++i) {
    CHECK(m.params()[i].name == plain.params()[i].name);
    CHECK(m.params()[i].shape == plain.params()[i].shape);
  }
  std::vector<float> a(static_cast<size_t>(m.param_count())), b(a.size());
  m.init(a.data(), 7);
  plain.init(b.data(), 7);
  CHECK(bits(a.data(), m.param_count()) == bits(b.data(), plain.param_count()));
  // Training forward with keyed dropout: the same masks, so the same logits, bit for bit.
  Tensor x({2, 1, 12, 12});
  std::vector<float> xv(static_cast<size_t>(x.numel()));
  fill(xv, 99);
  std::copy(xv.begin(), xv.end(), x.data());
  const int64_t rows[2] = {4, 17};
  LayerCtx ctx;
  ctx.rows = rows;
  ctx.mask_key = dropout_step_key(3, 1);
  Activations fa, pa;
  const Tensor& fy = m.forward(a.data(), x, fa, ctx);
  const Tensor& py = plain.forward(b.data(), x, pa, ctx);
  CHECK(bits(fy.data(), fy.numel()) == bits(py.data(), py.numel()));
}

}  // namespace
}  // namespace dtrain
