// A run folder copied with links to branch an experiment (`cp -rs`: every file a symbolic link
// to the original's; `cp -al`: hard links) and resumed: the copy's writes replace its own links
// and never reach the original run's files (they rewrote its latest, summary and config and
// appended to its metrics, leaving it unresumable).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>

#include "test_util.h"

using dtrain::testing::CmdResult;
using dtrain::testing::read_text;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

namespace fs = std::filesystem;

// Every regular file under `dir` (links followed) by relative path, with its bytes.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = read_text(e.path());
  return out;
}

}  // namespace

TEST_CASE("a run folder copied with symbolic or hard links resumes without touching the original") {
  TempDir dir;
  const std::string cfg =
      dir.write("m.yaml",
                "seed: 3\nmodel: {hidden: [8]}\ndata:\n  format: synthetic\n"
                "  synthetic: {samples: 400, features: 4, classes: 3}\n  batch_size: 20\n"
                "optimizer: {type: sgd, lr: 0.1, momentum: 0.9}\n"
                "train: {max_steps: 20, checkpoint: {every_steps: 10}}\nruntime: {threads: 1}\n");
  const std::string run = "run " + cfg + " --log-level warn --out ";
  REQUIRE(run_cmd(std::string(DTRAIN_BIN) + " " + run + dir / "a").exit_code == 0);
  // The reference: a plain copy resumed.
  fs::copy(dir / "a", dir / "plain", fs::copy_options::recursive);
  REQUIRE(run_cmd(std::string(DTRAIN_BIN) + " " + run + dir / "plain" +
                  " --resume auto --set train.max_steps=40")
              .exit_code == 0);
  const auto original = snapshot(dir / "a");
  for (const std::string how : {"-rs", "-al"}) {
    CAPTURE(how);
    const std::string copy = dir / ("copy" + how);
    REQUIRE(run_cmd("cp " + how + " " + dir / "a" + " " + copy).exit_code == 0);
    const CmdResult r = run_cmd(std::string(DTRAIN_BIN) + " " + run + copy +
                                " --resume auto --set train.max_steps=40");
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    CHECK(snapshot(dir / "a") == original);  // byte for byte, every file
    // The copy went on as the plain copy did.
    CHECK(read_text(copy + "/checkpoints/latest") == "step-40.safetensors\n");
    CHECK(read_text(copy + "/checkpoints/step-40.safetensors") ==
          read_text(dir / "plain/checkpoints/step-40.safetensors"));
    // (its records: the same lines, whose timings differ)
    const auto lines = [](const std::string& text) {
      return std::count(text.begin(), text.end(), '\n');
    };
    CHECK(lines(read_text(copy + "/metrics.jsonl")) ==
          lines(read_text(dir / "plain/metrics.jsonl")));
  }
  // A dangling link named latest creates nothing where it points.
  fs::copy(dir / "a", dir / "d", fs::copy_options::recursive);
  fs::remove(dir / "d/checkpoints/latest");
  fs::create_symlink(dir / "nowhere", dir / "d/checkpoints/latest");
  const CmdResult d = run_cmd(std::string(DTRAIN_BIN) + " " + run + dir / "d" +
                              " --resume auto --set train.max_steps=30");
  CHECK_MESSAGE(d.exit_code == 0, d.output);
  CHECK_FALSE(fs::exists(dir / "nowhere"));
}
