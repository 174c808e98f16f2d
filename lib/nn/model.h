// A model is a sequence of layers plus the table that places their parameters in one flat float
// buffer (llm.c / FSDP flat-parameter style). Gradients and every optimizer state buffer use the
// same layout, so buckets, shards, pipeline stages and checkpoints are ranges of these buffers.
// The elements of the sequence are the units that buckets, FSDP units and pipeline stages cut
// along; an element may be a composite layer (a transformer block) with child layers inside.
//
// Parameter names are the element's prefix plus the layer's own names: "layers.<i>.<param>" by
// default (PyTorch's nn.Sequential: layers.0.weight [512, 784]), or a prefix given per element
// ("transformer.h.3" + "attn.c_attn.weight"). Element i's parameters occupy
// [layer_begin(i), layer_end(i)).
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

// More parameter values than any machine holds (4 TiB of float32): model construction refuses
// models above it, so offsets and counts never overflow int64.
inline constexpr int64_t kMaxParamValues = int64_t{1} << 40;

struct ParamEntry {
  std::string name;  // "layers.0.weight"
  Shape shape;
  int64_t offset = 0;  // in floats, into the flat buffer
  int64_t numel = 0;
  int layer = 0;  // index of the owning layer
};

// Per-forward storage: out[i] is layer i's output, state[i] its backward state, ctx the forward's
// context (backward runs under it). Reused across steps (no allocation once sizes settle).
struct Activations {
  std::vector<Tensor> out;
  std::vector<LayerState> state;
  std::vector<Tensor> grad;  // scratch for activation gradients during backward
  LayerCtx ctx;              // of the last forward, rng and rows cleared
  int64_t bytes() const;     // bytes currently held in out + state
};

// One element of a model's top-level sequence: its parameter-name prefix and its layer.
struct ModelElement {
  std::string prefix;  // "layers.3", "transformer.h.0"; "" for names without a prefix
  std::unique_ptr<Layer> layer;
  // The stream (seed, init_stream) the element initialises from; -1: its index. A tied copy's
  // element draws from its primary's stream, so both start equal wherever each is initialised.
  int64_t init_stream = -1;
  // The element's dropout site (LayerCtx::site); -1: its index. A fused element keeps its first
  // list entry's (nn/registry.cc), so masks do not depend on fusion.
  int64_t site = -1;
};

// Two copies of one parameter (weight tying): `mirror` is kept equal to `primary` (indices into
// Model::params()). Both live in the flat layout, each inside its own element, so units, shards
// and stages stay ranges; the training loop sums their gradients every step.
struct TiedParam {
  size_t primary = 0, mirror = 0;
};

class Model {
 public:
  Model() = default;
  // Elements named "layers.<i>" (nn.Sequential's names).
  explicit Model(std::vector<std::unique_ptr<Layer>> layers);
  // ties: (primary name, mirror name) pairs of equal-shaped parameters.
  explicit Model(std::vector<ModelElement> elements,
                 const std::vector<std::pair<std::string, std::string>>& ties = {});

  size_t num_layers() const { return layers_.size(); }
  const Layer& layer(size_t i) const { return *layers_[i].layer; }
  const std::string& layer_prefix(size_t i) const { return layers_[i].prefix; }
  const std::vector<ParamEntry>& params() const { return table_; }
  int64_t param_count() const { return total_; }
  // Parameters as PyTorch counts them (model.parameters() yields a tied tensor once): the
  // flat count without the tied copies.
  int64_t distinct_param_count() const;
  int64_t layer_begin(size_t i) const { return layer_offset_[i]; }
  int64_t layer_end(size_t i) const { return layer_offset_[i + 1]; }
  // Per-sample input and output shapes ([784] -> [10]; [T] tokens -> [T, 256] logits).
  const Shape& in_shape() const;
  const Shape& out_shape() const;
  int64_t in_features() const;   // elements per input sample
  int64_t out_features() const;  // elements per output sample
  // Outputs are rows of out_shape().back() scores: 1 per sample for a classifier, T for a
  // language model (each row has its own target).
  int64_t targets_per_sample() const;
  const ParamEntry* find(const std::string& name) const;  // null when absent
  const std::vector<TiedParam>& ties() const { return ties_; }
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
  // params + layer_begin(i) - base. Layer i runs under ctx with ctx.site = i.
  const Tensor& forward(const float* params, const Tensor& x, Activations& acts,
                        const ForwardCtx& ctx, size_t first = 0, size_t last = SIZE_MAX,
                        int64_t base = 0) const;

  // Backward through layers [first, last) in reverse, given dy = gradient w.r.t. the output of
  // layer last-1, under the context of the forward that filled acts. Accumulates into grads (flat
  // buffer, full layout). Writes dx (the gradient with respect to x) only when dx != null. After
  // each layer's gradients are final, calls on_layer_done(i) if set (DDP starts bucket reductions
  // from there). params and grads hold the flat layout from element `base` on, as in forward.
  void backward(const float* params, float* grads, const Tensor& x, Activations& acts,
                const Tensor& dy, Tensor* dx, size_t first = 0, size_t last = SIZE_MAX,
                const std::function<void(size_t)>& on_layer_done = {}, int64_t base = 0) const;

 private:
  std::vector<ModelElement> layers_;
  std::vector<TiedParam> ties_;
  std::vector<ParamEntry> table_;
  std::vector<int64_t> layer_offset_;  // size num_layers + 1
  int64_t total_ = 0;
};

// Builds the MLP described by `cfg` (hidden widths from the complexity preset, else cfg.hidden):
// for each hidden width h: Linear(prev, h), [LayerNorm(h)], activation, [Dropout(p)]; then
// Linear(prev, num_classes). in_features and num_classes must be resolved (> 0).
Model build_mlp(const ModelConfig& cfg, int64_t in_features, int64_t num_classes);

// Gives both copies of every tied parameter the sum of their gradients, in a buffer holding the
// whole flat layout (one process, or replicated gradients after their all-reduce).
void sum_tied_grads(const Model& m, float* grads);

// Owns the flat buffers for one model replica: values and gradients, same layout.
struct ParamStore {
  std::vector<float> values;
  std::vector<float> grads;
  explicit ParamStore(int64_t n = 0)
      : values(static_cast<size_t>(n)), grads(static_cast<size_t>(n)) {}
};

}  // namespace dtrain
