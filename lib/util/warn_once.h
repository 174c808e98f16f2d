// A warning said once per process, however often the code that finds it runs.
#pragma once

#include <string>

namespace dtrain {

// Logs `message` as a warning the first time it is given in this process, and ignores it after:
// a command expands its paths, resolves its checkpoint, ... several times (checked first, read
// later, once per in-process rank) and said the same thing as often. A log dedupe only: nothing
// reads the set it keeps. Thread-safe.
void warn_once(const std::string& message);
// The same, once per `what` (the thing the message is about), whatever the message's wording
// (callers that name it differently: the first one's is said).
void warn_once(const std::string& what, const std::string& message);

}  // namespace dtrain
