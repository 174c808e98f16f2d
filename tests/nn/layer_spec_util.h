// A model.layers entry for tests of the sequential builder: L(LayerKind::kConv2d, 32, 3, 1, 1)
// is `{conv2d: {out_channels: 32, kernel: 3, stride: 1, padding: 1}}` (0 = the kind's default).
#pragma once

#include <cstdint>

#include "nn/options.h"

namespace dtrain::testing {

inline LayerSpec L(LayerKind k, int64_t out = 0, int64_t kernel = 0, int64_t stride = 0,
                   int64_t padding = 0) {
  LayerSpec s;
  s.kind = k;
  s.out = out;
  s.kernel = kernel;
  s.stride = stride;
  s.padding = padding;
  return s;
}

}  // namespace dtrain::testing
