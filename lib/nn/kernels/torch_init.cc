#include "nn/kernels/torch_init.h"

#include <cmath>

#include "util/check.h"

namespace dtrain {

double torch_default_bound(int64_t fan_in) {
  DT_CHECK_GE(fan_in, 1);
  const double a = std::sqrt(5.0);
  const double gain = std::sqrt(2.0 / (1.0 + a * a));  // leaky_relu gain with slope a
  return gain * std::sqrt(3.0 / static_cast<double>(fan_in));
}

void torch_default_init(float* weight, int64_t weight_count, float* bias, int64_t bias_count,
                        int64_t fan_in, Rng& rng) {
  DT_CHECK_GE(weight_count, 0);
  DT_CHECK_GE(bias_count, 0);
  DT_CHECK(bias != nullptr || bias_count == 0);
  // The weight's kaiming bound and the bias bound 1 / sqrt(fan_in) are the same number.
  const double bound = torch_default_bound(fan_in);
  const float lo = static_cast<float>(-bound);
  const float width = static_cast<float>(2.0 * bound);
  for (int64_t i = 0; i < weight_count; ++i) weight[i] = lo + width * rng.uniform();
  for (int64_t i = 0; i < bias_count; ++i) bias[i] = lo + width * rng.uniform();
}

}  // namespace dtrain
