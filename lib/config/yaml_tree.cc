#include "config/yaml_tree.h"

#include <algorithm>
#include <string>
#include <vector>

#include "util/strings.h"

namespace dtrain {

namespace {

// Counts n's nodes down from `budget`, `path` holding the text positions of n's ancestors;
// false once it runs out or the nesting passes kMaxConfigDepth (an alias inside the node it
// names is a cycle: endless, and deep enough to overflow the stack long before the budget runs
// out); *out says which limit tripped.
bool count_down(const YAML::Node& n, int64_t& budget, std::vector<int>& path, TreeLimit* out) {
  if (static_cast<int>(path.size()) > kMaxConfigDepth) {
    out->deep = true;
    out->mark = n.Mark();
    // (an alias inside the node it names repeats that node's position on the way down)
    std::vector<int> seen = path;
    std::sort(seen.begin(), seen.end());
    out->cycle = std::adjacent_find(seen.begin(), seen.end()) != seen.end();
    return false;
  }
  if (--budget < 0) return false;
  if (!n.IsSequence() && !n.IsMap()) return true;
  path.push_back(n.Mark().pos);
  bool ok = true;
  if (n.IsSequence()) {
    for (const auto& e : n)
      if (!(ok = count_down(e, budget, path, out))) break;
  } else {
    for (const auto& kv : n)
      if (!(ok = count_down(kv.first, budget, path, out) &&
                 count_down(kv.second, budget, path, out)))
        break;
  }
  path.pop_back();
  return ok;
}

}  // namespace

std::optional<TreeLimit> tree_limit(const YAML::Node& n, int64_t limit) {
  int64_t budget = limit;
  std::vector<int> path;
  TreeLimit t;
  t.mark = n.Mark();
  if (count_down(n, budget, path, &t)) return std::nullopt;
  return t;
}

std::string tree_limit_message(const TreeLimit& t, const std::string& what, int64_t limit) {
  if (t.cycle) return what + " holds an alias inside the node it names: it nests without end";
  if (t.deep)
    return "collections nested more than " + std::to_string(kMaxConfigDepth) +
           " levels deep (a dtrain config nests 5 at most)";
  return what + " expands to more than " + std::to_string(limit) +
         " values once its YAML aliases are followed (an alias inside the node it names?): not "
         "a training config";
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
