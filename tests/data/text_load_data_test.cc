// load_data with data.format text: dispatch to load_text with DataConfig::block_size, the default
// held-out fraction 0.1 (the text's tail), explicit test files, path lists.
#include <doctest/doctest.h>

#include <string>

#include "data/dataset.h"
#include "test_util.h"
#include "util/check.h"

namespace dtrain {
namespace {

using testing::TempDir;

std::string bytes_of(int64_t n) {
  std::string s;
  for (int64_t i = 0; i < n; ++i) s += static_cast<char>('a' + i % 26);
  return s;
}

TEST_CASE("load_data: format text windows the text, holding out its last 10% by default") {
  TempDir t;
  const std::string text = bytes_of(1000);
  DataConfig cfg;
  cfg.format = DataFormat::kText;
  cfg.block_size = 16;
  cfg.train.path = {t.write("a.txt", text.substr(0, 600)), t.write("b.txt", text.substr(600))};
  const DataSplits s = load_data(cfg, 1);
  CHECK(s.train.kind == SampleKind::kTokenWindow);
  CHECK(s.train.features == 17);
  CHECK(s.train.num_classes == 256);
  CHECK(s.normalizer.method == Normalize::kNone);
  // 900 training bytes: (900 - 1) / 16 = 56 windows; 100 held out: 6 windows.
  CHECK(s.train.rows == 56);
  CHECK(s.test.rows == 6);
  CHECK(s.test.window(0)[0] == static_cast<unsigned char>(text[900]));
  CHECK(s.train.window(1)[0] == static_cast<unsigned char>(text[16]));
  // The seed does not matter: the split is the tail.
  CHECK(load_data(cfg, 2).test.tokens == s.test.tokens);

  cfg.test_fraction = 0;
  CHECK(load_data(cfg, 1).test.rows == 0);
  CHECK(load_data(cfg, 1).train.rows == (1000 - 1) / 16);
  cfg.test_fraction = -1;
  cfg.test.path = {t.write("t.txt", bytes_of(50))};
  const DataSplits e = load_data(cfg, 1);
  CHECK(e.train.rows == (1000 - 1) / 16);
  CHECK(e.test.rows == 3);
}

TEST_CASE("load_data: a text test_fraction that rounds to no byte is refused, not no test set") {
  TempDir t;
  DataConfig cfg;
  cfg.format = DataFormat::kText;
  cfg.block_size = 16;
  cfg.train.path = {t.write("a.txt", bytes_of(1000))};
  cfg.test_fraction = 1e-9;  // of 1000 bytes: 0, which trained with no evaluation before
  CHECK_THROWS_WITH_AS(load_data(cfg, 1), doctest::Contains("holds out 0 bytes"), UserError);
}

}  // namespace
}  // namespace dtrain
