// Layers with explicit forward and backward. A layer object is immutable configuration: it owns
// no parameters and no activations, so one model can serve several micro-batches (pipeline) or
// ranks (threads) at once. Its parameters are a contiguous range of the model's flat buffer,
// passed in as `p` (values) and `g` (gradients), in the order of params(); activations and the
// per-call state backward needs (`saved`) belong to the caller.
//
// Shapes: x is [B, in_features()], y is [B, out_features()], B >= 0.
// Gradients are ACCUMULATED (+=) into g, so micro-batches and gradient accumulation add up;
// the caller zeroes g once per optimizer step.
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
  std::string name;  // relative to the layer: "weight", "bias"
  Shape shape;
};

struct ForwardCtx {
  bool training = true;
  Rng* rng = nullptr;  // needed by Dropout in training mode
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string kind()
      const = 0;  // "linear", "relu", "gelu", "tanh", "sigmoid", "dropout", "layer_norm"
  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
  virtual std::vector<ParamSpec> params() const { return {}; }
  int64_t param_count() const;
  // Deterministic initialisation of this layer's parameters from `rng`.
  virtual void init(float* p, Rng& rng) const { (void)p, (void)rng; }
  // y is resized by the layer (y and saved are owning tensors, reused across calls).
  virtual void forward(const float* p, const Tensor& x, Tensor& y, Tensor& saved,
                       const ForwardCtx& ctx) const = 0;
  // dx may be null (first layer: no input gradient needed). dx is resized by the layer.
  virtual void backward(const float* p, float* g, const Tensor& x, const Tensor& y,
                        const Tensor& saved, const Tensor& dy, Tensor* dx) const = 0;
  // Forward multiply-adds per sample (for cost-balanced pipeline partitions).
  virtual double flops_per_sample() const { return static_cast<double>(out_features()); }
};

enum class Init { kKaiming, kXavier };

// y = x W^T + b, W [out, in], b [out]. Kaiming-uniform (bound sqrt(6/in)) or Xavier-uniform
// (bound sqrt(6/(in+out))) weights, zero bias.
std::unique_ptr<Layer> make_linear(int64_t in, int64_t out, Init init);
// Elementwise activations: relu, gelu (tanh approximation), tanh, sigmoid.
std::unique_ptr<Layer> make_activation(Activation kind, int64_t features);
// Inverted dropout with probability `p` (training only; identity in eval). saved holds the mask.
std::unique_ptr<Layer> make_dropout(int64_t features, double p);
// LayerNorm over the feature dimension with learned gamma (ones) and beta (zeros), eps 1e-5.
std::unique_ptr<Layer> make_layer_norm(int64_t features);

}  // namespace dtrain
