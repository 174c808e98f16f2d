// nn/sampling.h: sample_next's argmax cases, its top-k restriction, determinism, and its draw
// frequencies against softmax(logits / temperature).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "nn/sampling.h"
#include "util/check.h"

namespace dtrain {
namespace {

// softmax(l / T) restricted to `keep` (all when empty).
std::vector<double> softmax_of(const std::vector<float>& l, double T,
                               const std::vector<int>& keep = {}) {
  std::vector<double> p(l.size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    bool kept = keep.empty();
    for (int k : keep) kept = kept || static_cast<size_t>(k) == i;
    if (kept) total += p[i] = std::exp(l[i] / T);
  }
  for (double& v : p) v /= total;
  return p;
}

// Each token's frequency over `draws` draws lies within 5 standard deviations of `want`, and a
// token of probability 0 is never drawn.
void check_frequencies(const std::vector<float>& l, double T, int64_t k,
                       const std::vector<double>& want, int draws) {
  Rng rng(7);
  std::vector<int> count(l.size(), 0);
  for (int i = 0; i < draws; ++i)
    ++count[static_cast<size_t>(sample_next(l.data(), static_cast<int64_t>(l.size()), T, k, rng))];
  for (size_t i = 0; i < l.size(); ++i) {
    const double f = static_cast<double>(count[i]) / draws;
    const double sd = std::sqrt(want[i] * (1 - want[i]) / draws);
    INFO("token " << i << ": frequency " << f << ", softmax " << want[i]);
    if (want[i] == 0) {
      CHECK(count[i] == 0);
    } else {
      CHECK(std::abs(f - want[i]) <= 5 * sd + 1e-12);
    }
  }
}

const std::vector<float> kLogits = {0.5f, -1.0f, 2.0f, 1.5f, -0.25f, 2.0f, 0.0f, -3.0f};

TEST_CASE("sample_next: temperature 0 and top_k 1 are the argmax, lowest index among ties") {
  Rng rng(1);
  const auto before = rng.state();
  CHECK(sample_next(kLogits.data(), 8, 0.0, 0, rng) == 2);  // 2 and 5 tie at 2.0
  CHECK(sample_next(kLogits.data(), 8, 0.0, 5, rng) == 2);
  CHECK(rng.state() == before);  // greedy draws nothing
  for (double T : {0.1, 1.0, 50.0}) CHECK(sample_next(kLogits.data(), 8, T, 1, rng) == 2);
  const std::vector<float> one = {-4.0f};
  CHECK(sample_next(one.data(), 1, 1.0, 0, rng) == 0);
}

TEST_CASE("sample_next: frequencies match softmax(logits / temperature)") {
  check_frequencies(kLogits, 1.0, 0, softmax_of(kLogits, 1.0), 200000);
  check_frequencies(kLogits, 2.5, 0, softmax_of(kLogits, 2.5), 200000);
  check_frequencies(kLogits, 0.5, 8, softmax_of(kLogits, 0.5), 200000);  // top_k = vocab: all
}

TEST_CASE("sample_next: top_k keeps the k largest logits, ties towards lower indices") {
  // The 3 largest: 2 and 5 (2.0), 3 (1.5).
  check_frequencies(kLogits, 1.0, 3, softmax_of(kLogits, 1.0, {2, 3, 5}), 100000);
  // k = 2 with a tie at 2.0: exactly tokens 2 and 5, equally often.
  check_frequencies(kLogits, 1.0, 2, softmax_of(kLogits, 1.0, {2, 5}), 100000);
  // A tie at the k-th value: {1, 1, 1} with k = 2 keeps tokens 0 and 1.
  const std::vector<float> flat = {1.0f, 1.0f, 1.0f};
  check_frequencies(flat, 1.0, 2, {0.5, 0.5, 0.0}, 20000);
}

TEST_CASE("sample_next: the same rng state gives the same tokens, another seed others") {
  auto draw = [](uint64_t seed) {
    Rng rng(seed);
    std::vector<int64_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(sample_next(kLogits.data(), 8, 1.0, 0, rng));
    return out;
  };
  CHECK(draw(3) == draw(3));
  CHECK(draw(3) != draw(4));
}

TEST_CASE("sample_next: non-finite logits are a UserError, bad settings an InternalError") {
  Rng rng(1);
  std::vector<float> l = kLogits;
  l[4] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_AS(sample_next(l.data(), 8, 1.0, 0, rng), UserError);
  l[4] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(sample_next(l.data(), 8, 0.0, 0, rng), UserError);
  CHECK_THROWS_AS(sample_next(kLogits.data(), 8, -1.0, 0, rng), InternalError);
  CHECK_THROWS_AS(sample_next(kLogits.data(), 8, 1.0, 9, rng), InternalError);
  CHECK_THROWS_AS(sample_next(kLogits.data(), 8, 1.0, -1, rng), InternalError);
}

}  // namespace
}  // namespace dtrain
