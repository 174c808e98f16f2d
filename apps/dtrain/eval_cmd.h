// `dtrain eval` and `dtrain predict`: the subcommands' work after parsing (cli.cc).
#pragma once

#include <string>

#include "config/config.h"

namespace dtrain {

// Prints the test set's loss and accuracy (and bits per byte for text) as one JSON line for the
// checkpoint's weights in the config's model; returns the exit code (0).
int cmd_eval(const Config& cfg, const std::string& ckpt);

// Writes, for every row of the CSV `input`, the predicted class and the probabilities to `output`
// (stdout when empty); returns the exit code (0). `header`: whether the input's first row is a
// header (--input-header; auto detects it).
int cmd_predict(const Config& cfg, const std::string& ckpt, const std::string& input,
                const std::string& output, CsvHeader header = CsvHeader::kAuto);

}  // namespace dtrain
