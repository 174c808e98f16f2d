// The model registry: one entry point that builds the model a config describes, keyed on
// model.type, for run, eval, predict and generate alike.
#pragma once

#include <cstdint>

#include "nn/model.h"
#include "nn/options.h"
#include "tensor/tensor.h"

namespace dtrain {

// What the data gives the model: the per-sample input shape and the number of classes (the
// vocabulary, for token data).
struct ModelInput {
  Shape sample;
  int64_t num_classes = 0;
  // Where num_classes comes from, for errors: model.num_classes (true) or the data's labels.
  bool classes_from_config = false;
};

// mlp: build_mlp over the flattened input. sequential: cfg.layers in order, each built for the
// shape the previous one produces, initialised as PyTorch initialises the same nn.Sequential;
// the last layer must produce [num_classes]. A layer that does not fit its input is a UserError
// naming its index: "model.layers[3] (conv2d): kernel 5x5 is larger than ...".
Model build_model(const ModelConfig& cfg, const ModelInput& in);

// The sequential model alone (exposed for tests).
Model build_sequential(const std::vector<LayerSpec>& layers, const ModelInput& in);

// The per-sample shape a sequential layer list produces from `sample` (its output width is the
// list's, whatever the data's classes); UserError as build_sequential for a layer that does not
// fit, or an empty list.
Shape sequential_output_shape(const std::vector<LayerSpec>& layers, const Shape& sample);

}  // namespace dtrain
