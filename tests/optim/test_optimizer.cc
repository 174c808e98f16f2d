// Optimizer updates against hand-computed values (the arithmetic is written out next to each
// expectation), range ownership, state layout, lr schedules and gradient-norm helpers.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "optim/optimizer.h"
#include "util/check.h"

namespace dtrain {
namespace {

// float32 results against double-precision hand arithmetic: a few float ulps of slack.
doctest::Approx near(double x) {
  return doctest::Approx(x).epsilon(2e-6);
}

OptimizerConfig sgd(double lr, double momentum = 0, bool nesterov = false, double wd = 0) {
  OptimizerConfig c;
  c.type = OptimizerType::kSgd;
  c.lr = lr;
  c.momentum = momentum;
  c.nesterov = nesterov;
  c.weight_decay = wd;
  return c;
}

OptimizerConfig adam(const std::string& type, double wd = 0) {
  OptimizerConfig c;
  c.type = parse_enum<OptimizerType>(type).value();
  c.lr = 0.1;
  c.beta1 = 0.9;
  c.beta2 = 0.999;
  c.eps = 1e-8;
  c.weight_decay = wd;
  return c;
}

// Runs one-element steps with the given gradients; returns p after each step.
std::vector<double> run1(Optimizer& opt, float p, const std::vector<float>& grads, double lr) {
  std::vector<double> out;
  for (float g : grads) {
    opt.step(&p, &g, lr);
    out.push_back(p);
  }
  return out;
}

TEST_CASE("sgd plain: p -= lr * g") {
  auto opt = make_optimizer(sgd(0.1), 0, 1);
  CHECK(opt->state_names().empty());
  CHECK(opt->state_bytes() == 0);
  // 1 - 0.1*0.5 = 0.95; 0.95 - 0.1*(-1) = 1.05; 1.05 - 0.1*0.25 = 1.025
  const auto p = run1(*opt, 1.0f, {0.5f, -1.0f, 0.25f}, 0.1);
  CHECK(p[0] == near(0.95));
  CHECK(p[1] == near(1.05));
  CHECK(p[2] == near(1.025));
  CHECK(opt->step_count() == 3);
}

TEST_CASE("sgd weight decay adds wd*p to the gradient") {
  auto opt = make_optimizer(sgd(0.1, 0, false, 0.1), 0, 1);
  // d = 0.5 + 0.1*1 = 0.6, p = 1 - 0.06 = 0.94
  // d = 0.5 + 0.1*0.94 = 0.594, p = 0.94 - 0.0594 = 0.8806
  const auto p = run1(*opt, 1.0f, {0.5f, 0.5f}, 0.1);
  CHECK(p[0] == near(0.94));
  CHECK(p[1] == near(0.8806));
}

TEST_CASE("sgd momentum") {
  auto opt = make_optimizer(sgd(0.1, 0.9), 0, 1);
  REQUIRE(opt->state_names() == std::vector<std::string>{"momentum"});
  CHECK(opt->state_bytes() == 4);
  // buf = 0.5 (first step: d), p = 1 - 0.05 = 0.95
  // buf = 0.9*0.5 + 0.5 = 0.95, p = 0.95 - 0.095 = 0.855
  // buf = 0.9*0.95 - 1 = -0.145, p = 0.855 + 0.0145 = 0.8695
  float p = 1.0f;
  const float g[] = {0.5f, 0.5f, -1.0f};
  const double want_p[] = {0.95, 0.855, 0.8695};
  const double want_buf[] = {0.5, 0.95, -0.145};
  for (int i = 0; i < 3; ++i) {
    opt->step(&p, &g[i], 0.1);
    CHECK(p == near(want_p[i]));
    CHECK(opt->state(0)[0] == near(want_buf[i]));
  }
}

TEST_CASE("sgd nesterov with weight decay") {
  SUBCASE("nesterov") {
    auto opt = make_optimizer(sgd(0.1, 0.9, true), 0, 1);
    // buf = 0.5, d = 0.5 + 0.9*0.5 = 0.95, p = 1 - 0.095 = 0.905
    // buf = 0.9*0.5 + 0.5 = 0.95, d = 0.5 + 0.855 = 1.355, p = 0.905 - 0.1355 = 0.7695
    const auto p = run1(*opt, 1.0f, {0.5f, 0.5f}, 0.1);
    CHECK(p[0] == near(0.905));
    CHECK(p[1] == near(0.7695));
  }
  SUBCASE("nesterov + weight decay") {
    auto opt = make_optimizer(sgd(0.1, 0.9, true, 0.1), 0, 1);
    // d = 0.5 + 0.1 = 0.6, buf = 0.6, d = 0.6 + 0.54 = 1.14, p = 1 - 0.114 = 0.886
    // d = 0.5 + 0.0886 = 0.5886, buf = 0.54 + 0.5886 = 1.1286, d = 0.5886 + 1.01574 = 1.60434,
    // p = 0.886 - 0.160434 = 0.725566
    const auto p = run1(*opt, 1.0f, {0.5f, 0.5f}, 0.1);
    CHECK(p[0] == near(0.886));
    CHECK(p[1] == near(0.725566));
  }
}

TEST_CASE("adam: moments and bias correction") {
  auto opt = make_optimizer(adam("adam"), 0, 1);
  REQUIRE(opt->state_names() == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
  CHECK(opt->state_bytes() == 8);
  // t=1, g=0.5: m = 0.05, v = 0.001*0.25 = 0.00025, mhat = 0.05/0.1 = 0.5,
  //   vhat = 0.00025/0.001 = 0.25, p = 1 - 0.1*0.5/(0.5 + 1e-8) = 0.900000002
  // t=2, g=-1: m = 0.045 - 0.1 = -0.055, v = 0.00024975 + 0.001 = 0.00124975,
  //   mhat = -0.055/0.19 = -0.289473684, vhat = 0.00124975/0.001999 = 0.625187594,
  //   p = 0.9 + 0.1*0.289473684/0.790688 = 0.936610354
  // t=3, g=0.25: m = -0.0495 + 0.025 = -0.0245, v = 0.00124850025 + 0.0000625 = 0.00131100025,
  //   p = 0.95027942
  float p = 1.0f;
  const float g[] = {0.5f, -1.0f, 0.25f};
  const double want_p[] = {0.900000002, 0.936610354, 0.95027942};
  const double want_m[] = {0.05, -0.055, -0.0245};
  const double want_v[] = {0.00025, 0.00124975, 0.00131100025};
  for (int i = 0; i < 3; ++i) {
    opt->step(&p, &g[i], 0.1);
    CHECK(p == near(want_p[i]));
    CHECK(opt->state(0)[0] == near(want_m[i]));
    CHECK(opt->state(1)[0] == near(want_v[i]));
  }
  CHECK(opt->step_count() == 3);
}

TEST_CASE("adam weight decay is L2 on the gradient") {
  auto opt = make_optimizer(adam("adam", 0.1), 0, 1);
  // t=1: g' = 0.5 + 0.1*1 = 0.6, m = 0.06, v = 0.00036; mhat/sqrt(vhat) = 0.6/0.6 = 1,
  //   p = 0.9 (the first Adam step is always ~lr*sign(g'))
  // t=2: g' = -1 + 0.09 = -0.91, m = 0.054 - 0.091 = -0.037, v = 0.00035964 + 0.0008281,
  //   p = 0.925263519; t=3: p = 0.924730574
  float p = 1.0f;
  const float g[] = {0.5f, -1.0f, 0.25f};
  const double want_p[] = {0.900000002, 0.925263519, 0.924730574};
  const double want_m[] = {0.06, -0.037, 0.000952635209};
  for (int i = 0; i < 3; ++i) {
    opt->step(&p, &g[i], 0.1);
    CHECK(p == near(want_p[i]));
    CHECK(opt->state(0)[0] == near(want_m[i]));
  }
}

TEST_CASE("adamw decays the parameter before the Adam step") {
  auto opt = make_optimizer(adam("adamw", 0.1), 0, 1);
  REQUIRE(opt->state_names() == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
  // t=1: p = 1*(1 - 0.1*0.1) = 0.99, then the Adam step of -0.1: 0.890000002
  // t=2: p = 0.89*0.99 = 0.8811, then +0.0366103538 (as in plain Adam): 0.917710354
  // t=3: p = 0.917710354*0.99 = 0.90853325, then +0.0136690673: 0.922202317
  float p = 1.0f;
  const float g[] = {0.5f, -1.0f, 0.25f};
  const double want_p[] = {0.890000002, 0.917710354, 0.922202317};
  const double want_v[] = {0.00025, 0.00124975, 0.00131100025};  // gradient untouched by wd
  for (int i = 0; i < 3; ++i) {
    opt->step(&p, &g[i], 0.1);
    CHECK(p == near(want_p[i]));
    CHECK(opt->state(1)[0] == near(want_v[i]));
  }
}

TEST_CASE("adam bias correction uses the restored step count") {
  // A resumed optimizer continues at t = step_count + 1: after set_step_count(1) and state
  // m=0.05, v=0.00025 (the state after the first step above), step g=-1 gives the t=2 value.
  auto opt = make_optimizer(adam("adam"), 0, 1);
  opt->set_step_count(1);
  opt->state(0)[0] = 0.05f;
  opt->state(1)[0] = 0.00025f;
  float p = 0.9f, g = -1.0f;
  opt->step(&p, &g, 0.1);
  CHECK(p == near(0.936610352));  // 0.9 + 0.0366103538
  CHECK(opt->step_count() == 2);
}

// Elements are independent, so an optimizer over a sub-range [begin, begin+n) must produce for
// each element exactly what a whole-range optimizer produces, and must not read or write
// anything outside the pointers' first n elements. n = 7 covers both the vector body (4-wide)
// and the scalar tail of the Adam loop.
TEST_CASE("optimizers touch only their own range") {
  const int64_t total = 16, begin = 5, n = 7;
  for (const char* type : {"sgd", "adam", "adamw"}) {
    CAPTURE(type);
    OptimizerConfig cfg =
        type == std::string("sgd") ? sgd(0.05, 0.9, true, 0.01) : adam(type, 0.01);
    std::vector<float> p_full(total), g(total);
    for (int64_t i = 0; i < total; ++i) {
      p_full[i] = 0.1f * static_cast<float>(i) - 0.7f;
      g[i] = 0.3f * std::sin(static_cast<float>(i));
    }
    std::vector<float> p_part = p_full;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> g_part = g;
    for (int64_t i = 0; i < total; ++i) {
      if (i < begin || i >= begin + n) {
        p_part[i] = 1234.5f;
        g_part[i] = nan;  // would poison the result if read
      }
    }
    auto whole = make_optimizer(cfg, 0, total);
    auto part = make_optimizer(cfg, begin, n);
    CHECK(part->begin() == begin);
    CHECK(part->size() == n);
    for (size_t s = 0; s < part->state_names().size(); ++s) CHECK(part->state(s).size() == 7u);
    for (int step = 0; step < 3; ++step) {
      whole->step(p_full.data(), g.data(), 0.05);
      part->step(p_part.data() + begin, g_part.data() + begin, 0.05);
    }
    for (int64_t i = 0; i < total; ++i) {
      CAPTURE(i);
      if (i < begin || i >= begin + n) {
        CHECK(p_part[i] == 1234.5f);
      } else {
        CHECK(p_part[i] == p_full[i]);
        for (size_t s = 0; s < part->state_names().size(); ++s) {
          CHECK(part->state(s)[i - begin] == whole->state(s)[i]);
        }
      }
    }
  }
}

// The vectorised Adam body against a plain per-element reference in PyTorch's operation order.
TEST_CASE("adam over many elements matches the per-element formula") {
  const int64_t n = 1003;
  auto opt = make_optimizer(adam("adam"), 0, n);
  std::vector<float> p(n), g(n), m(n, 0.0f), v(n, 0.0f), ref(n);
  for (int64_t i = 0; i < n; ++i) p[i] = ref[i] = std::cos(0.37f * static_cast<float>(i));
  for (int t = 1; t <= 4; ++t) {
    for (int64_t i = 0; i < n; ++i) g[i] = std::sin(0.11f * static_cast<float>(i * t)) * 1e-2f;
    opt->step(p.data(), g.data(), 0.01);
    const double bc1 = 1 - std::pow(0.9, t), bc2 = 1 - std::pow(0.999, t);
    for (int64_t i = 0; i < n; ++i) {
      m[i] = 0.9f * m[i] + 0.1f * g[i];
      v[i] = 0.999f * v[i] + 0.001f * g[i] * g[i];
      const float denom = std::sqrt(v[i]) / static_cast<float>(std::sqrt(bc2)) + 1e-8f;
      ref[i] = ref[i] + static_cast<float>(-0.01 / bc1) * m[i] / denom;
    }
  }
  for (int64_t i = 0; i < n; i += 7) {
    CAPTURE(i);
    CHECK(p[i] == doctest::Approx(ref[i]).epsilon(1e-6));
  }
}

TEST_CASE("zero-size range and argument checks") {
  auto opt = make_optimizer(adam("adam"), 10, 0);
  opt->step(nullptr, nullptr, 0.1);  // nothing to touch
  CHECK(opt->step_count() == 1);
  CHECK(opt->state_bytes() == 0);
  CHECK_THROWS_AS(make_optimizer(sgd(0.1), 0, -1), InternalError);
  OptimizerConfig bad = sgd(0.1);
  bad.type = static_cast<OptimizerType>(99);
  CHECK_THROWS_AS(make_optimizer(bad, 0, 1), InternalError);
}

// ---------------------------------------------------------------------------------------------
// Schedules

ScheduleConfig sched(const std::string& type, int64_t warmup = 0) {
  ScheduleConfig s;
  s.type = parse_enum<ScheduleType>(type).value();
  s.warmup_steps = warmup;
  return s;
}

TEST_CASE("lr_at constant and warmup") {
  const ScheduleConfig c = sched("constant");
  CHECK(lr_at(c, 0.1, 0, 100) == near(0.1));
  CHECK(lr_at(c, 0.1, 99, 100) == near(0.1));
  CHECK(lr_at(c, 0.1, 500, 100) == near(0.1));
  const ScheduleConfig w = sched("constant", 10);
  CHECK(lr_at(w, 0.1, 0, 100) == near(0.01));  // 0.1 * 1/10
  CHECK(lr_at(w, 0.1, 4, 100) == near(0.05));  // 0.1 * 5/10
  CHECK(lr_at(w, 0.1, 9, 100) == near(0.1));   // last warmup step reaches lr
  CHECK(lr_at(w, 0.1, 10, 100) == near(0.1));
}

TEST_CASE("lr_at step decay") {
  ScheduleConfig s = sched("step");
  s.step_size = 30;
  s.gamma = 0.5;
  CHECK(lr_at(s, 0.1, 0, 1000) == near(0.1));
  CHECK(lr_at(s, 0.1, 29, 1000) == near(0.1));
  CHECK(lr_at(s, 0.1, 30, 1000) == near(0.05));
  CHECK(lr_at(s, 0.1, 59, 1000) == near(0.05));
  CHECK(lr_at(s, 0.1, 60, 1000) == near(0.025));
  // With warmup the decay clock starts when warmup ends.
  s.warmup_steps = 5;
  CHECK(lr_at(s, 0.1, 0, 1000) == near(0.02));
  CHECK(lr_at(s, 0.1, 5, 1000) == near(0.1));
  CHECK(lr_at(s, 0.1, 34, 1000) == near(0.1));
  CHECK(lr_at(s, 0.1, 35, 1000) == near(0.05));
}

TEST_CASE("lr_at cosine") {
  ScheduleConfig s = sched("cosine", 10);
  s.min_lr = 0.001;
  CHECK(lr_at(s, 0.1, 0, 110) == near(0.01));  // warmup
  CHECK(lr_at(s, 0.1, 10, 110) == near(0.1));  // t = 0
  // t = 0.25: 0.001 + 0.099 * (1 + cos(pi/4)) / 2 = 0.001 + 0.099 * 0.853553 = 0.0855018
  CHECK(lr_at(s, 0.1, 35, 110) == near(0.0855018));
  CHECK(lr_at(s, 0.1, 60, 110) == near(0.0505));  // t = 0.5: midpoint of lr and min_lr
  CHECK(lr_at(s, 0.1, 110, 110) == near(0.001));  // t = 1: min_lr
  CHECK(lr_at(s, 0.1, 200, 110) == near(0.001));  // clamped past the end
  s.warmup_steps = 0;
  s.min_lr = 0;
  CHECK(lr_at(s, 0.2, 0, 100) == near(0.2));
  CHECK(lr_at(s, 0.2, 50, 100) == near(0.1));
  CHECK(lr_at(s, 0.2, 100, 100) == doctest::Approx(0.0).epsilon(1e-12));
  CHECK(lr_at(s, 0.2, 0, 0) == near(0.2));  // degenerate total: no division by zero
}

// ---------------------------------------------------------------------------------------------
// Gradient-norm helpers

TEST_CASE("sum_squares accumulates in double") {
  const float a[] = {1, 2, 3};
  CHECK(sum_squares(a, 3) == 14.0);
  CHECK(sum_squares(a, 0) == 0.0);
  // 1e8 + 4: float accumulation would round the small terms away (float ulp at 1e8 is 8).
  const float b[] = {1e4f, 1, 1, 1, 1};
  CHECK(sum_squares(b, 5) == 100000004.0);
  std::vector<float> c(1001);
  double want = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    c[i] = 0.01f * static_cast<float>(i) - 3.0f;
    want += static_cast<double>(c[i]) * c[i];
  }
  CHECK(sum_squares(c.data(), 1001) == doctest::Approx(want).epsilon(1e-12));
}

TEST_CASE("scale_inplace and clip_factor") {
  float g[] = {1, -2, 4, 0.5f, 8};
  scale_inplace(g, 4, 0.5f);
  CHECK(g[0] == 0.5f);
  CHECK(g[1] == -1.0f);
  CHECK(g[2] == 2.0f);
  CHECK(g[3] == 0.25f);
  CHECK(g[4] == 8.0f);  // outside n
  CHECK(clip_factor(10.0, 1.0) == doctest::Approx(1.0 / (10.0 + 1e-6)));
  CHECK(clip_factor(0.5, 1.0) == 1.0f);
  CHECK(clip_factor(0.0, 1.0) == 1.0f);
  CHECK(clip_factor(1e6, 0.0) == 1.0f);  // off
  CHECK(clip_factor(4.0, 2.0) * 4.0 == doctest::Approx(2.0).epsilon(1e-6));
}

}  // namespace
}  // namespace dtrain
