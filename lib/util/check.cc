#include "util/check.h"

namespace dtrain::detail {

void check_failed(const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << file << ":" << line << ": " << msg;
  throw InternalError(os.str());
}

}  // namespace dtrain::detail
