// Comparing training states: the tensors of two checkpoints (files or sharded folders), whole or
// as the updates of one step from a common starting state. `dtrain verify` and the fidelity tests
// use these; what "relative" means is defined once here.
//
// Scale: a difference is relative to the reference tensor's norm, not element-wise: float32
// summation-order noise is proportional to a tensor's scale, while element-wise ratios explode
// at values that happen to be near zero.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"

namespace dtrain {

struct NamedTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
// Every tensor of a checkpoint by name: parameters ("transformer.wte.weight"), optimizer state
// ("optim.momentum.<name>") and compression state ("comp.*").
using TensorMap = std::map<std::string, NamedTensor>;

// Reads a checkpoint file, or a sharded checkpoint folder (consolidated in memory through a
// temporary file next to it, or in `tmp_dir` when given, removed again), verifying checksums.
// UserError as load_checkpoint.
TensorMap read_checkpoint_tensors(const std::string& path, const std::string& tmp_dir = "");
// The same, as the safetensors file it reads (dtypes, tensors left unread: `options`).
StFile read_checkpoint_file(const std::string& path, const std::string& tmp_dir,
                            const StReadOptions& options);

// One tensor's comparison. `rel` is the L2 measure, ||got - want|| / ||want||: it weighs every
// element, so the few elements that Adam's division by sqrt(v) + eps turns from noise into a
// visible difference (gradients near eps) do not dominate it, while a real error -- a gradient off
// by a factor, a bucket not reduced -- moves a whole tensor. `max_rel` and the element locate the
// worst single value.
struct TensorDiff {
  std::string name;
  std::vector<int64_t> shape;    // the tensor's
  double rel = 0.0;              // ||got - want||_2 / ||want||_2
  double max_rel = 0.0;          // max |got - want| / max |want|
  double scale = 0.0;            // ||want||_2 (of the update, for update_diffs), or the floor
  int64_t index = -1;            // flat index of the worst element; -1 when all are equal
  double want = 0.0, got = 0.0;  // the worst element's reference and compared values
};

// "[3, 17]" for flat index i of a tensor of shape `shape` (row-major).
std::string format_index(const std::vector<int64_t>& shape, int64_t flat);

// A tensor whose own reference is small next to the rest of its kind (the parameters, or one
// optimizer state) is measured against a floor instead: kScaleFloor x the kind's RMS reference
// value x sqrt(its elements), i.e. the typical size of the kind's values. Why: a conv bias
// followed by a layer_norm has a true gradient of 0 (the norm removes any per-channel shift), so
// its reference update is float32 noise of a sum that cancels, and noise over noise is ~1 however
// exact the layout is. That noise was measured at 1e-6 to 1.5e-5 of the kind's RMS update
// (Fashion-MNIST, batches of 6 to 128 per rank, W = 4), over the 1e-4 tolerance with a floor of
// 1% of the RMS; at the RMS it is 7x below. The cost: an error by a factor k in a tensor whose
// update is a fraction r of its kind's RMS scores about (k - 1) r, so it is caught only for r
// above about 1e-4 / (k - 1) (an update of the kind's size where none is due scores ~1; a layout
// bug seldom spares every tensor that learns at the kind's pace).
inline constexpr double kScaleFloor = 1.0;

// Per tensor of `want` (sorted by name, tensors named "comp.*" skipped: the state of a
// compressor is not part of the model), got against want. UserError when a tensor is missing
// from `got` or has another shape.
std::vector<TensorDiff> tensor_diffs(const TensorMap& want, const TensorMap& got);

// One step's updates from the common state `from`: per tensor, (got - from) against
// (want - from). Where the reference update is all zero the scale falls back to the values of
// `want` (so an update where none was due is still measured). Tensors of `want` absent from
// `from` (optimizer state a fresh start does not have yet) start from zero. slack_ulps > 0:
// each element's difference is first reduced by that many units in the last place of its
// float32 value (a layout that rounds the parameters once more than one process, by design).
std::vector<TensorDiff> update_diffs(const TensorMap& from, const TensorMap& want,
                                     const TensorMap& got, double slack_ulps = 0.0);

// The largest rel of a list (the entry itself; a default TensorDiff when empty).
TensorDiff worst(const std::vector<TensorDiff>& diffs);

// max |a - b| over every tensor / max |a| over every tensor, "comp.*" skipped: one figure for a
// whole state (the fidelity tests' measure). UserError when the two hold different tensors.
double max_rel_diff(const TensorMap& a, const TensorMap& b);

}  // namespace dtrain
