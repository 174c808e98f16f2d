// Image layers over per-sample [C, H, W] inputs (NCHW batches), wrapping lib/nn/kernels:
// conv2d, max_pool2d, avg_pool2d, and flatten ([C, H, W] -> [C H W]). PyTorch's semantics,
// parameter names and shapes (nn.Conv2d: weight [O, C, k, k], bias [O]; nn.MaxPool2d,
// nn.AvgPool2d with stride defaulting to the kernel, padding 0; nn.Flatten), so a dtrain
// sequence's state loads into the same nn.Sequential.
//
// Builders first ask *_error(in_shape, spec): "" when the layer fits the input, else one line
// saying what does not ("expects a [C, H, W] input, got [784]", "kernel 5x5 is larger than
// the padded input 3x3 (input 3x3, padding 0x0)"); the model builder prefixes the layer index and
// throws the UserError. make_* DT_CHECK the same condition.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "nn/layer.h"

namespace dtrain {

struct Conv2dSpec {
  int64_t out_channels = 0;
  int64_t kernel = 0;  // square kernel
  int64_t stride = 1;
  int64_t padding = 0;  // zeros on every side
};

struct Pool2dSpec {
  int64_t kernel = 0;             // square window
  std::optional<int64_t> stride;  // default: the kernel (PyTorch's)
};

std::string conv2d_error(const Shape& in_shape, const Conv2dSpec& spec);
// Weights and bias initialised as PyTorch's nn.Conv2d (nn/kernels/torch_init.h). Saves nothing:
// backward recomputes the im2col buffer, in the state's scratch (see conv2d_layer.cc).
std::unique_ptr<Layer> make_conv2d(const Shape& in_shape, const Conv2dSpec& spec);

std::string pool2d_error(const Shape& in_shape, const Pool2dSpec& spec);
// Saves the argmax positions (LayerState::index, one int32 per output element).
std::unique_ptr<Layer> make_max_pool2d(const Shape& in_shape, const Pool2dSpec& spec);
std::unique_ptr<Layer> make_avg_pool2d(const Shape& in_shape, const Pool2dSpec& spec);

// conv2d, then ReLU, then (when max_pool is set) max_pool2d, as one layer: the sequential model
// builder (nn/registry.h) fuses a conv2d followed by relu, and a max_pool2d after those, into
// one element. Each sample's convolution output is rectified and pooled while it is in cache,
// and only the element's output (and the pool's argmax) is kept, so the big intermediate
// tensors and their memory-bound passes are gone. Parameters, names, init, outputs and
// gradients are bitwise those of the separate layers (see conv_relu_layer.cc).
std::unique_ptr<Layer> make_conv2d_relu(const Shape& in_shape, const Conv2dSpec& conv,
                                        const std::optional<Pool2dSpec>& max_pool);

// [d1, d2, ...] -> [d1 d2 ...] (nn.Flatten: every per-sample dimension into one). Any shape.
std::unique_ptr<Layer> make_flatten(const Shape& in_shape);

}  // namespace dtrain
