// The dtrain command line: parses arguments (CLI11), dispatches to lib/, maps errors to exit
// codes: 0 success, 2 user error (bad CLI, config, data or checkpoint), 1 runtime failure.
#pragma once

namespace dtrain {

int cli_main(int argc, char** argv);

}  // namespace dtrain
