#include "nn/kernels/pool2d.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "nn/kernels/geometry_util.h"
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

// Calls f(plane, out, top, left): for every plane (sample and channel) and output position, with
// `plane` the plane's index, `out` the output element's offset in y and (top, left) the window's
// first input row and column.
template <typename F>
void for_each_window(const Pool2dGeometry& g, F&& f) {
  const int64_t oh = g.out_height(), ow = g.out_width(), planes = g.batch * g.channels;
  for (int64_t pl = 0; pl < planes; ++pl) {
    for (int64_t p = 0; p < oh; ++p) {
      for (int64_t q = 0; q < ow; ++q)
        f(pl, (pl * oh + p) * ow + q, p * g.stride_h, q * g.stride_w);
    }
  }
}

}  // namespace

void max_pool2d_forward(const Pool2dGeometry& g, const float* x, float* y, int32_t* argmax) {
  check(g);
  const int64_t hw = g.height * g.width;
  for_each_window(g, [&](int64_t pl, int64_t out, int64_t top, int64_t left) {
    const float* in = x + pl * hw;
    // PyTorch's loop: start below everything, take a strictly larger element or any NaN.
    int64_t best = top * g.width + left;
    float v = -std::numeric_limits<float>::infinity();
    for (int64_t i = top; i < top + g.kernel_h; ++i) {
      for (int64_t j = left; j < left + g.kernel_w; ++j) {
        const float e = in[i * g.width + j];
        if (e > v || std::isnan(e)) {
          v = e;
          best = i * g.width + j;
        }
      }
    }
    y[out] = v;
    argmax[out] = static_cast<int32_t>(best);
  });
}

void max_pool2d_backward(const Pool2dGeometry& g, const float* dy, const int32_t* argmax,
                         float* dx) {
  check(g);
  const int64_t hw = g.height * g.width;
  std::fill(dx, dx + g.batch * g.in_sample(), 0.0f);
  for_each_window(g, [&](int64_t pl, int64_t out, int64_t, int64_t) {
    const int32_t a = argmax[out];
    DT_CHECK(a >= 0 && a < hw);
    dx[pl * hw + a] += dy[out];
  });
}

void avg_pool2d_forward(const Pool2dGeometry& g, const float* x, float* y) {
  check(g);
  const int64_t hw = g.height * g.width;
  const float count = static_cast<float>(g.kernel_h * g.kernel_w);
  for_each_window(g, [&](int64_t pl, int64_t out, int64_t top, int64_t left) {
    const float* in = x + pl * hw;
    float sum = 0.0f;
    for (int64_t i = top; i < top + g.kernel_h; ++i) {
      for (int64_t j = left; j < left + g.kernel_w; ++j) sum += in[i * g.width + j];
    }
    y[out] = sum / count;  // a division, as PyTorch rounds it
  });
}

void avg_pool2d_backward(const Pool2dGeometry& g, const float* dy, float* dx) {
  check(g);
  const int64_t hw = g.height * g.width;
  const float count = static_cast<float>(g.kernel_h * g.kernel_w);
  std::fill(dx, dx + g.batch * g.in_sample(), 0.0f);
  for_each_window(g, [&](int64_t pl, int64_t out, int64_t top, int64_t left) {
    float* d = dx + pl * hw;
    const float v = dy[out] / count;
    for (int64_t i = top; i < top + g.kernel_h; ++i) {
      for (int64_t j = left; j < left + g.kernel_w; ++j) d[i * g.width + j] += v;
    }
  });
}

}  // namespace dtrain
