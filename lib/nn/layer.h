// Layers with explicit forward and backward. A layer object is immutable configuration: it owns
// no parameters and no activations, so one model can serve several micro-batches (pipeline) or
// ranks (threads) at once. Its parameters are a contiguous range of the model's flat buffer,
// passed in as `p` (values) and `g` (gradients), in the order of params(); activations and the
// per-call state backward needs (LayerState) belong to the caller.
//
// Shapes are per sample: a layer is built for one input shape (in_shape(), e.g. [784], [1, 28,
// 28] or [T, C]) and maps x [B, in_shape...] to y [B, out_shape...], B >= 0. A layer checks only
// that x holds B * numel(in_shape) elements and reads it in its own per-sample layout, so a flat
// [B, 784] batch feeds a layer built for [1, 28, 28] unchanged; y is resized to [B, out_shape...].
//
// Gradients are ACCUMULATED (+=) into g, so micro-batches and gradient accumulation add up;
// the caller zeroes g once per optimizer step. Input gradients (dx) are overwritten.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/options.h"
#include "tensor/tensor.h"
#include "util/rng.h"

namespace dtrain {

struct ParamSpec {
  // Relative to the layer: "weight", "bias"; a composite layer prefixes its children's names
  // ("attn.c_attn.weight").
  std::string name;
  Shape shape;
};

// What a forward (and the matching backward) runs under. Copied by value; backward receives the
// same context as its forward, with rng and rows cleared (nothing may draw during backward).
//
// Dropout masks (nn_detail::dropout_mask) come from one of two sources in training mode:
//  - keyed, when rows is set (the training loop): batch row b's masks are drawn from a stream of
//    their own, keyed on (mask_key, rows[b], site, the layer's sub-site), so a sample gets the
//    same masks whichever rank, micro-batch or batch position it lands in: W ranks, any
//    accumulation and any pipeline split draw what one process draws;
//  - sequential, from *rng, otherwise (tests, tools).
class TensorGroup;  // nn/tp_gpt.h

struct LayerCtx {
  bool training = true;
  Rng* rng = nullptr;  // dropout's sequential source in training mode (when rows is null)
  // Per batch row: the sample's index in the training set (rows of x, in order).
  const int64_t* rows = nullptr;
  uint64_t mask_key = 0;  // the step's key: dropout_step_key(seed, step)
  int64_t site = 0;       // the element's index in the model (set by Model::forward)
  // The tensor-parallel group a tensor-parallel layer all-reduces over (its f and g, nn/tp_gpt.h);
  // null when the model has no such layers. Kept for backward.
  TensorGroup* tensor = nullptr;
};
using ForwardCtx = LayerCtx;

// The key of optimizer step `step` (0-based) of a run seeded `seed`: masks differ from step to
// step (and so from epoch to epoch for the same sample), and a resumed run draws the same ones.
uint64_t dropout_step_key(uint64_t seed, int64_t step);

// The state one forward call leaves for its backward: saved float tensors, integer state (max
// pooling's argmax) and, for composite layers, one state per child. Layers size it themselves
// and reuse its capacity across calls, so steady-state steps do not allocate.
struct LayerState {
  std::vector<Tensor> saved;
  std::vector<int32_t> index;
  std::vector<LayerState> children;
  // Backward's workspace (attention's T x T scratch, a block's gradient buffers): sized by
  // forward or on first use, contents unspecified between calls, written by backward even
  // though the state is otherwise read-only there. Not counted as saved state.
  mutable std::vector<Tensor> work;
  // The same for kernels that grow a float vector themselves (conv2d's im2col buffer): one per
  // state rather than per thread, so no layer keeps hidden global state.
  mutable std::vector<float> scratch;
  int64_t bytes() const;  // bytes held by saved, index and children, recursively
};

class Layer {
 public:
  virtual ~Layer() = default;
  // "linear", "relu", "gelu", "tanh", "sigmoid", "dropout", "layer_norm", ...
  virtual std::string kind() const = 0;
  const Shape& in_shape() const { return in_shape_; }
  const Shape& out_shape() const { return out_shape_; }
  int64_t in_features() const { return shape_numel(in_shape_); }  // elements per sample
  int64_t out_features() const { return shape_numel(out_shape_); }
  virtual std::vector<ParamSpec> params() const { return {}; }
  int64_t param_count() const;
  // Deterministic initialisation of this layer's parameters from `rng`.
  virtual void init(float* p, Rng& rng) const { (void)p, (void)rng; }
  // y is resized by the layer (y and st are caller-owned, reused across calls).
  virtual void forward(const float* p, const Tensor& x, Tensor& y, LayerState& st,
                       const LayerCtx& ctx) const = 0;
  // dx may be null (first layer: no input gradient needed). dx is resized by the layer. ctx is
  // the forward's context.
  virtual void backward(const float* p, float* g, const Tensor& x, const Tensor& y,
                        const LayerState& st, const Tensor& dy, Tensor* dx,
                        const LayerCtx& ctx) const = 0;
  // Forward multiply-adds per sample (for cost-balanced pipeline partitions).
  virtual double flops_per_sample() const { return static_cast<double>(out_features()); }
  // 4-byte values (floats, or int32 indices) per sample that a training forward leaves in its
  // LayerState beyond the output (saved tensors, indices, backward's work buffers), roughly: what
  // the start-up memory estimate counts for activations (train/loop.cc). Buffers of a fixed size
  // (conv2d's im2col block) are not counted.
  virtual double state_values_per_sample() const { return 0.0; }
  // 4-byte values of the work buffers whose size does not grow with the batch (conv2d's im2col
  // block of kConv2dChunk samples), grown in each LayerState that runs the layer: the memory
  // check counts them once for training and once for evaluation.
  virtual double scratch_values() const { return 0.0; }
  // The same for an evaluation forward (training off: no dropout masks, no backward work), what
  // the memory estimate counts per sample of data.eval_batch_size. At most the training figure.
  virtual double eval_values_per_sample() const { return state_values_per_sample(); }

 protected:
  Layer(Shape in_shape, Shape out_shape);

 private:
  Shape in_shape_;
  Shape out_shape_;
};

// kTorch: PyTorch's nn.Linear default, U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
// kNormal: normal(0, normal_std) weights, zero bias (nanoGPT's).
enum class Init { kKaiming, kXavier, kTorch, kNormal };

// y = x W^T + b over the last dimension, W [out, in], b [out]; in_shape [..., in] gives out_shape
// [..., out] (leading per-sample dimensions, such as positions, are batch-like). Kaiming-uniform
// (bound sqrt(6/in)) or Xavier-uniform (bound sqrt(6/(in+out))) weights with zero bias, or
// PyTorch's default (kTorch).
// bias = false: no bias parameter (y = x W^T).
std::unique_ptr<Layer> make_linear(const Shape& in_shape, int64_t out, Init init, bool bias = true,
                                   double normal_std = 0.02);
// Elementwise activations: relu, gelu (tanh approximation), tanh, sigmoid. Any shape.
std::unique_ptr<Layer> make_activation(Activation kind, const Shape& shape);
// Inverted dropout with probability `p` (training only; identity in eval). Any shape.
std::unique_ptr<Layer> make_dropout(const Shape& shape, double p);
// LayerNorm over the last dimension with learned gamma (ones) and beta (zeros), eps 1e-5.
std::unique_ptr<Layer> make_layer_norm(const Shape& shape);

}  // namespace dtrain
