// PyTorch's default nn.Linear / nn.Conv2d initialisation (lib/nn/kernels/torch_init.h): the bound
// 1 / sqrt(fan_in) and the uniform distribution on [-bound, bound) for weights and biases.
//
// Distribution checks on n draws with a fixed seed: the extremes within and near the bound, the
// mean within 5 standard errors of 0 (se = bound / sqrt(3 n)), the second moment within 5
// standard errors of bound^2 / 3 (se = bound^2 sqrt(4 / (45 n))), and the Kolmogorov-Smirnov
// distance to U(-bound, bound) below 1.63 / sqrt(n) (the 1% critical value). A wrong bound (the
// fan_out, sqrt(6 / fan_in) of kaiming with ReLU gain, or the bias's own count) fails the extremes
// and moments by far more than these margins.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "nn/kernels/torch_init.h"
#include "util/rng.h"

namespace dtrain {
namespace {

void check_uniform(std::vector<float> v, double bound) {
  const double n = static_cast<double>(v.size());
  double sum = 0.0, sq = 0.0;
  for (float e : v) {
    sum += e;
    sq += static_cast<double>(e) * e;
  }
  std::sort(v.begin(), v.end());
  CHECK(v.front() >= -bound);
  CHECK(v.back() < bound);
  CHECK(v.front() < -0.99 * bound);
  CHECK(v.back() > 0.99 * bound);
  CHECK(std::fabs(sum / n) < 5.0 * bound / std::sqrt(3.0 * n));
  CHECK(std::fabs(sq / n - bound * bound / 3.0) <
        5.0 * bound * bound * std::sqrt(4.0 / (45.0 * n)));
  double ks = 0.0;
  for (size_t i = 0; i < v.size(); ++i) {
    const double cdf = (v[i] + bound) / (2.0 * bound);
    ks = std::max({ks, std::fabs(cdf - static_cast<double>(i) / n),
                   std::fabs(cdf - static_cast<double>(i + 1) / n)});
  }
  CHECK(ks < 1.63 / std::sqrt(n));
}

TEST_CASE("torch init: the bound is 1 / sqrt(fan_in), kaiming_uniform with a = sqrt(5)") {
  CHECK(torch_default_bound(9) == doctest::Approx(1.0 / 3.0).epsilon(1e-12));  // conv 1->32, 3x3
  CHECK(torch_default_bound(288) == doctest::Approx(1.0 / std::sqrt(288.0)).epsilon(1e-12));
  CHECK(torch_default_bound(3136) == doctest::Approx(1.0 / 56.0).epsilon(1e-12));
  CHECK(torch_default_bound(1) == doctest::Approx(1.0).epsilon(1e-12));
}

TEST_CASE("torch init: weights and biases are uniform on the fan_in bound") {
  // cnn-ref's Linear 3136 -> 128: 401,408 weights and 128 biases, bound 1/56.
  std::vector<float> w(3136 * 128), b(128);
  Rng rng(3);
  torch_default_init(w.data(), static_cast<int64_t>(w.size()), b.data(), 128, 3136, rng);
  check_uniform(w, 1.0 / 56.0);
  for (float e : b) CHECK(std::fabs(e) <= 1.0f / 56.0f);
  // A conv layer's bias (fan_in C kh kw = 288), enough draws to test its distribution.
  std::vector<float> conv_bias(200000);
  torch_default_init(nullptr, 0, conv_bias.data(), static_cast<int64_t>(conv_bias.size()), 288,
                     rng);
  check_uniform(conv_bias, 1.0 / std::sqrt(288.0));
}

TEST_CASE("torch init: deterministic per seed, weights drawn before the bias, bias optional") {
  std::vector<float> w1(90), b1(10), w2(90), b2(10), all(100);
  Rng r1(11), r2(11), r3(11);
  torch_default_init(w1.data(), 90, b1.data(), 10, 9, r1);
  torch_default_init(w2.data(), 90, b2.data(), 10, 9, r2);
  CHECK(w1 == w2);
  CHECK(b1 == b2);
  // The same stream as one weight tensor of 100: the bias continues where the weight stopped.
  torch_default_init(all.data(), 100, nullptr, 0, 9, r3);
  CHECK(std::equal(w1.begin(), w1.end(), all.begin()));
  CHECK(std::equal(b1.begin(), b1.end(), all.begin() + 90));
  Rng other(12);
  torch_default_init(w2.data(), 90, b2.data(), 10, 9, other);
  CHECK(w1 != w2);
}

}  // namespace
}  // namespace dtrain
