// Small string helpers shared across areas.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain {

// What a UTF-8 lead byte promises: the sequence length n (1 for ASCII, 2..4, or 0 when c cannot
// start a sequence) and the allowed range [lo, hi] of the second byte, which excludes overlong
// forms, UTF-16 surrogates and code points past U+10FFFF; later bytes are 0x80..0xBF.
struct Utf8Lead {
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;
};

inline Utf8Lead utf8_lead(unsigned char c) {
  Utf8Lead l;
  if (c < 0x80) {
    l.n = 1;
  } else if (c >= 0xc2 && c <= 0xdf) {
    l.n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    l.n = 3;
    if (c == 0xe0) l.lo = 0xa0;
    if (c == 0xed) l.hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    l.n = 4;
    if (c == 0xf0) l.lo = 0x90;
    if (c == 0xf4) l.hi = 0x8f;
  }
  return l;
}

// The length of the well-formed UTF-8 sequence at s[i] (1..4), or 0 when none starts there: a
// stray or truncated sequence, an overlong form, a UTF-16 surrogate (U+D800..U+DFFF) or a code
// point past U+10FFFF.
inline size_t utf8_sequence_at(const std::string& s, size_t i) {
  const Utf8Lead l = utf8_lead(static_cast<unsigned char>(s[i]));
  if (l.n <= 1) return l.n;
  if (i + l.n > s.size()) return 0;
  const auto c1 = static_cast<unsigned char>(s[i + 1]);
  if (c1 < l.lo || c1 > l.hi) return 0;
  for (size_t k = 2; k < l.n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return 0;
  return l.n;
}

// True when s is well-formed UTF-8 (what JSON text may hold: summary.json, metrics.jsonl and
// manifests name paths, config.json holds config values). The same rule as nlohmann::json's
// serializer, which throws on what this refuses.
inline bool valid_utf8(const std::string& s) {
  for (size_t i = 0, n = 0; i < s.size(); i += n)
    if ((n = utf8_sequence_at(s, i)) == 0) return false;
  return true;
}

// Largest bracket nesting of JSON text, outside strings. Checked before parsing text a user can
// edit (safetensors headers, checkpoint manifests): copying or printing a parsed tree recurses
// once per level, so a hostile file must not reach them arbitrarily deep.
inline int json_depth(std::string_view s) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char ch : s) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '{' || ch == '[') {
      max_depth = std::max(max_depth, ++depth);
    } else if (ch == '}' || ch == ']') {
      --depth;
    }
  }
  return max_depth;
}

// s for a place that takes only well-formed, printable UTF-8 text (an SVG document, cairo's
// text): each byte that starts no well-formed sequence, and each control character but tab,
// becomes '?'.
inline std::string printable_utf8(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_at(s, i);
    const auto c = static_cast<unsigned char>(s[i]);
    if (n == 0 || (n == 1 && ((c < 0x20 && c != '\t') || c == 0x7f))) {
      out += '?';
      ++i;
      continue;
    }
    out.append(s, i, n);
    i += n;
  }
  return out;
}

// s with ASCII letters in lower case (other bytes kept: UTF-8 passes through).
inline std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out)
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
  return out;
}

// s as shown inside a message: printable_utf8, and past max_bytes cut (at a character boundary)
// with its size: a 5 MB cell or tensor name must not become a 5 MB message.
inline std::string shown_text(std::string_view s, size_t max_bytes = 60) {
  if (s.size() <= max_bytes) return printable_utf8(std::string(s));
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return printable_utf8(std::string(s.substr(0, cut))) + "... (" + std::to_string(s.size()) +
         " bytes)";
}

// A message for one line of the console: past max_bytes, its head and tail around a note of
// what was left out (cut at character boundaries). The last guard against a message that
// quotes unbounded input.
inline std::string bounded_message(std::string_view s, size_t max_bytes = 8192) {
  if (s.size() <= max_bytes) return std::string(s);
  const auto boundary = [&](size_t i) {
    while (i > 0 && i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    return i;
  };
  const size_t head = boundary(max_bytes * 3 / 4);
  const size_t tail = boundary(s.size() - max_bytes / 4);
  return std::string(s.substr(0, head)) + " [... " + std::to_string(tail - head) +
         " bytes left out ...] " + std::string(s.substr(tail));
}

// Why `addr` cannot be a host as an address setting gives it ("" when it can): a URL, whitespace,
// unbalanced brackets, or a "host:port" (`port_advice` says where the port goes instead). IPv6
// literals (two or more ':', or bracketed without a port) pass.
inline std::string host_text_problem(const std::string& addr, const std::string& port_advice) {
  if (addr.find("://") != std::string::npos)
    return "is a URL: give the host alone (a name or an IP address)";
  if (addr.find_first_of(" \t\r\n") != std::string::npos) return "holds whitespace";
  const auto count = [&](char c) { return std::count(addr.begin(), addr.end(), c); };
  if (count('[') != count(']') || addr.find('[') > addr.find(']'))
    return "has an unbalanced '[' or ']' (an IPv6 address: [::1] or ::1)";
  if (count(':') == 1 || (addr.starts_with('[') && addr.find("]:") != std::string::npos))
    return "holds a port (host:port): give the host alone, and " + port_advice;
  return "";
}

// A JSON library error's text for a person: nlohmann's "[json.exception.type_error.302] type
// must be number, but is null" without its bracketed tag.
inline std::string json_error_text(const std::string& what) {
  if (what.rfind("[json.exception.", 0) == 0)
    if (const size_t end = what.find("] "); end != std::string::npos) return what.substr(end + 2);
  return what;
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
