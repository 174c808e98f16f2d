// dtrain on a terminal (a pseudo-terminal made by script(1)): the progress bar fits the window
// (a line that wraps leaves a stale row per redraw), TERM=dumb gets no escape sequences, and
// NO_COLOR (no-color.org) turns the log's colours off.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "test_util.h"

using dtrain::testing::read_text;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;

// `s` as one shell word.
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// What `cmd` wrote to a pseudo-terminal (script's typescript file).
std::string on_terminal(const TempDir& t, const std::string& cmd) {
  const std::string ts = t / "typescript";
  // (TERM set: spdlog colours only a terminal whose TERM it knows, and CI may have none)
  run_cmd("TERM=xterm script -qec " + quoted(cmd) + " " + ts + " > /dev/null");
  return read_text(ts);
}

}  // namespace

TEST_CASE("on a terminal: a progress bar that fits, TERM=dumb and NO_COLOR respected") {
  if (run_cmd("script -qec true /dev/null").exit_code != 0) {
    MESSAGE("skipped: no script(1) to make a pseudo-terminal");
    return;
  }
  TempDir t;
  const std::string run = kBin + " run " + DTRAIN_SOURCE_DIR +
                          "/configs/smoke.yaml --set train.epochs=200 --set "
                          "train.log_every=1000000 --out " +
                          t / "r" + " --overwrite";
  // 60 columns: every redraw of the bar is shorter than the window.
  const std::string narrow = on_terminal(t, "stty cols 60; " + run);
  size_t draws = 0, longest = 0;
  for (size_t at = narrow.find("\r\033[K"); at != std::string::npos;
       at = narrow.find("\r\033[K", at + 1)) {
    const size_t from = at + 4;
    const size_t end = std::min(narrow.find('\r', from), narrow.find('\n', from));
    const std::string line = narrow.substr(from, end - from);
    // (the bar, or its text alone when the bar does not fit; the clear before a log line is
    // followed by that line)
    if (line.rfind("step ", 0) != 0 && line.find("] step ") == std::string::npos) continue;
    ++draws;
    longest = std::max(longest, line.size());
  }
  CHECK(draws > 0);
  CHECK_MESSAGE(longest < 60, longest);
  // A dumb terminal: no bar, whose line it could not erase.
  CHECK(on_terminal(t, "TERM=dumb " + run).find("\033[K") == std::string::npos);
  // Colours by default, none with NO_COLOR.
  CHECK(on_terminal(t, run + " --no-progress").find("\033[32m") != std::string::npos);
  CHECK(on_terminal(t, "NO_COLOR=1 " + run + " --no-progress").find("\033[") == std::string::npos);
}
