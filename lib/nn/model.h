// A model is a sequence of layers plus the table that places their parameters in one flat float
// buffer (llm.c / FSDP flat-parameter style). Gradients and every optimizer state buffer use the
// same layout, so buckets, shards, pipeline stages and checkpoints are ranges of these buffers.
//
// Parameter names follow the layer index in the sequence: "layers.<i>.<param>", e.g.
// layers.0.weight [512, 784]. Layer i's parameters occupy [layer_begin(i), layer_end(i)).
//
// The model holds no parameter values itself (ParamStore does) and no activations
// (Activations does), so it may be shared read-only across threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/layer.h"
#include "nn/options.h"
#include "tensor/tensor.h"

namespace dtrain {

struct ParamEntry {
  std::string name;  // "layers.0.weight"
  Shape shape;
  int64_t offset = 0;  // in floats, into the flat buffer
  int64_t numel = 0;
  int layer = 0;  // index of the owning layer
};

// Per-forward storage: out[i] is layer i's output, saved[i] its backward state. Reused across
// steps (no allocation once sizes settle).
struct Activations {
  std::vector<Tensor> out;
  std::vector<Tensor> saved;
  std::vector<Tensor> grad;  // scratch for activation gradients during backward
  int64_t bytes() const;     // bytes currently held in out + saved
};

class Model {
 public:
  Model() = default;
  explicit Model(std::vector<std::unique_ptr<Layer>> layers);

  size_t num_layers() const { return layers_.size(); }
  const Layer& layer(size_t i) const { return *layers_[i]; }
  const std::vector<ParamEntry>& params() const { return table_; }
  int64_t param_count() const { return total_; }
  int64_t layer_begin(size_t i) const { return layer_offset_[i]; }
  int64_t layer_end(size_t i) const { return layer_offset_[i + 1]; }
  int64_t in_features() const;
  int64_t out_features() const;
  const ParamEntry* find(const std::string& name) const;  // null when absent
  std::string describe() const;  // one line per layer: index, kind, in -> out, params

  // Deterministic initialisation of the whole flat buffer (size param_count()) from `seed`:
  // each layer draws from its own stream (seed, layer index), so the result does not depend on
  // which ranks or stages initialise which layers.
  // Layers [first, last) only, into params holding the layout from element `base` on (FSDP
  // initialises one unit at a time).
  void init(float* params, uint64_t seed, size_t first = 0, size_t last = SIZE_MAX,
            int64_t base = 0) const;

  // Runs layers [first, last) on x (last = num_layers() for all). acts.out[i] receives layer i's
  // output; returns a reference to the final output. `params` holds the flat layout from element
  // `base` on (FSDP passes a gathered unit: base = layer_begin(first)); layer i reads
  // params + layer_begin(i) - base.
  const Tensor& forward(const float* params, const Tensor& x, Activations& acts,
                        const ForwardCtx& ctx, size_t first = 0, size_t last = SIZE_MAX,
                        int64_t base = 0) const;

  // Backward through layers [first, last) in reverse, given dy = gradient w.r.t. the output of
  // layer last-1. Accumulates into grads (flat buffer, full layout). Writes dx (the gradient with
  // respect to x) only when dx != null. After each layer's gradients are final, calls
  // on_layer_done(i) if set (DDP starts bucket reductions from there). params and grads hold the
  // flat layout from element `base` on, as in forward.
  void backward(const float* params, float* grads, const Tensor& x, Activations& acts,
                const Tensor& dy, Tensor* dx, size_t first = 0, size_t last = SIZE_MAX,
                const std::function<void(size_t)>& on_layer_done = {}, int64_t base = 0) const;

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<ParamEntry> table_;
  std::vector<int64_t> layer_offset_;  // size num_layers + 1
  int64_t total_ = 0;
};

// Builds the MLP described by `cfg` (hidden widths from the complexity preset, else cfg.hidden):
// for each hidden width h: Linear(prev, h), [LayerNorm(h)], activation, [Dropout(p)]; then
// Linear(prev, num_classes). in_features and num_classes must be resolved (> 0).
Model build_mlp(const ModelConfig& cfg, int64_t in_features, int64_t num_classes);

// Owns the flat buffers for one model replica: values and gradients, same layout.
struct ParamStore {
  std::vector<float> values;
  std::vector<float> grads;
  explicit ParamStore(int64_t n = 0)
      : values(static_cast<size_t>(n)), grads(static_cast<size_t>(n)) {}
};

}  // namespace dtrain
