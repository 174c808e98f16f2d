// data.format text in the config: data.train.path / data.test.path as one path or a list of
// paths (KeyType::kPathList), resolved against the config's folder, written back to config.json
// (a string for one path, so existing configs keep their JSON and hash), and the format's checks.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "../test_util.h"
#include "config/config.h"
#include "config_test_util.h"
#include "util/check.h"

namespace dtrain {
namespace {

using Paths = std::vector<std::string>;

using config_test::error_of;

TEST_CASE("config: a path list is one string or a list of strings") {
  const Config one = parse_config("data: {format: csv, train: {path: a.csv}}\n", "x");
  CHECK(one.data.train.path == Paths{"a.csv"});
  CHECK(one.data.test.path.empty());
  const Config many = parse_config(
      "model: {type: gpt}\ndata: {format: text, train: {path: [a.txt, 'c/*.txt', \"d e.gz\"]}}\n",
      "x");
  CHECK(many.data.train.path == Paths{"a.txt", "c/*.txt", "d e.gz"});
  const Config set =
      parse_config("model: {type: gpt}\ndata: {format: text, train: {path: a.txt}}\n", "x",
                   {"data.test.path=[t1.txt, t2.txt]"});
  CHECK(set.data.test.path == Paths{"t1.txt", "t2.txt"});
  // "" and [] are no path (the default).
  CHECK(parse_config("data: {format: csv, train: {path: a.csv}, test: {path: ''}}\n", "x")
            .data.test.path.empty());
  CHECK(parse_config("data: {format: csv, train: {path: a.csv}, test: {path: []}}\n", "x")
            .data.test.path.empty());
}

TEST_CASE("config: path list errors name the entry") {
  CHECK(error_of("model: {type: gpt}\ndata: {format: text, train: {path: {a: 1}}}\n") ==
        "x.yaml:2:36: data.train.path: expected a path or a list of paths such as [a.txt, "
        "'corpus/*.txt'], got a mapping");
  CHECK(error_of("model: {type: gpt}\ndata: {format: text, train: {path: [a.txt, [b]]}}\n") ==
        "x.yaml:2:44: data.train.path[1]: expected a path, got a sequence");
  CHECK(error_of("model: {type: gpt}\ndata: {format: text, train: {path: [a.txt, '']}}\n") ==
        "x.yaml:2:44: data.train.path[1]: expected a path, got an empty string");
  CHECK(error_of("data: {format: csv, train: {path: [a.csv, b.csv]}}\n") ==
        "x.yaml:1:35: data.train.path: format csv reads one file (got a list of 2; a list of "
        "files or patterns is for format text)");
}

TEST_CASE("config: format text reads path only and requires data.train.path") {
  CHECK(error_of("data: {format: text, train: {path: a.txt}}\n") ==
        "x.yaml:1:1: model.type: data.format text needs model.type gpt (got mlp)");
  CHECK(error_of("model: {type: gpt}\ndata: {format: csv, train: {path: a.csv}}\n") ==
        "x.yaml:2:16: data.format: model.type gpt reads text: needs data.format text (got csv)");
  CHECK(error_of(
            "model: {type: gpt}\ndata: {format: text, train: {path: a.txt}, normalize: none}\n") ==
        "x.yaml:2:55: data.normalize: not used by format text (token ids are used as they are)");
  // The window length comes from model.block_size.
  CHECK(parse_config("model: {type: gpt, block_size: 16}\ndata: {format: text, train: {path: a}}\n",
                     "x")
            .data.block_size == 16);
  CHECK(error_of("model: {type: gpt}\ndata: {format: text}\n") ==
        "x.yaml:2:7: data.train.path: required for format text");
  CHECK(
      error_of("model: {type: gpt}\ndata: {format: text, train: {path: a.txt, images: i.gz}}\n") ==
      "x.yaml:2:51: data.train.images: not used by format text (it reads path)");
  CHECK(error_of("model: {type: gpt}\ndata: {format: text, train: {path: a.txt}, test: {labels: "
                 "l.gz}}\n") ==
        "x.yaml:2:59: data.test.labels: not used by format text (it reads path)");
  CHECK(error_of("data: {format: idx, train: {images: a, labels: b, path: [c, d]}}\n") ==
        "x.yaml:1:57: data.train.path: not used by format idx (it reads images and labels)");
}

TEST_CASE("config: path list entries resolve against the config's folder, --set against cwd") {
  testing::TempDir t;
  const std::string cfg = t.write("c.yaml",
                                  "model: {type: gpt}\ndata: {format: text, train: {path: [a.txt, "
                                  "'sub/*.txt', /abs/b.txt]}}\n");
  const Config c = load_config(cfg);
  CHECK(c.data.train.path == Paths{t / "a.txt", t / "sub/*.txt", "/abs/b.txt"});
  const Config s = load_config(cfg, {"data.train.path=[x.txt, y.txt]"});
  const std::string cwd = std::filesystem::current_path().string();
  CHECK(s.data.train.path == Paths{cwd + "/x.txt", cwd + "/y.txt"});
  // Existence checks skip glob patterns (the loader expands them); files are checked.
  const auto files = config_input_files(c);
  REQUIRE(files.size() == 2);
  CHECK(files[0] == std::pair<std::string, std::string>{"data.train.path", t / "a.txt"});
  CHECK(files[1].second == "/abs/b.txt");
  CHECK_THROWS_AS(check_input_files(c), UserError);
  t.write("a.txt", "x");
  CHECK_THROWS_WITH_AS(check_input_files(c),
                       doctest::Contains("data.train.path: '/abs/b.txt' does not exist"),
                       UserError);
  // A CSV path is literal, brackets and all: checked like any file.
  const Config csv =
      load_config(t.write("csv.yaml", "data: {format: csv, train: {path: 'm[1].csv'}}\n"));
  CHECK_THROWS_WITH_AS(check_input_files(csv), doctest::Contains("m[1].csv' does not exist"),
                       UserError);
}

TEST_CASE("config: config.json writes one path as a string, several as a list, and loads back") {
  const Config one = parse_config("data: {format: csv, train: {path: a.csv}}\n", "x");
  const nlohmann::json j1 = config_to_json(one);
  CHECK(j1["data"]["train"]["path"] == "a.csv");
  CHECK(j1["data"]["test"]["path"] == "");
  // The same as a list of one: same JSON, same hash.
  const Config listed = parse_config("data: {format: csv, train: {path: [a.csv]}}\n", "x");
  CHECK(config_to_json(listed) == j1);
  CHECK(config_hash(listed) == config_hash(one));

  const Config many = parse_config(
      "model: {type: gpt}\ndata: {format: text, train: {path: [a.txt, 'c/*.txt']}, test: {path: "
      "t.txt}}\n",
      "x");
  const nlohmann::json j = config_to_json(many);
  CHECK(j["data"]["train"]["path"] == nlohmann::json::array({"a.txt", "c/*.txt"}));
  CHECK(j["data"]["test"]["path"] == "t.txt");
  // JSON is YAML: config.json parses back to the same config.
  const Config back = parse_config(j.dump(), "config.json");
  CHECK(back.data.train.path == many.data.train.path);
  CHECK(back.data.test.path == many.data.test.path);
  CHECK(config_to_json(back) == j);
  CHECK(config_hash(back) == config_hash(many));
  CHECK(config_hash(many) !=
        config_hash(parse_config(
            "model: {type: gpt}\ndata: {format: text, train: {path: [c/*.txt, a.txt]}, test: "
            "{path: t.txt}}\n",
            "x")));  // the order is part of the text
}

}  // namespace
}  // namespace dtrain
