// Small string helpers shared across areas.
#pragma once

#include <string>
#include <vector>

namespace dtrain {

// True when s is well-formed UTF-8 (what JSON text may hold: summary.json, metrics.jsonl and
// manifests name paths, config.json holds config values): no stray or truncated sequences, no
// overlong forms, no UTF-16 surrogates (U+D800..U+DFFF), nothing past U+10FFFF. The same rule as
// nlohmann::json's serializer, which throws on what this refuses.
inline bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    // The sequence length, and the range of the second byte (which excludes overlong forms,
    // surrogates and code points past U+10FFFF); later bytes are 0x80..0xBF.
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      n = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    const auto c1 = static_cast<unsigned char>(s[i + 1]);
    if (c1 < lo || c1 > hi) return false;
    for (size_t k = 2; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    i += n;
  }
  return true;
}

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

// The pieces joined with sep between them: {"a", "b"}, ", " -> "a, b".
inline std::string join(const std::vector<std::string>& pieces, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < pieces.size(); ++i) out += (i == 0 ? "" : sep) + pieces[i];
  return out;
}

}  // namespace dtrain
