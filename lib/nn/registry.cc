#include "nn/registry.h"

#include <memory>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/image_layers.h"
#include "nn/layer.h"
#include "util/check.h"

namespace dtrain {
namespace {

// Layer i of `spec` built for input shape `in`; "" from the *_error checks means it fits.
std::unique_ptr<Layer> make_sequential_layer(const LayerSpec& spec, const Shape& in,
                                             const std::string& where) {
  auto fits = [&](const std::string& why) {
    if (!why.empty()) throw UserError(where + ": " + why);
  };
  switch (spec.kind) {
    case LayerKind::kLinear:
      fits(in.empty() ? "needs an input with at least one dimension" : "");
      return make_linear(in, spec.out, Init::kTorch);
    case LayerKind::kConv2d: {
      const Conv2dSpec c{spec.out, spec.kernel, spec.stride > 0 ? spec.stride : 1, spec.padding};
      fits(conv2d_error(in, c));
      return make_conv2d(in, c);
    }
    case LayerKind::kMaxPool2d:
    case LayerKind::kAvgPool2d: {
      Pool2dSpec p;
      p.kernel = spec.kernel;
      if (spec.stride > 0) p.stride = spec.stride;
      fits(pool2d_error(in, p));
      return spec.kind == LayerKind::kMaxPool2d ? make_max_pool2d(in, p) : make_avg_pool2d(in, p);
    }
    case LayerKind::kFlatten:
      return make_flatten(in);
    case LayerKind::kRelu:
      return make_activation(Activation::kRelu, in);
    case LayerKind::kGelu:
      return make_activation(Activation::kGelu, in);
    case LayerKind::kTanh:
      return make_activation(Activation::kTanh, in);
    case LayerKind::kSigmoid:
      return make_activation(Activation::kSigmoid, in);
    case LayerKind::kDropout:
      return make_dropout(in, spec.p);
    case LayerKind::kLayerNorm:
      return make_layer_norm(in);
  }
  DT_CHECK_MSG(false, "unknown layer kind " << static_cast<int>(spec.kind));
  return nullptr;
}

}  // namespace

Model build_sequential(const std::vector<LayerSpec>& specs, const ModelInput& in) {
  if (specs.empty())
    throw UserError(
        "model.layers is empty: model.type sequential needs a layer list, e.g. "
        "[{linear: 128}, relu, {linear: " +
        std::to_string(in.num_classes) + "}]");
  std::vector<std::unique_ptr<Layer>> layers;
  Shape shape = in.sample;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string where =
        "model.layers[" + std::to_string(i) + "] (" + std::string(to_string(specs[i].kind)) + ")";
    layers.push_back(make_sequential_layer(specs[i], shape, where));
    shape = layers.back()->out_shape();
  }
  if (shape != Shape{in.num_classes})
    throw UserError("model.layers: the last layer gives " + shape_str(shape) +
                    " per sample, but the data has " + std::to_string(in.num_classes) +
                    " classes: end the list with {linear: " + std::to_string(in.num_classes) +
                    "} (after a flatten for image shapes)");
  return Model(std::move(layers));
}

Model build_model(const ModelConfig& cfg, const ModelInput& in) {
  switch (cfg.type) {
    case ModelType::kMlp:
      return build_mlp(cfg, shape_numel(in.sample), in.num_classes);
    case ModelType::kSequential:
      return build_sequential(cfg.layers, in);
    case ModelType::kGpt:
      // The input is [T] token ids; the vocabulary is the class count (256 bytes).
      return build_gpt(cfg, in.num_classes, in.sample.empty() ? cfg.block_size : in.sample[0]);
  }
  DT_CHECK_MSG(false, "unknown model type " << static_cast<int>(cfg.type));
  return Model();
}

}  // namespace dtrain
