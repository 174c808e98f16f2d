#pragma once
// A checkpoint's stored config against the config it is used with: what a resume reports as
// changed, and what eval, predict and generate refuse (the weights would compute something else).

#include <optional>
#include <string>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "data/dataset.h"

namespace dtrain {

// A resume under another config: names the keys that changed -- a warning when they change what
// is computed (the config hash), else one info line (epochs, logging, checkpointing, timeouts).
// Checkpoints from before the config was stored in them only have the hash.
void report_config_changes(const std::string& path, const CheckpointMeta& m, const Config& cfg,
                           const std::string& hash);

// The config a checkpoint stores, as a Config (JSON is YAML; keys it omits take defaults), or
// nullopt: none stored (older checkpoints) or it does not load (`why` says why, when given).
std::optional<Config> stored_config(const CheckpointMeta& m, const std::string& path,
                                    std::string* why = nullptr);

// Before training: the input record every checkpoint of the run stores in its header (the
// normaliser's per-feature statistics and the CSV column names, as JSON) leaves room in a
// safetensors header for the rest (kStMaxHeaderBytes). Wide inputs (four 2048x2048 images, 1.7M
// named columns) trained to the end and then wrote checkpoints no reader accepts. Throws
// UserError naming the size and what to change.
void check_input_record_fits(const DataSplits& data);

// For eval, predict and generate: the checkpoint's stored config (when it has one) and `cfg`
// agree on every model key that changes what the weights compute (n_head, activation, layers,
// ...; not dropout, init or loss) and on data.normalize (how inputs are scaled). Shapes alone do
// not catch these. Throws UserError listing them.
void check_model_config(const std::string& path, const CheckpointMeta& m, const Config& cfg);
// The same from the checkpoint's header alone (checkpoint_config_json), before the model is
// built: a config that differs is named rather than allocated (a model.hidden typo could ask
// for more memory than there is). `resolved`: resolve_checkpoint's result.
void check_config_before_build(const std::string& resolved, const Config& cfg);

// For eval: when `cfg` evaluates a held-out part of the training data (no data.test), the keys
// that draw that part differently from the run checkpoint `path` was trained in (seed and
// data.test_fraction, the training files, the synthetic data's options; a training run with test
// files of its own), as a warning naming them; "" when they agree or the checkpoint stores no
// config. The rows evaluated then include rows the model trained on.
std::string held_out_split_difference(const std::string& path, const CheckpointMeta& m,
                                      const Config& cfg);

}  // namespace dtrain
