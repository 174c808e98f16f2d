// max_pool2d's 2x2 stride-2 path (lib/nn/kernels/pool2d_2x2.cc, SSE2 with overlapping last
// vectors and scalar rows below 4 windows) against PyTorch's scalar rule and the scatter
// definition of the gradient, bit for bit: ties, -0 next to +0, +-inf, NaN of both signs, odd
// heights and widths (a last row/column in no window), rows of 1 to 40 windows.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "nn/kernels/pool2d.h"
#include "nn/kernels/pool2d_2x2.h"
#include "util/check.h"
#include "util/rng.h"

namespace dtrain {
namespace {

uint32_t bits(float v) {
  return std::bit_cast<uint32_t>(v);
}

// PyTorch's CPU loop over 2x2 windows at stride 2: from -inf, take a strictly larger element or
// any NaN.
void reference_forward(const Pool2dGeometry& g, const std::vector<float>& x, std::vector<float>& y,
                       std::vector<int32_t>& idx) {
  const int64_t oh = g.out_height(), ow = g.out_width(), hw = g.height * g.width;
  for (int64_t pl = 0; pl < g.batch * g.channels; ++pl)
    for (int64_t p = 0; p < oh; ++p)
      for (int64_t q = 0; q < ow; ++q) {
        float v = -std::numeric_limits<float>::infinity();
        int32_t at = static_cast<int32_t>(2 * p * g.width + 2 * q);
        for (int64_t i = 0; i < 2; ++i)
          for (int64_t j = 0; j < 2; ++j) {
            const int32_t k = static_cast<int32_t>((2 * p + i) * g.width + 2 * q + j);
            const float e = x[static_cast<size_t>(pl * hw + k)];
            if (e > v || std::isnan(e)) v = e, at = k;
          }
        const size_t o = static_cast<size_t>((pl * oh + p) * ow + q);
        y[o] = v;
        idx[o] = at;
      }
}

// dx = 0 everywhere, then dy added at each argmax (the general kernel's fill and scatter).
std::vector<float> reference_backward(const Pool2dGeometry& g, const std::vector<float>& dy,
                                      const std::vector<int32_t>& idx) {
  std::vector<float> dx(static_cast<size_t>(g.batch * g.in_sample()), 0.0f);
  const int64_t hw = g.height * g.width, per_plane = g.out_height() * g.out_width();
  for (size_t o = 0; o < dy.size(); ++o)
    dx[static_cast<size_t>(static_cast<int64_t>(o) / per_plane * hw + idx[o])] += dy[o];
  return dx;
}

}  // namespace

TEST_CASE("max_pool2d 2x2 stride 2: selection and gradient bitwise as the scalar definitions") {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> values = {
      0.0f, -0.0f, 1.0f, 1.0f, -1.0f,
      2.5f, -2.5f, inf,  -inf, std::numeric_limits<float>::denorm_min()};
  Rng rng(2024);
  const auto pick = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(hi - lo + 1)));
  };
  int with_nan = 0, vector_rows = 0, odd = 0;
  for (int round = 0; round < 300; ++round) {
    const Pool2dGeometry g = pool2d_geometry(pick(1, 2), pick(1, 3), pick(2, 9), pick(2, 81), 2);
    REQUIRE(kernels_detail::is_max_pool_2x2(g));
    std::vector<float> x(static_cast<size_t>(g.batch * g.in_sample()));
    for (float& v : x)
      v = round % 2 == 0 ? values[rng.below(values.size())] : 2.0f * rng.uniform() - 1.0f;
    if (round % 5 == 0) {
      for (int k = 0; k < 3; ++k) x[rng.below(x.size())] = k == 0 ? std::nanf("") : -std::nanf("");
      ++with_nan;
    }
    vector_rows += g.out_width() >= 4;
    odd += g.height % 2 == 1 || g.width % 2 == 1;
    const size_t ny = static_cast<size_t>(g.batch * g.out_sample());
    std::vector<float> y(ny), ref(ny), dy(ny);
    std::vector<int32_t> idx(ny), ref_idx(ny);
    max_pool2d_forward(g, x.data(), y.data(), idx.data());
    reference_forward(g, x, ref, ref_idx);
    INFO("round ", round, ": ", g.batch, "x", g.channels, "x", g.height, "x", g.width);
    for (size_t o = 0; o < ny; ++o) {
      INFO("output ", o);
      REQUIRE(idx[o] == ref_idx[o]);
      REQUIRE(bits(y[o]) == bits(ref[o]));  // the sign of a zero and a NaN's payload included
    }
    for (size_t o = 0; o < ny; ++o) dy[o] = o % 7 == 3 ? -0.0f : 2.0f * rng.uniform() - 1.0f;
    std::vector<float> dx(x.size(), 5.0f);  // overwritten everywhere
    max_pool2d_backward(g, dy.data(), idx.data(), dx.data());
    const std::vector<float> ref_dx = reference_backward(g, dy, idx);
    for (size_t t = 0; t < dx.size(); ++t) {
      INFO("input ", t);
      REQUIRE(bits(dx[t]) == bits(ref_dx[t]));
    }
  }
  CHECK(with_nan >= 50);  // the cases above were all reached
  CHECK(vector_rows >= 200);
  CHECK(odd >= 100);
}

TEST_CASE("max_pool2d 2x2 stride 2: an argmax outside its window is an internal error") {
  const Pool2dGeometry g = pool2d_geometry(1, 1, 4, 10, 2);  // 5 windows a row: the SSE2 path
  std::vector<float> dy(10, 1.0f), dx(40);
  std::vector<int32_t> idx = {0, 2, 4, 6, 8, 20, 22, 24, 26, 28};
  max_pool2d_backward(g, dy.data(), idx.data(), dx.data());
  idx[7] = 23;  // window 2 of the second row starts at 24: 23 belongs to window 1
  CHECK_THROWS_AS(max_pool2d_backward(g, dy.data(), idx.data(), dx.data()), InternalError);
  const Pool2dGeometry narrow = pool2d_geometry(1, 1, 2, 4, 2);  // 2 windows: the scalar path
  idx = {0, 1};
  CHECK_THROWS_AS(max_pool2d_backward(narrow, dy.data(), idx.data(), dx.data()), InternalError);
}

}  // namespace dtrain
