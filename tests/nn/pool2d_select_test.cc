// max_pool2d_forward's vectorised selection (integer keys, lib/nn/kernels/pool2d.cc) against
// PyTorch's scalar rule on inputs made to hit every corner of it: ties, -0 next to +0, +-inf,
// subnormals, NaN of both signs, and rows longer than one tile of outputs.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "nn/kernels/pool2d.h"
#include "util/rng.h"

namespace dtrain {
namespace {

// PyTorch's CPU max-pool loop: start at -inf, take a strictly larger element or any NaN.
void reference(const Pool2dGeometry& g, const std::vector<float>& x, std::vector<float>& y,
               std::vector<int32_t>& idx) {
  const int64_t oh = g.out_height(), ow = g.out_width(), hw = g.height * g.width;
  for (int64_t pl = 0; pl < g.batch * g.channels; ++pl)
    for (int64_t p = 0; p < oh; ++p)
      for (int64_t q = 0; q < ow; ++q) {
        float v = -std::numeric_limits<float>::infinity();
        int32_t at = static_cast<int32_t>(p * g.stride_h * g.width + q * g.stride_w);
        for (int64_t i = 0; i < g.kernel_h; ++i)
          for (int64_t j = 0; j < g.kernel_w; ++j) {
            const int32_t k =
                static_cast<int32_t>((p * g.stride_h + i) * g.width + q * g.stride_w + j);
            const float e = x[static_cast<size_t>(pl * hw + k)];
            if (e > v || std::isnan(e)) v = e, at = k;
          }
        const size_t o = static_cast<size_t>((pl * oh + p) * ow + q);
        y[o] = v;
        idx[o] = at;
      }
}

}  // namespace

TEST_CASE("max_pool2d: ties, signed zeros, infinities, subnormals and NaN as PyTorch selects") {
  const float inf = std::numeric_limits<float>::infinity();
  const float sub = std::numeric_limits<float>::denorm_min();
  const std::vector<float> values = {0.0f, -0.0f, 1.0f, 1.0f, -1.0f, 2.5f, -2.5f, inf, -inf,
                                     sub,  -sub,  std::numeric_limits<float>::max(),
                                     -std::numeric_limits<float>::max()};
  Rng rng(77);
  const auto pick = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(hi - lo + 1)));
  };
  for (int round = 0; round < 200; ++round) {
    // Some rows wider than the kernel's 64-output tile; NaN in a fifth of the rounds.
    const int64_t width = round % 4 == 0 ? pick(130, 300) : pick(1, 12);
    const Pool2dGeometry g{pick(1, 2), pick(1, 2), pick(1, 6),  width,
                           pick(1, 3), pick(1, 3), pick(1, 3), pick(1, 3)};
    if (!pool2d_geometry_error(g).empty()) continue;
    std::vector<float> x(static_cast<size_t>(g.batch * g.in_sample()));
    for (float& v : x) v = values[rng.below(values.size())];
    if (round % 5 == 0)
      for (int k = 0; k < 3; ++k)
        x[rng.below(x.size())] = k == 0 ? std::nanf("") : -std::nanf("");
    const size_t ny = static_cast<size_t>(g.batch * g.out_sample());
    std::vector<float> y(ny), ref(ny);
    std::vector<int32_t> idx(ny), ref_idx(ny);
    max_pool2d_forward(g, x.data(), y.data(), idx.data());
    reference(g, x, ref, ref_idx);
    INFO("round ", round, ": ", g.height, "x", g.width, " kernel ", g.kernel_h, "x", g.kernel_w,
         " stride ", g.stride_h, "x", g.stride_w);
    for (size_t o = 0; o < ny; ++o) {
      INFO("output ", o);
      REQUIRE(idx[o] == ref_idx[o]);
      // Bitwise: the sign of a zero and a NaN's payload included.
      REQUIRE(std::bit_cast<uint32_t>(y[o]) == std::bit_cast<uint32_t>(ref[o]));
    }
  }
}

}  // namespace dtrain
