// Small string helpers shared across areas.
#pragma once

#include <string>
#include <vector>

namespace dtrain {

// The pieces of s between separators: "a;b;" -> {"a", "b", ""}; "" -> {""}.
inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (;;) {
    const size_t e = s.find(sep, pos);
    out.push_back(s.substr(pos, e == std::string::npos ? std::string::npos : e - pos));
    if (e == std::string::npos) return out;
    pos = e + 1;
  }
}

}  // namespace dtrain
