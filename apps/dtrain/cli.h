// The dtrain command line: parses arguments (CLI11), dispatches to lib/, maps errors to exit
// codes: 0 success, 2 user error (bad CLI, config, data or checkpoint), 1 runtime failure.
#pragma once

#include <string>

namespace dtrain {

// Exit codes of every command.
constexpr int kExitOk = 0;
constexpr int kExitRuntime = 1;
constexpr int kExitUser = 2;

int cli_main(int argc, char** argv);

// The path of this executable (/proc/self/exe, else argv0), so `launch` and `bench comm` start
// the same dtrain.
std::string self_exe(const char* argv0);

}  // namespace dtrain
