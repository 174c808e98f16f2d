// Helpers shared by the training tests.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"

namespace dtrain::testing {

// Max |a - b| / max |a| over the parameters and optimizer state of two checkpoint files (the
// compression state, "comp.*", is not compared: a compressed run is compared with plain ones).
inline double checkpoint_rel_diff(const std::string& a_path, const std::string& b_path) {
  const StFile a = read_safetensors(a_path), b = read_safetensors(b_path);
  auto trained = [](const StFile& f) {
    size_t n = 0;
    for (const auto& [name, t] : f.tensors) n += name.rfind("comp.", 0) != 0;
    return n;
  };
  REQUIRE(trained(a) == trained(b));
  double max_diff = 0.0, max_abs = 0.0;
  for (const auto& [name, t] : a.tensors) {
    if (name.rfind("comp.", 0) == 0) continue;
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

// A run's checkpoint at `step` as one file: a sharded folder is consolidated next to the run.
inline std::string as_file(const std::string& run, int64_t step) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(run) / "checkpoints";
  const fs::path file = dir / checkpoint_file_name(step);
  if (fs::exists(file)) return file.string();
  const fs::path out = fs::path(run) / ("consolidated-" + std::to_string(step) + ".safetensors");
  consolidate_checkpoint((dir / sharded_checkpoint_name(step)).string(), out.string());
  return out.string();
}

}  // namespace dtrain::testing
