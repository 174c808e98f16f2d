// The GPT's kernels (nn/kernels/attention.h, nn/kernels/embedding.h): finite-difference gradient
// checks, the causal mask, the overwrite/accumulate contracts and that steps do not allocate.
//
// Gradient check: J = sum(y * r) for a fixed random r, the forward in float and J accumulated in
// double; the numeric derivative of each input element is the central difference
// (J(v + eps) - J(v - eps)) / (v_hi - v_lo) with eps = 1e-2 and the perturbation as stored in
// float. Criterion (as in gradcheck_test.cc): max |numeric - analytic| <= 1e-3 * max |numeric|. The
// attention core is smooth with O(1) derivatives on inputs in [-1, 1], so the truncation error
// (~eps^2 |J'''| / 6) and float rounding in J (~1e-7 |J| / eps) are both ~1e-5 of the scale; a
// missing softmax-backward term or a wrong scale is off by far more than 1e-3.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "fd_util.h"
#include "nn/kernels/attention.h"
#include "nn/kernels/embedding.h"
#include "nn/kernels/fast_math.h"
#include "util/rng.h"

namespace dtrain_test {
long allocations();
}  // namespace dtrain_test

namespace dtrain {
namespace {

using testing::fd_error;
using testing::kTol;
using testing::uniform;
using testing::weighted_sum;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct AttentionRun {
  AttentionDims d;
  std::vector<float> qkv, y, saved, scratch;
  explicit AttentionRun(AttentionDims dims, uint64_t seed)
      : d(dims),
        qkv(uniform(dims.batch * dims.seq * 3 * dims.embd, seed)),
        y(static_cast<size_t>(dims.batch * dims.seq * dims.embd), kNaN),
        saved(static_cast<size_t>(attention_saved_floats(dims)), kNaN),
        scratch(static_cast<size_t>(attention_scratch_floats(dims)), kNaN) {}
  void forward() { attention_forward(d, qkv.data(), y.data(), saved.data()); }
};

void check_attention(int64_t batch, int64_t seq, int64_t n_head, int64_t head_size) {
  INFO("B=", batch, " T=", seq, " nh=", n_head, " hs=", head_size);
  AttentionRun run({batch, seq, n_head, n_head * head_size}, 17 + seq);
  const std::vector<float> r = uniform(static_cast<int64_t>(run.y.size()), 5);
  run.forward();
  std::vector<float> dqkv(run.qkv.size(), kNaN);  // overwritten, so NaNs must not survive
  attention_backward(run.d, run.qkv.data(), run.saved.data(), r.data(), dqkv.data(),
                     run.scratch.data());
  for (float g : dqkv) REQUIRE(std::isfinite(g));
  CHECK(fd_error(run.qkv, dqkv, [&] {
          run.forward();
          return weighted_sum(run.y, r);
        }) < kTol);
}

TEST_CASE("gpt kernels: attention gradient check over several B, T, heads and head sizes") {
  check_attention(1, 1, 1, 4);  // T = 1: each position attends only to itself, so y = v
  check_attention(2, 1, 2, 3);
  check_attention(1, 5, 1, 3);
  check_attention(2, 3, 2, 4);
  check_attention(3, 4, 4, 2);
  check_attention(2, 7, 3, 5);
}

TEST_CASE("gpt kernels: attention is causal, its rows are distributions, T = 1 copies v") {
  AttentionRun run({2, 6, 2, 8}, 3);
  run.forward();
  const int64_t T = 6, C = 8, nh = 2;
  for (int64_t bh = 0; bh < 2 * nh; ++bh) {
    for (int64_t t = 0; t < T; ++t) {
      double sum = 0.0;
      for (int64_t j = 0; j < T; ++j) {
        const float p = run.saved[static_cast<size_t>((bh * T + t) * T + j)];
        if (j > t) CHECK(p == 0.0f);
        CHECK(p >= 0.0f);
        sum += p;
      }
      CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
    }
  }
  // Changing q, k and v of the last position changes only the last position's output.
  const std::vector<float> before = run.y;
  for (int64_t c = 0; c < 3 * C; ++c) run.qkv[static_cast<size_t>((T - 1) * 3 * C + c)] += 0.5f;
  run.forward();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(t * C + c);
      if (t < T - 1) CHECK(run.y[i] == before[i]);
    }
  }
  CHECK(run.y[static_cast<size_t>((T - 1) * C)] != before[static_cast<size_t>((T - 1) * C)]);
  CHECK(run.y[static_cast<size_t>(T * C)] == before[static_cast<size_t>(T * C)]);  // batch 1

  AttentionRun one({3, 1, 2, 4}, 9);
  one.forward();
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t c = 0; c < 4; ++c) {
      CHECK(one.y[static_cast<size_t>(b * 4 + c)] ==
            doctest::Approx(one.qkv[static_cast<size_t>(b * 12 + 8 + c)]).epsilon(1e-6));
    }
  }
}

TEST_CASE("gpt kernels: attention forward and backward do not allocate, null dqkv is a no-op") {
  AttentionRun run({2, 8, 2, 8}, 4);
  const std::vector<float> dy = uniform(static_cast<int64_t>(run.y.size()), 8);
  std::vector<float> dqkv(run.qkv.size());
  run.forward();  // first call: lets OpenBLAS set up whatever it sets up once
  const long before = dtrain_test::allocations();
  for (int i = 0; i < 3; ++i) {
    run.forward();
    attention_backward(run.d, run.qkv.data(), run.saved.data(), dy.data(), dqkv.data(),
                       run.scratch.data());
  }
  CHECK(dtrain_test::allocations() == before);
  std::vector<float> scratch_before = run.scratch;
  attention_backward(run.d, run.qkv.data(), run.saved.data(), dy.data(), nullptr,
                     run.scratch.data());
  CHECK(run.scratch == scratch_before);
}

TEST_CASE("gpt kernels: row_max is the exact maximum and row_dot the sum, at every length") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {-3.5f, -0.0f, -7.25f, -1e-30f, -2.0f, -1e30f, -9.0f, -0.5f, -4.0f, -8.0f};
  CHECK(row_max(v.data(), 1) == -3.5f);
  CHECK(row_max(v.data(), 3) == 0.0f);
  CHECK(row_max(v.data() + 2, 8) == -1e-30f);  // negatives only: the one closest to zero
  CHECK(row_max(v.data() + 4, 6) == -0.5f);
  v[9] = 5.0f;
  CHECK(row_max(v.data(), 10) == 5.0f);  // beyond the first lane block
  v[8] = inf;
  CHECK(row_max(v.data(), 10) == inf);
  v[8] = -inf;
  CHECK(row_max(v.data() + 8, 1) == -inf);
  CHECK(std::isnan(row_max(std::vector<float>{1.0f, kNaN, 2.0f}.data(), 3)));
  for (int64_t n = 1; n <= 19; ++n) {
    std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    double sum = 0, dot = 0;
    for (int64_t j = 0; j < n; ++j) {
      x[static_cast<size_t>(j)] = static_cast<float>(j + 1);
      y[static_cast<size_t>(j)] = static_cast<float>(2 * j - 5);
      sum += j + 1;
      dot += (j + 1.0) * (2 * j - 5);
    }
    CHECK(row_dot(x.data(), nullptr, n) == sum);  // small integers: exact in any order
    CHECK(row_dot(x.data(), y.data(), n) == dot);
  }
}

struct EmbeddingRun {
  EmbeddingDims d{3, 4, 5, 6, 3};  // B, T, V, block_size (> T: wpe rows 4, 5 unused), C
  std::vector<int32_t> tokens = {0, 3, 3, 1, 3, 0, 4, 4, 2, 2, 2, 3};  // repeats in and across rows
  std::vector<float> wte = uniform(5 * 3, 1), wpe = uniform(6 * 3, 2);
  std::vector<float> out = std::vector<float>(3 * 4 * 3, kNaN);
  void forward() { embedding_forward(d, tokens.data(), wte.data(), wpe.data(), out.data()); }
};

TEST_CASE("gpt kernels: embedding forward adds the token's and the position's rows") {
  EmbeddingRun e;
  e.forward();
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t t = 0; t < 4; ++t) {
      const int32_t tok = e.tokens[static_cast<size_t>(b * 4 + t)];
      for (int64_t c = 0; c < 3; ++c) {
        CHECK(e.out[static_cast<size_t>((b * 4 + t) * 3 + c)] ==
              e.wte[static_cast<size_t>(tok * 3 + c)] + e.wpe[static_cast<size_t>(t * 3 + c)]);
      }
    }
  }
}

TEST_CASE("gpt kernels: embedding gradient check with repeated tokens, gradients accumulate") {
  EmbeddingRun e;
  const std::vector<float> r = uniform(static_cast<int64_t>(e.out.size()), 7);
  const auto objective = [&] {
    e.forward();
    return weighted_sum(e.out, r);
  };
  // Start from non-zero gradients: the backward adds to them.
  const std::vector<float> dwte0 = uniform(5 * 3, 11), dwpe0 = uniform(6 * 3, 12);
  std::vector<float> dwte = dwte0, dwpe = dwpe0;
  embedding_backward(e.d, e.tokens.data(), r.data(), dwte.data(), dwpe.data());
  std::vector<float> gte(dwte.size()), gpe(dwpe.size());
  for (size_t i = 0; i < gte.size(); ++i) gte[i] = dwte[i] - dwte0[i];
  for (size_t i = 0; i < gpe.size(); ++i) gpe[i] = dwpe[i] - dwpe0[i];
  CHECK(fd_error(e.wte, gte, objective) < kTol);
  CHECK(fd_error(e.wpe, gpe, objective) < kTol);
  // Token 3 occurs 4 times: its row is the sum of those four output rows' gradients; positions
  // past T get nothing.
  for (int64_t c = 0; c < 3; ++c) {
    const float expect = r[static_cast<size_t>(1 * 3 + c)] + r[static_cast<size_t>(2 * 3 + c)] +
                         r[static_cast<size_t>(4 * 3 + c)] + r[static_cast<size_t>(11 * 3 + c)];
    CHECK(gte[static_cast<size_t>(3 * 3 + c)] == doctest::Approx(expect).epsilon(1e-6));
    CHECK(gpe[static_cast<size_t>(4 * 3 + c)] == 0.0f);
    CHECK(gpe[static_cast<size_t>(5 * 3 + c)] == 0.0f);
  }
  // A null gradient is skipped; the other one is still accumulated.
  std::vector<float> only_pe = dwpe0;
  embedding_backward(e.d, e.tokens.data(), r.data(), nullptr, only_pe.data());
  CHECK(only_pe == dwpe);
}

}  // namespace
}  // namespace dtrain
