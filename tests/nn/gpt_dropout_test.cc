// The GPT's dropout (nn/gpt.h): off is bitwise the model without dropout, evaluation is
// deterministic and equal to it, training masks are keyed on the sample (the same whichever batch
// a row is in), the drop rate and scaling are right, and steps do not allocate. Gradient checks
// with a fixed mask are in gpt_gradcheck_test.cc.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "nn/gpt.h"
#include "nn/layer.h"
#include "nn/loss.h"
#include "nn/model.h"
#include "util/rng.h"

namespace dtrain_test {
long allocations();  // heap allocations so far (alloc_counter.cc)
}  // namespace dtrain_test

namespace dtrain {
namespace {

constexpr int64_t kT = 8, kV = 256;

ModelConfig gpt_config(double dropout) {
  ModelConfig c;
  c.type = ModelType::kGpt;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.block_size = kT;
  c.dropout = dropout;
  return c;
}

Tensor tokens(int64_t batch, uint64_t seed) {
  Rng rng(seed);
  Tensor x({batch, kT});
  for (int64_t i = 0; i < x.numel(); ++i) x[i] = static_cast<float>(rng.below(kV));
  return x;
}

LayerCtx training(const std::vector<int64_t>& rows, int64_t step) {
  LayerCtx c;
  c.training = true;
  c.rows = rows.data();
  c.mask_key = dropout_step_key(3, step);
  return c;
}

const LayerCtx kEval{false, nullptr};

std::vector<float> run(const Model& m, const std::vector<float>& p, const Tensor& x,
                       const LayerCtx& ctx, Activations& acts) {
  const Tensor& y = m.forward(p.data(), x, acts, ctx);
  return {y.data(), y.data() + y.numel()};
}

// Gradients of the mean cross-entropy (targets: the next token, or 0 at the end) under ctx.
std::vector<float> grads(const Model& m, const std::vector<float>& p, const Tensor& x,
                         const LayerCtx& ctx) {
  Activations acts;
  const Tensor& y = m.forward(p.data(), x, acts, ctx);
  std::vector<int32_t> targets(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i)
    targets[static_cast<size_t>(i)] = (i + 1) % kT == 0 ? 0 : static_cast<int32_t>(x[i + 1]);
  Tensor d;
  softmax_cross_entropy(y, targets.data(), &d, 1.0f / static_cast<float>(x.numel()));
  std::vector<float> g(p.size(), 0.0f);
  m.backward(p.data(), g.data(), x, acts, d, nullptr);
  return g;
}

TEST_CASE("gpt dropout: 0 is the model without dropout, and evaluation ignores it, bitwise") {
  const Model plain = build_gpt(gpt_config(0.0), kV, kT);
  const Model drop = build_gpt(gpt_config(0.3), kV, kT);
  REQUIRE(plain.param_count() == drop.param_count());
  std::vector<float> p(static_cast<size_t>(plain.param_count()));
  plain.init(p.data(), 4);
  std::vector<float> q(p.size());
  drop.init(q.data(), 4);
  CHECK(p == q);  // dropout has no parameters and draws nothing at init
  const Tensor x = tokens(3, 1);
  const std::vector<int64_t> rows = {10, 11, 12};
  Activations a1, a2, a3, a4;
  const std::vector<float> ref = run(plain, p, x, kEval, a1);
  // p = 0 in training mode: no mask anywhere, the same arithmetic.
  CHECK(run(plain, p, x, training(rows, 0), a2) == ref);
  // p > 0 in evaluation: the same, every time.
  CHECK(run(drop, p, x, kEval, a3) == ref);
  CHECK(run(drop, p, x, kEval, a3) == ref);
  CHECK(a3.state[0].saved[0].numel() == 0);  // the embedding's mask is empty in evaluation
  CHECK(grads(drop, p, x, kEval) == grads(plain, p, x, training(rows, 0)));
  // In training, p > 0 changes the output (so the comparisons above are not vacuous).
  CHECK(run(drop, p, x, training(rows, 0), a4) != ref);
}

TEST_CASE("gpt dropout: masks are keyed on the sample and the step, not the batch position") {
  const Model m = build_gpt(gpt_config(0.25), kV, kT);
  std::vector<float> p(static_cast<size_t>(m.param_count()));
  m.init(p.data(), 2);
  const Tensor x3 = tokens(3, 7);
  const std::vector<int64_t> rows = {5, 9, 2};
  Activations a3;
  const std::vector<float> y3 = run(m, p, x3, training(rows, 4), a3);
  const int64_t per = kT * kV;
  for (int64_t b = 0; b < 3; ++b) {
    Tensor x1({1, kT});
    for (int64_t t = 0; t < kT; ++t) x1[t] = x3[b * kT + t];
    const std::vector<int64_t> one = {rows[static_cast<size_t>(b)]};
    Activations a1;
    const std::vector<float> y1 = run(m, p, x1, training(one, 4), a1);
    // The embedding's mask of the row is the same bits; the logits agree up to GEMM rounding.
    const Tensor& m3 = a3.state[0].saved[0];
    const Tensor& m1 = a1.state[0].saved[0];
    REQUIRE(m1.numel() == kT * 16);
    CHECK(std::equal(m1.data(), m1.data() + m1.numel(), m3.data() + b * m1.numel()));
    double worst = 0.0;
    for (int64_t i = 0; i < per; ++i)
      worst = std::max(worst, static_cast<double>(std::fabs(y1[static_cast<size_t>(i)] -
                                                            y3[static_cast<size_t>(b * per + i)])));
    CHECK(worst < 1e-4);
  }
  // Another step, or another sample, draws other masks.
  Activations b1, b2;
  CHECK(run(m, p, x3, training(rows, 5), b1) != y3);
  const std::vector<int64_t> other = {5, 9, 3};
  const std::vector<float> y_other = run(m, p, x3, training(other, 4), b2);
  CHECK(std::equal(y_other.begin(), y_other.begin() + 2 * per, y3.begin()));
  CHECK(!std::equal(y_other.begin() + 2 * per, y_other.end(), y3.begin() + 2 * per));
  // Without rows, the masks come from the context's stream, which they advance.
  Rng rng(1);
  LayerCtx seq{true, &rng};
  const auto before = rng.state();
  Activations c1;
  run(m, p, x3, seq, c1);
  CHECK(rng.state() != before);
}

TEST_CASE("gpt dropout: the drop rate is p and the kept values are scaled by 1 / (1 - p)") {
  for (double pr : {0.1, 0.5}) {
    const Model m = build_gpt(gpt_config(pr), kV, kT);
    std::vector<float> p(static_cast<size_t>(m.param_count()));
    m.init(p.data(), 2);
    std::vector<int64_t> rows(64);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(3 * i);
    Activations acts;
    run(m, p, tokens(64, 3), training(rows, 0), acts);
    const Tensor& mask = acts.state[0].saved[0];  // 64 x 8 x 16 = 8192 entries
    int64_t zeros = 0, scaled = 0;
    for (int64_t i = 0; i < mask.numel(); ++i) {
      zeros += mask[i] == 0.0f;
      scaled += mask[i] == static_cast<float>(1.0 / (1.0 - pr));
    }
    INFO("p = ", pr, ", zeros ", zeros, " of ", mask.numel());
    CHECK(zeros + scaled == mask.numel());
    // Binomial(8192, p): 5 standard deviations are at most 0.028 of the count.
    CHECK(std::fabs(static_cast<double>(zeros) / static_cast<double>(mask.numel()) - pr) < 0.028);
  }
}

TEST_CASE("gpt: training steps do not allocate once sizes settle, with and without dropout") {
  for (double pr : {0.0, 0.2}) {
    const Model m = build_gpt(gpt_config(pr), kV, kT);
    std::vector<float> p(static_cast<size_t>(m.param_count())), g(p.size());
    m.init(p.data(), 2);
    const Tensor x = tokens(4, 5);
    const std::vector<int32_t> targets(4 * kT, 7);
    const std::vector<int64_t> rows = {0, 1, 2, 3};
    Activations acts;
    Tensor d;
    for (int step = 0; step < 3; ++step) {
      const LayerCtx ctx = training(rows, step);
      const long before = dtrain_test::allocations();
      const Tensor& y = m.forward(p.data(), x, acts, ctx);
      softmax_cross_entropy(y, targets.data(), &d, 1.0f / (4 * kT));
      m.backward(p.data(), g.data(), x, acts, d, nullptr);
      INFO("p = ", pr, ", step ", step);
      if (step > 0) CHECK(dtrain_test::allocations() - before == 0);
    }
  }
}

}  // namespace
}  // namespace dtrain
