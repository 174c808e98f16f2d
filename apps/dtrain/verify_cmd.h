// `dtrain verify`: the subcommand's work after parsing. cli.cc fills the VerifyOptions.
#pragma once

#include "train/verify.h"

namespace dtrain {

// Runs the verification under an interrupt guard and prints the report (JSON with `json`);
// returns dtrain's exit code: 0 pass (or diverges as expected), 1 fail, 128 + the signal when
// interrupted (the temporary work folder removed, one line on stderr).
int cmd_verify(VerifyOptions o, bool json);

}  // namespace dtrain
