// What `dtrain validate` checks beyond the config's own rules: what `run` would refuse (or warn
// about) once it has loaded the data, laid out its ranks and built the model, where the config and
// the data files' headers tell without reading the data.
#pragma once

#include "config/config.h"

namespace dtrain {

// Warns when some ranks get no training samples; throws UserError (as run would) for
// data.drop_last with a global batch above the training set, an in-process rank grid that cannot
// be laid out, and a model that does not fit its input, its pipeline stages or this machine's
// memory (with an evaluation batch unless `evaluate` is false: `run --no-eval`).
void check_config_without_data(const Config& cfg, bool evaluate = true);

}  // namespace dtrain
