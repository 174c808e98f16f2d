// Checks of command-line option values that CLI11 does not make by itself. Each adds a
// validator to the option and returns it (for chaining); a value refused is a usage error, exit 2.
#pragma once

#include <CLI/CLI.hpp>

namespace dtrain {

// Refuses an empty value (`--out ""`): an option that names a file or folder would otherwise
// fall back to its default, or to nothing, without a word.
CLI::Option* non_empty(CLI::Option* o);

// Accepts only a decimal integer ("-3", "12"), as the environment variables the option overrides
// are read (parse_env_int): CLI11 reads "010" as octal 8, "0x1f" as 31, and takes "+3" and " 3".
CLI::Option* decimal(CLI::Option* o);

// Accepts only a number written in decimal ("0.7", "-1e-3", "inf"), whole: CLI11 takes "" as 0
// (`--temperature "$T"` with T unset sampled greedily) and "0x10" as 16.
CLI::Option* real_number(CLI::Option* o);

// Refuses an integer beyond int64's range (CLI11 clamps it to the limit without a word; an
// `int` option it refuses by itself), and one not written in decimal (decimal()).
CLI::Option* int64_range(CLI::Option* o);

}  // namespace dtrain
