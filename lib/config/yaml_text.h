// Checks of a config's YAML text made before yaml-cpp loads it: what yaml-cpp cannot report well
// (a NUL byte), cannot get past at all (a document that makes no progress) or would build a tree
// of any size for (too many nodes).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <yaml-cpp/yaml.h>

namespace dtrain {

// Where the text must be refused, and why (the message after the location).
struct TextProblem {
  YAML::Mark mark;  // 0-based line and column, as yaml-cpp's marks
  std::string message;
};

// The first NUL byte in `text`: YAML text holds none, and yaml-cpp stops there and blames the
// next character instead. nullopt when there is none.
std::optional<TextProblem> nul_byte_problem(const std::string& text);

// yaml-cpp 0.7's LoadAll never ends when a document starts with a token no node begins with
// (a ',' at the top level: ",\n", "---\n,"): it yields empty documents without consuming the
// token, allocating until memory runs out (a 2-byte config took 19 s and 3.6 GB before
// bad_alloc; found by fuzz/config.cc). Walking the documents first, a document that starts
// where the previous one did, with its first event at the same place, made no progress: that
// place, naming the character. nullopt when every document moves on. Throws what yaml-cpp's
// parser throws (YAML::Exception) for text it cannot parse.
std::optional<TextProblem> stuck_document_problem(const std::string& text);

// Where the text's YAML node number `limit` + 1 begins, counted by the event parser over every
// document (an alias counts once: tree_limit bounds them on the tree), with the message;
// nullopt when it has at most `limit`. yaml-cpp's tree takes about 1 KB per node, so 400 KB of
// empty flow entries ("{,,,...}") took 390 MB before the tree's count could refuse them. Throws
// YAML::Exception on text it cannot parse, as stuck_document_problem.
std::optional<TextProblem> too_many_nodes_problem(const std::string& text, int64_t limit);

}  // namespace dtrain
