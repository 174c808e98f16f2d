// The model registry: sequential models carry nn.Sequential's names, shapes and init; layer lists
// that do not fit their input are user errors naming the entry.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "layer_spec_util.h"
#include "nn/registry.h"
#include "util/check.h"

namespace dtrain {
namespace {

using testing::L;

std::vector<LayerSpec> cnn_ref() {
  using K = LayerKind;
  return {L(K::kConv2d, 32, 3, 1, 1),
          L(K::kRelu),
          L(K::kMaxPool2d, 0, 2, 2),
          L(K::kConv2d, 64, 3, 1, 1),
          L(K::kRelu),
          L(K::kMaxPool2d, 0, 2, 2),
          L(K::kFlatten),
          L(K::kLinear, 128),
          L(K::kRelu),
          L(K::kLinear, 10)};
}

std::string error_of(const std::vector<LayerSpec>& layers, const Shape& sample) {
  try {
    build_sequential(layers, {sample, 10});
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_CASE("registry: cnn-ref has torch.nn.Sequential's names, shapes and parameter count") {
  ModelConfig cfg;
  cfg.type = ModelType::kSequential;
  cfg.layers = cnn_ref();
  const Model m = build_model(cfg, {{1, 28, 28}, 10});
  CHECK(m.param_count() == 421642);  // the peer's count
  const std::vector<std::pair<std::string, Shape>> expect = {
      {"layers.0.weight", {32, 1, 3, 3}},  {"layers.0.bias", {32}},
      {"layers.3.weight", {64, 32, 3, 3}}, {"layers.3.bias", {64}},
      {"layers.7.weight", {128, 3136}},    {"layers.7.bias", {128}},
      {"layers.9.weight", {10, 128}},      {"layers.9.bias", {10}}};
  REQUIRE(m.params().size() == expect.size());
  for (size_t i = 0; i < expect.size(); ++i) {
    CHECK(m.params()[i].name == expect[i].first);
    CHECK(m.params()[i].shape == expect[i].second);
  }
  CHECK(m.out_shape() == Shape{10});
  // PyTorch's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases alike.
  std::vector<float> p(static_cast<size_t>(m.param_count()));
  m.init(p.data(), 3);
  for (const ParamEntry& e : m.params()) {
    const int64_t fan_in = e.name == "layers.0.weight" || e.name == "layers.0.bias" ? 9
                           : e.name.starts_with("layers.3")                         ? 288
                           : e.name.starts_with("layers.7")                         ? 3136
                                                                                    : 128;
    const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
    float lo = 1, hi = -1;
    for (int64_t i = 0; i < e.numel; ++i) {
      lo = std::min(lo, p[static_cast<size_t>(e.offset + i)]);
      hi = std::max(hi, p[static_cast<size_t>(e.offset + i)]);
    }
    INFO(e.name);
    CHECK(lo >= -bound);
    CHECK(hi <= bound);
    if (e.numel >= 100) CHECK(hi - lo > 1.8f * bound);  // spread over the whole interval
  }
  // The input shape comes from the data: a flat [784] CSV row does not fit a convolution.
  CHECK(error_of(cnn_ref(), {784}) ==
        "model.layers[0] (conv2d): expects a [C, H, W] input, got [784]");
}

TEST_CASE("registry: layer lists that do not fit are errors naming the entry") {
  using K = LayerKind;
  CHECK(error_of({L(K::kConv2d, 8, 5), L(K::kFlatten), L(K::kLinear, 10)}, {1, 3, 3})
            .starts_with("model.layers[0] (conv2d): kernel 5x5 is larger than"));
  CHECK(error_of({L(K::kMaxPool2d, 0, 2, 2), L(K::kMaxPool2d, 0, 2, 2), L(K::kFlatten),
                  L(K::kLinear, 10)},
                 {1, 3, 3})
            .starts_with("model.layers[1] (max_pool2d): "));
  CHECK(error_of({L(K::kConv2d, 8, 3)}, {1, 8, 8}) ==
        "model.layers: the last layer gives [8, 6, 6] per sample, but the data has 10 classes "
        "(labels 0..9 over the training and test data): "
        "end the list with {linear: 10} (after a flatten for image shapes)");
  CHECK(error_of({}, {4}).starts_with("model.layers is empty"));
  // Linear works on the last dimension, as torch.nn.Linear: [1, 28, 28] -> [1, 28, 10].
  // No linear at all, but a last dimension that happens to equal the classes: end with one.
  CHECK(error_of({L(K::kConv2d, 4, 3), L(K::kRelu)}, {1, 12, 12})
            .ends_with(": end the list with {linear: 10} (after a flatten for image shapes)"));
  // The list already ends with the classes' linear: the flatten is what it lacks.
  CHECK(error_of({L(K::kRelu), L(K::kLinear, 10)}, {1, 28, 28}) ==
        "model.layers: the last layer gives [1, 28, 10] per sample, but the data has 10 classes "
        "(labels 0..9 over the training and test data): add a flatten before the list's linear "
        "layers (a linear maps the last dimension only)");
  CHECK(error_of({L(K::kFlatten), L(K::kLinear, 10)}, {1, 28, 28}) == "(no error)");
  // A class count set by model.num_classes is named as that, not as the data's labels.
  ModelConfig cfg;
  cfg.type = ModelType::kSequential;
  cfg.layers = cnn_ref();
  cfg.num_classes = 12;
  CHECK_THROWS_WITH(build_model(cfg, {{1, 28, 28}, 12}),
                    "model.layers: the last layer gives [10] per sample, but model.num_classes "
                    "is 12: end the list with {linear: 12} (after a flatten for image shapes)");
}

TEST_CASE("registry: mlp builds the same model as build_mlp over the flattened sample") {
  ModelConfig cfg;
  cfg.hidden = {16};
  const Model a = build_model(cfg, {{1, 4, 4}, 3});
  const Model b = build_mlp(cfg, 16, 3);
  REQUIRE(a.params().size() == b.params().size());
  for (size_t i = 0; i < a.params().size(); ++i) {
    CHECK(a.params()[i].name == b.params()[i].name);
    CHECK(a.params()[i].shape == b.params()[i].shape);
  }
}

}  // namespace
}  // namespace dtrain
