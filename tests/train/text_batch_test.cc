// Text data (data/text.h) through the batch gather (train/batch.h): a window's first T bytes are
// the input, the next T bytes the targets, high bytes as tokens 128..255 (not negative).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "data/text.h"
#include "test_util.h"
#include "train/batch.h"

namespace dtrain {
namespace {

TEST_CASE("text batch: windows of a text file become inputs and next-byte targets") {
  testing::TempDir dir;
  std::string text;
  for (int i = 0; i < 40; ++i) text += static_cast<char>(250 - 7 * i);  // 250, 243, ... wraps
  TextOptions o;
  o.train = {dir.write("t.bin", text)};
  o.block_size = 4;
  o.test_fraction = 0.25;  // the last 10 bytes: 2 windows
  const DataSplits s = load_text(o);
  REQUIRE(s.train.rows == (30 - 1) / 4);
  REQUIRE(s.test.rows == (10 - 1) / 4);
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  Batch b;
  gather_batch(s.train, {3, 0}, b);
  CHECK(b.x.shape() == Shape{2, 4});
  CHECK(b.targets.size() == 8u);
  for (size_t j = 0; j < 4; ++j) {
    CHECK(b.x.data()[j] == static_cast<float>(byte(12 + j)));
    CHECK(b.targets[j] == byte(13 + j));
    CHECK(b.x.data()[4 + j] == static_cast<float>(byte(j)));
    CHECK(b.targets[4 + j] == byte(1 + j));
  }
  gather_batch(s.test, {1}, b);
  for (size_t j = 0; j < 4; ++j) CHECK(b.targets[j] == byte(30 + 4 + 1 + j));
}

}  // namespace
}  // namespace dtrain
