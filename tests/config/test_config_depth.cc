// Deeply nested YAML (100k brackets) is one clear error naming the depth, not yaml-cpp's "bad
// file", in a file and in a --set value alike; nesting a config can use still parses.
#include <doctest/doctest.h>

#include <string>

#include "config/config.h"
#include "config_test_util.h"
#include "util/check.h"

using namespace dtrain;

namespace {
using config_test::error_of;
}  // namespace

TEST_CASE("YAML nested past the reader's limit is refused naming the depth") {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string in_file = error_of("model: {hidden: " + deep + "}\n");
  CHECK(in_file.find("x.yaml:1:") == 0);
  CHECK(in_file.find("collections nested 500 levels deep, past the YAML reader's limit") !=
        std::string::npos);
  CHECK(in_file.find("bad file") == std::string::npos);
  const std::string in_set = error_of("model: {hidden: [4]}\n", {"model.hidden=" + deep});
  CHECK(in_set.find("the value is not valid YAML: collections nested") != std::string::npos);
  // 50 levels are YAML, just not a list of widths.
  const std::string fifty = std::string(50, '[') + std::string(50, ']');
  CHECK(error_of("model: {hidden: " + fifty + "}\n").find("expected an integer") !=
        std::string::npos);
}
