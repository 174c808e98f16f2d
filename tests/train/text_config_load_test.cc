// data.format text from a config file to load_data: globs resolved against the config's folder,
// the window length from model.block_size.
#include <doctest/doctest.h>

#include <string>

#include "config/config.h"
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

TEST_CASE("load_data: format text through the config: globs, block_size from the model") {
  TempDir t;
  t.write("x1.txt", bytes_of(400));
  t.write("x2.txt", bytes_of(400));
  const Config c = load_config(t.write(
      "c.yaml",
      "model: {type: gpt, block_size: 8}\ndata: {format: text, train: {path: 'x*.txt'}}\n"));
  const DataSplits s = load_data(c.data, c.seed);
  // 720 training bytes: 89 windows of 9; 80 held out: 9 windows.
  CHECK(s.train.features == 9);
  CHECK(s.train.rows == 89);
  CHECK(s.test.rows == 9);
  const Config none = load_config(t / "c.yaml", {"data.train.path=" + t / "nothing*.txt"});
  CHECK_THROWS_WITH_AS(load_data(none.data, 1), doctest::Contains("matches no file"), UserError);
}

}  // namespace
}  // namespace dtrain
