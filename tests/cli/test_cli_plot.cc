// `dtrain plot` as users run it: two real training runs drawn as SVG and PNG; bad input exits 2
// with a message naming the problem.
#include <doctest/doctest.h>

#include <filesystem>

#include "test_util.h"

using dtrain::testing::CmdResult;
using dtrain::testing::contains;
using dtrain::testing::read_text;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;

CmdResult run_dtrain(const std::string& args) {
  return run_cmd(kBin + " " + args);
}

const char* kTinyRun = R"(seed: 3
model: {hidden: [16]}
data:
  format: synthetic
  synthetic: {samples: 600, features: 5, classes: 3, noise: 0.3}
  batch_size: 20
optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
train: {epochs: 3, log_every: 5}
runtime: {threads: 1}
)";

}  // namespace

TEST_CASE("plot draws two real runs as SVG and PNG") {
  TempDir dir;
  const std::string cfg = dir.write("tiny.yaml", kTinyRun);
  for (const char* lr : {"0.1", "0.02"}) {
    const auto r = run_dtrain("run " + cfg + " --no-progress --set optimizer.lr=" + lr + " --out " +
                              dir / ("lr" + std::string(lr)));
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  }
  const std::string runs = dir / "lr0.1" + " " + dir / "lr0.02";
  auto r = run_dtrain("plot " + runs + " -o " + dir / "cmp.svg" + " --title 'lr sweep'");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string svg = read_text(dir / "cmp.svg");
  CHECK(contains(svg, "</svg>"));
  CHECK(contains(svg, ">lr0.1</text>"));
  CHECK(contains(svg, ">lr0.02</text>"));
  CHECK(contains(svg, ">lr sweep</text>"));
  for (const char* cls : {"class=\"series run-0\"", "class=\"series run-1\""}) {
    size_t n = 0;
    for (size_t i = svg.find(cls); i != std::string::npos; i = svg.find(cls, i + 1)) ++n;
    CHECK_MESSAGE(n == 2, cls);  // a loss and an accuracy curve per run
  }

  // --labels takes one comma-separated argument, so run folders may follow it.
  r = run_dtrain("plot --labels fast,slow " + runs + " -o " + dir / "cmp.png" +
                 " --width 800 --height 400");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  r = run_dtrain("plot --labels 'fast lr,slow' " + runs + " -o " + dir / "labelled.svg");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string labelled = read_text(dir / "labelled.svg");
  CHECK(contains(labelled, ">fast lr</text>"));
  CHECK(contains(labelled, ">slow</text>"));
  const std::string png = read_text(dir / "cmp.png");
  REQUIRE(png.size() > 24);
  CHECK(png.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
  CHECK(png.compare(12, 4, "IHDR") == 0);
  const auto* u = reinterpret_cast<const unsigned char*>(png.data());
  CHECK(((u[16] << 24) | (u[17] << 16) | (u[18] << 8) | u[19]) == 800);
  CHECK(((u[20] << 24) | (u[21] << 16) | (u[22] << 8) | u[23]) == 400);
}

TEST_CASE("plot: bad input exits 2 with a clear message") {
  TempDir dir;
  std::filesystem::create_directories(dir / "run");
  dir.write("run/metrics.jsonl", "{\"kind\":\"train\",\"step\":10,\"loss\":1.5}\n{oops\n");
  std::filesystem::create_directories(dir / "ok");
  dir.write("ok/metrics.jsonl", "{\"kind\":\"train\",\"step\":10,\"loss\":1.5}\n");
  std::filesystem::create_directories(dir / "nothing");
  dir.write("nothing/metrics.jsonl", "{\"kind\":\"train\",\"step\":10,\"loss\":null}\n");
  std::filesystem::create_directories(dir / "empty");
  const std::string out = " -o " + dir / "o.svg";
  const std::pair<std::string, std::string> cases[] = {
      {"plot " + dir / "missing" + out, "does not exist"},
      {"plot " + dir / "empty" + out, "no metrics.jsonl"},
      {"plot " + dir / "run" + out, "metrics.jsonl:2: malformed JSON"},
      {"plot " + dir / "nothing" + out, "no data points"},
      {"plot " + dir / "ok" + " -o " + dir / "o.gif", "unknown image format '.gif'"},
      {"plot " + dir / "ok" + out + " --labels a,b", "--labels has 2 name(s) for 1"},
      {"plot " + dir / "ok" + out + " --labels ,", "--labels ',': name 1 is empty"},
      {"plot " + dir / "ok", "output"},  // -o is required
      {"plot -o " + dir / "o.svg", "runs"},
  };
  for (const auto& [args, msg] : cases) {
    const auto r = run_dtrain(args);
    CHECK_MESSAGE(r.exit_code == 2, args, "\n", r.output);
    CHECK_MESSAGE(contains(r.output, msg), args, "\n", r.output);
  }
  CHECK_FALSE(std::filesystem::exists(dir / "o.svg"));
  const auto r = run_dtrain("plot " + dir / "ok" + out);
  CHECK_MESSAGE(r.exit_code == 0, r.output);
}
