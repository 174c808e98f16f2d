// Helpers shared by the CLI tests that compare runs of the real binary.
#pragma once

#include <doctest/doctest.h>

#include <string>

#include "checkpoint/safetensors.h"
#include "test_util.h"

namespace dtrain::testing {

// The newest checkpoint of a run folder as one file's tensors: a checkpoint file is read as it
// is, a sharded folder through `dtrain checkpoint consolidate` (bin: the dtrain binary).
inline dtrain::StFile latest_state(const std::string& bin, const std::string& run) {
  std::string latest = read_text(run + "/checkpoints/latest");
  while (!latest.empty() && latest.back() == '\n') latest.pop_back();
  if (latest.size() > 12 && latest.substr(latest.size() - 12) == ".safetensors")
    return dtrain::read_safetensors(run + "/checkpoints/" + latest);
  const std::string file = run + "/final.safetensors";
  const auto r = run_cmd(bin + " checkpoint consolidate " + run + " -o " + file);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  return dtrain::read_safetensors(file);
}

// Adam and dropout: a resume must restore the optimizer state and every rank's RNG (and the
// compression state, when set) to be exact. Checkpoints at steps 10, 20, 30.
inline const char* kRestartCfg = R"(seed: 5
model: {hidden: [16, 8], dropout: 0.1}
data:
  format: synthetic
  synthetic: {samples: 500, features: 9, classes: 3}
  batch_size: 10
optimizer: {type: adam, lr: 0.01}
train: {epochs: 0, max_steps: 30, checkpoint: {every_steps: 10, keep_last: 3}}
distributed: {timeout_s: 20, ddp: {bucket_mb: 0.0005}}
runtime: {threads: 1}
)";

// Both hold the same tensors, bit for bit.
inline void check_same_tensors(const dtrain::StFile& a, const dtrain::StFile& b,
                               const std::string& what) {
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    REQUIRE_MESSAGE(b.tensors.count(name) == 1, what, " ", name);
    CHECK_MESSAGE(t.data == b.tensors.at(name).data, what, " ", name);
  }
}

}  // namespace dtrain::testing
