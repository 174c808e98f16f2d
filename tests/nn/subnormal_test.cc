// Layers compute with subnormal floats flushed to zero (tensor/fp_mode.h), and only layers: the
// caller's floating-point mode is the same after Model::forward / backward as before, also when
// the caller had flushing on itself, and on_layer_done runs in the caller's mode.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <memory>
#include <vector>

#include "nn/layer.h"
#include "nn/model.h"
#include "tensor/fp_mode.h"

namespace dtrain {
namespace {

// A subnormal: 2^-130.
const float kSub = std::ldexp(1.0f, -130);

// Defeats constant folding: the arithmetic below must run on the CPU in the current mode.
float opaque(float x) {
  volatile float v = x;
  return v;
}

Model one_linear(int64_t in, int64_t out) {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(make_linear({in}, out, Init::kXavier));
  return Model(std::move(layers));
}

TEST_CASE("FlushSubnormals: flushes inside its scope, restores the mode after it") {
  REQUIRE(std::fpclassify(kSub) == FP_SUBNORMAL);
  CHECK(opaque(kSub) * opaque(1.0f) == kSub);  // IEEE mode outside any scope
  {
    const FlushSubnormals flush;
    CHECK(opaque(kSub) * opaque(1.0f) == 0.0f);     // input treated as zero
    CHECK(opaque(FLT_MIN) * opaque(0.5f) == 0.0f);  // subnormal result flushed
    {
      const FlushSubnormals nested;  // already on: stays on, and stays on after it
      CHECK(opaque(FLT_MIN) * opaque(0.5f) == 0.0f);
    }
    CHECK(opaque(FLT_MIN) * opaque(0.5f) == 0.0f);
  }
  CHECK(opaque(FLT_MIN) * opaque(0.5f) == FLT_MIN / 2);
}

TEST_CASE("Model: layers flush subnormal inputs and results, and the caller's mode is kept") {
  const Model m = one_linear(2, 1);
  std::vector<float> p = {1.0f, 0.5f, 0.0f};  // W [1, 2], b [1]
  Tensor x({1, 2});
  x.data()[0] = kSub;     // subnormal input: counts as zero
  x.data()[1] = FLT_MIN;  // 0.5 * FLT_MIN is a subnormal result: flushed
  Activations acts;
  const Tensor& y = m.forward(p.data(), x, acts, ForwardCtx{});
  CHECK(y.data()[0] == 0.0f);
  CHECK(opaque(kSub) * opaque(1.0f) == kSub);  // the caller computes in IEEE mode again

  // Backward: dW = dy^T x with dy = 1 gives x as it is seen inside the layer (the subnormal
  // input as 0); db = dy. on_layer_done runs in the caller's IEEE mode.
  Tensor dy({1, 1});
  dy.data()[0] = 1.0f;
  std::vector<float> g(3, 0.0f);
  bool called = false;
  m.backward(p.data(), g.data(), x, acts, dy, nullptr, 0, SIZE_MAX, [&](size_t) {
    called = true;
    CHECK(opaque(kSub) * opaque(1.0f) == kSub);
  });
  CHECK(called);
  CHECK(g[0] == 0.0f);
  CHECK(g[1] == FLT_MIN);
  CHECK(g[2] == 1.0f);

  // A caller that flushes itself keeps flushing after the model returns.
  const FlushSubnormals flush;
  m.forward(p.data(), x, acts, ForwardCtx{});
  CHECK(opaque(kSub) * opaque(1.0f) == 0.0f);
}

}  // namespace
}  // namespace dtrain
