#include "dtrain/option_checks.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <system_error>

namespace dtrain {

// Refuses an empty value (`--out ""`): an option that names a file or folder would otherwise
// fall back to its default, or to nothing, without a word.
CLI::Option* non_empty(CLI::Option* o) {
  return o->check(CLI::Validator(
      [](std::string& v) { return v.empty() ? std::string("must not be empty") : std::string(); },
      "", "non-empty"));
}

// Accepts only a decimal integer ("-3", "12"), as the environment variables the option overrides
// are read (parse_env_int): CLI11 reads "010" as octal 8, "0x1f" as 31, and takes "+3" and " 3".
CLI::Option* decimal(CLI::Option* o) {
  return o->check(CLI::Validator(
      [](std::string& v) {
        const size_t digits = v.starts_with('-') ? 1 : 0;
        const bool ok =
            v.size() > digits && std::all_of(v.begin() + static_cast<long>(digits), v.end(),
                                             [](char c) { return c >= '0' && c <= '9'; });
        const bool leading_zero = v.size() > digits + 1 && v[digits] == '0';
        return ok && !leading_zero ? std::string()
                                   : std::string(
                                         "must be a decimal integer (no '+', spaces, "
                                         "leading zeros, exponent or 0x)");
      },
      "", "decimal"));
}

// Accepts only a number written in decimal ("0.7", "-1e-3", "inf"), whole: CLI11 takes "" as 0
// (`--temperature "$T"` with T unset sampled greedily) and "0x10" as 16.
CLI::Option* real_number(CLI::Option* o) {
  return o->check(CLI::Validator(
      [](std::string& v) {
        double x = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
        if (!v.empty() && ec == std::errc::result_out_of_range && end == v.data() + v.size())
          return std::isinf(std::strtod(v.c_str(), nullptr))
                     ? std::string("is out of a double's range (about ±1.8e308)")
                     : std::string("is too small for a double (below about 4.9e-324): write 0");
        return !v.empty() && ec == std::errc() && end == v.data() + v.size()
                   ? std::string()
                   : std::string("must be a decimal number");
      },
      "", "number"));
}

// Refuses an integer beyond int64's range (CLI11 clamps it to the limit without a word; an
// `int` option it refuses by itself), and one not written in decimal (decimal()).
CLI::Option* int64_range(CLI::Option* o) {
  decimal(o);
  return o->check(CLI::Validator(
      [](std::string& v) {
        int64_t x = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
        return ec == std::errc::result_out_of_range
                   ? std::string("is out of the integer range [-2^63, 2^63 - 1]")
                   : std::string();
      },
      "", "int64"));
}

}  // namespace dtrain
