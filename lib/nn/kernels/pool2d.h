// 2-D max and average pooling over NCHW float tensors and their gradients.
//
// Semantics are PyTorch's nn.MaxPool2d / nn.AvgPool2d with padding 0, dilation 1 and
// ceil_mode false: x [N, C, H, W] -> y [N, C, OH, OW], OH = floor((H - kh) / stride_h) + 1 (OW
// likewise), window (p, q) covering rows p stride_h .. p stride_h + kh - 1 and the columns
// likewise. Average pooling divides by kh kw (PyTorch's count_include_pad default is the same
// thing without padding). Windows may overlap (stride < kernel): backward adds up.
// All buffers are contiguous, row-major, caller-owned; the kernels keep no state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dtrain {

struct Pool2dGeometry {
  int64_t batch = 0;  // N, >= 0
  int64_t channels = 0;
  int64_t height = 0, width = 0;  // of the input
  int64_t kernel_h = 0, kernel_w = 0;
  int64_t stride_h = 1, stride_w = 1;

  int64_t out_height() const { return (height - kernel_h) / stride_h + 1; }
  int64_t out_width() const { return (width - kernel_w) / stride_w + 1; }
  int64_t in_sample() const { return channels * height * width; }
  int64_t out_sample() const { return channels * out_height() * out_width(); }
};

// A square window; no stride means stride = kernel, PyTorch's default.
Pool2dGeometry pool2d_geometry(int64_t batch, int64_t channels, int64_t height, int64_t width,
                               int64_t kernel, std::optional<int64_t> stride = std::nullopt);

// "" when valid, else one line saying what does not fit, for example
// "kernel 3x3 is larger than the input 2x2". The kernels below DT_CHECK it.
std::string pool2d_geometry_error(const Pool2dGeometry& g);

// y = the maximum of each window; argmax [N, C, OH, OW] receives its position in the input plane,
// h * W + w, as PyTorch's return_indices gives it. The first maximum in row-major window order
// wins a tie; NaN propagates (the last NaN in the window is the maximum), as in PyTorch.
void max_pool2d_forward(const Pool2dGeometry& g, const float* x, float* y, int32_t* argmax);
// dx [N, C, H, W] overwritten: dy routed to the saved argmax positions (summed where windows
// overlap), 0 elsewhere.
void max_pool2d_backward(const Pool2dGeometry& g, const float* dy, const int32_t* argmax,
                         float* dx);

// y = the mean of each window.
void avg_pool2d_forward(const Pool2dGeometry& g, const float* x, float* y);
// dx overwritten: each window's dy / (kh kw) added to every element of the window.
void avg_pool2d_backward(const Pool2dGeometry& g, const float* dy, float* dx);

}  // namespace dtrain
