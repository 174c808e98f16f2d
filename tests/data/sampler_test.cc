// Sampler: the distributed slices reproduce the single-process batches exactly.
#include "data/sampler.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include <doctest/doctest.h>

namespace dtrain {
namespace {

TEST_CASE("sampler: ranks together see exactly the single-process batches") {
  for (int world = 1; world <= 4; ++world) {
    for (int64_t n : {0, 1, 3, 7, 10, 64, 101}) {
      for (int64_t b : {1, 3, 8}) {
        for (bool drop_last : {false, true}) {
          CAPTURE(world);
          CAPTURE(n);
          CAPTURE(b);
          CAPTURE(drop_last);
          Sampler single(n, world * b, 1, 0, true, drop_last, 99);
          std::vector<Sampler> ranks;
          for (int r = 0; r < world; ++r) ranks.emplace_back(n, b, world, r, true, drop_last, 99);
          const int64_t g = world * b;
          const int64_t expect_batches = drop_last ? n / g : (n + g - 1) / g;
          REQUIRE(single.batches_per_epoch() == expect_batches);
          for (const Sampler& s : ranks) REQUIRE(s.batches_per_epoch() == expect_batches);
          for (int64_t epoch : {0, 3}) {
            std::set<int64_t> seen;
            for (int64_t k = 0; k < expect_batches; ++k) {
              const std::vector<int64_t> want = single.batch(epoch, k);
              CHECK(static_cast<int64_t>(want.size()) == single.global_batch_size(k));
              std::vector<int64_t> got;
              size_t min_len = SIZE_MAX, max_len = 0;
              for (Sampler& s : ranks) {
                const std::vector<int64_t> part = s.batch(epoch, k);
                CHECK(s.global_batch_size(k) == single.global_batch_size(k));
                min_len = std::min(min_len, part.size());
                max_len = std::max(max_len, part.size());
                got.insert(got.end(), part.begin(), part.end());
              }
              CHECK(got == want);             // same items, same order, rank slices contiguous
              CHECK(max_len - min_len <= 1);  // near-equal even on a short batch
              for (int64_t i : got) {
                CHECK(i >= 0);
                CHECK(i < n);
                CHECK(seen.insert(i).second);  // disjoint across ranks and batches
              }
            }
            // Without drop_last every item is seen once per epoch; with it, only the remainder
            // of n modulo the global batch is missing.
            CHECK(static_cast<int64_t>(seen.size()) == (drop_last ? n / g * g : n));
          }
        }
      }
    }
  }
}

TEST_CASE("sampler: full batches give each rank b items, short batch split") {
  // n = 10, world 4, b = 2: batch 0 has 8 items (2 each), batch 1 has 2 items: 1,1,0,0.
  std::vector<size_t> sizes0, sizes1;
  for (int r = 0; r < 4; ++r) {
    Sampler s(10, 2, 4, r, false, false, 1);
    REQUIRE(s.batches_per_epoch() == 2);
    sizes0.push_back(s.batch(0, 0).size());
    sizes1.push_back(s.batch(0, 1).size());
  }
  CHECK(sizes0 == std::vector<size_t>{2, 2, 2, 2});
  CHECK(sizes1 == std::vector<size_t>{1, 1, 0, 0});
  Sampler r1(10, 2, 4, 1, false, false, 1);
  CHECK(r1.batch(0, 0) == std::vector<int64_t>{2, 3});
  CHECK(r1.batch(0, 1) == std::vector<int64_t>{9});
  Sampler dropped(10, 2, 4, 1, false, true, 1);
  CHECK(dropped.batches_per_epoch() == 1);
  // n = 11, world 3, b = 2: the last batch has 5 items, split 2,2,1.
  std::vector<std::vector<int64_t>> last;
  for (int r = 0; r < 3; ++r) last.push_back(Sampler(11, 2, 3, r, false, false, 1).batch(0, 1));
  CHECK(last == std::vector<std::vector<int64_t>>{{6, 7}, {8, 9}, {10}});
}

TEST_CASE("sampler: permutations by seed and epoch, shuffle off is the identity") {
  Sampler a(1000, 10, 2, 0, true, false, 5), b(1000, 10, 2, 1, true, false, 5);
  const std::vector<int64_t> e0 = a.permutation(0);
  const std::vector<int64_t> e1 = a.permutation(1);
  CHECK(a.permutation(0) == e0);  // recomputed after the cache moved on
  CHECK(b.permutation(0) == e0);  // every rank agrees
  CHECK(e0 != e1);
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(e0 != identity);
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == identity);
  Sampler other_seed(1000, 10, 2, 0, true, false, 6);
  CHECK(other_seed.permutation(0) != e0);

  Sampler plain(1000, 10, 2, 0, false, false, 5);
  CHECK(plain.permutation(0) == identity);
  CHECK(plain.permutation(7) == identity);
  CHECK(plain.batch(7, 3) == std::vector<int64_t>{60, 61, 62, 63, 64, 65, 66, 67, 68, 69});

  Sampler empty(0, 4, 2, 1, true, false, 5);
  CHECK(empty.batches_per_epoch() == 0);
  CHECK(empty.permutation(0).empty());
}

}  // namespace
}  // namespace dtrain

TEST_CASE("sampler: the epoch fraction counts items, whatever the batch cut") {
  // 200 items: batches of 24 (8 full and one of 8) or of 8 (25 full). 48 items are 0.24 of the
  // epoch either way (by batches it was 2/9 = 0.222 against 6/25 = 0.24).
  const dtrain::Sampler big(200, 24, 1, 0, true, false, 1), small(200, 8, 1, 0, true, false, 1);
  CHECK(big.epoch_fraction(2) == doctest::Approx(0.24));
  CHECK(small.epoch_fraction(6) == doctest::Approx(0.24));
  CHECK(big.epoch_fraction(big.batches_per_epoch()) == 1.0);
  CHECK(big.epoch_fraction(0) == 0.0);
  // 2 ranks of 12 are one global batch of 24.
  CHECK(dtrain::Sampler(200, 12, 2, 1, true, false, 1).epoch_fraction(2) == doctest::Approx(0.24));
  // drop_last: the epoch is the 192 items of its 8 full batches.
  const dtrain::Sampler dropped(200, 24, 1, 0, true, true, 1);
  CHECK(dropped.epoch_fraction(4) == doctest::Approx(0.5));
  CHECK(dropped.epoch_fraction(dropped.batches_per_epoch()) == 1.0);
}
