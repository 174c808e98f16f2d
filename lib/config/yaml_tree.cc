#include "config/yaml_tree.h"

#include "util/strings.h"

namespace dtrain {

namespace {

// Counts n's nodes down from `budget`; false once it runs out or the nesting passes
// kMaxConfigDepth (an alias inside the node it names is a cycle: endless, and deep enough to
// overflow the stack long before the budget runs out).
bool count_down(const YAML::Node& n, int64_t& budget, int depth) {
  if (--budget < 0 || depth > kMaxConfigDepth) return false;
  if (n.IsSequence()) {
    for (const auto& e : n)
      if (!count_down(e, budget, depth + 1)) return false;
  } else if (n.IsMap()) {
    for (const auto& kv : n)
      if (!count_down(kv.first, budget, depth + 1) || !count_down(kv.second, budget, depth + 1))
        return false;
  }
  return true;
}

}  // namespace

bool within_values(const YAML::Node& n, int64_t limit) {
  int64_t budget = limit;
  return count_down(n, budget, 0);
}

int64_t occurrences(const YAML::Node& n, const YAML::Node& target) {
  int64_t k = n.is(target) ? 1 : 0;
  if (n.IsSequence()) {
    for (const auto& e : n) k += occurrences(e, target);
  } else if (n.IsMap()) {
    for (const auto& kv : n) k += occurrences(kv.second, target);
  }
  return k;
}

std::optional<YAML::Mark> non_utf8_at(const YAML::Node& n) {
  if (n.IsScalar()) {
    if (!valid_utf8(n.Scalar())) return n.Mark();
  } else if (n.IsSequence()) {
    for (const auto& e : n)
      if (auto m = non_utf8_at(e)) return m;
  } else if (n.IsMap()) {
    for (const auto& kv : n) {
      if (auto m = non_utf8_at(kv.first)) return m;
      if (auto m = non_utf8_at(kv.second)) return m;
    }
  }
  return std::nullopt;
}

}  // namespace dtrain
