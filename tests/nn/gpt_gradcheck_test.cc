// Finite-difference gradient checks of the GPT above its kernels: the transformer block (a
// composite of 7 children with two residual connections), the tied head (one tensor, two uses,
// gradients summed) and the whole GPT (the loss w.r.t. every parameter tensor), without and with
// dropout (a fixed mask: keyed masks are the same on every forward of the same rows, step key and
// site, nn/layer.h).
//
// Method (fd_util.h): central differences with eps = 1e-2 of an objective evaluated in float and
// accumulated in double, against the analytic gradient; per tensor, max |numeric - analytic| <=
// tol * max |numeric|, so a small tensor's error cannot hide under a large one's scale.
//
// Block: J = sum(y * r) for a fixed random r, random parameters (weights U(-0.4, 0.4), LayerNorm
// gammas 1 + U(-0.4, 0.4)) rather than the init (zero biases and unit gammas would hide mistakes),
// inputs U(-1, 1). tol = 1e-3 as for every layer (gradcheck_test.cc); measured errors <= 1e-4.
//
// Whole GPT: J = the mean next-token cross-entropy, as training computes it. Its gradients are
// smaller than a layer's (each logit's share is 1 / (B T)), so float rounding in J (~1e-7 |J|,
// divided by 2 eps) weighs more: measured errors <= 7e-4 (wpe, wte), so tol = 1e-2. A wrong
// gradient is still far outside it: leaving out the head's share of the tied gradient gives 1.0, a
// 5% error 0.05 (both asserted below). Elements are sampled (8 per tensor, always including the one
// with the largest analytic gradient, so the scale cannot vanish), which keeps the check under a
// second.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fd_util.h"
#include "nn/gpt.h"
#include "nn/layer.h"
#include "nn/loss.h"
#include "nn/model.h"
#include "util/rng.h"

namespace dtrain {
namespace {

using testing::fill_uniform;
using testing::grad_error;
using testing::kEps;
using testing::numeric_at;
using testing::numeric_grad;
using testing::weighted_sum;

constexpr double kBlockTol = 1e-3;
constexpr double kModelTol = 1e-2;

ModelConfig gpt_config(double dropout, bool tie = true) {
  ModelConfig c;
  c.type = ModelType::kGpt;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.block_size = 6;
  c.dropout = dropout;
  c.tie_embeddings = tie;
  return c;
}

// A training context with keyed masks: the same masks on every call (rows, key and site fixed).
struct KeyedCtx {
  std::vector<int64_t> rows;
  LayerCtx ctx;
  explicit KeyedCtx(std::vector<int64_t> r, int64_t site = 0) : rows(std::move(r)) {
    ctx.training = true;
    ctx.rows = rows.data();
    ctx.mask_key = dropout_step_key(17, 3);
    ctx.site = site;
  }
};

// Random parameters for `specs` laid out contiguously: weights U(-s, s), LayerNorm gammas
// ("ln_*.weight") 1 + U(-s, s).
std::vector<float> random_params(const std::vector<ParamSpec>& specs, uint64_t seed, float s) {
  Rng rng(seed, 2);
  std::vector<float> p;
  for (const ParamSpec& e : specs) {
    std::vector<float> v(static_cast<size_t>(shape_numel(e.shape)));
    fill_uniform(v, rng, -s, s);
    const bool gamma = e.name.find("ln_") != std::string::npos && e.name.ends_with(".weight");
    if (gamma)
      for (float& x : v) x += 1.0f;
    p.insert(p.end(), v.begin(), v.end());
  }
  return p;
}

// Per-tensor errors of `num` against `ana` over the layout of `specs`; CHECKs each below tol.
void check_by_tensor(const std::vector<ParamSpec>& specs, const std::vector<double>& num,
                     const std::vector<float>& ana, double tol) {
  int64_t off = 0;
  for (const ParamSpec& e : specs) {
    const int64_t n = shape_numel(e.shape);
    const std::vector<double> part(num.begin() + off, num.begin() + off + n);
    const double err = grad_error(part, ana.data() + off);
    INFO(e.name, ": error ", err);
    CHECK(err < tol);
    off += n;
  }
}

struct BlockGrads {
  std::vector<ParamSpec> specs;
  std::vector<float> ana_x, ana_p;
  std::vector<double> num_x, num_p;
};

// Analytic and numeric gradients of J = sum(y * r) for the first block of a GPT built from cfg,
// run under ctx.
BlockGrads block_grads(const ModelConfig& cfg, const LayerCtx& ctx) {
  const int64_t B = 2, T = cfg.block_size, C = cfg.n_embd;
  const Model m = build_gpt(cfg, 11, T);
  const Layer& block = m.layer(1);
  REQUIRE(block.kind() == "block");
  BlockGrads out;
  out.specs = block.params();
  REQUIRE(out.specs.size() == 12);  // ln_1, c_attn, c_proj, ln_2, c_fc, c_proj: weight, bias
  std::vector<float> p = random_params(out.specs, 5, 0.4f);
  REQUIRE(static_cast<int64_t>(p.size()) == block.param_count());
  Tensor x({B, T, C}), r({B, T, C}), y;
  Rng rng(6);
  fill_uniform(x.data(), x.numel(), rng, -1.0f, 1.0f);
  fill_uniform(r.data(), r.numel(), rng, -1.0f, 1.0f);
  LayerState st;
  auto objective = [&]() {
    block.forward(p.data(), x, y, st, ctx);
    return weighted_sum(y, r);
  };
  objective();
  std::vector<float> g(p.size(), 0.0f);
  Tensor dx;
  block.backward(p.data(), g.data(), x, y, st, r, &dx, ctx);
  out.ana_x.assign(dx.data(), dx.data() + dx.numel());
  out.ana_p = g;
  out.num_x = numeric_grad(x.data(), x.numel(), kEps, objective);
  out.num_p = numeric_grad(p, kEps, objective);
  return out;
}

TEST_CASE("gpt gradcheck: the transformer block, inputs and every parameter tensor") {
  KeyedCtx k({3, 8}, 1);
  const BlockGrads gr = block_grads(gpt_config(0.0), k.ctx);
  CHECK(grad_error(gr.num_x, gr.ana_x) < kBlockTol);
  check_by_tensor(gr.specs, gr.num_p, gr.ana_p, kBlockTol);
}

TEST_CASE("gpt gradcheck: the transformer block with dropout, for a fixed mask") {
  KeyedCtx k({3, 8}, 1);
  const BlockGrads gr = block_grads(gpt_config(0.3), k.ctx);
  CHECK(grad_error(gr.num_x, gr.ana_x) < kBlockTol);
  check_by_tensor(gr.specs, gr.num_p, gr.ana_p, kBlockTol);
  // Dropout changed the gradients (the masks are in effect), and the check sees a wrong one:
  // the block's gradients without dropout are far from these.
  const BlockGrads plain = block_grads(gpt_config(0.0), k.ctx);
  CHECK(grad_error(gr.num_x, plain.ana_x) > 0.1);
}

// A GPT with random parameters (tied copies equal), tokens and targets, and its loss.
struct GptCase {
  Model m;
  std::vector<float> p;
  Tensor x;
  std::vector<int32_t> targets;
  int64_t B = 3, T = 6;
  GptCase(const ModelConfig& cfg, uint64_t seed) : m(build_gpt(cfg, 11, 6)), x({3, 6}) {
    std::vector<ParamSpec> specs;
    for (const ParamEntry& e : m.params()) specs.push_back({e.name, e.shape});
    p = random_params(specs, seed, 0.3f);
    for (const TiedParam& t : m.ties())
      std::copy_n(p.begin() + m.params()[t.primary].offset, m.params()[t.primary].numel,
                  p.begin() + m.params()[t.mirror].offset);
    Rng rng(seed, 7);
    for (int64_t i = 0; i < B * T; ++i) {
      x[i] = static_cast<float>(rng.below(11));
      targets.push_back(static_cast<int32_t>(rng.below(11)));
    }
  }
  // The mean cross-entropy over the B T positions; its gradient into grads when not null.
  double loss(const LayerCtx& ctx, float* grads) {
    Activations acts;
    const float scale = 1.0f / static_cast<float>(B * T);
    const Tensor& logits = m.forward(p.data(), x, acts, ctx);
    Tensor dlogits;
    const double l =
        softmax_cross_entropy(logits, targets.data(), grads != nullptr ? &dlogits : nullptr, scale);
    if (grads != nullptr) m.backward(p.data(), grads, x, acts, dlogits, nullptr);
    return l * scale;
  }
};

// Up to 8 indices of [0, n): the largest |g| and others drawn at random.
std::vector<int64_t> sample(const float* g, int64_t n, Rng& rng) {
  std::vector<int64_t> idx = {0};
  for (int64_t i = 1; i < n; ++i)
    if (std::fabs(g[i]) > std::fabs(g[idx[0]])) idx[0] = i;
  while (static_cast<int64_t>(idx.size()) < std::min<int64_t>(8, n)) {
    const auto i = static_cast<int64_t>(rng.below(static_cast<uint64_t>(n)));
    if (std::find(idx.begin(), idx.end(), i) == idx.end()) idx.push_back(i);
  }
  return idx;
}

// Numeric derivative of the loss w.r.t. element i of parameter e; a tied parameter's two copies
// are perturbed together (the total derivative w.r.t. the one shared tensor).
double numeric_param(GptCase& c, const LayerCtx& ctx, size_t e, int64_t i) {
  const auto loss = [&] { return c.loss(ctx, nullptr); };
  const ParamEntry& pe = c.m.params()[e];
  for (const TiedParam& t : c.m.ties()) {
    if (t.primary != e) continue;
    float* a = c.p.data() + pe.offset + i;
    float* b = c.p.data() + c.m.params()[t.mirror].offset + i;
    const float orig = *a;
    *a = *b = orig + kEps;
    const double hi = *a, fp = loss();
    *a = *b = orig - kEps;
    const double lo = *a, fm = loss();
    *a = *b = orig;
    return (fp - fm) / (hi - lo);
  }
  return numeric_at(c.p.data() + pe.offset, i, kEps, loss);
}

// Every tensor of the GPT: analytic (after sum_tied_grads) against sampled numeric derivatives.
void check_gpt(const ModelConfig& cfg, const LayerCtx& ctx) {
  GptCase c(cfg, 21);
  std::vector<float> g(c.p.size(), 0.0f);
  c.loss(ctx, g.data());
  sum_tied_grads(c.m, g.data());
  Rng rng(8);
  int checked = 0;
  for (size_t e = 0; e < c.m.params().size(); ++e) {
    const ParamEntry& pe = c.m.params()[e];
    bool mirror = false;
    for (const TiedParam& t : c.m.ties()) mirror = mirror || t.mirror == e;
    if (mirror) continue;  // checked through its primary: both copies move together
    const std::vector<int64_t> idx = sample(g.data() + pe.offset, pe.numel, rng);
    std::vector<double> num;
    std::vector<float> ana;
    for (int64_t i : idx) {
      num.push_back(numeric_param(c, ctx, e, i));
      ana.push_back(g[static_cast<size_t>(pe.offset + i)]);
    }
    const double err = grad_error(num, ana);
    INFO(pe.name, ": error ", err);
    CHECK(err < kModelTol);
    ++checked;
  }
  CHECK(checked == static_cast<int>(c.m.params().size() - c.m.ties().size()));
}

TEST_CASE("gpt gradcheck: the whole GPT, the loss w.r.t. every parameter tensor") {
  KeyedCtx k({0, 1, 2});
  SUBCASE("tied head") {
    check_gpt(gpt_config(0.0, true), k.ctx);
  }
  SUBCASE("untied head") {
    check_gpt(gpt_config(0.0, false), k.ctx);
  }
  SUBCASE("tied, with dropout (a fixed mask)") {
    check_gpt(gpt_config(0.2, true), k.ctx);
  }
}

TEST_CASE("gpt gradcheck: the tied head's gradient is the sum of the embedding's and the head's") {
  KeyedCtx k({0, 1, 2});
  GptCase c(gpt_config(0.0, true), 33);
  REQUIRE(c.m.ties().size() == 1);
  const TiedParam t = c.m.ties()[0];
  const ParamEntry& wte = c.m.params()[t.primary];
  const ParamEntry& head = c.m.params()[t.mirror];
  CHECK(wte.name == "transformer.wte.weight");
  CHECK(head.name == "lm_head.weight");
  std::vector<float> g(c.p.size(), 0.0f);
  c.loss(k.ctx, g.data());
  const std::vector<float> part_wte(g.begin() + wte.offset, g.begin() + wte.offset + wte.numel);
  sum_tied_grads(c.m, g.data());
  const std::vector<float> total(g.begin() + wte.offset, g.begin() + wte.offset + wte.numel);
  // Both copies hold the sum.
  CHECK(std::equal(total.begin(), total.end(), g.begin() + head.offset));
  // Every element of the shared tensor (11 x 8), both copies perturbed together.
  std::vector<double> num;
  for (int64_t i = 0; i < wte.numel; ++i) num.push_back(numeric_param(c, k.ctx, t.primary, i));
  CHECK(grad_error(num, total) < kModelTol);
  // The checker fails a gradient without the head's share, and one 5% off.
  CHECK(grad_error(num, part_wte) > 0.1);
  std::vector<float> off = total;
  for (float& v : off) v *= 1.05f;
  CHECK(grad_error(num, off) > kModelTol);
}

}  // namespace
}  // namespace dtrain
