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
  if (!fits_int32({g.height, g.width, g.kernel_h, g.kernel_w, g.stride_h, g.stride_w, g.pad_h,
                   g.pad_w, g.channels, g.out_channels}))
    return "sizes must be below 2^31 (input " + dims(g.height, g.width) + ", kernel " +
           dims(g.kernel_h, g.kernel_w) + ", stride " + dims(g.stride_h, g.stride_w) +
           ", padding " + dims(g.pad_h, g.pad_w) + ")";
  const int64_t ph = g.height + 2 * g.pad_h, pw = g.width + 2 * g.pad_w;
  if (g.kernel_h > ph || g.kernel_w > pw)
    return "kernel " + dims(g.kernel_h, g.kernel_w) + " is larger than the padded input " +
           dims(ph, pw) + " (input " + dims(g.height, g.width) + ", padding " +
           dims(g.pad_h, g.pad_w) + ")";
  // GEMM dimensions and leading strides are 32-bit in OpenBLAS: the per-sample input, output,
  // weights and im2col buffer must fit (a block of several samples is made smaller where it
  // would not: conv2d_block_samples). In double, so the products themselves cannot overflow.
  const double c = static_cast<double>(g.channels), o = static_cast<double>(g.out_channels);
  const double ohw = static_cast<double>(g.out_height()) * static_cast<double>(g.out_width());
  const double patch = c * static_cast<double>(g.kernel_h) * static_cast<double>(g.kernel_w);
  const double in = c * static_cast<double>(g.height) * static_cast<double>(g.width);
  if (std::max({in, patch * ohw, o * ohw, o * patch}) > kernels_detail::kMaxElements)
    return "too large: " + std::to_string(g.channels) + "x" + dims(g.height, g.width) + " input, " +
           std::to_string(g.out_channels) + " output channels, kernel " +
           dims(g.kernel_h, g.kernel_w) + ", stride " + dims(g.stride_h, g.stride_w) +
           " and padding " + dims(g.pad_h, g.pad_w) + " (a " + dims(g.out_height(), g.out_width()) +
           " output) need 2^31 or more elements per sample";
  return "";
}

int64_t conv2d_block_samples(const Conv2dGeometry& g, int64_t chunk) {
  DT_CHECK_GE(chunk, 1);
  int64_t n = std::max<int64_t>(1, std::min(chunk, g.batch));
  // A block's GEMMs have N = n x OH x OW; the im2col buffer [C kh kw, N], the output [O, N].
  const double ohw = static_cast<double>(g.out_height()) * static_cast<double>(g.out_width());
  const double widest = std::max(static_cast<double>(g.channels) * static_cast<double>(g.kernel_h) *
                                     static_cast<double>(g.kernel_w),
                                 static_cast<double>(g.out_channels));
  while (n > 1 && static_cast<double>(n) * ohw * widest > kernels_detail::kMaxElements) --n;
  return n;
}

namespace {

void check(const Conv2dGeometry& g) {
  const std::string err = conv2d_geometry_error(g);
  DT_CHECK_MSG(err.empty(), err);
}

float* grow(std::vector<float>& scratch, int64_t floats) {
  if (static_cast<int64_t>(scratch.size()) < floats) scratch.resize(static_cast<size_t>(floats));
  return scratch.data();
}

// sum of r[0, n) in 8 independent float lanes (GCC vectorises them; one running sum is a chain of
// dependent adds, 4 cycles each: it made db of cnn-ref's first conv cost more than its GEMMs).
float row_sum(const float* r, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    for (int k = 0; k < 8; ++k) lane[k] += r[t + k];
  }
  double sum = 0.0;
  for (int k = 0; k < 8; ++k) sum += lane[k];
  for (; t < n; ++t) sum += r[t];
  return static_cast<float>(sum);
}

// One patch position (c, i, j) of one sample: the [OH, OW] block of col it fills, and where it
// reads. Output (p, q) reads input element plane + (p stride_h + di) W + q stride_w + dj, which is
// inside the input plane exactly for rows p in [p0, p1) and columns q in [q0, q1); the rest of the
// block is padding.
struct PatchBlock {
  int64_t out;     // offset of the block in col
  int64_t plane;   // offset of the sample's input channel plane in x
  int64_t di, dj;  // i - pad_h, j - pad_w
  int64_t p0, p1, q0, q1;
};

template <typename F>
void for_each_patch_block(const Conv2dGeometry& g, int64_t s0, int64_t n, F&& f) {
  const int64_t oh = g.out_height(), ow = g.out_width(), ohw = oh * ow, len = n * ohw;
  for (int64_t c = 0; c < g.channels; ++c) {
    for (int64_t i = 0; i < g.kernel_h; ++i) {
      const auto [p0, p1] = valid_span(oh, g.stride_h, i - g.pad_h, g.height);
      for (int64_t j = 0; j < g.kernel_w; ++j) {
        const auto [q0, q1] = valid_span(ow, g.stride_w, j - g.pad_w, g.width);
        const int64_t row = ((c * g.kernel_h + i) * g.kernel_w + j) * len;
        for (int64_t s = 0; s < n; ++s) {
          const int64_t plane = ((s0 + s) * g.channels + c) * g.height * g.width;
          f(PatchBlock{row + s * ohw, plane, i - g.pad_h, j - g.pad_w, p0, p1, q0, q1});
        }
      }
    }
  }
}

// Stride 1 with OW == W (the "same" convolutions of cnn-ref): input index of (p, q) is
// p W + q + (di W + dj), a constant shift of the output index, so the valid part of a block is one
// contiguous run from (p0, q0) to (p1 - 1, q1 - 1) -- apart from the padding columns inside it,
// which the callers fix up. Long contiguous loops instead of OW-element rows: ~2x faster im2col.
bool contiguous(const Conv2dGeometry& g) {
  return g.stride_h == 1 && g.stride_w == 1 && g.out_width() == g.width;
}

// Zeroes the padding columns (q < q0, q >= q1) of rows [p0, p1) of a block. Column by column,
// strided over the rows: row by row, GCC turns the loops over the one or two side columns into
// memset calls that cost more than the whole copy (seen in perf on cnn-ref).
void zero_side_columns(float* d, int64_t ow, const PatchBlock& b) {
  const auto zero_column = [&](int64_t q) {
    for (int64_t p = b.p0; p < b.p1; ++p) d[p * ow + q] = 0.0f;
  };
  for (int64_t q = 0; q < b.q0; ++q) zero_column(q);
  for (int64_t q = b.q1; q < ow; ++q) zero_column(q);
}

// im2col: samples [s0, s0 + n) of x into col [C kh kw, n OH OW] (overwritten). Plain loops rather
// than std::fill / std::copy: runs are short and the library calls per run cost more.
void im2col(const Conv2dGeometry& g, const float* x, int64_t s0, int64_t n, float* col) {
  const int64_t oh = g.out_height(), ow = g.out_width(), w = g.width, sw = g.stride_w;
  const bool fast = contiguous(g);
  for_each_patch_block(g, s0, n, [&](const PatchBlock& b) {
    float* d = col + b.out;
    if (b.p0 >= b.p1 || b.q0 >= b.q1) {  // all padding
      for (int64_t t = 0; t < oh * ow; ++t) d[t] = 0.0f;
      return;
    }
    for (int64_t t = 0; t < b.p0 * ow; ++t) d[t] = 0.0f;
    for (int64_t t = b.p1 * ow; t < oh * ow; ++t) d[t] = 0.0f;
    if (fast) {
      const int64_t shift = b.plane + b.di * w + b.dj;
      for (int64_t t = b.p0 * ow + b.q0; t < (b.p1 - 1) * ow + b.q1; ++t) d[t] = x[shift + t];
      zero_side_columns(d, ow, b);
      return;
    }
    for (int64_t p = b.p0; p < b.p1; ++p) {
      float* r = d + p * ow;
      const int64_t in = b.plane + (p * g.stride_h + b.di) * w + b.dj;  // + q sw >= 0 for q >= q0
      for (int64_t q = 0; q < b.q0; ++q) r[q] = 0.0f;
      for (int64_t q = b.q0; q < b.q1; ++q) r[q] = x[in + q * sw];
      for (int64_t q = b.q1; q < ow; ++q) r[q] = 0.0f;
    }
  });
}

// The adjoint of im2col: dcol [C kh kw, n OH OW] ADDED into samples [s0, s0 + n) of dx. Zeroes
// dcol's padding entries on the way (it is scratch), so the contiguous path adds exact zeros
// where its run crosses them.
void col2im_add(const Conv2dGeometry& g, float* dcol, int64_t s0, int64_t n, float* dx) {
  const int64_t ow = g.out_width(), w = g.width, sw = g.stride_w;
  const bool fast = contiguous(g);
  for_each_patch_block(g, s0, n, [&](const PatchBlock& b) {
    if (b.p0 >= b.p1 || b.q0 >= b.q1) return;  // all padding: nothing receives a gradient
    float* d = dcol + b.out;
    if (fast) {
      zero_side_columns(d, ow, b);
      const int64_t shift = b.plane + b.di * w + b.dj;
      for (int64_t t = b.p0 * ow + b.q0; t < (b.p1 - 1) * ow + b.q1; ++t) dx[shift + t] += d[t];
      return;
    }
    for (int64_t p = b.p0; p < b.p1; ++p) {
      const float* r = d + p * ow;
      const int64_t in = b.plane + (p * g.stride_h + b.di) * w + b.dj;
      for (int64_t q = b.q0; q < b.q1; ++q) dx[in + q * sw] += r[q];
    }
  });
}

}  // namespace

int64_t conv2d_col_floats(const Conv2dGeometry& g, int64_t n) {
  return g.patch() * n * g.out_height() * g.out_width();
}

void conv2d_forward_block(const Conv2dGeometry& g, const float* x, int64_t n, const float* w,
                          float* out, float* col) {
  const int64_t k = g.patch(), len = n * g.out_height() * g.out_width();
  im2col(g, x, 0, n, col);
  gemm(false, false, g.out_channels, len, k, 1.0f, w, k, col, len, 0.0f, out, len);
}

void conv2d_backward_block(const Conv2dGeometry& g, const float* x, int64_t n, const float* w,
                           const float* dout, float* dw, float* db, float* dx, float* col) {
  const int64_t o_ch = g.out_channels, k = g.patch(), len = n * g.out_height() * g.out_width();
  im2col(g, x, 0, n, col);
  gemm(false, true, o_ch, k, len, 1.0f, dout, len, col, len, 1.0f, dw, k);  // dW += dout col^T
  if (db != nullptr) {
    for (int64_t o = 0; o < o_ch; ++o) db[o] += row_sum(dout + o * len, len);
  }
  if (dx == nullptr) return;
  gemm(true, false, k, len, o_ch, 1.0f, w, k, dout, len, 0.0f, col, len);  // dcol = W^T dout
  std::fill(dx, dx + n * g.in_sample(), 0.0f);
  col2im_add(g, col, 0, n, dx);
}

namespace {

// The chunk loop both directions share: checks g, grows scratch, and calls f(s0, n, col, tmp)
// for each chunk of n samples from s0 (col: conv2d_col_floats(g, n) floats; tmp: the [O, n OH OW]
// block).
template <typename F>
void for_each_chunk(const Conv2dGeometry& g, std::vector<float>& scratch, int64_t chunk, F&& f) {
  check(g);
  if (g.batch == 0) return;
  const int64_t cn = conv2d_block_samples(g, chunk);
  float* col = grow(scratch, conv2d_scratch_floats(g, cn));
  float* tmp = col + conv2d_col_floats(g, cn);
  for (int64_t s0 = 0; s0 < g.batch; s0 += cn) f(s0, std::min(cn, g.batch - s0), col, tmp);
}

}  // namespace

int64_t conv2d_scratch_floats(const Conv2dGeometry& g, int64_t chunk) {
  const int64_t n = conv2d_block_samples(g, chunk);
  // col [C kh kw, n OH OW] (reused for dcol), then the [O, n OH OW] block.
  return conv2d_col_floats(g, n) + g.out_channels * n * g.out_height() * g.out_width();
}

void conv2d_forward(const Conv2dGeometry& g, const float* x, const float* w, const float* b,
                    float* y, std::vector<float>& scratch, int64_t chunk) {
  const int64_t o_ch = g.out_channels, ohw = g.out_height() * g.out_width();
  for_each_chunk(g, scratch, chunk, [&](int64_t s0, int64_t n, float* col, float* tmp) {
    conv2d_forward_block(g, x + s0 * g.in_sample(), n, w, tmp, col);
    const int64_t len = n * ohw;
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t o = 0; o < o_ch; ++o) {
        const float* src = tmp + o * len + s * ohw;
        float* dst = y + ((s0 + s) * o_ch + o) * ohw;
        const float bias = b != nullptr ? b[o] : 0.0f;
        for (int64_t t = 0; t < ohw; ++t) dst[t] = src[t] + bias;
      }
    }
  });
}

void conv2d_backward(const Conv2dGeometry& g, const float* x, const float* w, const float* dy,
                     float* dw, float* db, float* dx, std::vector<float>& scratch, int64_t chunk) {
  const int64_t o_ch = g.out_channels, ohw = g.out_height() * g.out_width();
  for_each_chunk(g, scratch, chunk, [&](int64_t s0, int64_t n, float* col, float* tmp) {
    // dy of the chunk as [O, n OH OW]: in place for one sample, gathered otherwise.
    const float* dyc = dy + s0 * g.out_sample();
    if (n > 1) {
      const int64_t len = n * ohw;
      for (int64_t s = 0; s < n; ++s) {
        for (int64_t o = 0; o < o_ch; ++o) {
          const float* src = dyc + (s * o_ch + o) * ohw;
          std::copy(src, src + ohw, tmp + o * len + s * ohw);
        }
      }
      dyc = tmp;
    }
    conv2d_backward_block(g, x + s0 * g.in_sample(), n, w, dyc, dw, db,
                          dx != nullptr ? dx + s0 * g.in_sample() : nullptr, col);
  });
}

}  // namespace dtrain
