// Model: parameter table, initialisation, range forward/backward (pipeline split), gradient
// accumulation, the skipped input gradient of layer 0, batch sizes 0 and 1, describe().
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "nn/layer.h"
#include "nn/loss.h"
#include "nn/model.h"
#include "util/check.h"
#include "util/rng.h"

namespace dtrain_test {
long allocations();  // heap allocations so far (alloc_counter.cc)
}  // namespace dtrain_test

namespace dtrain {
namespace {

void fill_uniform(float* v, int64_t n, Rng& rng, float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * rng.uniform();
}

Tensor random_input(int64_t batch, int64_t features, uint64_t seed) {
  Rng rng(seed, 1);
  Tensor x({batch, features});
  fill_uniform(x.data(), x.numel(), rng, -1.0f, 1.0f);
  return x;
}

bool same(const float* a, const float* b, int64_t n) {
  return n == 0 || std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

// max |a - b| / max(1, max |b|).
double rel_diff(const float* a, const float* b, int64_t n) {
  double err = 0.0, scale = 1.0;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return err / scale;
}

ModelConfig mlp_config(std::vector<int64_t> hidden, const std::string& act, bool layer_norm,
                       double dropout) {
  ModelConfig cfg;
  cfg.hidden = std::move(hidden);
  cfg.activation = parse_enum<Activation>(act).value();
  cfg.layer_norm = layer_norm;
  cfg.dropout = dropout;
  return cfg;
}

TEST_CASE("model: build_mlp layer sequence and parameter table") {
  const Model m = build_mlp(mlp_config({5, 4}, "relu", true, 0.1), 7, 3);
  const std::vector<std::string> kinds = {"linear",  "layer_norm", "relu",
                                          "dropout", "linear",     "layer_norm",
                                          "relu",    "dropout",    "linear"};
  REQUIRE(m.num_layers() == kinds.size());
  for (size_t i = 0; i < kinds.size(); ++i) CHECK(m.layer(i).kind() == kinds[i]);
  CHECK(m.in_features() == 7);
  CHECK(m.out_features() == 3);

  struct Expect {
    std::string name;
    Shape shape;
    int layer;
  };
  const std::vector<Expect> expect = {{"layers.0.weight", {5, 7}, 0}, {"layers.0.bias", {5}, 0},
                                      {"layers.1.weight", {5}, 1},    {"layers.1.bias", {5}, 1},
                                      {"layers.4.weight", {4, 5}, 4}, {"layers.4.bias", {4}, 4},
                                      {"layers.5.weight", {4}, 5},    {"layers.5.bias", {4}, 5},
                                      {"layers.8.weight", {3, 4}, 8}, {"layers.8.bias", {3}, 8}};
  REQUIRE(m.params().size() == expect.size());
  int64_t offset = 0;
  for (size_t k = 0; k < expect.size(); ++k) {
    const ParamEntry& e = m.params()[k];
    INFO(e.name);
    CHECK(e.name == expect[k].name);
    CHECK(e.shape == expect[k].shape);
    CHECK(e.layer == expect[k].layer);
    CHECK(e.offset == offset);  // contiguous, in params() order
    CHECK(e.numel == shape_numel(e.shape));
    CHECK(m.find(e.name) == &e);
    offset += e.numel;
  }
  CHECK(m.param_count() == offset);
  CHECK(m.find("layers.2.weight") == nullptr);
  CHECK(m.find("nope") == nullptr);
  // Layer ranges tile the buffer; parameterless layers have empty ranges.
  for (size_t i = 0; i < m.num_layers(); ++i) {
    CHECK(m.layer_end(i) - m.layer_begin(i) == m.layer(i).param_count());
    if (i > 0) CHECK(m.layer_begin(i) == m.layer_end(i - 1));
  }
  CHECK(m.layer_begin(0) == 0);
  CHECK(m.layer_end(m.num_layers() - 1) == m.param_count());
}

TEST_CASE("model: reference MLP 784-512-512-10 and presets") {
  const Model m = build_mlp(ModelConfig{}, 784, 10);
  CHECK(m.num_layers() == 5);
  CHECK(m.param_count() == 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10);
  CHECK(m.layer(0).flops_per_sample() == 784.0 * 512);

  CHECK(complexity_preset(Complexity::kSimple) == std::vector<int64_t>{128});
  CHECK(complexity_preset(Complexity::kMedium) == std::vector<int64_t>{512, 512});
  CHECK(complexity_preset(Complexity::kComplex) == std::vector<int64_t>{1024, 1024, 512, 256});
  CHECK_THROWS_AS(complexity_preset(Complexity::kNone), InternalError);

  ModelConfig cfg;
  cfg.complexity = Complexity::kComplex;
  const Model c = build_mlp(cfg, 20, 4);
  CHECK(c.num_layers() == 9);
  CHECK(c.layer(0).out_features() == 1024);
  CHECK(c.layer(6).out_features() == 256);
  CHECK(c.out_features() == 4);

  const Model linear_only = build_mlp(mlp_config({}, "relu", false, 0.0), 3, 2);
  CHECK(linear_only.num_layers() == 1);
}

TEST_CASE("model: build_mlp rejects bad user settings") {
  CHECK_THROWS_AS(build_mlp(mlp_config({4}, "relu", false, 1.0), 3, 2), UserError);
  CHECK_THROWS_AS(build_mlp(mlp_config({0}, "relu", false, 0.0), 3, 2), UserError);
}

// Largest |w| over a layer's weight.
float max_abs_weight(const Model& m, const std::vector<float>& p, size_t layer) {
  const ParamEntry* w = m.find("layers." + std::to_string(layer) + ".weight");
  REQUIRE(w != nullptr);
  float mx = 0.0f;
  for (int64_t i = 0; i < w->numel; ++i) mx = std::max(mx, std::fabs(p[w->offset + i]));
  return mx;
}

TEST_CASE("model: init bounds, auto init choice, zero biases, LayerNorm ones and zeros") {
  for (const char* act : {"relu", "gelu", "tanh", "sigmoid"}) {
    const Model m = build_mlp(mlp_config({300}, act, true, 0.0), 200, 100);
    std::vector<float> p(m.param_count());
    m.init(p.data(), 1);
    const bool kaiming = std::string(act) == "relu" || std::string(act) == "gelu";
    const double bound0 = kaiming ? std::sqrt(6.0 / 200) : std::sqrt(6.0 / 500);
    const double bound3 = kaiming ? std::sqrt(6.0 / 300) : std::sqrt(6.0 / 400);
    INFO(act);
    // 60000 uniform draws: the max is within 0.1% of the bound with overwhelming probability.
    CHECK(max_abs_weight(m, p, 0) <= bound0);
    CHECK(max_abs_weight(m, p, 0) > 0.99 * bound0);
    CHECK(max_abs_weight(m, p, 3) <= bound3);
    CHECK(max_abs_weight(m, p, 3) > 0.99 * bound3);
    for (const char* zero : {"layers.0.bias", "layers.1.bias", "layers.3.bias"}) {
      const ParamEntry* e = m.find(zero);
      for (int64_t i = 0; i < e->numel; ++i) CHECK(p[e->offset + i] == 0.0f);
    }
    const ParamEntry* gamma = m.find("layers.1.weight");
    for (int64_t i = 0; i < gamma->numel; ++i) CHECK(p[gamma->offset + i] == 1.0f);
  }
  ModelConfig xavier_relu = mlp_config({300}, "relu", false, 0.0);
  xavier_relu.init = WeightInit::kXavier;
  const Model m = build_mlp(xavier_relu, 200, 100);
  std::vector<float> p(m.param_count());
  m.init(p.data(), 1);
  CHECK(max_abs_weight(m, p, 0) <= std::sqrt(6.0 / 500));
}

TEST_CASE("model: init is deterministic and independent of calling order") {
  const Model m = build_mlp(mlp_config({16, 8}, "tanh", true, 0.0), 10, 3);
  std::vector<float> a(m.param_count()), b(m.param_count()), c(m.param_count());
  m.init(a.data(), 42);
  m.init(b.data(), 42);
  CHECK(a == b);
  m.init(c.data(), 43);
  CHECK(a != c);
  // Layer by layer, in reverse, each from its own (seed, index) stream: the same buffer, which is
  // what lets pipeline stages initialise only their own layers.
  std::vector<float> d(m.param_count(), -7.0f);
  for (size_t i = m.num_layers(); i-- > 0;) {
    Rng rng(42, i);
    m.layer(i).init(d.data() + m.layer_begin(i), rng);
  }
  CHECK(a == d);
}

TEST_CASE("model: describe() lists every layer and the total") {
  const Model m = build_mlp(mlp_config({5, 4}, "gelu", true, 0.25), 7, 3);
  const std::string text = m.describe();
  for (const char* kind : {"linear", "layer_norm", "gelu", "dropout"}) {
    CHECK(text.find(kind) != std::string::npos);
  }
  for (const char* io : {"7 -> 5", "5 -> 5", "5 -> 4", "4 -> 3"}) {
    CHECK(text.find(io) != std::string::npos);
  }
  // One line per layer plus a header and the total.
  CHECK(std::count(text.begin(), text.end(), '\n') == static_cast<long>(m.num_layers() + 2));
  CHECK(text.find(std::to_string(m.param_count())) != std::string::npos);
  CHECK(text.find("40") != std::string::npos);  // layers.0: 5 * 7 + 5
}

struct Fixture {
  Model model = build_mlp(mlp_config({9, 8, 6}, "gelu", true, 0.3), 5, 4);
  ParamStore store{model.param_count()};
  Fixture() { model.init(store.values.data(), 9); }
};

TEST_CASE("model: forward and backward over layer ranges compose to the full pass") {
  Fixture f;
  const Model& m = f.model;
  const Tensor x = random_input(6, 5, 2);
  const std::vector<int32_t> labels = {0, 1, 2, 3, 0, 1};
  const Rng dropout_rng(77);

  // Full pass.
  Activations full;
  Rng r1 = dropout_rng;
  const Tensor& out = m.forward(f.store.values.data(), x, full, ForwardCtx{true, &r1});
  Tensor dlogits;
  softmax_cross_entropy(out, labels.data(), &dlogits, 1.0f / 6);
  m.backward(f.store.values.data(), f.store.grads.data(), x, full, dlogits, nullptr);

  // Every split point: stage A runs [0, k), stage B [k, n) on stage A's output, each with its own
  // Activations, and B's input gradient feeds A's backward.
  const size_t n = m.num_layers();
  for (size_t k = 1; k < n; ++k) {
    INFO("split at ", k);
    Activations a, b;
    Rng r2 = dropout_rng;  // dropout layers draw in the same order as in the full pass
    const ForwardCtx ctx{true, &r2};
    const Tensor& mid = m.forward(f.store.values.data(), x, a, ctx, 0, k);
    CHECK(&mid == &a.out[k - 1]);
    const Tensor& out2 = m.forward(f.store.values.data(), mid, b, ctx, k, n);
    REQUIRE(out2.shape() == out.shape());
    CHECK(same(out2.data(), out.data(), out.numel()));
    std::vector<float> grads(m.param_count(), 0.0f);
    Tensor dmid;
    m.backward(f.store.values.data(), grads.data(), mid, b, dlogits, &dmid, k, n);
    CHECK(dmid.shape() == mid.shape());
    m.backward(f.store.values.data(), grads.data(), x, a, dmid, nullptr, 0, k);
    CHECK(same(grads.data(), f.store.grads.data(), m.param_count()));
  }
}

TEST_CASE("model: gradients accumulate across backward calls") {
  Fixture f;
  const Model& m = f.model;
  const Tensor x = random_input(4, 5, 3);
  const std::vector<int32_t> labels = {3, 2, 1, 0};
  Activations acts;
  const ForwardCtx eval{false, nullptr};
  const Tensor& out = m.forward(f.store.values.data(), x, acts, eval);
  Tensor dlogits;
  softmax_cross_entropy(out, labels.data(), &dlogits, 0.25f);

  std::vector<float> once(m.param_count(), 0.0f);
  m.backward(f.store.values.data(), once.data(), x, acts, dlogits, nullptr);
  std::vector<float> twice(m.param_count(), 0.0f);
  m.backward(f.store.values.data(), twice.data(), x, acts, dlogits, nullptr);
  m.backward(f.store.values.data(), twice.data(), x, acts, dlogits, nullptr);
  // Starting from arbitrary values: they are kept and added to.
  Rng rng(5);
  std::vector<float> base(m.param_count());
  fill_uniform(base.data(), m.param_count(), rng, -1.0f, 1.0f);
  std::vector<float> offset = base;
  m.backward(f.store.values.data(), offset.data(), x, acts, dlogits, nullptr);

  std::vector<float> doubled(once), shifted(once);
  double norm = 0.0;
  for (size_t i = 0; i < once.size(); ++i) {
    doubled[i] = 2.0f * once[i];
    shifted[i] = base[i] + once[i];
    norm += std::fabs(once[i]);
  }
  CHECK(norm > 0.0);
  CHECK(rel_diff(twice.data(), doubled.data(), m.param_count()) < 1e-6);
  CHECK(rel_diff(offset.data(), shifted.data(), m.param_count()) < 1e-6);
}

// Wraps a layer and records what Model::backward asks of it.
class SpyLayer final : public Layer {
 public:
  SpyLayer(std::unique_ptr<Layer> inner, size_t index, std::vector<std::string>* log)
      : Layer(inner->in_shape(), inner->out_shape()),
        inner_(std::move(inner)),
        index_(index),
        log_(log) {}
  std::string kind() const override { return inner_->kind(); }
  std::vector<ParamSpec> params() const override { return inner_->params(); }
  void init(float* p, Rng& rng) const override { inner_->init(p, rng); }
  void forward(const float* p, const Tensor& x, Tensor& y, LayerState& saved,
               const LayerCtx& ctx) const override {
    inner_->forward(p, x, y, saved, ctx);
  }
  void backward(const float* p, float* g, const Tensor& x, const Tensor& y, const LayerState& saved,
                const Tensor& dy, Tensor* dx, const LayerCtx& ctx) const override {
    log_->push_back("backward " + std::to_string(index_) + (dx ? " dx" : " no-dx"));
    inner_->backward(p, g, x, y, saved, dy, dx, ctx);
  }

 private:
  std::unique_ptr<Layer> inner_;
  size_t index_;
  std::vector<std::string>* log_;
};

TEST_CASE("model: layer 0 gets no dx unless asked, on_layer_done follows each layer") {
  std::vector<std::string> log;
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<SpyLayer>(make_linear({5}, 6, Init::kKaiming), 0, &log));
  layers.push_back(std::make_unique<SpyLayer>(make_activation(Activation::kRelu, {6}), 1, &log));
  layers.push_back(std::make_unique<SpyLayer>(make_linear({6}, 3, Init::kKaiming), 2, &log));
  const Model m(std::move(layers));
  ParamStore store(m.param_count());
  m.init(store.values.data(), 1);
  const Tensor x = random_input(4, 5, 6);
  Activations acts;
  const Tensor& out = m.forward(store.values.data(), x, acts, ForwardCtx{false, nullptr});
  Tensor dy = random_input(4, 3, 7);
  REQUIRE(out.shape() == dy.shape());
  auto done = [&log](size_t i) { log.push_back("done " + std::to_string(i)); };

  m.backward(store.values.data(), store.grads.data(), x, acts, dy, nullptr, 0, SIZE_MAX, done);
  CHECK(log == std::vector<std::string>{"backward 2 dx", "done 2", "backward 1 dx", "done 1",
                                        "backward 0 no-dx", "done 0"});
  // With dx requested, layer 0 computes it: dx = dy_0 W_0 with dy_0 the gradient at its output.
  log.clear();
  Tensor dx;
  m.backward(store.values.data(), store.grads.data(), x, acts, dy, &dx);
  CHECK(log.back() == "backward 0 dx");
  CHECK(dx.shape() == x.shape());
  Tensor d_relu, d_lin2;
  std::vector<float> scratch(m.param_count(), 0.0f);
  m.layer(2).backward(store.values.data() + m.layer_begin(2), scratch.data() + m.layer_begin(2),
                      acts.out[1], acts.out[2], acts.state[2], dy, &d_lin2, acts.ctx);
  m.layer(1).backward(nullptr, nullptr, acts.out[0], acts.out[1], acts.state[1], d_lin2, &d_relu,
                      acts.ctx);
  Tensor expect;
  m.layer(0).backward(store.values.data(), scratch.data(), x, acts.out[0], acts.state[0], d_relu,
                      &expect, acts.ctx);
  CHECK(same(dx.data(), expect.data(), dx.numel()));
}

TEST_CASE("model: batch sizes 0 and 1") {
  Fixture f;
  const Model& m = f.model;
  const Tensor x3 = random_input(3, 5, 8);
  const std::vector<int32_t> labels = {2, 0, 1};
  const ForwardCtx eval{false, nullptr};

  SUBCASE("B = 0") {
    const Tensor x({0, 5});
    Activations acts;
    Rng rng(1);
    const Tensor& out = m.forward(f.store.values.data(), x, acts, ForwardCtx{true, &rng});
    CHECK(out.shape() == Shape{0, 4});
    Tensor dlogits;
    CHECK(softmax_cross_entropy(out, labels.data(), &dlogits, 1.0f) == 0.0);
    CHECK(dlogits.shape() == Shape{0, 4});
    Tensor dx;
    m.backward(f.store.values.data(), f.store.grads.data(), x, acts, dlogits, &dx);
    CHECK(dx.shape() == Shape{0, 5});
    for (float g : f.store.grads) CHECK(g == 0.0f);
  }
  SUBCASE("B = 1 matches the corresponding row of a larger batch") {
    Activations a3, a1;
    const Tensor& out3 = m.forward(f.store.values.data(), x3, a3, eval);
    Tensor x1({1, 5});
    std::memcpy(x1.data(), x3.data() + 5, 5 * sizeof(float));
    const Tensor& out1 = m.forward(f.store.values.data(), x1, a1, eval);
    REQUIRE(out1.shape() == Shape{1, 4});
    CHECK(rel_diff(out1.data(), out3.data() + 4, 4) < 1e-5);
    // Gradient of one row's loss, computed at B = 1 and at B = 3 with the other rows' gradient
    // zeroed, agree.
    Tensor d1, d3;
    softmax_cross_entropy(out1, labels.data() + 1, &d1, 1.0f);
    softmax_cross_entropy(out3, labels.data(), &d3, 1.0f);
    for (int64_t i = 0; i < d3.numel(); ++i) {
      if (i / 4 != 1) d3[i] = 0.0f;
    }
    std::vector<float> g1(m.param_count(), 0.0f), g3(m.param_count(), 0.0f);
    m.backward(f.store.values.data(), g1.data(), x1, a1, d1, nullptr);
    m.backward(f.store.values.data(), g3.data(), x3, a3, d3, nullptr);
    CHECK(rel_diff(g1.data(), g3.data(), m.param_count()) < 1e-5);
  }
}

TEST_CASE("model: no allocation per step once sizes settle") {
  Fixture f;
  const Model& m = f.model;
  const Tensor x = random_input(8, 5, 4);
  const std::vector<int32_t> labels = {0, 1, 2, 3, 0, 1, 2, 3};
  Activations acts;
  Rng rng(3);
  Tensor dlogits, dx;
  size_t done = 0;
  const std::function<void(size_t)> on_done = [&done](size_t) { ++done; };
  for (int step = 0; step < 3; ++step) {
    const long before = dtrain_test::allocations();
    const Tensor& out = m.forward(f.store.values.data(), x, acts, ForwardCtx{true, &rng});
    softmax_cross_entropy(out, labels.data(), &dlogits, 0.125f);
    m.backward(f.store.values.data(), f.store.grads.data(), x, acts, dlogits, &dx, 0, SIZE_MAX,
               on_done);
    const long allocated = dtrain_test::allocations() - before;
    INFO("step ", step);
    if (step > 0) CHECK(allocated == 0);
  }
  CHECK(done == 3 * m.num_layers());
  // out holds 8 x (9 + 9 + 9 + 9 + 8 + 8 + 8 + 8 + 6 + 6 + 6 + 6 + 4) floats; saved adds the
  // LayerNorm statistics (8 x 2 each) and the dropout masks (the widths of layers 3, 7, 11).
  int64_t out_floats = 0;
  for (const Tensor& t : acts.out) out_floats += t.numel();
  CHECK(out_floats == 8 * 96);
  CHECK(acts.bytes() == 4 * (8 * 96 + 3 * 8 * 2 + 8 * (9 + 8 + 6)));
}

}  // namespace
}  // namespace dtrain
