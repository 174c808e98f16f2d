// What fuzz/config.cc found, with its inputs committed in fuzz/regressions/config/:
// - config values that are not UTF-8 passed validation and failed later as a raw JSON exception
//   when config.json or the config hash was written; now refused naming the key and the line;
// - a ',' at the top level made yaml-cpp's LoadAll yield empty documents forever, allocating
//   until memory ran out; now refused at once, naming the position.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "config/config.h"
#include "util/check.h"
#include "util/strings.h"

using namespace dtrain;

namespace {

std::string error_of(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  try {
    const Config c = parse_config(yaml, "x.yaml", sets);
    (void)config_to_json(c).dump();  // what run writes as config.json: must not throw
    (void)config_hash(c);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string read_input(const std::string& rel) {
  std::ifstream in(std::string(DTRAIN_SOURCE_DIR) + "/" + rel, std::ios::binary);
  REQUIRE(in);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("fuzz regression: a path value with bytes that are not UTF-8 is a user error") {
  const std::string e = error_of(read_input("fuzz/regressions/config/non_utf8_path_value"));
  CHECK(e.find("x.yaml:11:") == 0);
  CHECK(e.find("data.train.labels: the value is not valid UTF-8 text") != std::string::npos);
}

TEST_CASE("config strings that are not UTF-8 are refused in the file and in --set") {
  const std::string base =
      "seed: 1\nmodel: {type: mlp, hidden: [8]}\n"
      "data: {format: synthetic, synthetic: {samples: 100, features: 4, classes: 2}}\n";
  // A raw Latin-1 byte, quoted and plain.
  for (const std::string& bad : {std::string("\"caf\xe9.bin\""), std::string("caf\xe9.bin")}) {
    INFO(bad);
    const std::string in_file = error_of(base + "distributed: {token_file: " + bad + "}\n");
    CHECK(in_file.find("x.yaml:4:") == 0);
    CHECK(in_file.find("distributed.token_file: the value is not valid UTF-8") !=
          std::string::npos);
    const std::string in_set = error_of(base, {"distributed.token_file=" + bad});
    CHECK(in_set.find("--set distributed.token_file=") == 0);
    CHECK(in_set.find("not valid UTF-8") != std::string::npos);
  }
  CHECK(error_of(base + "distributed: {token_file: \"caf\xc3\xa9 \\u00e9.bin\"}\n") ==
        "(no error)");
  // An escaped UTF-16 surrogate: yaml-cpp refuses it itself, as a user error.
  CHECK(error_of(base + "distributed: {token_file: \"\\uD800\"}\n").find("x.yaml:4:") == 0);
}

TEST_CASE(
    "valid_utf8 follows JSON's rule: no overlong forms, surrogates or code points past U+10FFFF") {
  CHECK(valid_utf8(""));
  CHECK(valid_utf8("plain ascii"));
  CHECK(
      valid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf"));  // up to U+10FFFF
  CHECK(valid_utf8("\xed\x9f\xbf \xee\x80\x80"));  // U+D7FF and U+E000, either side of surrogates
  CHECK_FALSE(valid_utf8("\xff"));
  CHECK_FALSE(valid_utf8("\x80"));              // a stray continuation byte
  CHECK_FALSE(valid_utf8("caf\xc3"));           // truncated
  CHECK_FALSE(valid_utf8("\xc0\x80"));          // overlong NUL
  CHECK_FALSE(valid_utf8("\xc1\xbf"));          // overlong
  CHECK_FALSE(valid_utf8("\xe0\x9f\xbf"));      // overlong 3-byte
  CHECK_FALSE(valid_utf8("\xf0\x8f\xbf\xbf"));  // overlong 4-byte
  CHECK_FALSE(valid_utf8("\xed\xa0\x80"));      // U+D800, a surrogate
  CHECK_FALSE(valid_utf8("\xf4\x90\x80\x80"));  // U+110000
  CHECK_FALSE(valid_utf8("\xf5\x80\x80\x80"));
  CHECK_FALSE(valid_utf8("\xe2\x82"));
  CHECK_FALSE(valid_utf8("\xe2\x28\xa1"));  // a bad continuation byte
}

TEST_CASE("fuzz regression: a top-level ',' is refused at once, not parsed until memory runs out") {
  const auto start = std::chrono::steady_clock::now();
  const std::string e = error_of(read_input("fuzz/regressions/config/top_level_comma_never_ends"));
  // (The fuzzer's input also holds a NUL byte, now refused first, at once.)
  CHECK(e == "x.yaml:1:11: a NUL byte: a config is text, and this file is not");
  for (const std::string& text :
       {std::string(",\n"), std::string("---\n,\n"), std::string("seed: 1\n...\n,\n")}) {
    INFO(text);
    CHECK(error_of(text).find("unexpected ','") != std::string::npos);
  }
  CHECK(error_of("---\n,\n").find("x.yaml:2:1: ") == 0);
  // Documents that do make progress are still read: empty ones, and a second one is refused.
  CHECK(error_of("---\n---\n").find("unexpected") == std::string::npos);
  CHECK(error_of("seed: 1\n---\nseed: 2\n").find("found another after the first's end") != std::string::npos);
  // Generous: the loop took 19 s and 3.6 GB; refusing takes microseconds.
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

TEST_CASE("a config of many small YAML values is refused before its tree is built") {
  // yaml-cpp's tree took ~1 KB per node: 400 KB of empty flow entries took 390 MB, a 40 MB list
  // 9.3 GB, before the value count refused them. The event parser counts them first now.
  const std::string commas = "{" + std::string(400000, ',') + "}\n";
  std::string list = "data: {format: synthetic}\nmodel: {hidden: [";
  for (int i = 0; i < 200000; ++i) list += "1,";
  list += "1]}\n";
  for (const std::string& text : {commas, list}) {
    const std::string e = error_of(text);
    CHECK_MESSAGE(e.find("more than 100000 YAML values") != std::string::npos, e);
  }
  // The same in a --set value.
  const std::string e = error_of("seed: 1\n", {"model.hidden=[" + std::string(300000, ',') + "]"});
  CHECK_MESSAGE(e.find("more than 100000 YAML values") != std::string::npos, e);
  // A file over 1 MiB is refused before it is parsed.
  const std::string path = "/tmp/dtrain_big_config_test.yaml";
  {
    std::ofstream f(path);
    f << "seed: 1\n" << std::string(1 << 20, '#') << "\n";
  }
  CHECK_THROWS_WITH_AS(load_config(path),
                       doctest::Contains("more than the 1 MiB a config may have"), UserError);
  std::remove(path.c_str());
  // A --set value of several documents is refused, as a file of several is.
  const std::string two = error_of("seed: 1\n", {"optimizer.lr=0.1\n---\n0.2"});
  CHECK_MESSAGE(two.find("found another after the first's end") != std::string::npos, two);
}

TEST_CASE("a tag on a section or a list names its type or is refused, as on a value") {
  // Only scalars' tags were checked: `hidden: !foo [8]` and `data: !!seq {...}` passed.
  for (const std::string& text :
       {std::string("data: {format: synthetic}\nmodel: {hidden: !foo [8]}\n"),
        std::string("data: {format: synthetic}\nmodel: {hidden: !!int [8]}\n"),
        std::string("data: !!seq {format: synthetic}\n"),
        std::string("data: {format: text, train: {path: !!map [a.txt]}}\n")}) {
    CAPTURE(text);
    CHECK(error_of(text).find("(remove the tag)") != std::string::npos);
  }
  CHECK(error_of("data: !!map {format: synthetic}\nmodel: {hidden: !!seq [8]}\n") == "(no error)");
}
