#include "config/yaml_text.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <sstream>
#include <utility>

namespace dtrain {

namespace {

// The parser's events, each node's start passed to node(): what the checks below count or note.
class NodeEvents : public YAML::EventHandler {
 public:
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                const std::string&) override {
    node(m);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    node(m);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    node(m);
  }
  void OnMapEnd() override {}

 protected:
  virtual void node(const YAML::Mark& m) = 0;
};

// Where the last document handed to it began, and its first node (positions in the text, -1
// when unknown): what stuck_document_problem compares between documents.
class DocumentStarts : public NodeEvents {
 public:
  std::pair<int, int> at{-1, -1};
  YAML::Mark first_mark = YAML::Mark::null_mark();

  void OnDocumentStart(const YAML::Mark& m) override {
    at = {m.pos, -1};
    first_mark = m;
  }

 private:
  void node(const YAML::Mark& m) override {
    if (at.second != -1) return;
    at.second = m.pos;
    first_mark = m;
  }
};

// Counts nodes; past the limit, throws Past (where it happened) to stop the parse there.
class NodeCounter : public NodeEvents {
 public:
  struct Past {
    YAML::Mark mark;
  };
  explicit NodeCounter(int64_t limit) : left_(limit) {}
  void OnDocumentStart(const YAML::Mark&) override {}

 private:
  void node(const YAML::Mark& m) override {
    if (--left_ < 0) throw Past{m};
  }
  int64_t left_;
};

}  // namespace

std::optional<TextProblem> nul_byte_problem(const std::string& text) {
  const size_t nul = text.find('\0');
  if (nul == std::string::npos) return std::nullopt;
  YAML::Mark at;
  at.line = static_cast<int>(std::count(text.begin(), text.begin() + nul, '\n'));
  const size_t line_start = text.rfind('\n', nul);
  at.column = static_cast<int>(nul - (line_start == std::string::npos ? 0 : line_start + 1));
  return TextProblem{at, "a NUL byte: a config is text, and this file is not"};
}

std::optional<TextProblem> stuck_document_problem(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts starts;
  std::pair<int, int> last{-2, -2};
  while (parser.HandleNextDocument(starts)) {
    if (starts.at == last) {
      const int pos = starts.at.second;
      const char ch = pos >= 0 && static_cast<size_t>(pos) < text.size() ? text[pos] : '?';
      return TextProblem{starts.first_mark,
                         std::string("unexpected '") + ch + "': the YAML reader cannot go past it" +
                             (ch == ',' ? " (',' separates items only inside [ ] or { })" : "")};
    }
    last = starts.at;
  }
  return std::nullopt;
}

std::optional<TextProblem> too_many_nodes_problem(const std::string& text, int64_t limit) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  NodeCounter counter(limit);
  try {
    while (parser.HandleNextDocument(counter)) {
    }
  } catch (const NodeCounter::Past& p) {
    return TextProblem{p.mark, "more than " + std::to_string(limit) +
                                   " YAML values (keys, entries, empty ones too): not a training "
                                   "config"};
  }
  return std::nullopt;
}

}  // namespace dtrain
