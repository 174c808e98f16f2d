// Text helpers of lib/config: "did you mean" suggestions and message pieces.
#include "config/internal.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>

#include "config/schema.h"
#include "util/strings.h"

namespace dtrain::config_detail {
namespace {

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// Optimal string alignment distance: Levenshtein plus adjacent transpositions ("wieght").
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::string join_key(std::string_view prefix, std::string_view key) {
  std::string out(prefix);
  if (!out.empty()) out += '.';
  out += key;
  return out;
}

std::string join_list(const KeyList& list, std::string_view sep) {
  std::string out;
  for (std::string_view s : list) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

std::string show(int64_t v) {
  return std::to_string(v);
}

std::string show(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string closest(std::string_view word, const KeyList& candidates) {
  const std::string w = to_lower(word);
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (std::string_view c : candidates) {
    // Longer than c by more than 3 (the largest limit): neither close nor a prefix of c, and
    // the distance's table would be |word| x |c| (a pasted megabyte took seconds and gigabytes).
    if (c.empty() || w.size() > c.size() + 3) continue;
    const std::string lc = to_lower(c);
    const size_t d = edit_distance(w, lc);
    const size_t limit = std::max<size_t>(1, std::min<size_t>(3, lc.size() / 3));
    const bool prefix = w.size() >= 3 && lc.starts_with(w);
    if ((d <= limit || prefix) && d < best_d) {
      best = std::string(c);
      best_d = d;
    }
  }
  return best;
}

std::string key_suggestion(std::string_view section, std::string_view key) {
  const auto& sections = config_sections();
  if (key == "<<") return " (YAML merge keys '<<' are not supported: write the keys out)";
  // A dotted path as --set spells it, written as one YAML key: nested in a file.
  // (".seed", "a..b" or "seed." are no --set path: --set refuses them too)
  if (const size_t dot = key.rfind('.'); dot != std::string_view::npos && key.front() != '.' &&
                                         key.back() != '.' &&
                                         key.find("..") == std::string_view::npos) {
    const std::string full = join_key(section, key);
    const size_t at = full.rfind('.');
    const auto sec = sections.find(std::string_view(full).substr(0, at));
    const std::string_view leaf = std::string_view(full).substr(at + 1);
    if (sec != sections.end() &&
        std::find(sec->second.begin(), sec->second.end(), leaf) != sec->second.end())
      return " ('" + full + "' is --set's spelling: in YAML nest it, as " +
             std::string(key.substr(0, key.find('.'))) + ": {...})";
  }
  std::string s = closest(key, sections.find(section)->second);
  if (s.empty()) {
    const std::string lk = to_lower(key);
    std::vector<std::string> found;
    for (const auto& [sec, keys] : sections) {
      for (std::string_view k : keys) {
        if (sec != section && to_lower(k) == lk) found.push_back(join_key(sec, k));
      }
    }
    if (found.size() == 1) s = found[0];
  }
  return s.empty() ? std::string() : " (did you mean '" + s + "'?)";
}

std::string enum_problem(const std::string& got, const KeyList& choices) {
  std::string msg =
      "must be one of " + join_list(choices, ", ") + " (got '" + shown_text(got, 200) + "'";
  const std::string s = closest(got, choices);
  if (!s.empty()) msg += "; did you mean '" + s + "'?";
  return msg + ")";
}

}  // namespace dtrain::config_detail
