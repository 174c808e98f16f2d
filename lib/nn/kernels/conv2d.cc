#include "nn/kernels/conv2d.h"

#include <algorithm>

#include "nn/kernels/geometry_util.h"
#include "tensor/blas.h"
#include "util/check.h"

namespace dtrain {

using kernels_detail::dims;
using kernels_detail::fits_int32;
using kernels_detail::valid_span;

Conv2dGeometry conv2d_geometry(int64_t batch, int64_t channels, int64_t height, int64_t width,
                               int64_t out_channels, int64_t kernel, int64_t stride,
                               int64_t padding) {
  return {batch,  channels, height, width,   out_channels, kernel,
          kernel, stride,   stride, padding, padding};
}

std::string conv2d_geometry_error(const Conv2dGeometry& g) {
  const std::string common = kernels_detail::window_error(
      {g.batch, g.channels, g.height, g.width, g.kernel_h, g.kernel_w, g.stride_h, g.stride_w},
      "input channels");
  if (!common.empty()) return common;
  if (g.out_channels < 1)
    return "out_channels must be >= 1 (got " + std::to_string(g.out_channels) + ")";
  if (g.pad_h < 0 || g.pad_w < 0)
    return "padding must be >= 0 (got " + dims(g.pad_h, g.pad_w) + ")";
  // Each factor below is checked to fit 32 bits first, so the sums and products cannot overflow.
  if (!fits_int32({g.height, g.width, g.kernel_h, g.kernel_w, g.pad_h, g.pad_w, g.channels,
                   g.out_channels}))
    return "sizes must be below 2^31 (input " + dims(g.height, g.width) + ", kernel " +
           dims(g.kernel_h, g.kernel_w) + ", padding " + dims(g.pad_h, g.pad_w) + ")";
  const int64_t ph = g.height + 2 * g.pad_h, pw = g.width + 2 * g.pad_w;
  if (g.kernel_h > ph || g.kernel_w > pw)
    return "kernel " + dims(g.kernel_h, g.kernel_w) + " is larger than the padded input " +
           dims(ph, pw) + " (input " + dims(g.height, g.width) + ", padding " +
           dims(g.pad_h, g.pad_w) + ")";
  // GEMM dimensions and leading strides are 32-bit in OpenBLAS: the per-sample input, output,
  // weights and im2col buffer must fit. In double, so the products themselves cannot overflow.
  const double c = static_cast<double>(g.channels), o = static_cast<double>(g.out_channels);
  const double ohw = static_cast<double>(g.out_height()) * static_cast<double>(g.out_width());
  const double patch = c * static_cast<double>(g.kernel_h) * static_cast<double>(g.kernel_w);
  const double in = c * static_cast<double>(g.height) * static_cast<double>(g.width);
  if (std::max({in, patch * ohw, o * ohw, o * patch}) > kernels_detail::kMaxElements)
    return "too large: " + std::to_string(g.channels) + "x" + dims(g.height, g.width) + " input, " +
           std::to_string(g.out_channels) + " output channels and kernel " +
           dims(g.kernel_h, g.kernel_w) + " need 2^31 or more elements per sample";
  return "";
}

namespace {

int64_t chunk_for(const Conv2dGeometry& g, int64_t chunk) {
  DT_CHECK_GE(chunk, 1);
  return std::max<int64_t>(1, std::min(chunk, g.batch));
}

void check(const Conv2dGeometry& g) {
  const std::string err = conv2d_geometry_error(g);
  DT_CHECK_MSG(err.empty(), err);
}

float* grow(std::vector<float>& scratch, int64_t floats) {
  if (static_cast<int64_t>(scratch.size()) < floats) scratch.resize(static_cast<size_t>(floats));
  return scratch.data();
}

// The walk im2col and col2im share. For every patch position (c, i, j), sample s of the chunk and
// output row p it calls f(out, in_row, off, q0, q1): `out` is the offset of that row's OW columns
// in col, `in_row` the offset in x of input row p * stride_h - pad_h + i (-1 when it is padding),
// and columns q in [q0, q1) read input element in_row + q * stride_w + off (off = j - pad_w); the
// columns outside [q0, q1) are padding.
template <typename F>
void for_each_patch_row(const Conv2dGeometry& g, int64_t s0, int64_t n, F&& f) {
  const int64_t oh = g.out_height(), ow = g.out_width(), ohw = oh * ow, len = n * ohw;
  for (int64_t c = 0; c < g.channels; ++c) {
    for (int64_t i = 0; i < g.kernel_h; ++i) {
      for (int64_t j = 0; j < g.kernel_w; ++j) {
        const int64_t col_row = ((c * g.kernel_h + i) * g.kernel_w + j) * len;
        const auto [q0, q1] = valid_span(ow, g.stride_w, j - g.pad_w, g.width);
        for (int64_t s = 0; s < n; ++s) {
          const int64_t plane = ((s0 + s) * g.channels + c) * g.height * g.width;
          for (int64_t p = 0; p < oh; ++p) {
            const int64_t ih = p * g.stride_h - g.pad_h + i;
            const int64_t in_row = ih >= 0 && ih < g.height ? plane + ih * g.width : -1;
            f(col_row + s * ohw + p * ow, in_row, j - g.pad_w, q0, q1);
          }
        }
      }
    }
  }
}

}  // namespace

void im2col(const Conv2dGeometry& g, const float* x, int64_t s0, int64_t n, float* col) {
  const int64_t ow = g.out_width(), sw = g.stride_w;
  for_each_patch_row(g, s0, n,
                     [&](int64_t out, int64_t in_row, int64_t off, int64_t q0, int64_t q1) {
                       float* d = col + out;
                       if (in_row < 0) {
                         std::fill(d, d + ow, 0.0f);
                         return;
                       }
                       const float* src = x + in_row;
                       std::fill(d, d + q0, 0.0f);
                       if (sw == 1) {
                         std::copy(src + q0 + off, src + q1 + off, d + q0);
                       } else {
                         for (int64_t q = q0; q < q1; ++q) d[q] = src[q * sw + off];
                       }
                       std::fill(d + q1, d + ow, 0.0f);
                     });
}

void col2im_add(const Conv2dGeometry& g, const float* dcol, int64_t s0, int64_t n, float* dx) {
  const int64_t sw = g.stride_w;
  for_each_patch_row(g, s0, n,
                     [&](int64_t out, int64_t in_row, int64_t off, int64_t q0, int64_t q1) {
                       if (in_row < 0) return;  // padding: no input element to receive the gradient
                       const float* d = dcol + out;
                       float* dst = dx + in_row;
                       for (int64_t q = q0; q < q1; ++q) dst[q * sw + off] += d[q];
                     });
}

int64_t conv2d_scratch_floats(const Conv2dGeometry& g, int64_t chunk) {
  const int64_t n = chunk_for(g, chunk);
  const int64_t len = n * g.out_height() * g.out_width();
  // col [C kh kw, len] (reused for dcol), plus the [O, len] GEMM result/gather when n > 1.
  return g.patch() * len + (n > 1 ? g.out_channels * len : 0);
}

void conv2d_forward(const Conv2dGeometry& g, const float* x, const float* w, const float* b,
                    float* y, std::vector<float>& scratch, int64_t chunk) {
  check(g);
  if (g.batch == 0) return;
  const int64_t cn = chunk_for(g, chunk);
  float* col = grow(scratch, conv2d_scratch_floats(g, cn));
  const int64_t o_ch = g.out_channels, k = g.patch(), ohw = g.out_height() * g.out_width();
  float* tmp = col + k * cn * ohw;
  for (int64_t s0 = 0; s0 < g.batch; s0 += cn) {
    const int64_t n = std::min(cn, g.batch - s0), len = n * ohw;
    im2col(g, x, s0, n, col);
    float* ys = y + s0 * g.out_sample();
    if (n == 1) {
      // Broadcast the bias, then y = W col + y: one write pass for the bias, no extra read.
      if (b != nullptr) {
        for (int64_t o = 0; o < o_ch; ++o) std::fill(ys + o * ohw, ys + (o + 1) * ohw, b[o]);
      }
      gemm(false, false, o_ch, len, k, 1.0f, w, k, col, len, b != nullptr ? 1.0f : 0.0f, ys, len);
      continue;
    }
    gemm(false, false, o_ch, len, k, 1.0f, w, k, col, len, 0.0f, tmp, len);
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t o = 0; o < o_ch; ++o) {
        const float* src = tmp + o * len + s * ohw;
        float* dst = ys + (s * o_ch + o) * ohw;
        const float bias = b != nullptr ? b[o] : 0.0f;
        for (int64_t t = 0; t < ohw; ++t) dst[t] = src[t] + bias;
      }
    }
  }
}

void conv2d_backward(const Conv2dGeometry& g, const float* x, const float* w, const float* dy,
                     float* dw, float* db, float* dx, std::vector<float>& scratch, int64_t chunk) {
  check(g);
  if (g.batch == 0) return;
  const int64_t cn = chunk_for(g, chunk);
  float* col = grow(scratch, conv2d_scratch_floats(g, cn));
  const int64_t o_ch = g.out_channels, k = g.patch(), ohw = g.out_height() * g.out_width();
  float* tmp = col + k * cn * ohw;
  for (int64_t s0 = 0; s0 < g.batch; s0 += cn) {
    const int64_t n = std::min(cn, g.batch - s0), len = n * ohw;
    im2col(g, x, s0, n, col);
    // dy of the chunk as [O, len]: in place for one sample, gathered otherwise.
    const float* dyc = dy + s0 * g.out_sample();
    if (n > 1) {
      for (int64_t s = 0; s < n; ++s) {
        for (int64_t o = 0; o < o_ch; ++o) {
          const float* src = dyc + (s * o_ch + o) * ohw;
          std::copy(src, src + ohw, tmp + o * len + s * ohw);
        }
      }
      dyc = tmp;
    }
    gemm(false, true, o_ch, k, len, 1.0f, dyc, len, col, len, 1.0f, dw, k);  // dW += dy col^T
    if (db != nullptr) {
      for (int64_t o = 0; o < o_ch; ++o) {
        const float* row = dyc + o * len;
        double sum = 0.0;
        for (int64_t t = 0; t < len; ++t) sum += row[t];
        db[o] += static_cast<float>(sum);
      }
    }
    if (dx == nullptr) continue;
    gemm(true, false, k, len, o_ch, 1.0f, w, k, dyc, len, 0.0f, col, len);  // dcol = W^T dy
    float* dxs = dx + s0 * g.in_sample();
    std::fill(dxs, dxs + n * g.in_sample(), 0.0f);
    col2im_add(g, col, s0, n, dx);
  }
}

}  // namespace dtrain
