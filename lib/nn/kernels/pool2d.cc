#include "nn/kernels/pool2d.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "nn/kernels/fast_math.h"
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

namespace {

// A float's bits as an int32 that orders exactly as `>` orders non-NaN floats: ordered_bits
// (fast_math.h) with -0 moved up to +0's key (the two compare equal as floats, so the first of
// them stays the maximum). NaN keys are wrong, but windows with a NaN are redone.
inline int32_t max_key(int32_t b) {
  return ordered_bits(b) + static_cast<int32_t>(b == std::numeric_limits<int32_t>::min());
}

inline int32_t is_nan_bits(int32_t b) {
  return static_cast<int32_t>((b & 0x7fffffff) > 0x7f800000);
}

constexpr int64_t kPoolTile = 64;  // outputs of one row per pass: the state stays in L1

// Outputs q in [0, n) of one output row, whose windows start at plane[first + q sw]: the first
// strict maximum in row-major window order. Window element by window element, with all n outputs
// in the inner loop; integer keys and bitmask selects, because a float compare-and-select is
// not if-converted under -ftrapping-math and the loop would stay scalar (and branchy: the
// comparison is unpredictable on real activations). Returns whether any element was NaN.
DT_SIMD_CLONES bool max_row_tile(const float* plane, int32_t first, int64_t n, int64_t sw,
                                 int64_t w, int64_t kh, int64_t kw, float* y, int32_t* argmax) {
  int32_t key[kPoolTile], val[kPoolTile], arg[kPoolTile];
  int32_t nan = 0;
  for (int64_t q = 0; q < n; ++q) {
    const int32_t at = first + static_cast<int32_t>(q * sw);
    const int32_t b = std::bit_cast<int32_t>(plane[at]);
    key[q] = max_key(b);
    val[q] = b;
    arg[q] = at;
    nan |= is_nan_bits(b);
  }
  for (int64_t i = 0; i < kh; ++i) {
    for (int64_t j = i == 0 ? 1 : 0; j < kw; ++j) {
      const int32_t off = first + static_cast<int32_t>(i * w + j);
      const float* src = plane + off;
      for (int64_t q = 0; q < n; ++q) {
        const int32_t b = std::bit_cast<int32_t>(src[q * sw]);
        const int32_t k = max_key(b);
        const int32_t m = -static_cast<int32_t>(k > key[q]);
        key[q] = (m & k) | (~m & key[q]);
        val[q] = (m & b) | (~m & val[q]);
        arg[q] = (m & (off + static_cast<int32_t>(q * sw))) | (~m & arg[q]);
        nan |= is_nan_bits(b);
      }
    }
  }
  for (int64_t q = 0; q < n; ++q) {
    y[q] = std::bit_cast<float>(val[q]);
    argmax[q] = arg[q];
  }
  return nan != 0;
}

}  // namespace

void max_pool2d_forward(const Pool2dGeometry& g, const float* x, float* y, int32_t* argmax) {
  check(g);
  const int64_t ow = g.out_width(), sw = g.stride_w, w = g.width, kh = g.kernel_h, kw = g.kernel_w;
  for_each_out_row(g, [&](int64_t in, int64_t out, int64_t top) {
    const float* plane = x + in;
    for (int64_t q0 = 0; q0 < ow; q0 += kPoolTile) {
      const int64_t n = std::min(kPoolTile, ow - q0);
      const int32_t first = static_cast<int32_t>(top * w + q0 * sw);
      if (!max_row_tile(plane, first, n, sw, w, kh, kw, y + out + q0, argmax + out + q0)) continue;
      // A NaN in the tile: its windows are redone PyTorch's way (NaN propagates).
      for (int64_t q = 0; q < n; ++q)
        max_window_with_nan(plane, first + static_cast<int32_t>(q * sw), w, kh, kw,
                            y + out + q0 + q, argmax + out + q0 + q);
    }
  });
}

void max_pool2d_backward(const Pool2dGeometry& g, const float* dy, const int32_t* argmax,
                         float* dx) {
  check(g);
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
