// Shared by lib/config's tests.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "util/check.h"

namespace dtrain::config_test {

// The UserError text parse_config throws for `yaml` (named x.yaml) after the --set overrides
// `sets`, or "(no error)".
inline std::string error_of(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  try {
    parse_config(yaml, "x.yaml", sets);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

// The smallest valid config: synthetic data needs no files.
inline constexpr const char* kSynthetic = "data: {format: synthetic}\n";

// The message for one --set applied to a valid base config.
inline std::string set_error(const std::string& set, const char* base = kSynthetic) {
  return error_of(base, {set});
}

}  // namespace dtrain::config_test
