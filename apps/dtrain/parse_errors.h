// The command line's parse errors as users read them (CLI11's own words are often misleading:
// "A subcommand is required" for a misspelt one).
#pragma once

#include <CLI/CLI.hpp>

namespace dtrain {

// A command-line error as one line, "error: WHAT", and where to read the options: the deepest
// subcommand the parse reached ("dtrain run --help"). On standard error.
void print_parse_error(const CLI::App& app, const CLI::ParseError& e, int argc, char** argv);

}  // namespace dtrain
