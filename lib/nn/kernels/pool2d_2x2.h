// Max pooling over 2x2 windows at stride 2 (PyTorch's nn.MaxPool2d(2), cnn-ref's pools): the
// general kernels' results (nn/kernels/pool2d.h) bit for bit, with the window unrolled.
//
// max_pool2d_forward and max_pool2d_backward call these when is_max_pool_2x2(g); they are not
// called directly elsewhere. The general loops over runtime kernel sizes cost ~20 cycles a window
// on cnn-ref (a tenth of its step, perf); here four windows are selected per SSE2 step with
// compares and maxps (scalar below 4 windows a row and where SSE2 is missing), and backward writes
// every input element once instead of zero-filling dx and scattering into it.
#pragma once

#include <cstdint>

#include "nn/kernels/pool2d.h"

namespace dtrain::kernels_detail {

// kernel 2x2 and stride 2 (any H, W >= 2; an odd last row or column is in no window).
inline bool is_max_pool_2x2(const Pool2dGeometry& g) {
  return g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2;
}

// Same contract as max_pool2d_forward (first strict maximum in row-major window order; NaN
// propagates, the last NaN of the window wins). g is valid and is_max_pool_2x2(g).
void max_pool2d_2x2_forward(const Pool2dGeometry& g, const float* x, float* y, int32_t* argmax);

// Same contract as max_pool2d_backward (dx overwritten); DT_CHECKs that every argmax lies in its
// own window, which max_pool2d_forward's always does (windows do not overlap at stride 2, so each
// input element receives 0 or one dy).
void max_pool2d_2x2_backward(const Pool2dGeometry& g, const float* dy, const int32_t* argmax,
                             float* dx);

}  // namespace dtrain::kernels_detail
