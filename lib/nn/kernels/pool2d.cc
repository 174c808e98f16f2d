#include "nn/kernels/pool2d.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "nn/kernels/geometry_util.h"
#include "nn/kernels/pool2d_2x2.h"
#include "util/check.h"

namespace dtrain {

using kernels_detail::dims;
using kernels_detail::fits_int32;

Pool2dGeometry pool2d_geometry(int64_t batch, int64_t channels, int64_t height, int64_t width,
                               int64_t kernel, std::optional<int64_t> stride) {
  const int64_t st = stride.value_or(kernel);
  return {batch, channels, height, width, kernel, kernel, st, st};
}

std::string pool2d_geometry_error(const Pool2dGeometry& g) {
  const std::string common = kernels_detail::window_error(
      {g.batch, g.channels, g.height, g.width, g.kernel_h, g.kernel_w, g.stride_h, g.stride_w},
      "channels");
  if (!common.empty()) return common;
  if (g.kernel_h > g.height || g.kernel_w > g.width)
    return "kernel " + dims(g.kernel_h, g.kernel_w) + " is larger than the input " +
           dims(g.height, g.width);
  // argmax holds positions in a plane as int32; the planes of all channels must fit too.
  const double plane = static_cast<double>(g.height) * static_cast<double>(g.width);
  if (!fits_int32({g.channels}) ||
      plane * static_cast<double>(g.channels) > kernels_detail::kMaxElements)
    return "too large: " + std::to_string(g.channels) + "x" + dims(g.height, g.width) +
           " input needs 2^31 or more elements per sample";
  return "";
}

namespace {

void check(const Pool2dGeometry& g) {
  const std::string err = pool2d_geometry_error(g);
  DT_CHECK_MSG(err.empty(), err);
}

// Calls f(in, out, top) for every output row: `in` is the offset of the row's input plane in x,
// `out` the offset of the row's OW outputs in y, `top` the first input row its windows cover.
template <typename F>
void for_each_out_row(const Pool2dGeometry& g, F&& f) {
  const int64_t oh = g.out_height(), ow = g.out_width(), planes = g.batch * g.channels;
  const int64_t hw = g.height * g.width;
  for (int64_t pl = 0; pl < planes; ++pl) {
    for (int64_t p = 0; p < oh; ++p) f(pl * hw, (pl * oh + p) * ow, p * g.stride_h);
  }
}

}  // namespace

namespace {

// PyTorch's loop over one window: start below everything, take a strictly larger element or any
// NaN (so the last NaN wins).
void max_window_with_nan(const float* plane, int32_t first, int64_t w, int64_t kh, int64_t kw,
                         float* y, int32_t* argmax) {
  float v = -std::numeric_limits<float>::infinity();
  int32_t best = first;
  for (int64_t i = 0; i < kh; ++i) {
    for (int64_t j = 0; j < kw; ++j) {
      const int32_t at = first + static_cast<int32_t>(i * w + j);
      const float e = plane[at];
      if (e > v || std::isnan(e)) {
        v = e;
        best = at;
      }
    }
  }
  *y = v;
  *argmax = best;
}

}  // namespace

void max_pool2d_forward(const Pool2dGeometry& g, const float* x, float* y, int32_t* argmax) {
  check(g);
  if (kernels_detail::is_max_pool_2x2(g))
    return kernels_detail::max_pool2d_2x2_forward(g, x, y, argmax);
  const int64_t ow = g.out_width(), sw = g.stride_w, w = g.width, kh = g.kernel_h, kw = g.kernel_w;
  for_each_out_row(g, [&](int64_t in, int64_t out, int64_t top) {
    const float* plane = x + in;
    for (int64_t q = 0; q < ow; ++q) {
      // Without NaN, PyTorch's rule is "the first strict maximum", which compiles to selects
      // (maxss, cmov) rather than branches: on real activations the comparison is unpredictable,
      // and the NaN test inside the loop made GCC branch. A window with a NaN is redone PyTorch's
      // way.
      const int32_t first = static_cast<int32_t>(top * w + q * sw);
      float v = -std::numeric_limits<float>::infinity();
      int32_t best = first;
      bool nan = false;
      for (int64_t i = 0; i < kh; ++i) {
        for (int64_t j = 0; j < kw; ++j) {
          const int32_t at = first + static_cast<int32_t>(i * w + j);
          const float e = plane[at];
          best = e > v ? at : best;
          v = e > v ? e : v;
          nan |= e != e;
        }
      }
      y[out + q] = v;
      argmax[out + q] = best;
      if (nan) max_window_with_nan(plane, first, w, kh, kw, y + out + q, argmax + out + q);
    }
  });
}

void max_pool2d_backward(const Pool2dGeometry& g, const float* dy, const int32_t* argmax,
                         float* dx) {
  check(g);
  if (kernels_detail::is_max_pool_2x2(g))
    return kernels_detail::max_pool2d_2x2_backward(g, dy, argmax, dx);
  const int64_t hw = g.height * g.width, ow = g.out_width();
  std::fill(dx, dx + g.batch * g.in_sample(), 0.0f);
  for_each_out_row(g, [&](int64_t in, int64_t out, int64_t) {
    for (int64_t q = 0; q < ow; ++q) {
      const int32_t a = argmax[out + q];
      DT_CHECK(a >= 0 && a < hw);
      dx[in + a] += dy[out + q];
    }
  });
}

void avg_pool2d_forward(const Pool2dGeometry& g, const float* x, float* y) {
  check(g);
  const int64_t ow = g.out_width(), sw = g.stride_w, w = g.width, kh = g.kernel_h, kw = g.kernel_w;
  const float count = static_cast<float>(kh * kw);
  for_each_out_row(g, [&](int64_t in, int64_t out, int64_t top) {
    float* sum = y + out;
    std::fill(sum, sum + ow, 0.0f);
    for (int64_t i = top; i < top + kh; ++i) {
      for (int64_t j = 0; j < kw; ++j) {
        const float* row = x + in + i * w + j;
        for (int64_t q = 0; q < ow; ++q) sum[q] += row[q * sw];
      }
    }
    for (int64_t q = 0; q < ow; ++q) sum[q] /= count;  // a division, as PyTorch rounds it
  });
}

void avg_pool2d_backward(const Pool2dGeometry& g, const float* dy, float* dx) {
  check(g);
  const int64_t ow = g.out_width(), sw = g.stride_w, w = g.width, kh = g.kernel_h, kw = g.kernel_w;
  const float count = static_cast<float>(kh * kw);
  std::fill(dx, dx + g.batch * g.in_sample(), 0.0f);
  for_each_out_row(g, [&](int64_t in, int64_t out, int64_t top) {
    for (int64_t i = top; i < top + kh; ++i) {
      for (int64_t j = 0; j < kw; ++j) {
        float* row = dx + in + i * w + j;
        for (int64_t q = 0; q < ow; ++q) row[q * sw] += dy[out + q] / count;
      }
    }
  });
}

}  // namespace dtrain
