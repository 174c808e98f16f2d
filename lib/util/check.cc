#include "util/check.h"

#include <algorithm>

namespace dtrain {

std::string UserError::printable(const std::string& s) {
  const auto plain = [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return (c >= 0x20 && c != 0x7f) || c == '\n' || c == '\t';
  };
  if (std::all_of(s.begin(), s.end(), plain)) return s;
  std::string out;
  out.reserve(s.size() + 8);
  static const char kHex[] = "0123456789abcdef";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == 0) {
      out += "\\0";
    } else if (!plain(ch)) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace dtrain

namespace dtrain::detail {

void check_failed(const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << file << ":" << line << ": " << msg;
  throw InternalError(os.str());
}

}  // namespace dtrain::detail
