// Helpers shared by the training tests.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/compare.h"
#include "checkpoint/safetensors.h"
#include "config/config.h"
#include "log_capture.h"
#include "train/trainer.h"

namespace dtrain::testing {

// Max |a - b| / max |a| over the parameters and optimizer state of two checkpoint files (the
// compression state, "comp.*", is not compared: a compressed run is compared with plain ones).
// The measure is dtrain verify's (checkpoint/compare.h).
inline double checkpoint_rel_diff(const std::string& a_path, const std::string& b_path) {
  return max_rel_diff(read_checkpoint_tensors(a_path), read_checkpoint_tensors(b_path));
}

// Trains the YAML text `yaml` with `sets` overrides in-process into `out` (resuming from
// `resume` when given) and returns the summary: the layout tests' one way to run a case.
inline nlohmann::json train_yaml(const std::string& yaml, const std::string& out,
                                 const std::vector<std::string>& sets,
                                 const std::string& resume = "") {
  RunOptions o;
  o.out_dir = out;
  o.resume = resume;
  return run_training(parse_config(yaml, "test.yaml", sets), o);
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
