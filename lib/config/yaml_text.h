// Checks of a config's YAML text made before yaml-cpp loads it: what yaml-cpp cannot report well
// (a NUL byte) or cannot get past at all (a document that makes no progress).
#pragma once

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

}  // namespace dtrain
