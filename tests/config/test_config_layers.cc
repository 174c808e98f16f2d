// model.layers (model.type sequential): every entry form, config.json round trip, and errors that
// name the entry's index.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "config/config.h"
#include "util/check.h"

namespace dtrain {
namespace {

const char* const kBase = "data: {format: synthetic}\nmodel:\n  type: sequential\n";

std::string error_of(const std::string& layers) {
  try {
    parse_config(std::string(kBase) + "  layers: " + layers + "\n", "x.yaml", {});
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_CASE("config: model.layers reads every layer form") {
  const Config c = parse_config(std::string(kBase) + R"(  layers:
    - {conv2d: {out_channels: 32, kernel: 3, padding: 1}}
    - relu
    - {max_pool2d: 2}
    - {avg_pool2d: {kernel: 3, stride: 1}}
    - flatten
    - {dropout: 0.25}
    - dropout
    - layer_norm
    - {linear: 128}
    - {linear: {out_features: 10}}
    - {gelu: {}}
)",
                                "x.yaml", {});
  const auto& l = c.model.layers;
  REQUIRE(l.size() == 11);
  CHECK(l[0] == LayerSpec{LayerKind::kConv2d, 32, 3, 1, 1, 0.5});
  CHECK(l[1].kind == LayerKind::kRelu);
  CHECK(l[2] == LayerSpec{LayerKind::kMaxPool2d, 0, 2, 2, 0, 0.5});  // stride = kernel
  CHECK(l[3] == LayerSpec{LayerKind::kAvgPool2d, 0, 3, 1, 0, 0.5});
  CHECK(l[4].kind == LayerKind::kFlatten);
  CHECK(l[5].p == 0.25);
  CHECK(l[6].p == 0.5);  // PyTorch's default
  CHECK(l[7].kind == LayerKind::kLayerNorm);
  CHECK(l[8].out == 128);
  CHECK(l[9].out == 10);
  CHECK(l[10].kind == LayerKind::kGelu);
  // config.json writes a canonical form that reads back to the same list and hash.
  const std::string json = config_to_json(c).dump();
  const Config back = parse_config(json, "config.json", {});
  CHECK(back.model.layers == l);
  CHECK(config_hash(back) == config_hash(c));
  // Another list is another config.
  const Config other =
      parse_config(std::string(kBase) + "  layers: [{linear: 10}]\n", "x.yaml", {});
  CHECK(config_hash(other) != config_hash(c));
  // --set replaces the list.
  const Config set =
      parse_config(std::string(kBase), "x.yaml", {"model.layers=[relu, {linear: 4}]"});
  REQUIRE(set.model.layers.size() == 2);
  CHECK(set.model.layers[1].out == 4);
}

TEST_CASE("config: model.layers errors name the entry") {
  CHECK(error_of("[relu, {conv: 3}]") ==
        "x.yaml:4:18: model.layers[1]: unknown layer: must be one of linear, conv2d, max_pool2d, "
        "avg_pool2d, flatten, relu, gelu, tanh, sigmoid, dropout, layer_norm (got 'conv'; did you "
        "mean 'conv2d'?)");
  CHECK(error_of("[{linear: 0}]").find("model.layers[0].linear: must be >= 1 (got 0)") !=
        std::string::npos);
  CHECK(error_of("[{conv2d: {out_channels: 8, kernal: 3}}]")
            .find("model.layers[0].conv2d.kernal: unknown field 'kernal' (did you mean "
                  "'kernel'?); expected out_channels, kernel, stride, padding") !=
        std::string::npos);
  CHECK(error_of("[{linear: {out_features: 4, out_features: 8}}]")
            .find("model.layers[0].linear.out_features: duplicate field 'out_features'") !=
        std::string::npos);
  CHECK(error_of("[{conv2d: {out_channels: 8}}]").find("conv2d needs out_channels and kernel") !=
        std::string::npos);
  CHECK(error_of("[max_pool2d]").find("model.layers[0]: max_pool2d needs its kernel") !=
        std::string::npos);
  CHECK(error_of("[{relu: 3}]").find("relu takes no value") != std::string::npos);
  CHECK(error_of("[{dropout: 1.5}]").find("dropout probability must be in [0, 1) (got 1.5)") !=
        std::string::npos);
  CHECK(error_of("[{linear: 4, relu: null}]").find("expected a layer") != std::string::npos);
  CHECK(error_of("relu").find("expected a list of layers") != std::string::npos);
  // An empty list (or none) is refused by the config check, so `dtrain validate` sees it.
  CHECK(error_of("[]").find("model.layers: must not be empty: model.type sequential needs a layer "
                            "list") != std::string::npos);
  try {
    parse_config(std::string(kBase), "x.yaml", {});
    FAIL("no error");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("model.layers: must not be empty") != std::string::npos);
  }
  // Keys of the other model type are refused, naming the owner.
  try {
    parse_config(std::string(kBase) + "  hidden: [8]\n", "x.yaml", {});
    FAIL("no error");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("model.hidden") != std::string::npos);
    CHECK(std::string(e.what()).find("by model type mlp") != std::string::npos);
  }
  try {
    parse_config("data: {format: synthetic}\nmodel: {layers: [relu]}\n", "x.yaml", {});
    FAIL("no error");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("by model type sequential") != std::string::npos);
  }
}

}  // namespace
}  // namespace dtrain
