// What lib/nn needs to know to build a model: its own option struct and enums. lib/config reads
// them from YAML (the key schema, defaults' documentation and checks live there); nothing in
// lib/nn parses text.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "util/enum_names.h"

namespace dtrain {

enum class ModelType { kMlp, kSequential, kGpt };
enum class Complexity { kNone, kSimple, kMedium, kComplex };
enum class Activation { kRelu, kGelu, kTanh, kSigmoid };
enum class WeightInit { kAuto, kKaiming, kXavier };
enum class Loss { kCrossEntropy, kMse };

inline constexpr EnumName<ModelType> kModelTypeNames[] = {
    {ModelType::kMlp, "mlp"}, {ModelType::kSequential, "sequential"}, {ModelType::kGpt, "gpt"}};

// The layers of `model.type: sequential` (PyTorch's nn.Sequential over the same list).
enum class LayerKind {
  kLinear,
  kConv2d,
  kMaxPool2d,
  kAvgPool2d,
  kFlatten,
  kRelu,
  kGelu,
  kTanh,
  kSigmoid,
  kDropout,
  kLayerNorm
};
inline constexpr EnumName<LayerKind> kLayerKindNames[] = {{LayerKind::kLinear, "linear"},
                                                          {LayerKind::kConv2d, "conv2d"},
                                                          {LayerKind::kMaxPool2d, "max_pool2d"},
                                                          {LayerKind::kAvgPool2d, "avg_pool2d"},
                                                          {LayerKind::kFlatten, "flatten"},
                                                          {LayerKind::kRelu, "relu"},
                                                          {LayerKind::kGelu, "gelu"},
                                                          {LayerKind::kTanh, "tanh"},
                                                          {LayerKind::kSigmoid, "sigmoid"},
                                                          {LayerKind::kDropout, "dropout"},
                                                          {LayerKind::kLayerNorm, "layer_norm"}};
constexpr std::span<const EnumName<LayerKind>> enum_names(LayerKind) {
  return kLayerKindNames;
}

// One entry of model.layers. Which fields apply depends on the kind:
//   linear: out (features);  conv2d: out (channels), kernel, stride (default 1), padding;
//   max_pool2d, avg_pool2d: kernel, stride (default: kernel);  dropout: p.
struct LayerSpec {
  LayerKind kind = LayerKind::kRelu;
  int64_t out = 0;
  int64_t kernel = 0;
  int64_t stride = 0;  // 0: the kind's default
  int64_t padding = 0;
  double p = 0.5;
  bool operator==(const LayerSpec&) const = default;
};
// kNone is "" (no preset, the default): config.json writes it; not offered as a choice.
inline constexpr EnumName<Complexity> kComplexityNames[] = {{Complexity::kNone, ""},
                                                            {Complexity::kSimple, "simple"},
                                                            {Complexity::kMedium, "medium"},
                                                            {Complexity::kComplex, "complex"}};
inline constexpr EnumName<Activation> kActivationNames[] = {{Activation::kRelu, "relu"},
                                                            {Activation::kGelu, "gelu"},
                                                            {Activation::kTanh, "tanh"},
                                                            {Activation::kSigmoid, "sigmoid"}};
inline constexpr EnumName<WeightInit> kWeightInitNames[] = {{WeightInit::kAuto, "auto"},
                                                            {WeightInit::kKaiming, "kaiming"},
                                                            {WeightInit::kXavier, "xavier"}};
inline constexpr EnumName<Loss> kLossNames[] = {{Loss::kCrossEntropy, "cross_entropy"},
                                                {Loss::kMse, "mse"}};

constexpr std::span<const EnumName<ModelType>> enum_names(ModelType) {
  return kModelTypeNames;
}
constexpr std::span<const EnumName<Complexity>> enum_names(Complexity) {
  return kComplexityNames;
}
constexpr std::span<const EnumName<Activation>> enum_names(Activation) {
  return kActivationNames;
}
constexpr std::span<const EnumName<WeightInit>> enum_names(WeightInit) {
  return kWeightInitNames;
}
constexpr std::span<const EnumName<Loss>> enum_names(Loss) {
  return kLossNames;
}

// Hidden widths of a preset; kNone has none (the model's `hidden` applies).
//   simple: [128]   medium: [512, 512]   complex: [1024, 1024, 512, 256]
inline std::vector<int64_t> complexity_preset(Complexity c) {
  switch (c) {
    case Complexity::kSimple:
      return {128};
    case Complexity::kMedium:
      return {512, 512};
    case Complexity::kComplex:
      return {1024, 1024, 512, 256};
    case Complexity::kNone:
      break;
  }
  DT_CHECK_MSG(false, "complexity_preset of no preset");
  return {};
}

struct ModelConfig {
  ModelType type = ModelType::kMlp;
  std::vector<LayerSpec> layers;  // type sequential: the layer list, in order
  // type gpt (nanoGPT's names): blocks, heads (dividing n_embd), width, context length, and
  // whether the output head is the token embedding (tied).
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  int64_t block_size = 64;
  bool tie_embeddings = true;
  // Preset that sets `hidden` (and nothing else); giving both `complexity` and `hidden` is an
  // error. load_config resolves it into `hidden`.
  Complexity complexity = Complexity::kNone;
  std::vector<int64_t> hidden = {512, 512};  // hidden layer widths, each >= 1; may be empty
  Activation activation = Activation::kRelu;
  double dropout = 0.0;                 // after each hidden activation, in [0, 1)
  bool layer_norm = false;              // LayerNorm after each hidden Linear (before activation)
  WeightInit init = WeightInit::kAuto;  // auto: kaiming for relu/gelu, xavier for tanh/sigmoid
  Loss loss = Loss::kCrossEntropy;      // mse on one-hot targets
  int64_t input_features = 0;           // 0: inferred from the data
  int64_t num_classes = 0;              // 0: inferred from the data (max label + 1)
};

}  // namespace dtrain
