// lib/config internals: text helpers for messages and "did you mean" suggestions, and the
// interface validation reports through. Not for use outside lib/config.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain {
struct Config;
}  // namespace dtrain

namespace dtrain::config_detail {

using KeyList = std::vector<std::string_view>;

std::string join_key(std::string_view prefix, std::string_view key);
std::string join_list(const KeyList& list, std::string_view sep);
std::string show(int64_t v);
std::string show(double v);  // shortest round-trip form: 0.01, 1e-08

// The candidate `word` is most plausibly a typo of, or "" when none is close: case-insensitive
// edit distance <= max(1, min(3, len/3)), or `word` (3+ chars) is a prefix of the candidate
// ("warmup" -> "warmup_steps").
std::string closest(std::string_view word, const KeyList& candidates);

// " (did you mean 'x'?)" for an unknown `key` in `section`: a close sibling key, else the full
// path of the one other section that has exactly this key (`lr` at the top -> `optimizer.lr`).
std::string key_suggestion(std::string_view section, std::string_view key);

// "must be one of a, b (got 'x'; did you mean 'y'?)"
std::string enum_problem(const std::string& got, const KeyList& choices);

// Where validation reports: the Reader, which knows each key's position in the YAML.
class KeyErrors {
 public:
  virtual ~KeyErrors() = default;
  // Throws UserError "WHERE: PATH: MSG", WHERE the node of `path` or of its nearest ancestor
  // present in the YAML.
  [[noreturn]] virtual void fail(const std::string& path, const std::string& msg) const = 0;
  // Whether the key was given (in the file or by --set).
  virtual bool given(const std::string& path) const = 0;

  void check(bool ok, const std::string& path, const std::string& msg) const {
    if (!ok) fail(path, msg);
  }
};

// Range and consistency checks of a parsed config, in place: resolves model.complexity into
// model.hidden. Throws through `errors` on the first problem.
void validate_config(Config& c, const KeyErrors& errors);

}  // namespace dtrain::config_detail
