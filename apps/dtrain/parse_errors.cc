#include "dtrain/parse_errors.h"

#include <algorithm>
#include <iostream>
#include <regex>
#include <string>

#include "util/strings.h"

namespace dtrain {

void print_parse_error(const CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  // The deepest command the parse reached, and where its name is on the command line.
  std::string cmd = "dtrain";
  const CLI::App* deepest = &app;
  int next_arg = 1;
  for (;;) {
    const auto subs = deepest->get_subcommands();
    if (subs.empty()) break;
    deepest = subs.front();
    cmd += " " + deepest->get_name();
    while (next_arg < argc && argv[next_arg] != deepest->get_name()) ++next_arg;
    ++next_arg;
  }
  const auto offered = deepest->get_subcommands([](const CLI::App*) { return true; });
  if (!offered.empty()) {
    // No subcommand recognised: CLI11 says "A subcommand is required" even for a misspelt one.
    std::string names;
    for (const CLI::App* c : offered) names += (names.empty() ? "" : ", ") + c->get_name();
    for (int i = next_arg; i < argc; ++i) {
      const std::string a = argv[i];
      // (a command taken as --log-level's value, or put after "--", was "unknown command 'X'")
      const auto is_command = [&](const char* w) {
        return std::any_of(offered.begin(), offered.end(),
                           [&](const CLI::App* c) { return c->get_name() == w; });
      };
      if (a == "--" || (a == "--log-level" && i + 1 < argc && is_command(argv[i + 1]))) {
        std::cerr << "error: "
                  << (a == "--" ? "'--' ends the options, so the command after it is not read "
                                  "as one: leave it out"
                                : "--log-level needs its level before the command (" + cmd +
                                      " --log-level LEVEL COMMAND ...)")
                  << "\nrun '" << cmd << " --help' for the options" << std::endl;
        return;
      }
      if (a == "--log-level") ++i;  // and its value
      if (a.starts_with("-")) continue;
      std::cerr << "error: unknown command '" << shown_text(a) << "'"
                << (deepest == &app ? "" : " for '" + cmd + "'") << " (commands: " << names
                << ")\nrun '" << cmd << " --help' for the options" << std::endl;
      return;
    }
    if (std::string(e.what()).find("subcommand") != std::string::npos) {
      std::cerr << "error: '" << cmd << "' needs a command: " << names << "\nrun '" << cmd
                << " --help' for the options" << std::endl;
      return;
    }
  }
  std::string what = e.what();
  for (char& c : what)
    if (c == '\n') c = ' ';
  while (!what.empty() && what.back() == ' ') what.pop_back();
  // A decimal integer (the options' validators passed it) that CLI11 could not convert: beyond
  // the option's type ("--width 99999999999").
  static const std::regex kOutOfRange("Could not convert: (\\S+) = (-?[0-9]+)");
  if (std::smatch m; std::regex_match(what, m, kOutOfRange))
    what = m[1].str() + " " + m[2].str() + " is out of range for this option";
  std::cerr << "error: " << bounded_message(what) << "\nrun '" << cmd << " --help' for the options"
            << std::endl;
}

}  // namespace dtrain
