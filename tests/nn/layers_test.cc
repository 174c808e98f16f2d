// Layer behaviour beyond gradients: values against references, init, dropout modes, B = 0.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "nn/layer.h"
#include "util/check.h"
#include "util/rng.h"

namespace dtrain {
namespace {

// The tensor a layer saved first (dropout's mask, layer norm's mean/rstd); empty if none.
const Tensor& mask_of(const LayerState& s) {
  static const Tensor kEmpty;
  return s.saved.empty() ? kEmpty : s.saved[0];
}

Tensor row_tensor(const std::vector<float>& v) {
  Tensor t({1, static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t[static_cast<int64_t>(i)] = v[i];
  return t;
}

double reference(const std::string& kind, double x) {
  if (kind == "relu") return x > 0 ? x : 0;
  if (kind == "gelu") {
    // 0.5 x (1 + tanh(u)) written as x / (1 + e^(-2u)): the first form loses all precision to
    // cancellation for x < -5, even in double.
    return x / (1 + std::exp(-2 * std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  }
  if (kind == "tanh") return std::tanh(x);
  return 1 / (1 + std::exp(-x));
}

TEST_CASE("layers: activations match double-precision references") {
  std::vector<float> xs = {0.0f,  -0.0f, 1e-30f, -1e-8f, 1e-4f,  0.3f,  -0.7f,  1.0f, 2.5f,
                           -3.0f, 5.77f, -8.0f,  20.0f,  -20.0f, 90.0f, -90.0f, 1e4f, -1e4f};
  for (float v = -12.0f; v <= 12.0f; v += 0.01f) xs.push_back(v);
  const Tensor x = row_tensor(xs);
  for (const char* kind : {"relu", "gelu", "tanh", "sigmoid"}) {
    auto l = make_activation(parse_enum<Activation>(kind).value(), {x.numel()});
    Tensor y;
    LayerState saved;
    l->forward(nullptr, x, y, saved, ForwardCtx{});
    REQUIRE(y.shape() == x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double xi = x[i];
      const double ref = reference(kind, xi);
      // Float evaluation is accurate to a few ulps times the condition number |x f'(x) / f(x)|
      // (GELU's reaches ~30 at x = -5); an absolute 1e-30 covers results that underflow.
      const double h = 1e-6 * std::max(1.0, std::fabs(xi));
      const double slope = (reference(kind, xi + h) - reference(kind, xi - h)) / (2 * h);
      const double cond = ref == 0 ? 1.0 : std::fabs(xi * slope / ref);
      INFO(kind, "(", x[i], ") = ", y[i], ", expected ", ref, ", condition ", cond);
      CHECK(std::fabs(y[i] - ref) <= 2e-6 * std::max(1.0, cond) * std::fabs(ref) + 1e-30);
    }
  }
}

TEST_CASE("layers: activations propagate NaN") {
  const Tensor x = row_tensor({std::numeric_limits<float>::quiet_NaN(), 1.0f});
  for (const char* kind : {"relu", "gelu", "tanh", "sigmoid"}) {
    auto l = make_activation(parse_enum<Activation>(kind).value(), {2});
    Tensor y;
    LayerState saved;
    l->forward(nullptr, x, y, saved, ForwardCtx{});
    INFO(kind);
    CHECK(std::isnan(y[0]));
    CHECK(std::isfinite(y[1]));
  }
  CHECK_THROWS_AS(make_activation(static_cast<Activation>(99), {3}), InternalError);
}

TEST_CASE("layers: linear forward equals the naive product, init bounds") {
  auto l = make_linear({3}, 2, Init::kKaiming);
  CHECK(l->kind() == "linear");
  REQUIRE(l->params().size() == 2);
  CHECK(l->params()[0].name == "weight");
  CHECK(l->params()[0].shape == Shape{2, 3});
  CHECK(l->params()[1].name == "bias");
  CHECK(l->params()[1].shape == Shape{2});
  CHECK(l->param_count() == 8);
  const std::vector<float> p = {1, 2, 3, 4, 5, 6, 0.5f, -1};  // W = [[1,2,3],[4,5,6]], b
  Tensor x({2, 3});
  for (int i = 0; i < 6; ++i) x[i] = static_cast<float>(i + 1) * (i % 2 ? -1.0f : 1.0f);
  Tensor y;
  LayerState saved;
  l->forward(p.data(), x, y, saved, ForwardCtx{});
  REQUIRE(y.shape() == Shape{2, 2});
  // x = [[1,-2,3],[-4,5,-6]]
  CHECK(y.at(0, 0) == doctest::Approx(1 - 4 + 9 + 0.5));
  CHECK(y.at(0, 1) == doctest::Approx(4 - 10 + 18 - 1));
  CHECK(y.at(1, 0) == doctest::Approx(-4 + 10 - 18 + 0.5));
  CHECK(y.at(1, 1) == doctest::Approx(-16 + 25 - 36 - 1));

  for (Init init : {Init::kKaiming, Init::kXavier}) {
    auto big = make_linear({400}, 100, init);
    std::vector<float> w(big->param_count(), 9.0f);
    Rng rng(1);
    big->init(w.data(), rng);
    const double bound = init == Init::kKaiming ? std::sqrt(6.0 / 400) : std::sqrt(6.0 / 500);
    double mx = 0, sum = 0;
    for (int i = 0; i < 40000; ++i) {
      mx = std::max(mx, static_cast<double>(std::fabs(w[i])));
      sum += w[i];
    }
    CHECK(mx <= bound);
    CHECK(mx > 0.99 * bound);
    CHECK(std::fabs(sum / 40000) < 0.02 * bound);  // centred (std of the mean ~0.003 bound)
    for (int j = 40000; j < 40100; ++j) CHECK(w[j] == 0.0f);
  }
}

TEST_CASE("layers: B = 0 through every layer kind") {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(make_linear({4}, 4, Init::kKaiming));
  layers.push_back(make_activation(Activation::kGelu, {4}));
  layers.push_back(make_dropout({4}, 0.5));
  layers.push_back(make_layer_norm({4}));
  for (const auto& l : layers) {
    std::vector<float> p(l->param_count(), 0.5f), g(l->param_count(), 0.0f);
    const Tensor x({0, 4});
    Tensor y, dx;
    LayerState saved;
    Rng rng(1);
    l->forward(p.data(), x, y, saved, ForwardCtx{true, &rng});
    CHECK(y.shape() == Shape{0, 4});
    const Tensor dy({0, 4});
    l->backward(p.data(), g.data(), x, y, saved, dy, &dx, LayerCtx{});
    CHECK(dx.shape() == Shape{0, 4});
    l->backward(p.data(), g.data(), x, y, saved, dy, nullptr, LayerCtx{});
    for (float v : g) CHECK(v == 0.0f);
  }
}

TEST_CASE("layers: linear backward leaves dx alone when null and accumulates into g") {
  auto l = make_linear({3}, 2, Init::kKaiming);
  std::vector<float> p(8);
  Rng rng(2);
  l->init(p.data(), rng);
  Tensor x({2, 3});
  for (int i = 0; i < 6; ++i) x[i] = 0.1f * i;
  Tensor y;
  LayerState saved;
  l->forward(p.data(), x, y, saved, ForwardCtx{});
  Tensor dy({2, 2});
  dy.fill(1.0f);
  std::vector<float> g(8, 1.0f);
  l->backward(p.data(), g.data(), x, y, saved, dy, nullptr, LayerCtx{});
  // dW[o][i] = sum_r x[r][i] = 0.1 * (i + (i + 3)); db[o] = 2; plus the initial 1.
  for (int o = 0; o < 2; ++o) {
    for (int i = 0; i < 3; ++i) CHECK(g[o * 3 + i] == doctest::Approx(1 + 0.1 * (2 * i + 3)));
    CHECK(g[6 + o] == doctest::Approx(3.0));
  }
}

TEST_CASE("layers: dropout modes and mask") {
  const int64_t n = 20000;
  auto l = make_dropout({n}, 0.3);
  CHECK(l->param_count() == 0);
  Tensor x({1, n});
  for (int64_t i = 0; i < n; ++i) x[i] = 1.0f + static_cast<float>(i % 7);
  Tensor y, dx;
  LayerState saved;

  SUBCASE("eval: identity, nothing saved, no rng needed") {
    l->forward(nullptr, x, y, saved, ForwardCtx{false, nullptr});
    CHECK(mask_of(saved).numel() == 0);
    for (int64_t i = 0; i < n; ++i) CHECK(y[i] == x[i]);
    l->backward(nullptr, nullptr, x, y, saved, x, &dx, LayerCtx{});
    for (int64_t i = 0; i < n; ++i) CHECK(dx[i] == x[i]);
  }
  SUBCASE("p = 0 in training: identity without drawing") {
    auto none = make_dropout({n}, 0.0);
    Rng rng(4);
    const auto before = rng.state();
    none->forward(nullptr, x, y, saved, ForwardCtx{true, &rng});
    CHECK(rng.state() == before);
    for (int64_t i = 0; i < n; ++i) CHECK(y[i] == x[i]);
    none->forward(nullptr, x, y, saved, ForwardCtx{true, nullptr});
  }
  SUBCASE("training: mask of 0 and 1 / (1 - p), about p dropped, deterministic per rng") {
    Rng rng(4);
    l->forward(nullptr, x, y, saved, ForwardCtx{true, &rng});
    REQUIRE(mask_of(saved).numel() == n);
    const float keep = static_cast<float>(1.0 / 0.7);
    int64_t dropped = 0;
    for (int64_t i = 0; i < n; ++i) {
      CHECK((mask_of(saved)[i] == 0.0f || mask_of(saved)[i] == keep));
      dropped += mask_of(saved)[i] == 0.0f;
      CHECK(y[i] == x[i] * mask_of(saved)[i]);
    }
    // Binomial(20000, 0.3): std 65, so +-400 is > 6 sigma.
    CHECK(std::abs(dropped - 6000) < 400);
    Tensor dy({1, n});
    dy.fill(2.0f);
    l->backward(nullptr, nullptr, x, y, saved, dy, &dx, LayerCtx{});
    for (int64_t i = 0; i < n; ++i) CHECK(dx[i] == 2.0f * mask_of(saved)[i]);
    // Same rng state, same mask; the next call draws a different one.
    Rng again(4);
    Tensor y2;
    LayerState saved2;
    l->forward(nullptr, x, y2, saved2, ForwardCtx{true, &again});
    CHECK(std::equal(mask_of(saved).data(), mask_of(saved).data() + n, mask_of(saved2).data()));
    l->forward(nullptr, x, y2, saved2, ForwardCtx{true, &again});
    CHECK(!std::equal(mask_of(saved).data(), mask_of(saved).data() + n, mask_of(saved2).data()));
  }
  SUBCASE("training without an rng is an internal error") {
    CHECK_THROWS_AS(l->forward(nullptr, x, y, saved, ForwardCtx{true, nullptr}), InternalError);
  }
}

TEST_CASE("layers: layer norm normalises rows and saves mean and rstd") {
  auto l = make_layer_norm({4});
  CHECK(l->params()[0].name == "weight");
  CHECK(l->params()[1].name == "bias");
  std::vector<float> p(8, 5.0f);
  Rng rng(1);
  l->init(p.data(), rng);
  CHECK(p == std::vector<float>{1, 1, 1, 1, 0, 0, 0, 0});
  // A large common offset: the two-pass variance must not cancel.
  Tensor x({2, 4});
  const float v[8] = {1001, 1002, 1003, 1004, -1, 1, -1, 1};
  for (int i = 0; i < 8; ++i) x[i] = v[i];
  Tensor y;
  LayerState saved;
  l->forward(p.data(), x, y, saved, ForwardCtx{});
  REQUIRE(mask_of(saved).shape() == Shape{2, 2});
  CHECK(mask_of(saved)[0] == doctest::Approx(1002.5));
  CHECK(mask_of(saved)[1] == doctest::Approx(1 / std::sqrt(1.25 + 1e-5)));
  CHECK(mask_of(saved)[2] == doctest::Approx(0.0));
  CHECK(mask_of(saved)[3] == doctest::Approx(1 / std::sqrt(1.0 + 1e-5)));
  CHECK(y[0] == doctest::Approx(-1.5 / std::sqrt(1.25 + 1e-5)));
  CHECK(y[7] == doctest::Approx(1 / std::sqrt(1.0 + 1e-5)));
  // gamma and beta apply per feature.
  p = {2, 2, 2, 2, 1, 1, 1, 1};
  l->forward(p.data(), x, y, saved, ForwardCtx{});
  CHECK(y[7] == doctest::Approx(1 + 2 / std::sqrt(1.0 + 1e-5)));
}

}  // namespace
}  // namespace dtrain
