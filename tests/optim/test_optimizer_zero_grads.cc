// Optimizer::step_and_zero_grads: the same parameters and state as step(), bit for bit, for
// every update rule, on a range that is not a multiple of its slice; the gradients come back
// zero; and it counts as one step (Adam's bias correction).
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "util/rng.h"

namespace dtrain {
namespace {

OptimizerConfig config(const std::string& type, double momentum, bool nesterov, double wd) {
  OptimizerConfig c;
  c.type = parse_enum<OptimizerType>(type).value();
  c.lr = 0.05;
  c.momentum = momentum;
  c.nesterov = nesterov;
  c.weight_decay = wd;
  return c;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_CASE("step_and_zero_grads: bitwise step() plus zeroed gradients, for every update rule") {
  struct Case {
    std::string type;
    double momentum, wd;
    bool nesterov;
  };
  const std::vector<Case> cases = {{"sgd", 0.0, 0.0, false},   {"sgd", 0.9, 0.0, false},
                                   {"sgd", 0.9, 1e-4, true},   {"sgd", 0.0, 1e-4, false},
                                   {"adam", 0.0, 0.0, false},  {"adam", 0.0, 1e-2, false},
                                   {"adamw", 0.0, 1e-2, false}};
  const int64_t n = 3 * 4096 + 77;  // several slices and a short one
  for (const Case& c : cases) {
    CAPTURE(c.type);
    CAPTURE(c.momentum);
    CAPTURE(c.nesterov);
    const OptimizerConfig cfg = config(c.type, c.momentum, c.nesterov, c.wd);
    auto a = make_optimizer(cfg, 0, n);
    auto b = make_optimizer(cfg, 0, n);
    Rng rng(7, 1);
    std::vector<float> pa(static_cast<size_t>(n));
    for (float& v : pa) v = rng.normal();
    std::vector<float> pb = pa;
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g(static_cast<size_t>(n));
      for (float& v : g) v = 0.1f * rng.normal();
      std::vector<float> gb = g;
      a->step(pa.data(), g.data(), 0.05);
      b->step_and_zero_grads(pb.data(), gb.data(), 0.05);
      CHECK(same(pa, pb));
      for (size_t s = 0; s < a->state_names().size(); ++s) CHECK(same(a->state(s), b->state(s)));
      CHECK(same(gb, std::vector<float>(static_cast<size_t>(n), 0.0f)));
      CHECK(b->step_count() == a->step_count());
    }
  }
}

}  // namespace
}  // namespace dtrain
