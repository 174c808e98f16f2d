// Helpers shared by the training tests.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "checkpoint/safetensors.h"

namespace dtrain::testing {

// Max |a - b| / max |a| over every tensor of two checkpoint files.
inline double checkpoint_rel_diff(const std::string& a_path, const std::string& b_path) {
  const StFile a = read_safetensors(a_path), b = read_safetensors(b_path);
  REQUIRE(a.tensors.size() == b.tensors.size());
  double max_diff = 0.0, max_abs = 0.0;
  for (const auto& [name, t] : a.tensors) {
    REQUIRE_MESSAGE(b.tensors.count(name) == 1, name);
    const auto& u = b.tensors.at(name).data;
    REQUIRE(u.size() == t.data.size());
    for (size_t i = 0; i < u.size(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::abs(t.data[i] - u[i])));
      max_abs = std::max(max_abs, static_cast<double>(std::abs(t.data[i])));
    }
  }
  return max_diff / max_abs;
}

}  // namespace dtrain::testing
