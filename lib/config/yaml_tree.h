// Walks over a loaded YAML tree (yaml-cpp), for the config reader. Aliases (`*a`) are followed
// each time they occur, so a tree may be much larger than its text: callers bound it first
// (tree_limit) and only then walk it whole.
#pragma once

#include <cstdint>
#include <optional>

#include <yaml-cpp/yaml.h>

namespace dtrain {

// The most values (nodes, aliases followed) a config may expand to: a training config has a
// few hundred; aliases nested in aliases (a "billion laughs" of a few hundred bytes) have more
// than any walk could visit.
inline constexpr int64_t kMaxConfigValues = 100000;
// The deepest nesting a config may reach with its aliases followed (a training config has 4
// levels; an alias inside the node it names nests without end).
inline constexpr int kMaxConfigDepth = 200;

// Whether the tree under n has at most `limit` nodes and kMaxConfigDepth levels, aliases
// followed each time; stops counting past either, so it is cheap (and shallow) on any tree.
// nullopt within both; else which limit it passes: `deep` (a node past kMaxConfigDepth levels,
// at `mark`) or not (past `limit` nodes, mark: n's).
struct TreeLimit {
  bool deep = false;
  bool cycle = false;  // deep because a node contains an alias of itself
  YAML::Mark mark;
};
std::optional<TreeLimit> tree_limit(const YAML::Node& n, int64_t limit);
// The message for a TreeLimit, `what` naming the tree ("the config", "the value").
std::string tree_limit_message(const TreeLimit& t, const std::string& what, int64_t limit);

// How often `target` (the node itself, not an equal one) occurs in the tree under n: more than
// once when YAML aliases (`&a` ... `*a`) share it. Map keys are not counted.
int64_t occurrences(const YAML::Node& n, const YAML::Node& target);

// Where the first scalar of `n` (itself, or one inside a sequence or mapping, keys included)
// that is not well-formed UTF-8 is; nullopt when all are. YAML text is Unicode, but yaml-cpp
// passes other bytes through, which JSON (config.json, the config hash) cannot hold.
std::optional<YAML::Mark> non_utf8_at(const YAML::Node& n);

}  // namespace dtrain
