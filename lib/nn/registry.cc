#include "nn/registry.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/image_layers.h"
#include "nn/layer.h"
#include "util/check.h"

namespace dtrain {
namespace {

Conv2dSpec conv_spec(const LayerSpec& spec) {
  return {spec.out, spec.kernel, spec.stride > 0 ? spec.stride : 1, spec.padding};
}

Pool2dSpec pool_spec(const LayerSpec& spec) {
  Pool2dSpec p;
  p.kernel = spec.kernel;
  if (spec.stride > 0) p.stride = spec.stride;
  return p;
}

std::string where_of(const std::vector<LayerSpec>& specs, size_t i) {
  return "model.layers[" + std::to_string(i) + "] (" + std::string(to_string(specs[i].kind)) + ")";
}

// How many list entries from i form one fused element: 3 for conv2d, relu, max_pool2d; 2 for
// conv2d, relu; else 1 (make_conv2d_relu, nn/image_layers.h).
size_t fused_span(const std::vector<LayerSpec>& specs, size_t i) {
  const auto kind_at = [&](size_t j, LayerKind k) {
    return j < specs.size() && specs[j].kind == k;
  };
  if (!kind_at(i, LayerKind::kConv2d) || !kind_at(i + 1, LayerKind::kRelu)) return 1;
  return kind_at(i + 2, LayerKind::kMaxPool2d) ? 3 : 2;
}

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
      const Conv2dSpec c = conv_spec(spec);
      fits(conv2d_error(in, c));
      return make_conv2d(in, c);
    }
    case LayerKind::kMaxPool2d:
    case LayerKind::kAvgPool2d: {
      const Pool2dSpec p = pool_spec(spec);
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

Shape sequential_output_shape(const std::vector<LayerSpec>& specs, const Shape& sample) {
  if (specs.empty())
    throw UserError("model.layers is empty: model.type sequential needs a layer list");
  Shape shape = sample;
  for (size_t i = 0; i < specs.size(); ++i)
    shape = make_sequential_layer(specs[i], shape, where_of(specs, i))->out_shape();
  return shape;
}

Model build_sequential(const std::vector<LayerSpec>& specs, const ModelInput& in) {
  if (specs.empty())
    throw UserError(
        "model.layers is empty: model.type sequential needs a layer list, e.g. "
        "[{linear: 128}, relu, {linear: " +
        std::to_string(in.num_classes) + "}]");
  // Every list entry is built (and checked, with its own index in errors) as its own layer
  // first; fused runs then replace theirs. An element keeps its first entry's name
  // ("layers.<i>"), init stream and dropout site, so parameters, their init and dropout masks
  // do not depend on fusion.
  std::vector<std::unique_ptr<Layer>> layers;
  Shape shape = in.sample;
  for (size_t i = 0; i < specs.size(); ++i) {
    layers.push_back(make_sequential_layer(specs[i], shape, where_of(specs, i)));
    shape = layers.back()->out_shape();
  }
  if (shape != Shape{in.num_classes})
    throw UserError("model.layers: the last layer gives " + shape_str(shape) + " per sample, but " +
                    (in.classes_from_config
                         ? "model.num_classes is " + std::to_string(in.num_classes)
                         : "the data has " + std::to_string(in.num_classes) +
                               " classes (labels 0.." + std::to_string(in.num_classes - 1) +
                               " over the training and test data)") +
                    (shape.size() > 1 && shape.back() == in.num_classes &&
                             specs.back().kind == LayerKind::kLinear
                         ? ": add a flatten before the list's linear layers (a linear maps the "
                           "last dimension only)"
                         : ": end the list with {linear: " + std::to_string(in.num_classes) +
                               "} (after a flatten for image shapes)"));
  std::vector<ModelElement> elements;
  for (size_t i = 0; i < specs.size();) {
    const size_t n = fused_span(specs, i);
    ModelElement e;
    e.prefix = "layers." + std::to_string(i);
    e.init_stream = e.site = static_cast<int64_t>(i);
    if (n == 1) {
      e.layer = std::move(layers[i]);
    } else {
      std::optional<Pool2dSpec> pool;
      if (n == 3) pool = pool_spec(specs[i + 2]);
      e.layer = make_conv2d_relu(layers[i]->in_shape(), conv_spec(specs[i]), pool);
    }
    elements.push_back(std::move(e));
    i += n;
  }
  return Model(std::move(elements));
}

Model build_model(const ModelConfig& cfg, const ModelInput& in) {
  switch (cfg.type) {
    case ModelType::kMlp:
      return build_mlp(cfg, shape_numel(in.sample), in.num_classes);
    case ModelType::kSequential: {
      ModelInput named = in;
      named.classes_from_config = cfg.num_classes > 0 && cfg.num_classes == in.num_classes;
      return build_sequential(cfg.layers, named);
    }
    case ModelType::kGpt:
      // The input is [T] token ids; the vocabulary is the class count (256 bytes).
      return build_gpt(cfg, in.num_classes, in.sample.empty() ? cfg.block_size : in.sample[0]);
  }
  DT_CHECK_MSG(false, "unknown model type " << static_cast<int>(cfg.type));
  return Model();
}

}  // namespace dtrain
