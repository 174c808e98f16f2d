// Batches from a data set: features with labels, and token windows whose targets are the next
// tokens (issue 13's text data).
#include <doctest/doctest.h>

#include <vector>

#include "train/batch.h"

namespace dtrain {
namespace {

TEST_CASE("batch: feature rows give their features and labels") {
  Dataset d;
  d.rows = 3;
  d.features = 2;
  d.x = {0, 1, 10, 11, 20, 21};
  d.y = {7, 8, 9};
  d.num_classes = 10;
  Batch b;
  gather_batch(d, {2, 0}, b);
  CHECK(b.x.shape() == Shape{2, 2});
  CHECK(std::vector<float>(b.x.data(), b.x.data() + 4) == std::vector<float>{20, 21, 0, 1});
  CHECK(b.targets == std::vector<int32_t>{9, 7});
}

TEST_CASE("batch: token windows give the first T tokens as input and the next tokens as targets") {
  Dataset d;
  d.kind = SampleKind::kTokenWindow;
  d.rows = 2;
  d.features = 4;                                  // T = 3
  d.tokens = {'a', 'b', 'c', 'd', 'e', 'f', 'g'};  // windows abcd, defg
  d.num_classes = 256;
  CHECK(d.input_features() == 3);
  CHECK(d.targets_per_row() == 3);
  Batch b;
  gather_batch(d, {1, 0}, b);
  CHECK(b.x.shape() == Shape{2, 3});
  CHECK(std::vector<float>(b.x.data(), b.x.data() + 6) ==
        std::vector<float>{'d', 'e', 'f', 'a', 'b', 'c'});
  CHECK(b.targets == std::vector<int32_t>{'e', 'f', 'g', 'b', 'c', 'd'});
  std::vector<int64_t> idx;
  consecutive_rows(5, 3, idx);
  CHECK(idx == std::vector<int64_t>{5, 6, 7});
}

}  // namespace
}  // namespace dtrain
