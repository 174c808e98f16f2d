// The image layers (nn/image_layers.h) through the Layer interface: shapes and PyTorch's
// parameter names and init, the fit errors, flat inputs, finite-difference gradients of every
// layer, and a small CNN through Model end to end (finite differences of the cross-entropy).
// Method and tolerance as in fd_util.h / gradcheck_test.cc (eps 1e-2, 1e-3 of the scale).
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "fd_util.h"
#include "nn/image_layers.h"
#include "nn/kernels/torch_init.h"
#include "nn/layer.h"
#include "nn/loss.h"
#include "nn/model.h"
#include "util/check.h"
#include "util/rng.h"

namespace dtrain_test {
long allocations();  // heap allocations so far (alloc_counter.cc)
}  // namespace dtrain_test

namespace dtrain {
namespace {

using testing::fill_uniform;
using testing::grad_error;
using testing::numeric_grad;

using testing::kEps;
using testing::kTol;

Shape batched(int64_t batch, const Shape& sample) {
  Shape s = {batch};
  s.insert(s.end(), sample.begin(), sample.end());
  return s;
}

std::vector<float> as_vector(const Tensor& t) {
  return {t.data(), t.data() + t.numel()};
}

// FD check of J = sum(y * r) for one layer, inputs x (as given) and random parameters.
void check_layer(const Layer& layer, Tensor x, uint64_t seed) {
  INFO(layer.kind(), " ", shape_str(layer.in_shape()), " -> ", shape_str(layer.out_shape()));
  Rng rng(seed, 2);
  std::vector<float> p(static_cast<size_t>(layer.param_count()));
  fill_uniform(p, rng, -1.0f, 1.0f);
  const int64_t batch = x.dim(0);
  std::vector<float> r(static_cast<size_t>(batch * layer.out_features()));
  fill_uniform(r, rng, -1.0f, 1.0f);
  Tensor y;
  LayerState st;
  const LayerCtx ctx{true, nullptr};
  std::vector<float> xv = as_vector(x);
  const auto objective = [&]() {
    std::copy(xv.begin(), xv.end(), x.data());
    layer.forward(p.data(), x, y, st, ctx);
    double s = 0.0;
    for (size_t i = 0; i < r.size(); ++i)
      s += static_cast<double>(y[static_cast<int64_t>(i)]) * r[i];
    return s;
  };
  objective();
  CHECK(y.shape() == batched(batch, layer.out_shape()));
  Tensor dy = Tensor::view(r.data(), y.shape()), dx;
  std::vector<float> g(p.size(), 0.0f);
  layer.backward(p.data(), g.data(), x, y, st, dy, &dx, ctx);
  CHECK(dx.shape() == x.shape());
  const std::vector<float> ana_x = as_vector(dx);
  CHECK(grad_error(numeric_grad(xv, kEps, objective), ana_x) < kTol);
  if (!p.empty()) CHECK(grad_error(numeric_grad(p, kEps, objective), g) < kTol);
}

Tensor random_images(int64_t batch, const Shape& sample, uint64_t seed) {
  Tensor x(batched(batch, sample));
  Rng rng(seed, 1);
  for (int64_t i = 0; i < x.numel(); ++i) x[i] = 2.0f * rng.uniform() - 1.0f;
  return x;
}

// Distinct values k / 16 in shuffled order: max-pool windows have no near-ties (gaps > 2 eps).
Tensor distinct_images(int64_t batch, const Shape& sample, uint64_t seed) {
  Tensor x(batched(batch, sample));
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i - n / 2) / 16.0f;
  Rng rng(seed, 3);
  for (int64_t i = n - 1; i > 0; --i) std::swap(x[i], x[static_cast<int64_t>(rng.below(i + 1))]);
  return x;
}

TEST_CASE("image layers: shapes, PyTorch's parameter names and shapes, and init") {
  // cnn-ref up to the flatten: [1, 28, 28] -> [32, 28, 28] -> [32, 14, 14] -> [64, 14, 14] ...
  auto c1 = make_conv2d({1, 28, 28}, {32, 3, 1, 1});
  CHECK(c1->kind() == "conv2d");
  CHECK(c1->out_shape() == Shape{32, 28, 28});
  REQUIRE(c1->params().size() == 2);
  CHECK(c1->params()[0].name == "weight");
  CHECK(c1->params()[0].shape == Shape{32, 1, 3, 3});
  CHECK(c1->params()[1].name == "bias");
  CHECK(c1->params()[1].shape == Shape{32});
  CHECK(c1->flops_per_sample() == doctest::Approx(32.0 * 28 * 28 * 9));
  auto p1 = make_max_pool2d(c1->out_shape(), {2, std::nullopt});
  CHECK(p1->kind() == "max_pool2d");
  CHECK(p1->out_shape() == Shape{32, 14, 14});
  CHECK(p1->param_count() == 0);
  auto c2 = make_conv2d(p1->out_shape(), {64, 3, 1, 1});
  CHECK(c2->params()[0].shape == Shape{64, 32, 3, 3});
  auto p2 = make_avg_pool2d(c2->out_shape(), {2, 2});
  CHECK(p2->kind() == "avg_pool2d");
  CHECK(p2->out_shape() == Shape{64, 7, 7});
  auto f = make_flatten(p2->out_shape());
  CHECK(f->kind() == "flatten");
  CHECK(f->out_shape() == Shape{3136});
  CHECK(make_conv2d({3, 9, 7}, {5, 3, 2, 1})->out_shape() == Shape{5, 5, 4});  // floor
  CHECK(make_max_pool2d({2, 7, 7}, {3, 2})->out_shape() == Shape{2, 3, 3});

  // PyTorch's default init: weight and bias uniform within 1 / sqrt(C k k) = 1 / sqrt(288).
  std::vector<float> p(static_cast<size_t>(c2->param_count()));
  Rng rng(5);
  c2->init(p.data(), rng);
  const double bound = torch_default_bound(288);
  double wmax = 0.0, bmax = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double a = std::fabs(p[i]);
    CHECK(a <= bound);
    (i < 64 * 288 ? wmax : bmax) = std::max(i < 64 * 288 ? wmax : bmax, a);
  }
  CHECK(wmax > 0.99 * bound);
  CHECK(bmax > 0.5 * bound);  // 64 draws: the largest is almost surely above half the bound
}

TEST_CASE("image layers: a layer that does not fit its input gets one clear line") {
  CHECK(conv2d_error({784}, {32, 3, 1, 1}) == "expects a [C, H, W] input, got [784]");
  CHECK(conv2d_error({1, 3, 3}, {4, 5, 1, 0}) ==
        "kernel 5x5 is larger than the padded input 3x3 (input 3x3, padding 0x0)");
  CHECK(conv2d_error({1, 3, 3}, {0, 3, 1, 0}) == "out_channels must be >= 1 (got 0)");
  CHECK(conv2d_error({1, 3, 3}, {4, 3, 1, 1}).empty());
  CHECK(pool2d_error({32, 1, 1}, {2, std::nullopt}) == "kernel 2x2 is larger than the input 1x1");
  CHECK(pool2d_error({10}, {2, std::nullopt}) == "expects a [C, H, W] input, got [10]");
  CHECK(pool2d_error({1, 4, 4}, {2, 0}) == "stride must be >= 1 (got 0x0)");
  CHECK_THROWS_AS(make_conv2d({1, 3, 3}, {4, 5, 1, 0}), InternalError);
  CHECK_THROWS_AS(make_avg_pool2d({1, 3, 3}, {4, std::nullopt}), InternalError);
}

TEST_CASE("image layers: a flat [B, C H W] batch feeds a layer built for [C, H, W]") {
  auto c = make_conv2d({2, 5, 4}, {3, 3, 1, 1});
  std::vector<float> p(static_cast<size_t>(c->param_count()));
  Rng rng(9);
  c->init(p.data(), rng);
  const Tensor images = random_images(3, {2, 5, 4}, 4);
  Tensor flat({3, 40});
  std::copy(images.data(), images.data() + images.numel(), flat.data());
  Tensor y1, y2;
  LayerState s1, s2;
  c->forward(p.data(), images, y1, s1, {});
  c->forward(p.data(), flat, y2, s2, {});
  CHECK(y1.shape() == Shape{3, 3, 5, 4});
  CHECK(y2.shape() == y1.shape());
  CHECK(as_vector(y1) == as_vector(y2));
}

TEST_CASE("image layers: finite-difference gradients through the Layer interface") {
  check_layer(*make_conv2d({2, 5, 6}, {3, 3, 1, 1}), random_images(2, {2, 5, 6}, 1), 11);
  check_layer(*make_conv2d({3, 7, 5}, {2, 3, 2, 1}), random_images(3, {3, 7, 5}, 2), 12);
  check_layer(*make_conv2d({1, 4, 4}, {2, 2, 1, 0}), random_images(1, {1, 4, 4}, 3), 13);
  check_layer(*make_max_pool2d({3, 6, 6}, {2, std::nullopt}), distinct_images(2, {3, 6, 6}, 4), 14);
  check_layer(*make_max_pool2d({2, 7, 5}, {3, 2}), distinct_images(2, {2, 7, 5}, 5), 15);
  check_layer(*make_avg_pool2d({3, 6, 7}, {2, std::nullopt}), random_images(2, {3, 6, 7}, 6), 16);
  check_layer(*make_avg_pool2d({2, 5, 5}, {3, 1}), random_images(1, {2, 5, 5}, 7), 17);
  check_layer(*make_flatten({3, 2, 2}), random_images(2, {3, 2, 2}, 8), 18);
  // The fused conv2d + relu (+ max_pool2d) element; distinct inputs keep ReLU and max kinks
  // away from the finite-difference steps.
  check_layer(*make_conv2d_relu({2, 6, 6}, {3, 3, 1, 1}, Pool2dSpec{2, std::nullopt}),
              distinct_images(2, {2, 6, 6}, 9), 19);
  check_layer(*make_conv2d_relu({1, 5, 5}, {2, 3, 2, 1}, std::nullopt),
              distinct_images(2, {1, 5, 5}, 10), 20);
}

// Average pooling here: perturbing the first conv's weights moves every activation, and max
// pooling's argmax would switch in some window (a kink, not an error: measured 0.11 of the scale).
// Max pooling is checked per layer above with tie-free inputs, and end to end with ReLU against
// PyTorch (torch_cnn_ref_test.cc).
TEST_CASE("image layers: a small CNN through Model (conv-tanh-avgpool-conv-flatten-linear + CE)") {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(make_conv2d({1, 6, 6}, {3, 3, 1, 1}));
  layers.push_back(make_activation(Activation::kTanh, layers.back()->out_shape()));
  layers.push_back(make_avg_pool2d(layers.back()->out_shape(), {2, std::nullopt}));
  layers.push_back(make_conv2d(layers.back()->out_shape(), {4, 2, 1, 0}));
  layers.push_back(make_flatten(layers.back()->out_shape()));
  layers.push_back(make_linear(layers.back()->out_shape(), 3, Init::kKaiming));
  const Model model(std::move(layers));
  CHECK(model.params()[0].name == "layers.0.weight");
  CHECK(model.params()[2].name == "layers.3.weight");
  CHECK(model.params()[2].shape == Shape{4, 3, 2, 2});
  ParamStore store(model.param_count());
  model.init(store.values.data(), 3);
  Tensor x = random_images(2, {1, 6, 6}, 21);
  const std::vector<int32_t> labels = {2, 0};
  const float scale = 0.5f;
  Activations acts;
  const ForwardCtx ctx{false, nullptr};
  const auto objective = [&]() {
    const Tensor& out = model.forward(store.values.data(), x, acts, ctx);
    return softmax_cross_entropy(out, labels.data(), nullptr, scale) * scale;
  };
  const Tensor& out = model.forward(store.values.data(), x, acts, ctx);
  Tensor dlogits, dx;
  softmax_cross_entropy(out, labels.data(), &dlogits, scale);
  model.backward(store.values.data(), store.grads.data(), x, acts, dlogits, &dx);
  std::vector<float> xv = as_vector(x);
  const auto objective_x = [&]() {
    std::copy(xv.begin(), xv.end(), x.data());
    return objective();
  };
  const auto num_x = numeric_grad(xv, kEps, objective_x);
  CHECK(grad_error(num_x, as_vector(dx)) < kTol);
  // Per layer, so a small layer's error cannot hide under a large layer's scale.
  for (size_t i = 0; i < model.num_layers(); ++i) {
    if (model.layer(i).param_count() == 0) continue;
    INFO("layer ", i, " ", model.layer(i).kind());
    std::vector<float> part(store.values.begin() + model.layer_begin(i),
                            store.values.begin() + model.layer_end(i));
    const auto num = numeric_grad(part, kEps, [&]() {
      std::copy(part.begin(), part.end(), store.values.begin() + model.layer_begin(i));
      return objective();
    });
    std::copy(part.begin(), part.end(), store.values.begin() + model.layer_begin(i));
    const std::vector<float> ana(store.grads.begin() + model.layer_begin(i),
                                 store.grads.begin() + model.layer_end(i));
    CHECK(grad_error(num, ana) < kTol);
  }
}

TEST_CASE("image layers: cnn-ref's layers allocate nothing per step once sizes settle") {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(make_conv2d({1, 28, 28}, {32, 3, 1, 1}));
  layers.push_back(make_activation(Activation::kRelu, layers.back()->out_shape()));
  layers.push_back(make_max_pool2d(layers.back()->out_shape(), {2, std::nullopt}));
  layers.push_back(make_conv2d(layers.back()->out_shape(), {64, 3, 1, 1}));
  layers.push_back(make_activation(Activation::kRelu, layers.back()->out_shape()));
  layers.push_back(make_avg_pool2d(layers.back()->out_shape(), {2, std::nullopt}));
  layers.push_back(make_flatten(layers.back()->out_shape()));
  layers.push_back(make_linear(layers.back()->out_shape(), 10, Init::kKaiming));
  const Model model(std::move(layers));
  ParamStore store(model.param_count());
  model.init(store.values.data(), 1);
  const Tensor x = random_images(4, {1, 28, 28}, 2);
  const std::vector<int32_t> labels = {1, 7, 3, 9};
  Activations acts;
  Tensor dlogits;
  for (int step = 0; step < 3; ++step) {
    const long before = dtrain_test::allocations();
    const Tensor& out = model.forward(store.values.data(), x, acts, ForwardCtx{true, nullptr});
    softmax_cross_entropy(out, labels.data(), &dlogits, 0.25f);
    model.backward(store.values.data(), store.grads.data(), x, acts, dlogits, nullptr);
    INFO("step ", step);
    if (step > 0) CHECK(dtrain_test::allocations() - before == 0);
  }
  // The max-pool state: one int32 argmax per output element, 4 x 32 x 14 x 14.
  CHECK(acts.state[2].index.size() == 4u * 32 * 14 * 14);
}

}  // namespace
}  // namespace dtrain
