// README.md runs as written: every `build/bin/dtrain ...` line in its shell blocks uses options
// its command has, every config it names under configs/ validates with the line's --set values,
// the scripts it names exist, and it points at nothing outside the repository.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

using dtrain::testing::contains;
using dtrain::testing::read_text;
using dtrain::testing::run_cmd;

namespace {

const std::string kBin = DTRAIN_BIN;
const std::string kSrc = DTRAIN_SOURCE_DIR;

// Shell-like words: whitespace separates, '...' and "..." quote, a word starting with # ends.
std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool have = false;
  char quote = 0;
  for (char c : line) {
    if (quote) {
      if (c == quote)
        quote = 0;
      else
        cur += c;
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      have = true;
    } else if (c == ' ' || c == '\t') {
      if (have) out.push_back(cur);
      cur.clear();
      have = false;
    } else if (c == '#' && !have) {
      break;
    } else {
      cur += c;
      have = true;
    }
  }
  if (have) out.push_back(cur);
  return out;
}

// The lines of the README's ```sh blocks.
std::vector<std::string> shell_lines() {
  std::vector<std::string> out;
  std::istringstream in(read_text(kSrc + "/README.md"));
  bool in_sh = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("```", 0) == 0) {
      in_sh = !in_sh && line.substr(3) == "sh";
      continue;
    }
    if (in_sh) out.push_back(line);
  }
  return out;
}

std::string help_of(const std::vector<std::string>& cmd) {
  std::string c = kBin;
  for (const auto& w : cmd) c += " " + w;
  const auto r = run_cmd(c + " --help");
  REQUIRE_MESSAGE(r.exit_code == 0, c, r.output);
  return r.output;
}

}  // namespace

TEST_CASE("README's dtrain command lines use real options and their configs validate") {
  const std::vector<std::string> lines = shell_lines();
  REQUIRE(lines.size() > 10);
  std::map<std::string, std::string> helps;
  int commands = 0, validated = 0;
  for (const auto& line : lines) {
    std::vector<std::string> w = words(line);
    size_t i = 0;
    while (i < w.size() && w[i].find('=') != std::string::npos && w[i][0] != '-') ++i;  // VAR=x
    if (i >= w.size()) continue;
    if (w[i].rfind("scripts/", 0) == 0) {
      struct stat st {};
      CHECK_MESSAGE(::stat((kSrc + "/" + w[i]).c_str(), &st) == 0, line);
      CHECK_MESSAGE((st.st_mode & S_IXUSR) != 0, line, " is not executable");
      continue;
    }
    if (w[i] != "build/bin/dtrain") continue;
    ++commands;
    std::vector<std::string> args(w.begin() + static_cast<long>(i) + 1, w.end());
    // The command path: subcommands until the first option or file argument.
    std::vector<std::string> cmd;
    size_t k = 0;
    while (k < args.size() && args[k][0] != '-' && args[k].find('/') == std::string::npos &&
           args[k].find('.') == std::string::npos && cmd.size() < 2)
      cmd.push_back(args[k++]);
    REQUIRE_MESSAGE(!cmd.empty(), line);
    std::string key;
    for (const auto& c : cmd) key += c + " ";
    if (!helps.count(key)) helps[key] = help_of(cmd);
    std::string config;
    std::vector<std::string> sets;
    for (size_t j = k; j < args.size(); ++j) {
      const std::string& a = args[j];
      if (a.rfind("--", 0) == 0) {
        const std::string opt = a.substr(0, a.find('='));
        CHECK_MESSAGE(contains(helps[key], opt), line, ": `dtrain ", key, "` has no ", opt);
        if (opt == "--set" && j + 1 < args.size()) sets.push_back(args[++j]);
      } else if (a.rfind("configs/", 0) == 0 && a.size() > 5 && a.substr(a.size() - 5) == ".yaml" &&
                 config.empty()) {
        config = a;
      }
    }
    if (config.empty()) continue;
    std::string v = "cd " + kSrc + " && " + kBin + " validate " + config;
    for (const auto& s : sets) v += " --set '" + s + "'";
    const auto r = run_cmd(v);
    CHECK_MESSAGE(r.exit_code == 0, line, "\n", r.output);
    ++validated;
  }
  CHECK(commands >= 12);   // the extractor found the README's commands
  CHECK(validated >= 10);  // and their configs
}

TEST_CASE("README points at nothing outside the repository") {
  const std::string readme = read_text(kSrc + "/README.md");
  CHECK_FALSE(contains(readme, "../shared"));
  // Every repository path it names in backticks exists.
  for (const char* dir : {"configs/", "scripts/", "deploy/", "tests/"}) {
    size_t pos = 0;
    while ((pos = readme.find(std::string("`") + dir, pos)) != std::string::npos) {
      const size_t end = readme.find_first_of("` ", pos + 1);
      const std::string path = readme.substr(pos + 1, end - pos - 1);
      pos = end;
      if (path.find('<') != std::string::npos || path.find('*') != std::string::npos) continue;
      CHECK_MESSAGE(std::filesystem::exists(kSrc + "/" + path), path);
    }
  }
}
