// optimizer.weight_decay_on: weight decay restricted to flat ranges (the tensors of 2 or more
// dimensions). Only those ranges move by decay; any slicing of a step, and any packing of the
// flat layout into shard pieces, gives bitwise what one whole update gives; decay on every
// element is bitwise the previous behaviour.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "optim/optimizer.h"

using namespace dtrain;

namespace {

// A flat layout of four tensors: [3, 4] at 0, [4] at 12, [2, 3] at 16, [5] at 22 (27 floats).
// The decayed ranges are the two 2-D tensors.
constexpr int64_t kN = 27;
const std::vector<FlatRange> kMatrices = {{0, 12}, {16, 22}};
bool in_matrix(int64_t i) {
  return (i >= 0 && i < 12) || (i >= 16 && i < 22);
}

OptimizerConfig config(OptimizerType type) {
  OptimizerConfig c;
  c.type = type;
  c.lr = type == OptimizerType::kSgd ? 0.05 : 0.01;
  c.momentum = type == OptimizerType::kSgd ? 0.9 : 0.0;
  c.weight_decay = 0.1;
  return c;
}

const OptimizerType kTypes[] = {OptimizerType::kSgd, OptimizerType::kAdam, OptimizerType::kAdamw};

std::vector<float> random_vec(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  return true;
}

std::unique_ptr<Optimizer> matrices_opt(const OptimizerConfig& cfg) {
  return make_optimizer(cfg, kN, {{0, kN, 0}}, kMatrices);
}

}  // namespace

TEST_CASE("weight_decay_on matrices: with zero gradients only the 2-D tensors move") {
  for (OptimizerType type : kTypes) {
    CAPTURE(static_cast<int>(type));
    const OptimizerConfig cfg = config(type);
    auto opt = matrices_opt(cfg);
    CHECK_FALSE(opt->decays_all());
    CHECK(opt->decayed_state() == kMatrices);
    const std::vector<float> p0 = random_vec(kN, 1);
    std::vector<float> p = p0;
    const std::vector<float> g(static_cast<size_t>(kN), 0.0f);
    for (int s = 0; s < 3; ++s) opt->step(p.data(), g.data(), cfg.lr);
    for (int64_t i = 0; i < kN; ++i) {
      CAPTURE(i);
      const auto k = static_cast<size_t>(i);
      if (in_matrix(i)) {
        CHECK(std::abs(p[k]) < std::abs(p0[k]));  // decay pulls towards zero
      } else {
        CHECK(p[k] == p0[k]);  // bitwise untouched: no gradient, no decay
      }
    }
    // With decay on every element all of them move.
    auto all = make_optimizer(cfg, 0, kN);
    std::vector<float> q = p0;
    for (int s = 0; s < 3; ++s) all->step(q.data(), g.data(), cfg.lr);
    for (int64_t i = 0; i < kN; ++i)
      CHECK(std::abs(q[static_cast<size_t>(i)]) < std::abs(p0[static_cast<size_t>(i)]));
  }
}

TEST_CASE(
    "weight_decay_on matrices: slices cut through the range boundaries give the whole update "
    "bitwise") {
  // Cut points inside tensors and on their boundaries, one slice of length 1.
  const std::vector<std::vector<int64_t>> cuts = {
      {5, 13, 14, 20, 25}, {12, 16, 22}, {1, 2, 3, 11, 12, 13, 15, 16, 17, 21, 22, 23, 26}, {}};
  for (OptimizerType type : kTypes) {
    CAPTURE(static_cast<int>(type));
    const OptimizerConfig cfg = config(type);
    auto whole = matrices_opt(cfg);
    auto zeroing = matrices_opt(cfg);
    std::vector<std::unique_ptr<Optimizer>> sliced;
    for (size_t c = 0; c < cuts.size(); ++c) sliced.push_back(matrices_opt(cfg));
    std::vector<float> pw = random_vec(kN, 2), pz = pw;
    std::vector<std::vector<float>> ps(cuts.size(), pw);
    for (int s = 0; s < 5; ++s) {
      const std::vector<float> g = random_vec(kN, 10 + static_cast<uint32_t>(s));
      whole->step(pw.data(), g.data(), cfg.lr);
      std::vector<float> gz = g;
      zeroing->step_and_zero_grads(pz.data(), gz.data(), cfg.lr);
      CHECK(gz == std::vector<float>(static_cast<size_t>(kN), 0.0f));
      for (size_t c = 0; c < cuts.size(); ++c) {
        sliced[c]->begin_step();
        std::vector<int64_t> ends = cuts[c];
        ends.push_back(kN);
        // Slices in reverse order: the state offset, not the call order, places a slice.
        for (size_t e = ends.size(); e-- > 0;) {
          const int64_t b = e == 0 ? 0 : ends[e - 1], n = ends[e] - b;
          sliced[c]->update_slice(ps[c].data() + b, g.data() + b, b, n, cfg.lr);
        }
      }
    }
    CHECK(bitwise_equal(pz, pw));
    for (size_t c = 0; c < cuts.size(); ++c) {
      CAPTURE(c);
      CHECK(bitwise_equal(ps[c], pw));
      for (size_t i = 0; i < whole->state_names().size(); ++i)
        CHECK(bitwise_equal(sliced[c]->state(i), whole->state(i)));
    }
  }
}

TEST_CASE(
    "weight_decay_on matrices: a shard packing pieces of the layout decays what the whole does") {
  // Two ranks' shards of the 27 floats, pieces packed out of order: rank 0 holds [14, 20) at 0
  // and [0, 7) at 6 (plus 2 floats of padding), rank 1 holds [7, 14) and [20, 27).
  const std::vector<std::vector<StatePiece>> shards = {{{14, 20, 0}, {0, 7, 6}},
                                                       {{7, 14, 0}, {20, 27, 7}}};
  const int64_t shard_size = 15;
  for (OptimizerType type : kTypes) {
    CAPTURE(static_cast<int>(type));
    const OptimizerConfig cfg = config(type);
    auto whole = matrices_opt(cfg);
    std::vector<float> pw = random_vec(kN, 3);
    std::vector<std::unique_ptr<Optimizer>> opts;
    std::vector<std::vector<float>> pshard;
    for (const auto& pieces : shards) {
      opts.push_back(make_optimizer(cfg, shard_size, pieces, kMatrices));
      std::vector<float> s(static_cast<size_t>(shard_size), 0.0f);
      for (const StatePiece& p : pieces)
        for (int64_t i = p.begin; i < p.end; ++i)
          s[static_cast<size_t>(p.offset + i - p.begin)] = pw[static_cast<size_t>(i)];
      pshard.push_back(s);
    }
    // Rank 0's state ranges: [14, 16) is a vector, [16, 20) a matrix -> state [2, 6); [0, 7) all
    // matrix -> state [6, 13); merged as they touch.
    CHECK(opts[0]->decayed_state() == std::vector<FlatRange>{{2, 13}});
    CHECK(opts[1]->decayed_state() == std::vector<FlatRange>{{0, 5}, {7, 9}});
    for (int s = 0; s < 4; ++s) {
      const std::vector<float> g = random_vec(kN, 20 + static_cast<uint32_t>(s));
      whole->step(pw.data(), g.data(), cfg.lr);
      for (size_t r = 0; r < shards.size(); ++r) {
        opts[r]->begin_step();
        for (const StatePiece& p : shards[r]) {
          opts[r]->update_slice(pshard[r].data() + p.offset, g.data() + p.begin, p.offset,
                                p.end - p.begin, cfg.lr);
        }
      }
    }
    for (size_t r = 0; r < shards.size(); ++r)
      for (const StatePiece& p : shards[r])
        for (int64_t i = p.begin; i < p.end; ++i) {
          CAPTURE(i);
          const float a = pshard[r][static_cast<size_t>(p.offset + i - p.begin)];
          CHECK(std::memcmp(&a, &pw[static_cast<size_t>(i)], sizeof(float)) == 0);
          for (size_t k = 0; k < whole->state_names().size(); ++k)
            CHECK(opts[r]->state(k)[static_cast<size_t>(p.offset + i - p.begin)] ==
                  whole->state(k)[static_cast<size_t>(i)]);
        }
  }
}

namespace {

// The update rules as they were before weight_decay_on (decay on every element), one element at
// a time in PyTorch's order: the reference for "all is unchanged".
void reference_step(const OptimizerConfig& c, int64_t t, std::vector<float>& p,
                    const std::vector<float>& g, std::vector<float>& m, std::vector<float>& v) {
  const float lr = static_cast<float>(c.lr), wd = static_cast<float>(c.weight_decay);
  for (size_t i = 0; i < p.size(); ++i) {
    if (c.type == OptimizerType::kSgd) {
      float d = g[i] + wd * p[i];
      const float b = m[i] * static_cast<float>(c.momentum) + d;
      m[i] = b;
      d = b;
      p[i] = p[i] + -lr * d;
      continue;
    }
    const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(t));
    float pi = p[i];
    if (c.type == OptimizerType::kAdamw) pi = pi * static_cast<float>(1.0 - c.lr * c.weight_decay);
    float gi = g[i];
    if (c.type == OptimizerType::kAdam) gi = gi + wd * pi;
    const float mi = static_cast<float>(c.beta1) * m[i] + static_cast<float>(1.0 - c.beta1) * gi;
    const float vi =
        static_cast<float>(c.beta2) * v[i] + static_cast<float>(1.0 - c.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom =
        std::sqrt(vi) / static_cast<float>(std::sqrt(bc2)) + static_cast<float>(c.eps);
    p[i] = pi + static_cast<float>(-(c.lr / bc1)) * mi / denom;
  }
}

}  // namespace

TEST_CASE("weight_decay_on all: bitwise the previous update, whichever way it is built") {
  for (OptimizerType type : kTypes) {
    CAPTURE(static_cast<int>(type));
    const OptimizerConfig cfg = config(type);
    // The old form; the new form with the whole layout decayed; a shard whose pieces are all
    // decayed (padding outside them) -- all three take the unsplit path.
    auto old_form = make_optimizer(cfg, 0, kN);
    auto new_form = make_optimizer(cfg, kN, {{0, kN, 0}}, {{0, kN}});
    auto padded = make_optimizer(cfg, kN + 3, {{0, kN, 0}}, {{0, kN}});
    CHECK(old_form->decays_all());
    CHECK(new_form->decays_all());
    CHECK(padded->decays_all());
    std::vector<float> p = random_vec(kN, 4), pa = p, pb = p, pc = p;
    pc.resize(kN + 3, 0.0f);
    std::vector<float> m(static_cast<size_t>(kN), 0.0f), v = m;
    for (int64_t s = 1; s <= 5; ++s) {
      const std::vector<float> g = random_vec(kN, 30 + static_cast<uint32_t>(s));
      std::vector<float> gc = g;
      gc.resize(kN + 3, 0.0f);
      reference_step(cfg, s, p, g, m, v);
      old_form->step(pa.data(), g.data(), cfg.lr);
      new_form->step(pb.data(), g.data(), cfg.lr);
      padded->step(pc.data(), gc.data(), cfg.lr);
    }
    pc.resize(kN);
    CHECK(bitwise_equal(pa, p));
    CHECK(bitwise_equal(pb, p));
    CHECK(bitwise_equal(pc, p));
    CHECK(bitwise_equal(old_form->state(0), m));
  }
}
