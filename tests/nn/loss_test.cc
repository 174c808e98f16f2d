// Loss values against hand computation, stability, gradients' scale, count_correct, softmax.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "nn/loss.h"
#include "util/check.h"

namespace dtrain {
namespace {

Tensor matrix(int64_t rows, int64_t cols, const std::vector<float>& v) {
  Tensor t({rows, cols});
  for (size_t i = 0; i < v.size(); ++i) t[static_cast<int64_t>(i)] = v[i];
  return t;
}

TEST_CASE("loss: cross-entropy equals the hand-computed value and sums over rows") {
  const Tensor logits = matrix(2, 3, {1, 2, 3, 1, 2, 3});
  const std::vector<int32_t> labels = {2, 0};
  Tensor grad;
  const double loss = softmax_cross_entropy(logits, labels.data(), &grad, 0.5f);
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));  // 3.40760596...
  CHECK(loss == doctest::Approx((lse - 3) + (lse - 1)).epsilon(1e-7));
  CHECK(loss == doctest::Approx(0.40760596444438 + 2.40760596444438).epsilon(1e-7));
  // grad = (softmax - onehot) * grad_scale; the returned loss is not scaled.
  const double p[3] = {std::exp(1 - lse), std::exp(2 - lse), std::exp(3 - lse)};
  for (int j = 0; j < 3; ++j) {
    CHECK(grad[j] == doctest::Approx(0.5 * (p[j] - (j == 2))).epsilon(1e-6));
    CHECK(grad[3 + j] == doctest::Approx(0.5 * (p[j] - (j == 0))).epsilon(1e-6));
  }
  CHECK(softmax_cross_entropy(logits, labels.data(), nullptr, 0.5f) == loss);
}

TEST_CASE("loss: cross-entropy is stable for huge logits") {
  const Tensor logits =
      matrix(4, 3, {1e4f, 0, -1e4f, 1e4f, 0, -1e4f, 1e4f, 0, -1e4f, -1e4f, -1e4f, -1e4f});
  const std::vector<int32_t> labels = {0, 1, 2, 1};
  Tensor grad;
  const double loss = softmax_cross_entropy(logits, labels.data(), &grad, 1.0f);
  CHECK(std::isfinite(loss));
  CHECK(loss == doctest::Approx(0 + 1e4 + 2e4 + std::log(3.0)).epsilon(1e-12));
  for (int64_t i = 0; i < grad.numel(); ++i) CHECK(std::isfinite(grad[i]));
  CHECK(grad[0] == 0.0f);  // softmax 1 minus onehot 1
  CHECK(grad[4] == -1.0f);
  CHECK(grad[9] == doctest::Approx(1.0 / 3));
  CHECK(grad[10] == doctest::Approx(1.0 / 3 - 1));
}

TEST_CASE("loss: mse_onehot value and gradient") {
  const Tensor pred = matrix(2, 3, {0.5f, 0.2f, 0.1f, 0, 0, 0});
  const std::vector<int32_t> labels = {0, 2};
  Tensor grad;
  const double loss = mse_onehot(pred, labels.data(), &grad, 2.0f);
  // Row 0: (0.25 + 0.04 + 0.01) / 3 = 0.1; row 1: 1 / 3.
  CHECK(loss == doctest::Approx(0.1 + 1.0 / 3).epsilon(1e-7));
  // 2 (pred - onehot) / C * grad_scale.
  CHECK(grad[0] == doctest::Approx(2 * -0.5 / 3 * 2));
  CHECK(grad[1] == doctest::Approx(2 * 0.2 / 3 * 2));
  CHECK(grad[5] == doctest::Approx(2 * -1.0 / 3 * 2));
}

TEST_CASE("loss: count_correct uses the first maximum") {
  const Tensor logits = matrix(4, 3, {0, 5, 1, 2, 2, 1, -1, -2, -3, 0, 0, 9});
  CHECK(count_correct(logits, std::vector<int32_t>{1, 0, 0, 2}.data()) == 4);
  CHECK(count_correct(logits, std::vector<int32_t>{1, 1, 1, 2}.data()) == 2);  // tie -> index 0
  CHECK(count_correct(logits, std::vector<int32_t>{0, 2, 2, 0}.data()) == 0);
  CHECK(count_correct(Tensor({0, 3}), nullptr) == 0);
}

TEST_CASE("loss: softmax_rows") {
  const Tensor logits = matrix(2, 3, {1, 2, 3, 1e4f, -1e4f, 1e4f});
  Tensor probs;
  softmax_rows(logits, probs);
  REQUIRE(probs.shape() == logits.shape());
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  for (int j = 0; j < 3; ++j) CHECK(probs[j] == doctest::Approx(std::exp(j + 1 - lse)));
  CHECK(probs[3] == 0.5f);
  CHECK(probs[4] == 0.0f);
  CHECK(probs[5] == 0.5f);
}

TEST_CASE("loss: empty batch and out-of-range labels") {
  Tensor grad;
  CHECK(softmax_cross_entropy(Tensor({0, 4}), nullptr, &grad, 1.0f) == 0.0);
  CHECK(grad.shape() == Shape{0, 4});
  CHECK(mse_onehot(Tensor({0, 4}), nullptr, &grad, 1.0f) == 0.0);
  const Tensor logits = matrix(1, 3, {1, 2, 3});
  for (int32_t bad : {-1, 3}) {
    CHECK_THROWS_AS(softmax_cross_entropy(logits, &bad, &grad, 1.0f), InternalError);
    CHECK_THROWS_AS(mse_onehot(logits, &bad, nullptr, 1.0f), InternalError);
    CHECK_THROWS_AS(count_correct(logits, &bad), InternalError);
  }
}

}  // namespace
}  // namespace dtrain
