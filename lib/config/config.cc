// Config loading: YAML text -> checked tree -> typed struct -> validated Config.
//
// Passes, so that each error can name its key and point at the node that caused it:
//  1. --set overrides are grafted into the YAML tree (after checking their key paths).
//  2. The tree is walked against the key declarations (schema.h: unknown or duplicate keys,
//     sections that are not mappings) and flattened into leaves by dotted key path.
//  3. Leaves are converted with strict YAML typing into the struct (enums from their names),
//     which is then range- and consistency-checked (validate.cc).
// Locations: FILE:LINE:COL (1-based) for file content; "--set TEXT" for anything an override put
// there, since marks inside an override's value are relative to that value, not to the file.
#include "config/config.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include "config/internal.h"
#include "config/schema.h"
#include "config/yaml_text.h"
#include "config/yaml_tree.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/strings.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

using config_detail::closest;
using config_detail::enum_problem;
using config_detail::join_key;
using config_detail::join_list;
using config_detail::key_suggestion;
using config_detail::KeyList;
using config_detail::show;

const KeyList& section_keys(std::string_view path) {
  return config_sections().find(path)->second;
}
bool is_section(std::string_view path) {
  return config_sections().find(path) != config_sections().end();
}
bool contains(const KeyList& list, std::string_view s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

// "a.b.c" -> "a.b", "a.b[2]" -> "a.b", "a" -> "".
std::string parent_key(const std::string& path) {
  const size_t pos = path.find_last_of(".[");
  return pos == std::string::npos ? std::string() : path.substr(0, pos);
}

std::string trim(std::string_view s) {
  const auto is_space = [](char ch) { return std::isspace(static_cast<unsigned char>(ch)) != 0; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return std::string(s);
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "null (no value)";
    case YAML::NodeType::Scalar:
      // (escaped: a block scalar's newline, a control character, stay on the message's line)
      return (n.Tag() == "!" ? "the quoted string '" : "'") + shown_text(n.Scalar(), 200) + "'";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

struct Override {
  std::string path;  // dotted key path, checked against the schema
  std::string text;  // as given on the command line, for messages
};

class Reader final : public config_detail::KeyErrors {
 public:
  // `name` appears in messages; relative data paths from the file are joined to `base_dir`
  // (absolute; empty: left as written, i.e. relative to the working directory).
  Reader(std::string name, fs::path base_dir)
      : name_(name.empty() ? "config" : std::move(name)), base_dir_(std::move(base_dir)) {}

  Config run(const std::string& text, const std::vector<std::string>& overrides) {
    YAML::Node root = load(text);
    for (const std::string& o : overrides) apply_override(root, o);
    walk(root, "", root.Mark());
    Config c;
    read_all(c);
    config_detail::validate_config(c, *this);
    resolve_paths(c);
    for (const auto& [key, node] : leaves_) c.origins[key] = location(key, marks_.at(key));
    return c;
  }

 private:
  // ---- locations and errors ----

  // The latest override whose key path is `path` or an ancestor of it.
  const Override* override_for(std::string_view path) const {
    for (auto it = overrides_.rbegin(); it != overrides_.rend(); ++it) {
      const std::string& p = it->path;
      if (path.starts_with(p) &&
          (path.size() == p.size() || path[p.size()] == '.' || path[p.size()] == '[')) {
        return &*it;
      }
    }
    return nullptr;
  }

  std::string location(std::string_view path, const YAML::Mark& mark) const {
    if (const Override* o = override_for(path)) return "--set " + shown_text(o->text, 200);
    if (mark.is_null()) return name_;
    return name_ + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
  }

  // `msg` is the complete message after the location.
  [[noreturn]] void fail_at(std::string_view path, const YAML::Mark& mark,
                            const std::string& msg) const {
    throw UserError(location(path, mark) + ": " + msg);
  }

  // At the position recorded for `path` by the walk (a null value has no useful mark of its own;
  // the walk records its key's), else at `n`.
  [[noreturn]] void fail_node(const std::string& path, const YAML::Node& n,
                              const std::string& msg) const {
    const auto it = marks_.find(path);
    fail_at(path, it != marks_.end() ? it->second : n.Mark(), path + ": " + msg);
  }

  // "PATH: MSG" at the node of `path`, or of its nearest ancestor present in the YAML (a value
  // left at its default has no node of its own).
  [[noreturn]] void fail_near(const std::string& path, const std::string& msg) const {
    YAML::Mark mark = YAML::Mark::null_mark();
    for (std::string p = path;; p = parent_key(p)) {
      if (const auto it = marks_.find(p); it != marks_.end()) {
        mark = it->second;
        break;
      }
      if (p.empty()) break;
    }
    fail_at(path, mark, path + ": " + msg);
  }

  // ---- pass 1: YAML text and overrides ----

  static std::string too_deep(int depth) {
    return "collections nested " + std::to_string(depth) +
           " levels deep, past the YAML reader's limit (a dtrain config nests 5 at most)";
  }

  YAML::Node load(const std::string& text) const {
    if (const auto p = nul_byte_problem(text)) fail_at("", p->mark, p->message);
    std::vector<YAML::Node> docs;
    try {
      if (const auto p = stuck_document_problem(text)) fail_at("", p->mark, p->message);
      if (const auto p = too_many_nodes_problem(text, kMaxConfigValues))
        fail_at("", p->mark, "the config has " + p->message);
      docs = YAML::LoadAll(text);
    } catch (const YAML::DeepRecursion& e) {
      // yaml-cpp's own message is "bad file".
      throw UserError(location("", e.mark) + ": " + too_deep(e.depth()));
    } catch (const YAML::Exception& e) {
      throw UserError(location("", e.mark) + ": " + e.msg);
    }
    // A trailing "---" yields an empty extra document; only content after it is an error.
    for (size_t i = 1; i < docs.size(); ++i) {
      if (!docs[i].IsNull()) {
        fail_at("", docs[i].Mark(),
                "expected one YAML document, found another after the first's end "
                "(a '---' or '...' line)");
      }
    }
    if (docs.empty()) return YAML::Node();
    // Aliases repeated within aliases expand exponentially (a "billion laughs" of a few hundred
    // bytes), and every pass over the tree would follow them: bounded once here.
    if (const auto t = tree_limit(docs[0], kMaxConfigValues))
      fail_at("", t->mark, tree_limit_message(*t, "the config", kMaxConfigValues));
    return docs[0];
  }

  // Replaces map `cur`'s entry `key` by `value` in cur itself: yaml-cpp's cur[key] = value would
  // rewrite the entry's node, which an alias elsewhere may share.
  static void replace_entry(YAML::Node& cur, const std::string& key, const YAML::Node& value) {
    cur.remove(key);
    cur[key] = value;
  }

  // `node` must be the value of section `path`: a mapping, or null (an empty section).
  void expect_section(const YAML::Node& node, const std::string& path) const {
    if (node.IsMap()) check_tag(node, path, "a section", {"map"});
    if (node.IsMap() || node.IsNull()) return;
    if (path.empty()) {
      fail_at(path, node.Mark(),
              "a config must be a mapping of sections (" + join_list(section_keys(""), ", ") +
                  "), got " + describe(node));
    }
    fail_node(path, node,
              "expected a mapping of keys (" + join_list(section_keys(path), ", ") + "), got " +
                  describe(node));
  }

  // Parses "key.path=value" and puts the YAML value at that path, creating missing sections.
  // Mutation note: yaml-cpp's Node::operator= on a handle writes through to the node it refers
  // to, so descending uses reset() (rebinds the handle) and only `map[key] = value` writes.
  void apply_override(YAML::Node& root, const std::string& text) {
    const std::string where = "--set " + shown_text(text, 200);
    const size_t eq = text.find('=');
    if (eq == std::string::npos) throw UserError(where + ": expected key.path=value");
    const std::string path = trim(std::string_view(text).substr(0, eq));
    if (path.empty()) throw UserError(where + ": empty key path (expected key.path=value)");

    std::vector<std::string> segs;
    for (size_t start = 0;;) {
      const size_t dot = path.find('.', start);
      segs.push_back(path.substr(start, dot == std::string::npos ? dot : dot - start));
      if (segs.back().empty()) throw UserError(where + ": malformed key path '" + path + "'");
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    std::string prefix;
    for (size_t i = 0; i < segs.size(); ++i) {
      const std::string full = join_key(prefix, segs[i]);
      if (!contains(section_keys(prefix), segs[i])) {
        throw UserError(where + ": unknown key '" + full + "'" + key_suggestion(prefix, segs[i]));
      }
      if (i + 1 < segs.size() && !is_section(full)) {
        throw UserError(where + ": '" + full + "' is a value, not a section with key '" +
                        segs[i + 1] + "'");
      }
      prefix = full;
    }

    YAML::Node value;
    const std::string raw = text.substr(eq + 1);
    const bool quoted =
        raw.size() >= 2 && (raw[0] == '"' || raw[0] == '\'') && raw.back() == raw[0];
    if (path == "data.csv.delimiter" && !quoted) {
      // A character, taken as typed: as YAML, "," is flow syntax (null) and "#" a comment.
      value.reset(YAML::Node(raw));
    } else {
      try {
        // (as load(): a ',' first left yaml-cpp's reader in place, which the count took for
        // "more than 100000 YAML values")
        if (const auto p = stuck_document_problem(raw))
          throw UserError(where + ": the value is not valid YAML: " + p->message);
        if (const auto p = too_many_nodes_problem(raw, kMaxConfigValues))
          throw UserError(where + ": the value has " + p->message);
        const std::vector<YAML::Node> docs = YAML::LoadAll(raw);
        // One document, as in the file (a trailing "---" yields an empty extra one).
        for (size_t i = 1; i < docs.size(); ++i)
          if (!docs[i].IsNull())
            throw UserError(where +
                            ": the value is not valid YAML: expected one document, found "
                            "another after the first's end (a '---' or '...' line)");
        if (!docs.empty()) value.reset(docs[0]);
      } catch (const YAML::DeepRecursion& e) {
        throw UserError(where + ": the value is not valid YAML: " + too_deep(e.depth()));
      } catch (const YAML::Exception& e) {
        throw UserError(where + ": the value is not valid YAML: " + e.msg);
      }
      // As for the file (load): every later walk follows the aliases.
      if (const auto t = tree_limit(value, kMaxConfigValues))
        throw UserError(where + ": " + tree_limit_message(*t, "the value", kMaxConfigValues));
    }

    // A section given nothing (`--set optimizer=`, an unset shell variable) took every key's
    // default in silence; in the file, `optimizer:` with nothing under it still does.
    if (is_section(path) && (!value.IsDefined() || value.IsNull()))
      throw UserError(where + ": '" + path +
                      "' is a section, and an empty or null value would reset all its keys to "
                      "their defaults: set its keys (--set " +
                      path + ".KEY=VALUE) or give a mapping ({KEY: VALUE, ...}; {} to reset it)");
    expect_section(root, "");
    if (root.IsNull()) root.reset(YAML::Node(YAML::NodeType::Map));
    // A section on the way that YAML aliases share (`train: &t {...}`, `test: *t`) is first
    // copied (YAML::Clone; its positions in the file are lost), and the value replaces its
    // entry (replace_entry): the override reaches this key path only.
    YAML::Node cur = root;
    prefix.clear();
    for (size_t i = 0; i + 1 < segs.size(); ++i) {
      prefix = join_key(prefix, segs[i]);
      const YAML::Node& look = cur;  // const: a lookup that adds no entry
      const YAML::Node found = look[segs[i]];
      YAML::Node child(YAML::NodeType::Map);
      if (!found.IsDefined() || found.IsNull()) {
        replace_entry(cur, segs[i], child);
      } else {
        expect_section(found, prefix);
        if (occurrences(root, found) > 1) {
          child = YAML::Clone(found);
          replace_entry(cur, segs[i], child);
        } else {
          child.reset(found);
        }
      }
      cur.reset(child);
    }
    replace_entry(cur, segs.back(), value);
    overrides_.push_back({path, text});
  }

  // ---- pass 2: structure ----

  // `where` is the node's position, or its key's when the value is null (yaml-cpp marks an empty
  // value at the next token, often on the following line).
  void walk(const YAML::Node& node, const std::string& path, const YAML::Mark& where) {
    marks_[path] = where;
    expect_section(node, path);
    if (!node.IsMap()) return;
    const KeyList& keys = section_keys(path);
    std::set<std::string> seen;
    for (const auto& kv : node) {
      const YAML::Node& k = kv.first;
      if (!k.IsScalar()) {
        fail_at(path, k.Mark(),
                "keys must be plain names, got " + describe(k) +
                    (path.empty() ? std::string() : " in section '" + path + "'"));
      }
      const std::string& key = k.Scalar();
      const std::string full = join_key(path, key);
      if (!contains(keys, key)) {
        fail_at(full, k.Mark(), "unknown key '" + full + "'" + key_suggestion(path, key));
      }
      if (!seen.insert(key).second) fail_at(full, k.Mark(), "duplicate key '" + full + "'");
      const YAML::Mark where = kv.second.IsNull() ? k.Mark() : kv.second.Mark();
      if (is_section(full)) {
        walk(kv.second, full, where);
      } else {
        if (const auto bad = non_utf8_at(kv.second))
          fail_at(full, *bad,
                  full +
                      ": the value is not valid UTF-8 text (a config is UTF-8, as YAML is, "
                      "and config.json records every value)");
        leaves_.emplace(full, kv.second);
        marks_[full] = where;
      }
    }
  }

  // ---- pass 3a: typed reads ----

  const YAML::Node* leaf(const std::string& path) const {
    const auto it = leaves_.find(path);
    return it == leaves_.end() ? nullptr : &it->second;
  }
  bool has(const std::string& path) const { return leaves_.count(path) != 0; }

  // The text of a plain (unquoted) scalar: YAML types numbers and booleans by their plain form,
  // so "128" in quotes is a string, not an integer.
  // An explicit YAML tag is accepted only when it names the type the key reads (`!!int 8` for an
  // integer); `!!str 8` or a custom tag (`!mine 8`) is refused rather than read as what it is not.
  // `core` is that type's core-schema tag names without the "tag:yaml.org,2002:" prefix.
  void check_tag(const YAML::Node& n, const std::string& path, const char* what,
                 std::initializer_list<std::string_view> core) const {
    const std::string& tag = n.Tag();
    if (tag.empty() || tag == "?" || tag == "!") return;  // untagged (plain, quoted)
    static constexpr std::string_view kCore = "tag:yaml.org,2002:";
    for (std::string_view c : core)
      if (tag.size() == kCore.size() + c.size() && tag.starts_with(kCore) && tag.ends_with(c))
        return;
    const std::string shown = tag.starts_with(kCore) ? "!!" + tag.substr(kCore.size()) : tag;
    fail_node(path, n,
              std::string("expected ") + what + ", got " +
                  (n.IsScalar() ? "'" + n.Scalar() + "'" : describe(n)) + " tagged " + shown +
                  " (remove the tag)");
  }

  const std::string& plain_scalar(const YAML::Node& n, const std::string& path, const char* what,
                                  std::initializer_list<std::string_view> core) const {
    if (!n.IsScalar() || n.Tag() == "!") {
      fail_node(path, n, std::string("expected ") + what + ", got " + describe(n));
    }
    check_tag(n, path, what, core);
    return n.Scalar();
  }

  // A string value, plain or quoted: no tag but !!str, and no NUL byte (YAML's "\0"), which every
  // file or system call would cut the string at (a path "a.csv\0x" read a.csv).
  const std::string& text_scalar(const YAML::Node& n, const std::string& path,
                                 const char* what) const {
    check_tag(n, path, what, {"str"});
    const std::string& s = n.Scalar();
    if (s.find('\0') != std::string::npos)
      fail_node(path, n, std::string("expected ") + what + ", got a string with a NUL byte");
    return s;
  }

  // Skips one leading '+' (YAML allows it; from_chars does not), but not "+-".
  static const char* skip_plus(const std::string& s) {
    return s.size() > 1 && s[0] == '+' && s[1] != '-' ? s.data() + 1 : s.data();
  }

  int64_t to_int(const YAML::Node& n, const std::string& path) const {
    const std::string& s = plain_scalar(n, path, "an integer", {"int"});
    const char* end = s.data() + s.size();
    int64_t v = 0;
    const auto [p, ec] = std::from_chars(skip_plus(s), end, v);
    if (ec == std::errc::result_out_of_range) {
      fail_node(path, n, "integer out of range (got '" + s + "')");
    }
    if (ec != std::errc() || p != end) fail_node(path, n, "expected an integer, got '" + s + "'");
    return v;
  }

  double to_double(const YAML::Node& n, const std::string& path) const {
    const std::string& s = plain_scalar(n, path, "a number", {"int", "float"});
    const char* end = s.data() + s.size();
    double v = 0;
    const auto [p, ec] = std::from_chars(skip_plus(s), end, v);
    if (ec == std::errc::result_out_of_range) {
      fail_node(path, n, "number out of range (got '" + s + "')");
    }
    if (ec != std::errc() || p != end) fail_node(path, n, "expected a number, got '" + s + "'");
    if (!std::isfinite(v)) fail_node(path, n, "expected a finite number, got '" + s + "'");
    // -0 is 0: the same setting, so the same config.json and config hash.
    return v == 0.0 ? 0.0 : v;
  }

  void read(const std::string& path, int64_t& out) const {
    if (const YAML::Node* n = leaf(path)) out = to_int(*n, path);
  }

  void read(const std::string& path, double& out) const {
    if (const YAML::Node* n = leaf(path)) out = to_double(*n, path);
  }

  // YAML 1.2 core-schema booleans only: yes/no/on/off are strings there.
  void read(const std::string& path, bool& out) const {
    const YAML::Node* n = leaf(path);
    if (!n) return;
    const std::string& s = plain_scalar(*n, path, "true or false", {"bool"});
    if (s == "true" || s == "True" || s == "TRUE") {
      out = true;
    } else if (s == "false" || s == "False" || s == "FALSE") {
      out = false;
    } else {
      fail_node(path, *n, "expected true or false, got '" + s + "'");
    }
  }

  // Any scalar, plain or quoted (`label_column: 3` is the text "3").
  void read(const std::string& path, std::string& out) const {
    const YAML::Node* n = leaf(path);
    if (!n) return;
    if (!n->IsScalar()) fail_node(path, *n, "expected a string, got " + describe(*n));
    out = text_scalar(*n, path, "a string");
  }

  // One character; the two-character text \t (unquoted in the file, or from --set) is a tab.
  void read(const std::string& path, char& out) const {
    const YAML::Node* n = leaf(path);
    if (!n) return;
    if (n->IsNull())
      fail_node(path, *n, "must be one character, got no value (quote it, e.g. ',' or \"\\t\")");
    std::string s;
    read(path, s);
    if (s == "\\t") s = "\t";
    if (s.size() != 1) {
      const std::string hint = override_for(path)
                                   ? "e.g. --set " + path + "=';', or '\\t' for a tab"
                                   : std::string("quote it, e.g. \"\\t\"");
      // A multibyte UTF-8 character looks like one character but is several bytes: the CSV
      // reader splits on one byte, so only ASCII can be a delimiter.
      const bool one_utf8_char =
          s.size() > 1 && (static_cast<unsigned char>(s[0]) & 0xC0) == 0xC0 &&
          std::all_of(s.begin() + 1, s.end(),
                      [](char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; });
      if (one_utf8_char)
        fail_node(path, *n,
                  "must be one ASCII character ('" + s + "' is " + std::to_string(s.size()) +
                      " bytes in UTF-8; " + hint + ")");
      fail_node(path, *n, "must be exactly one character (got '" + s + "'; " + hint + ")");
    }
    out = s[0];
  }

  void read(const std::string& path, std::vector<int64_t>& out) {
    const YAML::Node* n = leaf(path);
    if (!n) return;
    if (!n->IsSequence()) {
      fail_node(path, *n,
                "expected a sequence of integers such as [512, 512], got " + describe(*n));
    }
    check_tag(*n, path, "a sequence of integers", {"seq"});
    out.clear();
    size_t i = 0;
    for (const YAML::Node& e : *n) {
      const std::string ep = path + "[" + std::to_string(i++) + "]";
      marks_[ep] = e.Mark();
      out.push_back(to_int(e, ep));
    }
  }

  // A path list (KeyType::kPathList): one string, or a sequence of non-empty strings. "" and []
  // are the empty list (the default).
  void read(const std::string& path, std::vector<std::string>& out) {
    const YAML::Node* n = leaf(path);
    if (!n) return;
    out.clear();
    if (n->IsScalar()) {
      if (const std::string& p = text_scalar(*n, path, "a path"); !p.empty()) out.push_back(p);
      return;
    }
    if (!n->IsSequence())
      fail_node(path, *n,
                "expected a path or a list of paths such as [a.txt, 'corpus/*.txt'], got " +
                    describe(*n));
    check_tag(*n, path, "a list of paths", {"seq"});
    size_t i = 0;
    for (const YAML::Node& e : *n) {
      const std::string ep = path + "[" + std::to_string(i++) + "]";
      marks_[ep] = e.Mark();
      if (!e.IsScalar()) fail_node(ep, e, "expected a path, got " + describe(e));
      if (e.Scalar().empty()) fail_node(ep, e, "expected a path, got an empty string");
      out.push_back(text_scalar(e, ep, "a path"));
    }
  }

  // ---- model.layers: a list of kind names or one-key maps {kind: value} ----

  // The fields of one map-valued layer entry: each key must be one of `allowed`.
  void read_layer_fields(
      const YAML::Node& m, const std::string& path, const std::vector<std::string_view>& allowed,
      const std::function<void(const std::string&, const YAML::Node&, const std::string&)>& field)
      const {
    std::set<std::string> seen;
    for (const auto& kv : m) {
      if (!kv.first.IsScalar())
        fail_at(path, kv.first.Mark(),
                path + ": field names must be plain names, got " + describe(kv.first));
      const std::string k = kv.first.Scalar();
      const std::string kp = path + "." + k;
      if (!seen.insert(k).second)
        fail_at(kp, kv.first.Mark(), kp + ": duplicate field '" + k + "'");
      if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) {
        const std::string near = closest(k, allowed);
        fail_at(kp, kv.first.Mark(),
                kp + ": unknown field '" + k + "'" +
                    (near.empty() ? "" : " (did you mean '" + near + "'?)") + "; expected " +
                    join_list(allowed, ", "));
      }
      field(k, kv.second, kp);
    }
  }

  int64_t layer_int(const YAML::Node& n, const std::string& path, int64_t lo) const {
    const int64_t v = to_int(n, path);
    if (v < lo) fail_node(path, n, "must be >= " + std::to_string(lo) + " (got " + show(v) + ")");
    if (v > (int64_t{1} << 24)) fail_node(path, n, "must be <= 16777216 (got " + show(v) + ")");
    return v;
  }

  LayerSpec read_layer(const YAML::Node& e, const std::string& path) const {
    LayerSpec l;
    const YAML::Node* value = nullptr;
    std::string kind_text;
    YAML::Node v;
    if (e.IsScalar()) {
      kind_text = e.Scalar();
    } else if (e.IsMap() && e.size() == 1 && e.begin()->first.IsScalar()) {
      kind_text = e.begin()->first.Scalar();
      v = e.begin()->second;
      value = &v;
    } else {
      fail_node(path, e,
                "expected a layer: a name such as relu, or a one-key map such as {linear: 128}; "
                "got " +
                    describe(e));
    }
    const std::optional<LayerKind> kind = parse_enum<LayerKind>(kind_text);
    if (!kind)
      fail_node(path, e, "unknown layer: " + enum_problem(kind_text, enum_choices<LayerKind>()));
    l.kind = *kind;
    const std::string vp = path + "." + kind_text;
    const bool has_value = value != nullptr && !value->IsNull();
    auto need = [&](bool ok, const char* form) {
      if (!ok) fail_node(path, e, kind_text + " needs " + form);
    };
    switch (l.kind) {
      case LayerKind::kLinear:
        need(has_value, "its output width, e.g. {linear: 128}");
        if (value->IsMap()) {
          read_layer_fields(*value, vp, {"out_features"},
                            [&](auto&, auto& n, auto& fp) { l.out = layer_int(n, fp, 1); });
          need(l.out > 0, "out_features, e.g. {linear: {out_features: 128}}");
        } else {
          l.out = layer_int(*value, vp, 1);
        }
        break;
      case LayerKind::kConv2d:
        need(has_value && value->IsMap(),
             "a map, e.g. {conv2d: {out_channels: 32, kernel: 3, stride: 1, padding: 1}}");
        l.stride = 1;
        read_layer_fields(*value, vp, {"out_channels", "kernel", "stride", "padding"},
                          [&](const std::string& k, auto& n, auto& fp) {
                            if (k == "out_channels") l.out = layer_int(n, fp, 1);
                            if (k == "kernel") l.kernel = layer_int(n, fp, 1);
                            if (k == "stride") l.stride = layer_int(n, fp, 1);
                            if (k == "padding") l.padding = layer_int(n, fp, 0);
                          });
        need(l.out > 0 && l.kernel > 0, "out_channels and kernel");
        break;
      case LayerKind::kMaxPool2d:
      case LayerKind::kAvgPool2d:
        need(has_value, "its kernel, e.g. {max_pool2d: 2} or {max_pool2d: {kernel: 3, stride: 2}}");
        if (value->IsMap()) {
          read_layer_fields(*value, vp, {"kernel", "stride"},
                            [&](const std::string& k, auto& n, auto& fp) {
                              if (k == "kernel") l.kernel = layer_int(n, fp, 1);
                              if (k == "stride") l.stride = layer_int(n, fp, 1);
                            });
          need(l.kernel > 0, "kernel");
        } else {
          l.kernel = layer_int(*value, vp, 1);
        }
        if (l.stride == 0) l.stride = l.kernel;  // PyTorch's default
        break;
      case LayerKind::kDropout:
        if (has_value && value->IsMap()) {
          read_layer_fields(*value, vp, {"p"},
                            [&](auto&, auto& n, auto& fp) { l.p = to_double(n, fp); });
        } else if (has_value) {
          l.p = to_double(*value, vp);
        }
        if (!(l.p >= 0.0 && l.p < 1.0))
          fail_node(path, e, "dropout probability must be in [0, 1) (got " + show(l.p) + ")");
        break;
      default:  // no parameters: `relu` or {relu: null} / {relu: {}}
        if (has_value && !(value->IsMap() && value->size() == 0))
          fail_node(path, e,
                    kind_text + " takes no value (write it as a plain '" + kind_text + "')");
        break;
    }
    return l;
  }

  void read(const std::string& path, std::vector<LayerSpec>& out) {
    const YAML::Node* n = leaf(path);
    if (!n) return;
    if (!n->IsSequence())
      fail_node(path, *n,
                "expected a list of layers such as [{linear: 128}, relu], got " + describe(*n));
    check_tag(*n, path, "a list of layers", {"seq"});
    out.clear();
    size_t i = 0;
    for (const YAML::Node& e : *n) {
      const std::string ep = path + "[" + std::to_string(i++) + "]";
      marks_[ep] = e.Mark();
      out.push_back(read_layer(e, ep));
    }
  }

  // An enum key: its text must be one of the enum's names.
  void read(const std::string& path, const EnumRef& e, Config& c) const {
    std::string s;
    read(path, s);
    if (!e.set(c, s)) fail_node(path, *leaf(path), enum_problem(s, e.choices));
  }

  // Every declared key present in the YAML, into its field of `c`.
  void read_all(Config& c) {
    for (const KeyDecl& d : config_keys()) {
      if (!has(d.path)) continue;
      std::visit(
          [&](const auto& ref) {
            if constexpr (std::is_same_v<std::decay_t<decltype(ref)>, EnumRef>) {
              read(d.path, ref, c);
            } else {
              read(d.path, ref(c));
            }
          },
          d.ref);
    }
    // strategy pipeline (ddp with a pipeline) keeps its old default of two stages.
    if (c.distributed.strategy == StrategyKind::kPipeline && !has("distributed.pipeline.stages"))
      c.distributed.pipeline.stages = 2;
  }

  // ---- pass 3b: values (validate.cc), reported at the keys' positions ----

  [[noreturn]] void fail(const std::string& path, const std::string& msg) const override {
    fail_near(path, msg);
  }
  bool given(const std::string& path) const override { return has(path); }

  // ---- relative data paths ----

  // A relative path in the file is relative to its folder, one from --set to the working
  // directory; both become absolute (config.json loads back from anywhere).
  // `glob`: the value may be a glob pattern (text data's paths): a folder with *, ? or [ in its
  // name has them bracketed ("proj[1]" -> "proj[[]1]", which glob(3) and Python's glob read
  // literally), so the path -- a pattern, or a file name the loader would glob when it is
  // missing -- matches inside that folder only (a config in "proj[1]/" or "runs*/" must not
  // read "proj1/" or "runsX/").
  void resolve(const std::string& path, std::string& value, bool glob) const {
    if (value.empty() || base_dir_.empty()) return;
    const fs::path p(value);
    // (lexically normal: "/data//x.csv" and "/data/x.csv" are one config, one hash, on all ranks)
    if (p.is_absolute()) return void(value = p.lexically_normal().string());
    std::error_code ec;
    const std::string base =
        (override_for(path) ? fs::current_path(ec) : base_dir_).lexically_normal().string();
    std::string escaped;
    const bool bracket = glob && base.find_first_of("*?[") != std::string::npos;
    for (const char ch : base) {
      if (bracket && (ch == '*' || ch == '?' || ch == '['))
        escaped += std::string("[") + ch + "]";
      else if (bracket && ch == '\\')  // (glob(3) reads "\b" as "b"; both read "[\\]" as "\")
        escaped += "[\\\\]";
      else
        escaped += ch;
    }
    // An existing file named literally is that file (as text.h's loader reads a name that
    // exists), glob characters in the folder or the name or not.
    const fs::path literal = (fs::path(base) / p).lexically_normal();
    value = bracket && fs::is_regular_file(literal, ec)
                ? literal.string()
                : (fs::path(escaped) / p).lexically_normal().string();
    if (!valid_utf8(value)) {
      const auto m = marks_.find(path);
      fail_at(path, m != marks_.end() ? m->second : YAML::Mark::null_mark(),
              path + ": relative to the config's folder this is '" + value +
                  "', which is not valid UTF-8 (config.json records it): give an absolute path, "
                  "or keep the config in a folder whose name is UTF-8");
    }
  }

  void resolve_paths(Config& c) const {
    for (const KeyDecl& d : config_keys()) {
      if (d.type == KeyType::kPath)
        resolve(d.path, (*std::get<std::string& (*)(Config&)>(d.ref))(c), false);
      if (d.type == KeyType::kPathList) {  // (text data's lists take glob patterns)
        const bool glob = c.data.format == DataFormat::kText;
        for (std::string& p : (*std::get<std::vector<std::string>& (*)(Config&)>(d.ref))(c))
          resolve(d.path, p, glob);
      }
    }
  }

  std::string name_;
  fs::path base_dir_;
  std::vector<Override> overrides_;
  std::map<std::string, YAML::Node> leaves_;  // every leaf key present, by dotted path
  std::map<std::string, YAML::Mark> marks_;   // value position of every present key/section
};

}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  // A directory or an empty file would otherwise parse as an empty config and fail on the first
  // required key, which names neither the real problem nor the file.
  if (const std::string why = input_file_problem(path); !why.empty())
    throw UserError(
        "config '" + path + "' " + why +
        (why.starts_with("is a dir") ? " (give a YAML file, e.g. configs/smoke.yaml)" : ""));
  // A training config is a few KB: 1 MiB bounds the parse's time and memory (yaml-cpp's scanner
  // reads a flow collection whole before the node count can stop it).
  constexpr uintmax_t kMaxConfigBytes = uintmax_t{1} << 20;
  std::error_code ec;
  if (const uintmax_t size = fs::file_size(path, ec); !ec && size > kMaxConfigBytes)
    throw UserError("config '" + path + "' has " + std::to_string(size) +
                    " bytes, more than the 1 MiB a config may have (a training config is a few "
                    "KB)");
  const std::string text = read_regular_file(path, kMaxConfigBytes);
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw UserError("config '" + path + "' is empty" +
                    (text.empty() ? std::string() : " (only whitespace)") +
                    ": a config is a YAML mapping of sections (see configs/ for examples)");
  Config c = Reader(path, fs::absolute(fs::path(path)).parent_path()).run(text, overrides);
  c.source_path = path;
  return c;
}

Config parse_config(const std::string& yaml_text, const std::string& name,
                    const std::vector<std::string>& overrides) {
  return Reader(name, fs::path()).run(yaml_text, overrides);
}

}  // namespace dtrain
