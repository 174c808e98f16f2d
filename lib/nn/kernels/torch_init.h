// PyTorch's default initialisation of nn.Linear and nn.Conv2d, so that a dtrain model starts from
// the distribution its PyTorch twin starts from (the same distribution, not PyTorch's RNG stream).
#pragma once

#include <cstdint>

#include "util/rng.h"

namespace dtrain {

// reset_parameters() of nn.Linear / nn.Conv2d: kaiming_uniform_(weight, a = sqrt(5)) draws
// U(-bound, bound) with bound = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + a^2)), which is
// 1 / sqrt(fan_in); the bias is U(-1 / sqrt(fan_in), 1 / sqrt(fan_in)). fan_in is in_features for
// Linear and C kh kw for Conv2d. Draws the weight elements in order, then the bias; bias may be
// null (bias_count 0). fan_in >= 1.
void torch_default_init(float* weight, int64_t weight_count, float* bias, int64_t bias_count,
                        int64_t fan_in, Rng& rng);

// The bound above, 1 / sqrt(fan_in), for tests and documentation.
double torch_default_bound(int64_t fan_in);

}  // namespace dtrain
