// Finite-difference helpers for the kernel, layer and model gradient checks (tests/nn/*_test.cc).
//
// Method: a scalar objective J is evaluated with the float kernels and accumulated in double; the
// numeric derivative of element v is the central difference (J(v + eps) - J(v - eps)) /
// (v_hi - v_lo), dividing by the perturbation actually stored in float. The pass criterion is
// max_i |numeric_i - analytic_i| <= tol * max_i |numeric_i|. The usual eps = 1e-2 and tol = 1e-3
// (kEps, kTol) are justified in gradcheck_test.cc; checks that use others say why.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "tensor/tensor.h"
#include "util/rng.h"

namespace dtrain::testing {

inline constexpr float kEps = 1e-2f;
inline constexpr double kTol = 1e-3;

inline void fill_uniform(float* v, int64_t n, Rng& rng, float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * rng.uniform();
}
inline void fill_uniform(std::vector<float>& v, Rng& rng, float lo, float hi) {
  fill_uniform(v.data(), static_cast<int64_t>(v.size()), rng, lo, hi);
}

// n uniform values in [lo, hi) from stream (seed, 3).
inline std::vector<float> uniform(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(seed, 3);
  std::vector<float> v(static_cast<size_t>(n));
  fill_uniform(v, rng, lo, hi);
  return v;
}

// sum_i y[i] r[i] in double: the objective whose gradient with respect to y is r.
inline double weighted_sum(const float* y, const float* r, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(y[i]) * r[i];
  return s;
}
inline double weighted_sum(const std::vector<float>& y, const std::vector<float>& r) {
  REQUIRE(y.size() == r.size());
  return weighted_sum(y.data(), r.data(), static_cast<int64_t>(y.size()));
}
inline double weighted_sum(const Tensor& y, const Tensor& r) {
  REQUIRE(y.numel() == r.numel());
  return weighted_sum(y.data(), r.data(), y.numel());
}

// The central difference of f() with respect to v[i], perturbing v[i] in place and restoring it.
inline double numeric_at(float* v, int64_t i, float eps, const std::function<double()>& f) {
  const float orig = v[i];
  v[i] = orig + eps;
  const float hi = v[i];
  const double fp = f();
  v[i] = orig - eps;
  const float lo = v[i];
  const double fm = f();
  v[i] = orig;
  return (fp - fm) / (static_cast<double>(hi) - lo);
}

// Central differences of f() with respect to every element of v[0, n).
inline std::vector<double> numeric_grad(float* v, int64_t n, float eps,
                                        const std::function<double()>& f) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = numeric_at(v, i, eps, f);
  return out;
}
inline std::vector<double> numeric_grad(std::vector<float>& v, float eps,
                                        const std::function<double()>& f) {
  return numeric_grad(v.data(), static_cast<int64_t>(v.size()), eps, f);
}

// max |numeric - analytic| / max |numeric|: the quantity compared with the tolerance.
inline double grad_error(const std::vector<double>& numeric, const float* analytic) {
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < numeric.size(); ++i) {
    err = std::max(err, std::fabs(numeric[i] - analytic[i]));
    scale = std::max(scale, std::fabs(numeric[i]));
  }
  REQUIRE(scale > 0.0);  // a vanishing gradient would make the check vacuous
  return err / scale;
}
inline double grad_error(const std::vector<double>& numeric, const std::vector<float>& analytic) {
  REQUIRE(numeric.size() == analytic.size());
  return grad_error(numeric, analytic.data());
}

// grad_error of v's numeric gradient (eps = kEps) against `analytic`, perturbing v in place.
inline double fd_error(std::vector<float>& v, const std::vector<float>& analytic,
                       const std::function<double()>& objective) {
  REQUIRE(analytic.size() == v.size());
  return grad_error(numeric_grad(v, kEps, objective), analytic);
}

}  // namespace dtrain::testing
