// 2-D convolution over NCHW float tensors and its gradients, through GEMM on im2col buffers.
//
// Semantics are PyTorch's nn.Conv2d (dilation 1, groups 1, zero padding): input x [N, C, H, W],
// weight [O, C, kh, kw], bias [O], output y [N, O, OH, OW] with
//   OH = floor((H + 2 pad_h - kh) / stride_h) + 1 (OW likewise),
//   y[n, o, p, q] = b[o] + sum_{c,i,j} w[o, c, i, j] x[n, c, p sh - ph + i, q sw - pw + j]
// (sh, sw the strides, ph, pw the paddings) where x outside [0, H) x [0, W) is 0. All buffers are
// contiguous, row-major, caller-owned.
//
// im2col: `chunk` samples at a time are unrolled into col [C kh kw, chunk OH OW] (column index
// s * OH OW + p * OW + q), and one GEMM per chunk does the work: out = W col (forward),
// dW += dout col^T and dcol = W^T dout (backward; dcol is folded back into dx by col2im), with
// out [O, chunk OH OW] in the GEMM's own layout; a pass between it and NCHW adds the bias
// (forward) or gathers dy (backward). The fused conv2d + ReLU + max-pool element
// (nn/conv_relu_layer.cc) calls the block functions below directly and does its own pass over
// the block instead. The default chunk is the measured faster one (bench/conv_bench.cc, README):
// wider GEMMs run faster while col stays in L2.
//
// Scratch: a caller-owned vector, grown on first use and reused afterwards, so steady-state steps
// do not allocate. One scratch per concurrent caller (ranks are threads): the kernels keep no
// state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {

struct Conv2dGeometry {
  int64_t batch = 0;     // N, >= 0
  int64_t channels = 0;  // C, input channels
  int64_t height = 0;    // H of the input
  int64_t width = 0;     // W of the input
  int64_t out_channels = 0;
  int64_t kernel_h = 0, kernel_w = 0;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;

  int64_t out_height() const { return (height + 2 * pad_h - kernel_h) / stride_h + 1; }
  int64_t out_width() const { return (width + 2 * pad_w - kernel_w) / stride_w + 1; }
  int64_t in_sample() const { return channels * height * width; }                   // C H W
  int64_t out_sample() const { return out_channels * out_height() * out_width(); }  // O OH OW
  int64_t patch() const { return channels * kernel_h * kernel_w; }                  // C kh kw
  int64_t weight_count() const { return out_channels * patch(); }
};

// A square kernel, stride and padding (the config's `kernel`, `stride`, `padding`).
Conv2dGeometry conv2d_geometry(int64_t batch, int64_t channels, int64_t height, int64_t width,
                               int64_t out_channels, int64_t kernel, int64_t stride = 1,
                               int64_t padding = 0);

// "" when the geometry is valid, else one line saying what does not fit, for example
// "kernel 5x5 is larger than the padded input 3x3 (input 3x3, padding 0)". The layer turns it into
// the UserError that names its index; the kernels below DT_CHECK it.
std::string conv2d_geometry_error(const Conv2dGeometry& g);

// The default samples per im2col GEMM (see the header comment).
inline constexpr int64_t kConv2dChunk = 4;
// The samples of one block: `chunk`, at most the batch, and fewer where a block's GEMM operands
// would pass 2^31 elements (OpenBLAS's sizes are 32-bit; one sample always fits, as
// conv2d_geometry_error checks). The kernels and the fused conv layer block by it alike.
int64_t conv2d_block_samples(const Conv2dGeometry& g, int64_t chunk = kConv2dChunk);

// Floats of scratch the kernels use for this geometry and chunk (they grow `scratch` to it).
int64_t conv2d_scratch_floats(const Conv2dGeometry& g, int64_t chunk = kConv2dChunk);

// y = conv(x, w) + b, y overwritten. b may be null (no bias). The same arithmetic as
// conv2d_forward_block followed by out + b (so a caller of the blocks with the same chunks gets
// the same bits).
void conv2d_forward(const Conv2dGeometry& g, const float* x, const float* w, const float* b,
                    float* y, std::vector<float>& scratch, int64_t chunk = kConv2dChunk);

// Gradients from dy [N, O, OH, OW]: dw [O, C, kh, kw] and db [O] are ACCUMULATED (+=); dx
// [N, C, H, W] is overwritten. db may be null (no bias); dx may be null (first layer: not needed,
// and its GEMM is skipped).
void conv2d_backward(const Conv2dGeometry& g, const float* x, const float* w, const float* dy,
                     float* dw, float* db, float* dx, std::vector<float>& scratch,
                     int64_t chunk = kConv2dChunk);

// One block of n samples (g.batch is ignored): x [n, C, H, W], col >= conv2d_col_floats(g, n)
// floats of scratch. Forward: out [O, n OH OW] = W im2col(x), overwritten, no bias (element
// (o, s OH OW + p OW + q) is sample s's y[o, p, q] - b[o]).
int64_t conv2d_col_floats(const Conv2dGeometry& g, int64_t n);
void conv2d_forward_block(const Conv2dGeometry& g, const float* x, int64_t n, const float* w,
                          float* out, float* col);
// Backward from dout [O, n OH OW] (the forward block's layout): dw and db ACCUMULATED, dx
// [n, C, H, W] overwritten (null: skipped), db may be null.
void conv2d_backward_block(const Conv2dGeometry& g, const float* x, int64_t n, const float* w,
                           const float* dout, float* dw, float* db, float* dx, float* col);

}  // namespace dtrain
