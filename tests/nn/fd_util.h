// Finite-difference helpers for the kernel and layer gradient checks (tests/nn/*_test.cc).
//
// Method (as in gradcheck_test.cc): a scalar objective J is evaluated with the float kernels and
// accumulated in double; the numeric derivative of element v is the central difference
// (J(v + eps) - J(v - eps)) / (v_hi - v_lo), dividing by the perturbation actually stored in
// float. The pass criterion is max_i |numeric_i - analytic_i| <= tol * max_i |numeric_i|.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "util/rng.h"

namespace dtrain::testing {

inline void fill_uniform(std::vector<float>& v, Rng& rng, float lo, float hi) {
  for (float& e : v) e = lo + (hi - lo) * rng.uniform();
}

// sum_i y[i] r[i] in double: the objective whose gradient with respect to y is r.
inline double weighted_sum(const std::vector<float>& y, const std::vector<float>& r) {
  REQUIRE(y.size() == r.size());
  double s = 0.0;
  for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * r[i];
  return s;
}

// Central differences of f() with respect to every element of v, perturbing v in place.
inline std::vector<double> numeric_grad(std::vector<float>& v, float eps,
                                        const std::function<double()>& f) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const float orig = v[i];
    v[i] = orig + eps;
    const float hi = v[i];
    const double fp = f();
    v[i] = orig - eps;
    const float lo = v[i];
    const double fm = f();
    v[i] = orig;
    out[i] = (fp - fm) / (static_cast<double>(hi) - lo);
  }
  return out;
}

// max |numeric - analytic| / max |numeric|: the quantity compared with the tolerance.
inline double grad_error(const std::vector<double>& numeric, const std::vector<float>& analytic) {
  REQUIRE(numeric.size() == analytic.size());
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < numeric.size(); ++i) {
    err = std::max(err, std::fabs(numeric[i] - analytic[i]));
    scale = std::max(scale, std::fabs(numeric[i]));
  }
  REQUIRE(scale > 0.0);  // a vanishing gradient would make the check vacuous
  return err / scale;
}

}  // namespace dtrain::testing
