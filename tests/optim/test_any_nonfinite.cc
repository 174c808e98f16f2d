// any_nonfinite (the non-finite guard's pass): true exactly when some element is a NaN or an
// infinity of either sign, wherever it sits (the SSE2 body's four accumulators and the scalar
// tail), and false for every finite extreme (FLT_MAX, subnormals, signed zeros).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "optim/optimizer.h"

namespace dtrain {
namespace {

TEST_CASE("any_nonfinite finds a NaN or infinity at every position and no finite value") {
  using L = std::numeric_limits<float>;
  const float bad[] = {L::quiet_NaN(), -L::quiet_NaN(), L::signaling_NaN(), L::infinity(),
                       -L::infinity()};
  const float good[] = {L::max(), -L::max(), L::denorm_min(), -L::denorm_min(), L::min(), 0.0f,
                        -0.0f,    1.0f,      -1.0e38f};
  for (int64_t n : {0, 1, 3, 15, 16, 17, 31, 32, 33, 70}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = good[i % 9];
    CHECK_FALSE(any_nonfinite(v.data(), n));
    for (int64_t at = 0; at < n; ++at) {
      for (float b : bad) {
        const float keep = v[static_cast<size_t>(at)];
        v[static_cast<size_t>(at)] = b;
        CHECK_MESSAGE(any_nonfinite(v.data(), n), "n " << n << " at " << at << " value " << b);
        // Outside the range it is not seen.
        CHECK_FALSE(any_nonfinite(v.data(), at));
        v[static_cast<size_t>(at)] = keep;
      }
    }
  }
}

}  // namespace
}  // namespace dtrain
