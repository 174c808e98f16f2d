// data.format text from a config file to load_data: globs resolved against the config's folder,
// the window length from model.block_size.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "config/config.h"
#include "data/dataset.h"
#include "log_capture.h"
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
  // Matches that are not regular files are left out, said (they were left out in silence, where
  // naming one is refused).
  std::filesystem::create_directory(t / "x3.txt");
  REQUIRE(::mkfifo((t / "x4.txt").c_str(), 0600) == 0);
  std::filesystem::create_symlink(t / "gone", t / "x5.txt");
  testing::LogCapture cap;
  CHECK(load_data(c.data, c.seed).train.rows == 89);
  CHECK_MESSAGE(
      testing::contains(cap.text(), "matches 3 path(s) that are not regular files, left out: '" +
                                        t / "x3.txt" + "' (a folder), '" + t / "x4.txt" +
                                        "' (a FIFO), '" + t / "x5.txt" +
                                        "' (a symbolic link to nothing)"),
      cap.text());
  // Once, though the paths are expanded several times (the size checks and the load): it was
  // said 3 to 6 times per command.
  CHECK(cap.text().find("not regular files") == cap.text().rfind("not regular files"));
  CHECK(load_data(c.data, c.seed).train.rows == 89);
  CHECK(cap.text().find("not regular files") == cap.text().rfind("not regular files"));
  const Config only = load_config(t / "c.yaml", {"data.train.path=" + t / "x[345].txt"});
  CHECK_THROWS_WITH_AS(load_data(only.data, 1),
                       doctest::Contains("matches no file, only what is not one: '"), UserError);
}

TEST_CASE("load_data: a relative glob matches inside the config's folder, whatever its name") {
  // Folders whose names hold glob characters: the pattern applies inside the config's own
  // folder only. Before, "proj*/c.yaml" also read "proj[1]/" and "projX/", and "proj[1]/c.yaml"
  // matched nothing.
  TempDir t;
  for (const std::string folder : {"proj[1]", "proj*", "proj?", "projX", "proj1"})
    std::filesystem::create_directories(t / folder);
  for (const std::string folder : {"proj[1]", "proj*", "proj?"}) {
    t.write(folder + "/a.txt", bytes_of(400));
    t.write(folder + "/c.yaml",
            "model: {type: gpt, block_size: 8}\ndata: {format: text, train: {path: '*.txt'}}\n");
  }
  t.write("projX/a.txt", bytes_of(4000));
  t.write("proj1/a.txt", bytes_of(4000));
  for (const std::string folder : {"proj[1]", "proj*", "proj?"})  // a file name, not a pattern
    t.write(folder + "/l.yaml",
            "model: {type: gpt, block_size: 8}\ndata: {format: text, train: {path: a.txt}}\n");
  for (const std::string config : {"c.yaml", "l.yaml"})
    for (const std::string folder : {"proj[1]", "proj*", "proj?"}) {
      CAPTURE(folder);
      CAPTURE(config);
      const Config c = load_config(t / (folder + "/" + config));
      const DataSplits s = load_data(c.data, c.seed);
      // Its own 400 bytes only: 360 training bytes (44 windows of 9 at stride 8) and 40 held out
      // (4); the 4,000 bytes of projX/ or proj1/ would give hundreds.
      CHECK(s.train.rows == 44);
      CHECK(s.test.rows == 4);
    }
  // A file name that does not exist in the config's folder is missing, not globbed into a
  // sibling: "q[1]/a.txt" must not read "q1/a.txt" (the loader globs a path it cannot find), and
  // a backslash in the folder's name stays a backslash.
  for (const std::string folder : {"q[1]", "q\\b[1]"}) {
    CAPTURE(folder);
    std::filesystem::create_directories(t / folder);
    t.write(folder + "/l.yaml",
            "model: {type: gpt, block_size: 8}\ndata: {format: text, train: {path: a.txt}}\n");
  }
  std::filesystem::create_directories(t / "q1");
  t.write("q1/a.txt", bytes_of(4000));
  const Config q = load_config(t / "q[1]/l.yaml");
  CHECK_THROWS_WITH_AS(load_data(q.data, q.seed), doctest::Contains("matches no file"), UserError);
  t.write("q\\b[1]/a.txt", bytes_of(400));
  const Config b = load_config(t / "q\\b[1]/l.yaml");
  CHECK(load_data(b.data, b.seed).train.rows == 44);
  // A file that exists under its literal name is that file, glob characters in both the folder
  // and the name ("p[1]/x[2].txt" was read as the pattern "p[[]1]/x[2].txt": no x2.txt, no match).
  t.write("q[1]/x[2].txt", bytes_of(400));
  t.write("q[1]/x.yaml",
          "model: {type: gpt, block_size: 8}\ndata: {format: text, train: {path: 'x[2].txt'}}\n");
  const Config x = load_config(t / "q[1]/x.yaml");
  CHECK(x.data.train.path == std::vector<std::string>{t / "q[1]/x[2].txt"});
  CHECK(load_data(x.data, x.seed).train.rows == 44);
}

}  // namespace
}  // namespace dtrain
