// Finite-difference gradient checks for every layer, both losses and a small whole model.
//
// Method (fd_util.h): a scalar objective J (sum(y * r) with a fixed random r for layers, the loss
// times grad_scale for losses) is evaluated with the float forward and accumulated in double. The
// numeric derivative of each input and parameter element is the central difference
// (J(v + eps) - J(v - eps)) / (v_hi - v_lo), dividing by the perturbation actually stored in
// float. eps = 1e-2: truncation error is ~eps^2 |J'''| / 6 ~ 1e-5 of the gradient scale for these
// smooth O(1) functions, and float rounding in J contributes ~1e-7 |J| / eps ~ 1e-5; ReLU inputs
// are kept farther than eps from the kink. Measured errors are <= 1e-4.
//
// Pass criterion: max_i |numeric_i - analytic_i| <= kTol * max_i |numeric_i| with kTol = 1e-3,
// ten times the worst measured error, yet a wrong gradient violates it clearly: a sign flip of
// the largest element gives 2, a gradient 5% off gives 0.05, a missing term gives 0.1 (LayerNorm's
// xhat * mean(dxhat * xhat)) or 0.17 (GELU's x * tanh'). The "rejects wrong gradients" cases
// below assert exactly that, so the checker itself is shown able to fail.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "fd_util.h"
#include "nn/layer.h"
#include "nn/loss.h"
#include "nn/model.h"
#include "util/rng.h"

namespace dtrain {
namespace {

// The tensor a layer saved first (dropout's mask, layer norm's mean/rstd); empty if none.
const Tensor& mask_of(const LayerState& s) {
  static const Tensor kEmpty;
  return s.saved.empty() ? kEmpty : s.saved[0];
}

using testing::fill_uniform;
using testing::grad_error;
using testing::kEps;
using testing::kTol;
using testing::weighted_sum;

std::vector<double> numeric_grad(float* v, int64_t n, const std::function<double()>& f) {
  return testing::numeric_grad(v, n, kEps, f);
}

// Analytic and numeric gradients of J = sum(y * r) for one layer.
struct LayerGrads {
  std::vector<float> ana_x, ana_p;
  std::vector<double> num_x, num_p;
};

// `dropout_rng`, when set, is copied before every forward so each evaluation uses the same mask.
LayerGrads layer_grads(const Layer& layer, Tensor x, std::vector<float> p, Rng* dropout_rng,
                       uint64_t seed) {
  Rng rng(seed, 99);
  const int64_t batch = x.rows();
  Tensor r({batch, layer.out_features()});
  fill_uniform(r.data(), r.numel(), rng, -1.0f, 1.0f);
  Tensor y;
  LayerState saved;
  auto run = [&]() {
    ForwardCtx ctx;
    Rng copy = dropout_rng != nullptr ? *dropout_rng : Rng(0);
    ctx.training = true;
    ctx.rng = dropout_rng != nullptr ? &copy : nullptr;
    layer.forward(p.data(), x, y, saved, ctx);
    return weighted_sum(y, r);
  };
  LayerGrads out;
  run();
  std::vector<float> g(p.size(), 0.0f);
  Tensor dx;
  layer.backward(p.data(), g.data(), x, y, saved, r, &dx, LayerCtx{});
  out.ana_x.assign(dx.data(), dx.data() + dx.numel());
  out.ana_p = g;
  out.num_x = numeric_grad(x.data(), x.numel(), run);
  out.num_p = numeric_grad(p.data(), static_cast<int64_t>(p.size()), run);
  return out;
}

Tensor random_input(int64_t batch, int64_t features, uint64_t seed, bool avoid_zero = false) {
  Rng rng(seed, 1);
  Tensor x({batch, features});
  fill_uniform(x.data(), x.numel(), rng, -2.0f, 2.0f);
  if (avoid_zero) {  // |x| >= 0.1 > eps: central differences never straddle ReLU's kink
    for (int64_t i = 0; i < x.numel(); ++i) x[i] = x[i] < 0 ? x[i] - 0.1f : x[i] + 0.1f;
  }
  return x;
}

std::vector<float> random_params(const Layer& layer, uint64_t seed) {
  Rng rng(seed, 2);
  std::vector<float> p(static_cast<size_t>(layer.param_count()));
  // Random values rather than init(): zero biases and unit gammas would hide mistakes.
  fill_uniform(p.data(), static_cast<int64_t>(p.size()), rng, -1.0f, 1.0f);
  if (layer.kind() == "layer_norm") {
    const int64_t gammas = layer.params()[0].shape[0];
    for (int64_t j = 0; j < gammas; ++j) p[static_cast<size_t>(j)] += 1.0f;
  }
  return p;
}

void check_layer(const Layer& layer, int64_t batch, bool avoid_zero = false,
                 Rng* dropout_rng = nullptr) {
  const Tensor x = random_input(batch, layer.in_features(), 7 + batch, avoid_zero);
  const LayerGrads gr = layer_grads(layer, x, random_params(layer, 11), dropout_rng, 13);
  INFO(layer.kind(), " B=", batch);
  CHECK(grad_error(gr.num_x, gr.ana_x.data()) < kTol);
  if (layer.param_count() > 0) CHECK(grad_error(gr.num_p, gr.ana_p.data()) < kTol);
}

TEST_CASE("gradcheck: linear, inputs and parameters") {
  for (Init init : {Init::kKaiming, Init::kXavier}) {
    auto l = make_linear({5}, 4, init);
    check_layer(*l, 1);
    check_layer(*l, 3);
  }
}

TEST_CASE("gradcheck: linear and layer norm over the last of several per-sample dimensions") {
  // A [T, C] sample (a language model's positions): T rows per sample share the parameters.
  auto lin = make_linear({3, 5}, 4, Init::kKaiming);
  CHECK(lin->out_shape() == Shape{3, 4});
  CHECK(lin->params()[0].shape == Shape{4, 5});
  CHECK(lin->flops_per_sample() == 3.0 * 5 * 4);
  check_layer(*lin, 1);
  check_layer(*lin, 2);
  auto ln = make_layer_norm({2, 3, 7});
  CHECK(ln->out_shape() == Shape{2, 3, 7});
  CHECK(ln->param_count() == 14);
  check_layer(*ln, 2);
}

TEST_CASE("gradcheck: activations") {
  for (const char* kind : {"relu", "gelu", "tanh", "sigmoid"}) {
    auto l = make_activation(parse_enum<Activation>(kind).value(), {6});
    check_layer(*l, 1, /*avoid_zero=*/true);
    check_layer(*l, 3, /*avoid_zero=*/true);
  }
}

TEST_CASE("gradcheck: dropout with a fixed mask in training mode") {
  auto l = make_dropout({8}, 0.4);
  Rng mask_rng(5);
  check_layer(*l, 3, false, &mask_rng);
  // The mask really drops something here, so the check covers zeros and 1 / (1 - p) entries.
  Tensor x = random_input(3, 8, 1), y;
  LayerState saved;
  Rng copy = mask_rng;
  ForwardCtx ctx{true, &copy};
  l->forward(nullptr, x, y, saved, ctx);
  int zeros = 0;
  for (int64_t i = 0; i < mask_of(saved).numel(); ++i) zeros += mask_of(saved)[i] == 0.0f;
  CHECK(zeros > 0);
  CHECK(zeros < mask_of(saved).numel());
}

TEST_CASE("gradcheck: layer norm, inputs, gamma and beta") {
  auto l = make_layer_norm({7});
  check_layer(*l, 1);
  check_layer(*l, 4);
}

// Loss objective: J = loss * grad_scale, whose gradient the loss writes.
void check_loss(bool cross_entropy, float grad_scale) {
  const int64_t batch = 4, classes = 5;
  Tensor logits = random_input(batch, classes, 21);
  for (int64_t i = 0; i < logits.numel(); ++i) logits[i] *= 2.0f;
  const std::vector<int32_t> labels = {0, 3, 4, 3};
  auto loss = [&](Tensor* grad) {
    return cross_entropy ? softmax_cross_entropy(logits, labels.data(), grad, grad_scale)
                         : mse_onehot(logits, labels.data(), grad, grad_scale);
  };
  Tensor grad;
  loss(&grad);
  const auto num =
      numeric_grad(logits.data(), logits.numel(), [&]() { return loss(nullptr) * grad_scale; });
  INFO((cross_entropy ? "cross_entropy" : "mse"), " grad_scale=", grad_scale);
  CHECK(grad_error(num, grad.data()) < kTol);
}

TEST_CASE("gradcheck: losses, with and without grad_scale") {
  for (bool ce : {true, false}) {
    check_loss(ce, 1.0f);
    check_loss(ce, 0.37f);
  }
}

Model small_model() {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(make_linear({6}, 8, Init::kKaiming));
  layers.push_back(make_layer_norm({8}));
  layers.push_back(make_activation(Activation::kGelu, {8}));
  layers.push_back(make_linear({8}, 7, Init::kXavier));
  layers.push_back(make_activation(Activation::kTanh, {7}));
  layers.push_back(make_linear({7}, 4, Init::kXavier));
  return Model(std::move(layers));
}

TEST_CASE("gradcheck: whole model (Linear-LayerNorm-GELU-Linear-Tanh-Linear + cross-entropy)") {
  const Model model = small_model();
  ParamStore store(model.param_count());
  model.init(store.values.data(), 3);
  // Perturb the init so LayerNorm's gamma and beta and the biases are not trivial.
  Rng rng(4);
  for (float& v : store.values) v += 0.3f * (rng.uniform() - 0.5f);
  const int64_t batch = 3;
  Tensor x = random_input(batch, 6, 31);
  const std::vector<int32_t> labels = {1, 3, 0};
  const float scale = 1.0f / batch;
  Activations acts;
  const ForwardCtx ctx{false, nullptr};
  auto objective = [&]() {
    const Tensor& out = model.forward(store.values.data(), x, acts, ctx);
    return softmax_cross_entropy(out, labels.data(), nullptr, scale) * scale;
  };
  const Tensor& out = model.forward(store.values.data(), x, acts, ctx);
  Tensor dlogits, dx;
  softmax_cross_entropy(out, labels.data(), &dlogits, scale);
  model.backward(store.values.data(), store.grads.data(), x, acts, dlogits, &dx);
  const auto num_p = numeric_grad(store.values.data(), model.param_count(), objective);
  const auto num_x = numeric_grad(x.data(), x.numel(), objective);
  CHECK(grad_error(num_p, store.grads.data()) < kTol);
  CHECK(grad_error(num_x, dx.data()) < kTol);
  // Per layer too, so a small layer's error cannot hide under a large layer's scale.
  for (size_t i = 0; i < model.num_layers(); ++i) {
    if (model.layer(i).param_count() == 0) continue;
    const std::vector<double> part(num_p.begin() + model.layer_begin(i),
                                   num_p.begin() + model.layer_end(i));
    INFO("layer ", i);
    CHECK(grad_error(part, store.grads.data() + model.layer_begin(i)) < kTol);
  }
}

TEST_CASE("gradcheck: rejects wrong gradients") {
  SUBCASE("linear: sign flip of the largest weight gradient, and a 5% error in dx") {
    auto l = make_linear({5}, 4, Init::kKaiming);
    LayerGrads gr = layer_grads(*l, random_input(3, 5, 1), random_params(*l, 2), nullptr, 3);
    REQUIRE(grad_error(gr.num_p, gr.ana_p.data()) < kTol);
    size_t big = 0;
    for (size_t i = 0; i < 20; ++i) {  // weights only
      if (std::fabs(gr.ana_p[i]) > std::fabs(gr.ana_p[big])) big = i;
    }
    gr.ana_p[big] = -gr.ana_p[big];
    CHECK(grad_error(gr.num_p, gr.ana_p.data()) > kTol);
    for (float& v : gr.ana_x) v *= 1.05f;
    CHECK(grad_error(gr.num_x, gr.ana_x.data()) > kTol);
  }
  SUBCASE("layer norm: dx without the xhat * mean(dxhat * xhat) term") {
    auto l = make_layer_norm({7});
    const Tensor x = random_input(2, 7, 4);
    const std::vector<float> p = random_params(*l, 5);
    LayerGrads gr = layer_grads(*l, x, p, nullptr, 6);
    REQUIRE(grad_error(gr.num_x, gr.ana_x.data()) < kTol);
    // Rebuild dx by hand with the term missing: rstd * (dxhat - mean(dxhat)).
    Rng rng(6, 99);  // the r used by layer_grads
    std::vector<float> r(14);
    fill_uniform(r.data(), 14, rng, -1.0f, 1.0f);
    std::vector<float> wrong(14);
    for (int row = 0; row < 2; ++row) {
      double mean = 0, var = 0, mean_dxhat = 0;
      for (int j = 0; j < 7; ++j) mean += x[row * 7 + j] / 7.0;
      for (int j = 0; j < 7; ++j) var += (x[row * 7 + j] - mean) * (x[row * 7 + j] - mean) / 7.0;
      for (int j = 0; j < 7; ++j) mean_dxhat += r[row * 7 + j] * p[j] / 7.0;
      const double rstd = 1.0 / std::sqrt(var + 1e-5);
      for (int j = 0; j < 7; ++j) {
        wrong[row * 7 + j] = static_cast<float>(rstd * (r[row * 7 + j] * p[j] - mean_dxhat));
      }
    }
    CHECK(grad_error(gr.num_x, wrong.data()) > kTol);
  }
  SUBCASE("gelu: derivative without the x * tanh' term") {
    auto l = make_activation(Activation::kGelu, {6});
    const Tensor x = random_input(2, 6, 8, true);
    LayerGrads gr = layer_grads(*l, x, {}, nullptr, 9);
    Rng rng(9, 99);
    std::vector<float> wrong(12);
    fill_uniform(wrong.data(), 12, rng, -1.0f, 1.0f);  // r = dy
    for (int i = 0; i < 12; ++i) {
      const double u = 0.7978845608028654 * (x[i] + 0.044715 * x[i] * x[i] * x[i]);
      wrong[i] = static_cast<float>(wrong[i] * 0.5 * (1.0 + std::tanh(u)));
    }
    CHECK(grad_error(gr.num_x, wrong.data()) > kTol);
  }
  SUBCASE("cross-entropy: gradient missing grad_scale") {
    Tensor logits = random_input(3, 4, 10);
    const std::vector<int32_t> labels = {0, 1, 3};
    Tensor grad;
    softmax_cross_entropy(logits, labels.data(), &grad, 1.0f);  // should have been 0.5
    const auto num = numeric_grad(logits.data(), logits.numel(), [&]() {
      return softmax_cross_entropy(logits, labels.data(), nullptr, 0.5f) * 0.5;
    });
    CHECK(grad_error(num, grad.data()) > kTol);
  }
}

}  // namespace
}  // namespace dtrain
