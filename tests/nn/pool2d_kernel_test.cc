// The pooling kernels (lib/nn/kernels/pool2d.h): output sizes, geometry messages, PyTorch's
// argmax convention, ties and NaN, and finite-difference gradients of max and average pooling.
//
// Finite differences: both pools are linear in x as long as no perturbation changes a window's
// argmax. The max-pool inputs are distinct multiples of 1/16 (a shuffled ramp), so window elements
// differ by at least 1/16 > 2 eps with eps = 1e-2 and the argmax never moves. Tolerance 1e-3 as in
// gradcheck_test.cc; a gradient routed to the wrong element or a wrong divisor is off by O(1).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "fd_util.h"
#include "nn/kernels/pool2d.h"
#include "util/check.h"
#include "util/rng.h"

namespace dtrain {
namespace {

using testing::fill_uniform;
using testing::grad_error;
using testing::numeric_grad;
using testing::weighted_sum;

using testing::kEps;
using testing::kTol;

Pool2dGeometry geom(int64_t n, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh,
                    int64_t sw) {
  return {n, c, h, w, kh, kw, sh, sw};
}

// Stride = kernel (the default), overlapping windows (stride < kernel), gaps (stride > kernel),
// non-square inputs and windows, sizes the floor truncates, N and C > 1.
std::vector<Pool2dGeometry> geometries() {
  return {
      pool2d_geometry(2, 3, 6, 6, 2),     // cnn-ref's pooling
      pool2d_geometry(2, 2, 7, 5, 2),     // odd sizes: the last row and column are dropped
      pool2d_geometry(1, 2, 7, 7, 3, 2),  // overlapping 3x3 windows, stride 2
      geom(2, 1, 5, 8, 2, 3, 1, 2),       // non-square window and stride, overlapping rows
      geom(1, 3, 9, 7, 2, 2, 3, 3),       // stride > kernel: elements no window covers
  };
}

std::string name(const Pool2dGeometry& g) {
  std::ostringstream os;  // (not string +: GCC 12 warns falsely about it, -Wrestrict)
  os << "N" << g.batch << " C" << g.channels << " " << g.height << "x" << g.width << " k"
     << g.kernel_h << "x" << g.kernel_w << " s" << g.stride_h << "x" << g.stride_w;
  return os.str();
}

// Distinct values k / 16, k = 0 .. n - 1 shifted to be centred, in random order.
std::vector<float> distinct_input(int64_t n, uint64_t seed) {
  Rng rng(seed, 5);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i - n / 2) / 16.0f;
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(x[static_cast<size_t>(i)], x[rng.below(static_cast<uint64_t>(i + 1))]);
  return x;
}

TEST_CASE("pool2d kernel: output sizes follow PyTorch's floor formula, stride defaults to kernel") {
  const Pool2dGeometry a = pool2d_geometry(2, 32, 28, 28, 2);
  CHECK(a.stride_h == 2);
  CHECK(a.stride_w == 2);
  CHECK(a.out_height() == 14);
  CHECK(a.out_sample() == 32 * 14 * 14);
  CHECK(pool2d_geometry(1, 1, 7, 7, 2).out_height() == 3);     // floor(5 / 2) + 1
  CHECK(pool2d_geometry(1, 1, 7, 7, 3, 2).out_height() == 3);  // (7 - 3) / 2 + 1
  CHECK(pool2d_geometry(1, 1, 5, 5, 5).out_width() == 1);
  const Pool2dGeometry b = geom(1, 1, 5, 8, 2, 3, 1, 2);
  CHECK(b.out_height() == 4);
  CHECK(b.out_width() == 3);
}

TEST_CASE("pool2d kernel: a geometry that does not fit gets one clear line") {
  const auto err = [](const Pool2dGeometry& g) { return pool2d_geometry_error(g); };
  CHECK(err(pool2d_geometry(1, 4, 2, 2, 3)) == "kernel 3x3 is larger than the input 2x2");
  CHECK(err(geom(1, 4, 5, 2, 2, 3, 1, 1)) == "kernel 2x3 is larger than the input 5x2");
  CHECK(err(pool2d_geometry(1, 4, 2, 2, 2)).empty());
  CHECK(err(pool2d_geometry(1, 0, 4, 4, 2)) == "channels must be >= 1 (got 0)");
  CHECK(err(pool2d_geometry(1, 1, 4, 0, 2)) == "input height and width must be >= 1 (got 4x0)");
  CHECK(err(pool2d_geometry(1, 1, 4, 4, 0)) == "kernel must be >= 1 (got 0x0)");
  CHECK(err(pool2d_geometry(1, 1, 4, 4, 2, 0)) == "stride must be >= 1 (got 0x0)");
  CHECK(err(pool2d_geometry(-2, 1, 4, 4, 2)) == "batch must be >= 0 (got -2)");
  CHECK(err(pool2d_geometry(1, 8, 1 << 15, 1 << 15, 2)) ==
        "too large: 8x32768x32768 input needs 2^31 or more elements per sample");
  std::vector<float> buf(16);
  std::vector<int32_t> idx(16);
  CHECK_THROWS_AS(
      max_pool2d_forward(pool2d_geometry(1, 1, 2, 2, 3), buf.data(), buf.data(), idx.data()),
      InternalError);
}

TEST_CASE("max_pool2d kernel: values, PyTorch's argmax positions, ties and NaN") {
  // One 4x4 plane, 2x2 windows; argmax is the position h * W + w in the plane.
  const std::vector<float> x = {1,  5,  2,   2,  //
                                3,  4,  2,   2,  // a four-way tie: the first one wins
                                0,  -1, 9,   8,  //
                                -3, 7,  NAN, 6};
  const Pool2dGeometry g = pool2d_geometry(1, 1, 4, 4, 2);
  std::vector<float> y(4);
  std::vector<int32_t> idx(4);
  max_pool2d_forward(g, x.data(), y.data(), idx.data());
  CHECK(y[0] == 5.0f);
  CHECK(idx[0] == 1);
  CHECK(y[1] == 2.0f);
  CHECK(idx[1] == 2);
  CHECK(y[2] == 7.0f);
  CHECK(idx[2] == 13);
  CHECK(std::isnan(y[3]));  // NaN propagates, as in PyTorch
  CHECK(idx[3] == 14);
  // Backward routes each dy to its argmax; a second plane and sample offset by the plane size.
  std::vector<float> dx(16, 99.0f);
  max_pool2d_backward(g, std::vector<float>{1, 2, 3, 4}.data(), idx.data(), dx.data());
  CHECK(dx == std::vector<float>{0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 4, 0});
  // All -inf: the first position, not garbage.
  const std::vector<float> ninf(4, -std::numeric_limits<float>::infinity());
  max_pool2d_forward(pool2d_geometry(1, 1, 2, 2, 2), ninf.data(), y.data(), idx.data());
  CHECK(idx[0] == 0);
  CHECK(y[0] == -std::numeric_limits<float>::infinity());
}

TEST_CASE("max_pool2d kernel: finite-difference gradients, no ties") {
  for (const Pool2dGeometry& g : geometries()) {
    INFO(name(g));
    std::vector<float> x = distinct_input(g.batch * g.in_sample(), 61);
    std::vector<float> y(static_cast<size_t>(g.batch * g.out_sample())), r(y.size());
    std::vector<int32_t> idx(y.size());
    Rng rng(67);
    fill_uniform(r, rng, -1.0f, 1.0f);
    const auto objective = [&]() {
      max_pool2d_forward(g, x.data(), y.data(), idx.data());
      return weighted_sum(y, r);
    };
    objective();
    std::vector<float> dx(x.size(), -4.0f);  // overwritten, not added to
    max_pool2d_backward(g, r.data(), idx.data(), dx.data());
    CHECK(grad_error(numeric_grad(x, kEps, objective), dx) < kTol);
  }
}

TEST_CASE("avg_pool2d kernel: window means and finite-difference gradients") {
  // 3x3 windows of a 3x4 plane, stride 1: means of columns 0-2 and 1-3 (divisor 9, no padding).
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<float> y(2);
  avg_pool2d_forward(pool2d_geometry(1, 1, 3, 4, 3, 1), x.data(), y.data());
  CHECK(y[0] == doctest::Approx(6.0));
  CHECK(y[1] == doctest::Approx(7.0));
  for (const Pool2dGeometry& g : geometries()) {
    INFO(name(g));
    Rng rng(71);
    std::vector<float> in(static_cast<size_t>(g.batch * g.in_sample()));
    std::vector<float> out(static_cast<size_t>(g.batch * g.out_sample())), r(out.size());
    fill_uniform(in, rng, -1.0f, 1.0f);
    fill_uniform(r, rng, -1.0f, 1.0f);
    const auto objective = [&]() {
      avg_pool2d_forward(g, in.data(), out.data());
      return weighted_sum(out, r);
    };
    std::vector<float> dx(in.size(), 5.0f);  // overwritten, not added to
    avg_pool2d_backward(g, r.data(), dx.data());
    CHECK(grad_error(numeric_grad(in, kEps, objective), dx) < kTol);
  }
}

TEST_CASE("pool2d kernels: 300 random small geometries equal the definitions") {
  Rng rng(2027);
  const auto pick = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(hi - lo + 1)));
  };
  int tested = 0;
  while (tested < 300) {
    const Pool2dGeometry g = geom(pick(0, 3), pick(1, 3), pick(1, 8), pick(1, 8), pick(1, 4),
                                  pick(1, 4), pick(1, 4), pick(1, 4));
    if (!pool2d_geometry_error(g).empty()) continue;
    ++tested;
    INFO(name(g));
    const std::vector<float> x =
        distinct_input(g.batch * g.in_sample(), static_cast<uint64_t>(tested));
    const int64_t oh = g.out_height(), ow = g.out_width(), ny = g.batch * g.out_sample();
    std::vector<float> ymax(static_cast<size_t>(ny)), yavg(ymax.size()), dy(ymax.size());
    std::vector<int32_t> idx(ymax.size());
    Rng r(static_cast<uint64_t>(tested), 9);
    fill_uniform(dy, r, -1.0f, 1.0f);
    max_pool2d_forward(g, x.data(), ymax.data(), idx.data());
    avg_pool2d_forward(g, x.data(), yavg.data());
    std::vector<float> dmax(x.size(), 1.0f), davg(x.size(), 1.0f);
    max_pool2d_backward(g, dy.data(), idx.data(), dmax.data());
    avg_pool2d_backward(g, dy.data(), davg.data());
    // The definitions, window by window, with the gradients scattered in double.
    std::vector<double> ref_dmax(x.size(), 0.0), ref_davg(x.size(), 0.0);
    for (int64_t pl = 0; pl < g.batch * g.channels; ++pl)
      for (int64_t p = 0; p < oh; ++p)
        for (int64_t q = 0; q < ow; ++q) {
          const size_t o = static_cast<size_t>((pl * oh + p) * ow + q);
          float best = -1e30f;
          int64_t at = -1;
          double sum = 0.0;
          for (int64_t i = 0; i < g.kernel_h; ++i)
            for (int64_t j = 0; j < g.kernel_w; ++j) {
              const int64_t k = (p * g.stride_h + i) * g.width + q * g.stride_w + j;
              const float v = x[static_cast<size_t>(pl * g.height * g.width + k)];
              sum += v;
              if (v > best) best = v, at = k;
            }
          REQUIRE(ymax[o] == best);
          REQUIRE(idx[o] == at);
          REQUIRE(yavg[o] == doctest::Approx(sum / static_cast<double>(g.kernel_h * g.kernel_w)));
          const double n = static_cast<double>(g.kernel_h * g.kernel_w);
          ref_dmax[static_cast<size_t>(pl * g.height * g.width + at)] += dy[o];
          for (int64_t i = 0; i < g.kernel_h; ++i)
            for (int64_t j = 0; j < g.kernel_w; ++j)
              ref_davg[static_cast<size_t>(pl * g.height * g.width +
                                           (p * g.stride_h + i) * g.width + q * g.stride_w + j)] +=
                  dy[o] / n;
        }
    for (size_t i = 0; i < x.size(); ++i) {
      REQUIRE(std::fabs(dmax[i] - ref_dmax[i]) < 1e-6);
      REQUIRE(std::fabs(davg[i] - ref_davg[i]) < 1e-6);
    }
  }
}

}  // namespace
}  // namespace dtrain
