#include "util/warn_once.h"

#include <spdlog/spdlog.h>

#include <mutex>
#include <set>

namespace dtrain {

void warn_once(const std::string& message) {
  warn_once(message, message);
}

void warn_once(const std::string& what, const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> said;
  {
    const std::lock_guard<std::mutex> lock(mu);
    if (!said.insert(what).second) return;
  }
  spdlog::warn("{}", message);
}

}  // namespace dtrain
