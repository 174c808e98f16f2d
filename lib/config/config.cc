// Config loading: YAML text -> checked tree -> typed struct -> validated Config.
//
// Passes, so that each error can name its key and point at the node that caused it:
//  1. --set overrides are grafted into the YAML tree (after checking their key paths).
//  2. The tree is walked against the key schema (unknown or duplicate keys, sections that are not
//     mappings) and flattened into leaves by dotted key path.
//  3. Leaves are converted with strict YAML typing into the struct, which is then range- and
//     consistency-checked.
// Locations: FILE:LINE:COL (1-based) for file content; "--set TEXT" for anything an override put
// there, since marks inside an override's value are relative to that value, not to the file.
#include "config/config.h"

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
#include <set>
#include <string_view>
#include <utility>

#include "util/check.h"
#include "util/fs.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;
using KeyList = std::vector<std::string_view>;

// Every mapping of the config by key path ("" is the top level) with its allowed keys, in the
// order of config.h. A key whose full path is listed here is a section; any other key is a leaf.
// Must match the struct fields read in Reader::read_all and written by config_to_json.
const std::map<std::string, KeyList, std::less<>>& schema() {
  static const std::map<std::string, KeyList, std::less<>> s = {
      {"", {"seed", "model", "data", "optimizer", "train", "distributed", "runtime"}},
      {"model",
       {"type", "complexity", "hidden", "activation", "dropout", "layer_norm", "init", "loss",
        "input_features", "num_classes"}},
      {"data",
       {"format", "train", "test", "test_fraction", "batch_size", "eval_batch_size", "shuffle",
        "drop_last", "normalize", "csv", "synthetic"}},
      {"data.train", {"images", "labels", "path"}},
      {"data.test", {"images", "labels", "path"}},
      {"data.csv", {"header", "label_column", "delimiter"}},
      {"data.synthetic", {"samples", "features", "classes", "noise", "seed"}},
      {"optimizer",
       {"type", "lr", "momentum", "nesterov", "weight_decay", "beta1", "beta2", "eps", "scale_lr",
        "clip_grad_norm", "schedule"}},
      {"optimizer.schedule", {"type", "warmup_steps", "step_size", "gamma", "min_lr"}},
      {"train",
       {"epochs", "max_steps", "log_every", "eval_every", "grad_accum_steps", "nonfinite",
        "checkpoint"}},
      {"train.checkpoint", {"every_steps", "keep_last"}},
      {"distributed",
       {"backend", "world_size", "strategy", "timeout_s", "heartbeat_s", "rendezvous_timeout_s",
        "token_file", "bind", "shm", "tls", "ddp", "local_sgd", "compression", "fsdp", "pipeline"}},
      {"distributed.pipeline",
       {"stages", "micro_batches", "schedule", "partition", "activation_checkpointing"}},
      {"distributed.fsdp", {"unit", "layers_per_unit", "reshard_after_forward"}},
      {"distributed.compression", {"type", "ratio", "rank", "error_feedback"}},
      {"distributed.local_sgd",
       {"sync_every", "sync_optimizer_state", "outer_lr", "outer_momentum"}},
      {"distributed.tls", {"cert", "key", "ca"}},
      {"distributed.ddp", {"bucket_mb"}},
      {"runtime", {"threads"}},
  };
  return s;
}

const KeyList& section_keys(std::string_view path) {
  return schema().find(path)->second;
}
bool is_section(std::string_view path) {
  return schema().find(path) != schema().end();
}
bool contains(const KeyList& list, std::string_view s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

std::string join_key(std::string_view prefix, std::string_view key) {
  std::string out(prefix);
  if (!out.empty()) out += '.';
  out += key;
  return out;
}

// "a.b.c" -> "a.b", "a.b[2]" -> "a.b", "a" -> "".
std::string parent_key(const std::string& path) {
  const size_t pos = path.find_last_of(".[");
  return pos == std::string::npos ? std::string() : path.substr(0, pos);
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

std::string trim(std::string_view s) {
  const auto is_space = [](char ch) { return std::isspace(static_cast<unsigned char>(ch)) != 0; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return std::string(s);
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

// The candidate `word` is most plausibly a typo of, or "" when none is close: case-insensitive
// edit distance <= max(1, min(3, len/3)), or `word` (3+ chars) is a prefix of the candidate
// ("warmup" -> "warmup_steps").
std::string closest(std::string_view word, const KeyList& candidates) {
  const std::string w = to_lower(word);
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (std::string_view c : candidates) {
    if (c.empty()) continue;
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

// " (did you mean 'x'?)" for an unknown `key` in `section`: a close sibling key, else the full
// path of the one other section that has exactly this key (`lr` at the top -> `optimizer.lr`).
std::string key_suggestion(std::string_view section, std::string_view key) {
  std::string s = closest(key, section_keys(section));
  if (s.empty()) {
    const std::string lk = to_lower(key);
    std::vector<std::string> found;
    for (const auto& [sec, keys] : schema()) {
      for (std::string_view k : keys) {
        if (sec != section && to_lower(k) == lk) found.push_back(join_key(sec, k));
      }
    }
    if (found.size() == 1) s = found[0];
  }
  return s.empty() ? std::string() : " (did you mean '" + s + "'?)";
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "null (no value)";
    case YAML::NodeType::Scalar:
      return (n.Tag() == "!" ? "the quoted string '" : "'") + n.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

std::string show(int64_t v) {
  return std::to_string(v);
}
std::string show(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string join_list(const KeyList& list, std::string_view sep) {
  std::string out;
  for (std::string_view s : list) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

// Same table as complexity_preset in lib/nn/model.h; lib/config does not depend on lib/nn.
std::vector<int64_t> preset_hidden(const std::string& name) {
  if (name == "simple") return {128};
  if (name == "medium") return {512, 512};
  if (name == "complex") return {1024, 1024, 512, 256};
  throw InternalError("unknown complexity preset '" + name + "'");
}

struct Override {
  std::string path;  // dotted key path, checked against the schema
  std::string text;  // as given on the command line, for messages
};

class Reader {
 public:
  // `name` appears in messages; relative data paths from the file are joined to `base_dir`
  // (empty: left as written, i.e. relative to the working directory).
  Reader(std::string name, fs::path base_dir)
      : name_(name.empty() ? "config" : std::move(name)), base_dir_(std::move(base_dir)) {}

  Config run(const std::string& text, const std::vector<std::string>& overrides) {
    YAML::Node root = load(text);
    for (const std::string& o : overrides) apply_override(root, o);
    walk(root, "", root.Mark());
    Config c;
    read_all(c);
    validate(c);
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
    if (const Override* o = override_for(path)) return "--set " + o->text;
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
  [[noreturn]] void fail(const std::string& path, const std::string& msg) const {
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

  YAML::Node load(const std::string& text) const {
    std::vector<YAML::Node> docs;
    try {
      docs = YAML::LoadAll(text);
    } catch (const YAML::Exception& e) {
      throw UserError(location("", e.mark) + ": " + e.msg);
    }
    // A trailing "---" yields an empty extra document; only content after it is an error.
    for (size_t i = 1; i < docs.size(); ++i) {
      if (!docs[i].IsNull()) {
        fail_at("", docs[i].Mark(), "expected one YAML document, found more after '---'");
      }
    }
    return docs.empty() ? YAML::Node() : docs[0];
  }

  // `node` must be the value of section `path`: a mapping, or null (an empty section).
  void expect_section(const YAML::Node& node, const std::string& path) const {
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
    const std::string where = "--set " + text;
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
        value.reset(YAML::Load(raw));
      } catch (const YAML::Exception& e) {
        throw UserError(where + ": the value is not valid YAML: " + e.msg);
      }
    }

    expect_section(root, "");
    if (root.IsNull()) root.reset(YAML::Node(YAML::NodeType::Map));
    YAML::Node cur = root;
    prefix.clear();
    for (size_t i = 0; i + 1 < segs.size(); ++i) {
      prefix = join_key(prefix, segs[i]);
      YAML::Node child = cur[segs[i]];
      if (!child.IsDefined() || child.IsNull()) {
        cur[segs[i]] = YAML::Node(YAML::NodeType::Map);
        child.reset(cur[segs[i]]);
      } else {
        expect_section(child, prefix);
      }
      cur.reset(child);
    }
    cur[segs.back()] = value;
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
  const std::string& plain_scalar(const YAML::Node& n, const std::string& path,
                                  const char* what) const {
    if (!n.IsScalar() || n.Tag() == "!") {
      fail_node(path, n, std::string("expected ") + what + ", got " + describe(n));
    }
    return n.Scalar();
  }

  // Skips one leading '+' (YAML allows it; from_chars does not), but not "+-".
  static const char* skip_plus(const std::string& s) {
    return s.size() > 1 && s[0] == '+' && s[1] != '-' ? s.data() + 1 : s.data();
  }

  int64_t to_int(const YAML::Node& n, const std::string& path) const {
    const std::string& s = plain_scalar(n, path, "an integer");
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
    const std::string& s = plain_scalar(n, path, "a number");
    const char* end = s.data() + s.size();
    double v = 0;
    const auto [p, ec] = std::from_chars(skip_plus(s), end, v);
    if (ec == std::errc::result_out_of_range) {
      fail_node(path, n, "number out of range (got '" + s + "')");
    }
    if (ec != std::errc() || p != end) fail_node(path, n, "expected a number, got '" + s + "'");
    if (!std::isfinite(v)) fail_node(path, n, "expected a finite number, got '" + s + "'");
    return v;
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
    const std::string& s = plain_scalar(*n, path, "true or false");
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
    out = n->Scalar();
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
    out.clear();
    size_t i = 0;
    for (const YAML::Node& e : *n) {
      const std::string ep = path + "[" + std::to_string(i++) + "]";
      marks_[ep] = e.Mark();
      out.push_back(to_int(e, ep));
    }
  }

  void read_split(const std::string& path, SplitFiles& s) const {
    read(path + ".images", s.images);
    read(path + ".labels", s.labels);
    read(path + ".path", s.path);
  }

  void read_all(Config& c) {
    read("seed", c.seed);

    ModelConfig& m = c.model;
    read("model.type", m.type);
    read("model.complexity", m.complexity);
    read("model.hidden", m.hidden);
    read("model.activation", m.activation);
    read("model.dropout", m.dropout);
    read("model.layer_norm", m.layer_norm);
    read("model.init", m.init);
    read("model.loss", m.loss);
    read("model.input_features", m.input_features);
    read("model.num_classes", m.num_classes);

    DataConfig& d = c.data;
    read("data.format", d.format);
    read_split("data.train", d.train);
    read_split("data.test", d.test);
    read("data.test_fraction", d.test_fraction);
    read("data.batch_size", d.batch_size);
    read("data.eval_batch_size", d.eval_batch_size);
    read("data.shuffle", d.shuffle);
    read("data.drop_last", d.drop_last);
    read("data.normalize", d.normalize);
    read("data.csv.header", d.csv.header);
    read("data.csv.label_column", d.csv.label_column);
    read("data.csv.delimiter", d.csv.delimiter);
    read("data.synthetic.samples", d.synthetic.samples);
    read("data.synthetic.features", d.synthetic.features);
    read("data.synthetic.classes", d.synthetic.classes);
    read("data.synthetic.noise", d.synthetic.noise);
    read("data.synthetic.seed", d.synthetic.seed);

    OptimizerConfig& o = c.optimizer;
    read("optimizer.type", o.type);
    read("optimizer.lr", o.lr);
    read("optimizer.momentum", o.momentum);
    read("optimizer.nesterov", o.nesterov);
    read("optimizer.weight_decay", o.weight_decay);
    read("optimizer.beta1", o.beta1);
    read("optimizer.beta2", o.beta2);
    read("optimizer.eps", o.eps);
    read("optimizer.scale_lr", o.scale_lr);
    read("optimizer.clip_grad_norm", o.clip_grad_norm);
    read("optimizer.schedule.type", o.schedule.type);
    read("optimizer.schedule.warmup_steps", o.schedule.warmup_steps);
    read("optimizer.schedule.step_size", o.schedule.step_size);
    read("optimizer.schedule.gamma", o.schedule.gamma);
    read("optimizer.schedule.min_lr", o.schedule.min_lr);

    TrainConfig& t = c.train;
    read("train.epochs", t.epochs);
    read("train.max_steps", t.max_steps);
    read("train.log_every", t.log_every);
    read("train.eval_every", t.eval_every);
    read("train.grad_accum_steps", t.grad_accum_steps);
    read("train.nonfinite", t.nonfinite);
    read("train.checkpoint.every_steps", t.checkpoint.every_steps);
    read("train.checkpoint.keep_last", t.checkpoint.keep_last);

    read("distributed.backend", c.distributed.backend);
    read("distributed.world_size", c.distributed.world_size);
    read("distributed.strategy", c.distributed.strategy);
    read("distributed.timeout_s", c.distributed.timeout_s);
    read("distributed.heartbeat_s", c.distributed.heartbeat_s);
    read("distributed.rendezvous_timeout_s", c.distributed.rendezvous_timeout_s);
    read("distributed.token_file", c.distributed.token_file);
    read("distributed.bind", c.distributed.bind);
    read("distributed.shm", c.distributed.shm);
    read("distributed.tls.cert", c.distributed.tls.cert);
    read("distributed.tls.key", c.distributed.tls.key);
    read("distributed.tls.ca", c.distributed.tls.ca);
    read("distributed.ddp.bucket_mb", c.distributed.ddp.bucket_mb);
    CompressionConfig& cc = c.distributed.compression;
    read("distributed.compression.type", cc.type);
    read("distributed.compression.ratio", cc.ratio);
    read("distributed.compression.rank", cc.rank);
    read("distributed.compression.error_feedback", cc.error_feedback);
    LocalSgdConfig& ls = c.distributed.local_sgd;
    read("distributed.local_sgd.sync_every", ls.sync_every);
    read("distributed.local_sgd.sync_optimizer_state", ls.sync_optimizer_state);
    read("distributed.local_sgd.outer_lr", ls.outer_lr);
    read("distributed.local_sgd.outer_momentum", ls.outer_momentum);
    FsdpConfig& fc = c.distributed.fsdp;
    read("distributed.fsdp.unit", fc.unit);
    read("distributed.fsdp.layers_per_unit", fc.layers_per_unit);
    read("distributed.fsdp.reshard_after_forward", fc.reshard_after_forward);
    if (c.distributed.strategy == "zero3") c.distributed.strategy = "fsdp";  // alias
    PipelineConfig& pc = c.distributed.pipeline;
    read("distributed.pipeline.stages", pc.stages);
    // strategy pipeline (ddp with a pipeline) keeps its old default of two stages.
    if (c.distributed.strategy == "pipeline" && !has("distributed.pipeline.stages")) pc.stages = 2;
    read("distributed.pipeline.micro_batches", pc.micro_batches);
    read("distributed.pipeline.schedule", pc.schedule);
    read("distributed.pipeline.partition", pc.partition);
    read("distributed.pipeline.activation_checkpointing", pc.activation_checkpointing);

    read("runtime.threads", c.runtime.threads);
  }

  // ---- pass 3b: values ----

  void check(bool ok, const std::string& path, const std::string& msg) const {
    if (!ok) fail(path, msg);
  }
  void check_min(const std::string& path, int64_t v, int64_t lo) const {
    check(v >= lo, path, "must be >= " + show(lo) + " (got " + show(v) + ")");
  }
  void check_range(const std::string& path, int64_t v, int64_t lo, int64_t hi) const {
    check(v >= lo && v <= hi, path,
          "must be in [" + show(lo) + ", " + show(hi) + "] (got " + show(v) + ")");
  }
  void check_positive(const std::string& path, double v) const {
    check(v > 0, path, "must be > 0 (got " + show(v) + ")");
  }
  void check_non_negative(const std::string& path, double v) const {
    check(v >= 0, path, "must be >= 0 (got " + show(v) + ")");
  }
  void check_unit(const std::string& path, double v) const {
    check(v >= 0 && v < 1, path, "must be in [0, 1) (got " + show(v) + ")");
  }
  void check_enum(const std::string& path, const std::string& v, const KeyList& allowed) const {
    if (contains(allowed, v)) return;
    std::string msg = "must be one of " + join_list(allowed, ", ") + " (got '" + v + "'";
    const std::string s = closest(v, allowed);
    if (!s.empty()) msg += "; did you mean '" + s + "'?";
    fail(path, msg + ")");
  }

  void validate(Config& c) const {
    check_min("seed", c.seed, 0);
    validate_model(c.model);
    validate_data(c.data);
    validate_optimizer(c.optimizer);
    validate_train(c.train);
    check_enum("distributed.backend", c.distributed.backend, {"inproc", "grpc"});
    check_range("distributed.world_size", c.distributed.world_size, 1, 1024);
    check_enum("distributed.strategy", c.distributed.strategy,
               {"ddp", "local_sgd", "zero1", "zero2", "fsdp", "pipeline"});
    check_enum("distributed.fsdp.unit", c.distributed.fsdp.unit, {"layer", "model"});
    check_min("distributed.fsdp.layers_per_unit", c.distributed.fsdp.layers_per_unit, 1);
    const PipelineConfig& pc = c.distributed.pipeline;
    check_range("distributed.pipeline.stages", pc.stages, 1, 1024);
    check_min("distributed.pipeline.micro_batches", pc.micro_batches, 1);
    check_enum("distributed.pipeline.schedule", pc.schedule, {"gpipe", "1f1b"});
    check_enum("distributed.pipeline.partition", pc.partition, {"uniform", "balanced"});
    if (c.distributed.strategy == "pipeline" || pc.stages > 1) {
      // validate_model resolved a complexity preset into model.hidden.
      const int64_t linears = static_cast<int64_t>(c.model.hidden.size()) + 1;
      check(pc.stages <= linears, "distributed.pipeline.stages",
            "the model has " + show(linears) + " layers with parameters, fewer than " +
                show(pc.stages) + " stages");
      check(c.data.batch_size >= pc.micro_batches, "distributed.pipeline.micro_batches",
            "must be at most data.batch_size (" + show(c.data.batch_size) +
                "): micro-batches split a batch by samples");
    }
    const CompressionConfig& cc = c.distributed.compression;
    check_enum("distributed.compression.type", cc.type,
               {"none", "fp16", "bf16", "int8", "topk", "powersgd"});
    check(cc.ratio > 0 && cc.ratio <= 1, "distributed.compression.ratio",
          "must be in (0, 1] (got " + show(cc.ratio) + ")");
    check(
        cc.rank >= 1, "distributed.compression.rank",
        "must be >= 1: the number of columns of the PowerSGD factors (got " + show(cc.rank) + ")");
    check(cc.type == "none" || c.distributed.strategy == "ddp" ||
              c.distributed.strategy == "local_sgd",
          "distributed.compression.type",
          "compression applies to strategies ddp and local_sgd (got strategy '" +
              c.distributed.strategy + "')");
    const LocalSgdConfig& ls = c.distributed.local_sgd;
    check_min("distributed.local_sgd.sync_every", ls.sync_every, 1);
    check_non_negative("distributed.local_sgd.outer_lr", ls.outer_lr);
    check_unit("distributed.local_sgd.outer_momentum", ls.outer_momentum);
    if (c.distributed.strategy == "local_sgd" && c.train.checkpoint.every_steps > 0)
      check(c.train.checkpoint.every_steps % ls.sync_every == 0, "train.checkpoint.every_steps",
            "must be a multiple of distributed.local_sgd.sync_every (" + show(ls.sync_every) +
                ") with strategy local_sgd: checkpoints are taken at synchronisation points");
    check_positive("distributed.timeout_s", c.distributed.timeout_s);
    check_positive("distributed.heartbeat_s", c.distributed.heartbeat_s);
    check_positive("distributed.rendezvous_timeout_s", c.distributed.rendezvous_timeout_s);
    check_positive("distributed.ddp.bucket_mb", c.distributed.ddp.bucket_mb);
    const TlsConfig& tls = c.distributed.tls;
    check(!tls.enabled() || (!tls.cert.empty() && !tls.key.empty() && !tls.ca.empty()),
          "distributed.tls", "needs all of cert, key and ca (or none)");
    check_range("runtime.threads", c.runtime.threads, 0, 1024);
    validate_choices(c);
  }

  // Keys that belong to another choice of an option -- another optimizer, schedule, compression
  // type or strategy, fsdp.unit model, Local SGD without its outer optimizer -- are refused, as
  // keys of another data format are (validate_data): a config cannot silently run without a
  // setting it names. A key left at its default is harmless (config_to_json writes every key,
  // and a run's config.json must load back), so only a value other than the default is refused.
  // distributed.ddp is accepted with every strategy: ddp is the default strategy, zero1/zero2
  // shard along its buckets, and configs tuned for it are switched to others with --set.
  void validate_choices(const Config& c) const {
    const Config d;  // the defaults
    auto only = [&](bool used, bool at_default, const std::string& path, const std::string& owner,
                    const std::string& choice_key, const std::string& choice) {
      check(used || at_default, path,
            "only used " + owner + " (" + choice_key + " is " + choice + ")");
    };
    const OptimizerConfig &o = c.optimizer, &od = d.optimizer;
    const bool sgd = o.type == "sgd";
    const std::string ot = "optimizer.type", adam = "by optimizers adam and adamw";
    only(sgd, o.momentum == od.momentum, "optimizer.momentum", "by optimizer sgd", ot, o.type);
    only(sgd, o.nesterov == od.nesterov, "optimizer.nesterov", "by optimizer sgd", ot, o.type);
    only(!sgd, o.beta1 == od.beta1, "optimizer.beta1", adam, ot, o.type);
    only(!sgd, o.beta2 == od.beta2, "optimizer.beta2", adam, ot, o.type);
    only(!sgd, o.eps == od.eps, "optimizer.eps", adam, ot, o.type);
    const ScheduleConfig &sc = o.schedule, &sd = od.schedule;
    const std::string sk = "optimizer.schedule.type";
    only(sc.type == "step", sc.step_size == sd.step_size, "optimizer.schedule.step_size",
         "by schedule step", sk, sc.type);
    only(sc.type == "step", sc.gamma == sd.gamma, "optimizer.schedule.gamma", "by schedule step",
         sk, sc.type);
    only(sc.type == "cosine", sc.min_lr == sd.min_lr, "optimizer.schedule.min_lr",
         "by schedule cosine", sk, sc.type);

    const DistributedConfig &dc = c.distributed, &dd = d.distributed;
    const CompressionConfig &cc = dc.compression, &cd = dd.compression;
    const std::string ck = "distributed.compression.type";
    only(cc.type == "topk", cc.ratio == cd.ratio, "distributed.compression.ratio",
         "by compression topk", ck, cc.type);
    only(cc.type == "powersgd", cc.rank == cd.rank, "distributed.compression.rank",
         "by compression powersgd", ck, cc.type);
    only(cc.type != "none", cc.error_feedback == cd.error_feedback,
         "distributed.compression.error_feedback", "with compression", ck, cc.type);
    auto by_strategy = [&](const char* strategy, const char* key, bool at_default) {
      only(dc.strategy == strategy, at_default, std::string("distributed.") + strategy + "." + key,
           std::string("by strategy ") + strategy, "distributed.strategy", dc.strategy);
    };
    const LocalSgdConfig &ls = dc.local_sgd, &lsd = dd.local_sgd;
    by_strategy("local_sgd", "sync_every", ls.sync_every == lsd.sync_every);
    by_strategy("local_sgd", "sync_optimizer_state",
                ls.sync_optimizer_state == lsd.sync_optimizer_state);
    by_strategy("local_sgd", "outer_lr", ls.outer_lr == lsd.outer_lr);
    by_strategy("local_sgd", "outer_momentum", ls.outer_momentum == lsd.outer_momentum);
    check(ls.outer_lr > 0 || ls.outer_momentum == lsd.outer_momentum,
          "distributed.local_sgd.outer_momentum",
          "only used with distributed.local_sgd.outer_lr > 0 (the outer optimizer; outer_lr is "
          "0)");
    const FsdpConfig &fc = dc.fsdp, &fd = dd.fsdp;
    by_strategy("fsdp", "unit", fc.unit == fd.unit);
    by_strategy("fsdp", "layers_per_unit", fc.layers_per_unit == fd.layers_per_unit);
    by_strategy("fsdp", "reshard_after_forward",
                fc.reshard_after_forward == fd.reshard_after_forward);
    check(fc.unit == "layer" || fc.layers_per_unit == fd.layers_per_unit,
          "distributed.fsdp.layers_per_unit",
          "only used with distributed.fsdp.unit layer (unit is " + fc.unit + ")");
    // The pipeline's keys belong to a pipeline: stages > 1, or strategy pipeline.
    const PipelineConfig &pc = dc.pipeline, &pd = dd.pipeline;
    const bool pipelined = dc.strategy == "pipeline" || pc.stages > 1;
    auto by_pipeline = [&](const char* key, bool at_default) {
      only(pipelined, at_default, std::string("distributed.pipeline.") + key,
           "with a pipeline", "distributed.pipeline.stages",
           std::to_string(pc.stages));
    };
    by_pipeline("micro_batches", pc.micro_batches == pd.micro_batches);
    by_pipeline("schedule", pc.schedule == pd.schedule);
    by_pipeline("partition", pc.partition == pd.partition);
    by_pipeline("activation_checkpointing",
                pc.activation_checkpointing == pd.activation_checkpointing);
  }

  void validate_model(ModelConfig& m) const {
    check_enum("model.type", m.type, {"mlp"});
    if (!m.complexity.empty()) {
      check_enum("model.complexity", m.complexity, {"simple", "medium", "complex"});
      check(!has("model.hidden"), "model.hidden",
            "contradicts model.complexity '" + m.complexity +
                "' (the preset sets hidden); give only one of them");
      m.hidden = preset_hidden(m.complexity);
    }
    for (size_t i = 0; i < m.hidden.size(); ++i) {
      check_min("model.hidden[" + std::to_string(i) + "]", m.hidden[i], 1);
    }
    check_enum("model.activation", m.activation, {"relu", "gelu", "tanh", "sigmoid"});
    check_unit("model.dropout", m.dropout);
    check_enum("model.init", m.init, {"auto", "kaiming", "xavier"});
    check_enum("model.loss", m.loss, {"cross_entropy", "mse"});
    check_min("model.input_features", m.input_features, 0);
    check_min("model.num_classes", m.num_classes, 0);
  }

  // Which file keys each format reads: a file key of another format is an error, not ignored,
  // so a config cannot silently train on something other than what it names.
  void validate_data(const DataConfig& d) const {
    check_enum("data.format", d.format, {"idx", "csv", "synthetic"});
    const std::pair<const char*, const SplitFiles*> splits[] = {{"data.train", &d.train},
                                                                {"data.test", &d.test}};
    for (const auto& [name, s] : splits) {
      const std::string p = name;
      if (d.format == "idx") {
        check(s->path.empty(), p + ".path", "not used by format idx (it reads images and labels)");
      } else if (d.format == "csv") {
        check(s->images.empty(), p + ".images", "not used by format csv (it reads path)");
        check(s->labels.empty(), p + ".labels", "not used by format csv (it reads path)");
      } else {
        const char* why = "not used by format synthetic (it generates its data from no files)";
        check(s->images.empty(), p + ".images", why);
        check(s->labels.empty(), p + ".labels", why);
        check(s->path.empty(), p + ".path", why);
      }
    }
    if (d.format == "idx") {
      check(!d.train.images.empty(), "data.train.images", "required for format idx");
      check(!d.train.labels.empty(), "data.train.labels", "required for format idx");
      check(!d.test.images.empty() || d.test.labels.empty(), "data.test.images",
            "required when data.test.labels is given (give both or neither)");
      check(!d.test.labels.empty() || d.test.images.empty(), "data.test.labels",
            "required when data.test.images is given (give both or neither)");
    } else if (d.format == "csv") {
      check(!d.train.path.empty(), "data.train.path", "required for format csv");
    }

    check(d.test_fraction == -1.0 || (d.test_fraction >= 0 && d.test_fraction < 1),
          "data.test_fraction",
          "must be -1 (the default) or in [0, 1) (got " + show(d.test_fraction) + ")");
    check(d.test.empty() || d.test_fraction <= 0, "data.test_fraction",
          "contradicts data.test: a test set is given, so nothing is held out (remove one)");
    check_min("data.batch_size", d.batch_size, 1);
    check_min("data.eval_batch_size", d.eval_batch_size, 1);
    check_enum("data.normalize", d.normalize, {"auto", "scale", "standardize", "none"});

    const CsvOptions csv_default;
    const std::string not_csv = "only used by format csv (format is " + d.format + ")";
    if (d.format != "csv") {
      check(d.csv.header == csv_default.header, "data.csv.header", not_csv);
      check(d.csv.label_column == csv_default.label_column, "data.csv.label_column", not_csv);
      check(d.csv.delimiter == csv_default.delimiter, "data.csv.delimiter", not_csv);
    }
    check_enum("data.csv.header", d.csv.header, {"auto", "true", "false"});
    check(d.csv.delimiter != '\n' && d.csv.delimiter != '\r' && d.csv.delimiter != '"',
          "data.csv.delimiter", "cannot be a newline or a double quote");

    const SyntheticOptions syn_default;
    const SyntheticOptions& syn = d.synthetic;
    if (d.format != "synthetic") {
      const std::string why = "only used by format synthetic (format is " + d.format + ")";
      check(syn.samples == syn_default.samples, "data.synthetic.samples", why);
      check(syn.features == syn_default.features, "data.synthetic.features", why);
      check(syn.classes == syn_default.classes, "data.synthetic.classes", why);
      check(syn.noise == syn_default.noise, "data.synthetic.noise", why);
      check(syn.seed == syn_default.seed, "data.synthetic.seed", why);
    }
    check_min("data.synthetic.samples", syn.samples, 2);
    check_min("data.synthetic.features", syn.features, 1);
    check_min("data.synthetic.classes", syn.classes, 2);
    check_non_negative("data.synthetic.noise", syn.noise);
    check_min("data.synthetic.seed", syn.seed, -1);
  }

  void validate_optimizer(const OptimizerConfig& o) const {
    check_enum("optimizer.type", o.type, {"sgd", "adam", "adamw"});
    check_positive("optimizer.lr", o.lr);
    check_unit("optimizer.momentum", o.momentum);
    // (nesterov with another optimizer is refused by validate_choices, naming sgd)
    check(o.type != "sgd" || !o.nesterov || o.momentum > 0, "optimizer.nesterov",
          "needs optimizer.momentum > 0 (got momentum " + show(o.momentum) + ")");
    check_non_negative("optimizer.weight_decay", o.weight_decay);
    check_unit("optimizer.beta1", o.beta1);
    check_unit("optimizer.beta2", o.beta2);
    check_positive("optimizer.eps", o.eps);
    check_enum("optimizer.scale_lr", o.scale_lr, {"none", "linear"});
    check_non_negative("optimizer.clip_grad_norm", o.clip_grad_norm);

    const ScheduleConfig& s = o.schedule;
    check_enum("optimizer.schedule.type", s.type, {"constant", "step", "cosine"});
    check_min("optimizer.schedule.warmup_steps", s.warmup_steps, 0);
    check_min("optimizer.schedule.step_size", s.step_size, 1);
    check(s.gamma > 0 && s.gamma <= 1, "optimizer.schedule.gamma",
          "must be in (0, 1] (got " + show(s.gamma) + ")");
    check_non_negative("optimizer.schedule.min_lr", s.min_lr);
    check(s.type != "cosine" || s.min_lr < o.lr, "optimizer.schedule.min_lr",
          "must be < optimizer.lr for a cosine schedule (got " + show(s.min_lr) + ", lr " +
              show(o.lr) + ")");
  }

  void validate_train(const TrainConfig& t) const {
    check_min("train.epochs", t.epochs, 0);
    check_min("train.max_steps", t.max_steps, 0);
    check(t.epochs > 0 || t.max_steps > 0, "train.epochs",
          "nothing to train: epochs and max_steps are both 0 (set one of them > 0)");
    check_min("train.log_every", t.log_every, 1);
    check_min("train.eval_every", t.eval_every, 0);
    check_min("train.grad_accum_steps", t.grad_accum_steps, 1);
    check_enum("train.nonfinite", t.nonfinite, {"abort", "skip"});
    check_min("train.checkpoint.every_steps", t.checkpoint.every_steps, 0);
    check_min("train.checkpoint.keep_last", t.checkpoint.keep_last, 1);
  }

  // ---- relative data paths ----

  // A relative path written in the file is relative to the file's folder; one from --set is
  // relative to the working directory, as any command-line path.
  void resolve(const std::string& path, std::string& value) const {
    if (value.empty() || base_dir_.empty() || override_for(path)) return;
    const fs::path p(value);
    if (p.is_absolute()) return;
    value = (base_dir_ / p).lexically_normal().string();
  }

  void resolve_paths(Config& c) const {
    resolve("distributed.token_file", c.distributed.token_file);
    resolve("distributed.tls.cert", c.distributed.tls.cert);
    resolve("distributed.tls.key", c.distributed.tls.key);
    resolve("distributed.tls.ca", c.distributed.tls.ca);
    for (const auto& [name, s] :
         {std::pair{"data.train", &c.data.train}, std::pair{"data.test", &c.data.test}}) {
      const std::string p = name;
      resolve(p + ".images", s->images);
      resolve(p + ".labels", s->labels);
      resolve(p + ".path", s->path);
    }
  }

  std::string name_;
  fs::path base_dir_;
  std::vector<Override> overrides_;
  std::map<std::string, YAML::Node> leaves_;  // every leaf key present, by dotted path
  std::map<std::string, YAML::Mark> marks_;   // value position of every present key/section
};

nlohmann::json split_json(const SplitFiles& s) {
  return {{"images", s.images}, {"labels", s.labels}, {"path", s.path}};
}

}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  // A directory or an empty file would otherwise parse as an empty config and fail on the first
  // required key, which names neither the real problem nor the file.
  if (const std::string why = input_file_problem(path); !why.empty())
    throw UserError(
        "config '" + path + "' " + why +
        (why.starts_with("is a dir") ? " (give a YAML file, e.g. configs/smoke.yaml)" : ""));
  const std::string text = read_file(path);
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw UserError("config '" + path + "' is empty" +
                    (text.empty() ? std::string() : " (only whitespace)") +
                    ": a config is a YAML mapping of sections (see configs/ for examples)");
  Config c = Reader(path, fs::path(path).parent_path()).run(text, overrides);
  c.source_path = path;
  return c;
}

Config parse_config(const std::string& yaml_text, const std::string& name,
                    const std::vector<std::string>& overrides) {
  return Reader(name, fs::path()).run(yaml_text, overrides);
}

// `complexity` is written as "" and `hidden` as the resolved widths: the JSON must load back as
// a config (giving both is an error), and a preset hashes the same as its explicit widths.
nlohmann::json config_to_json(const Config& c) {
  nlohmann::json j;
  j["seed"] = c.seed;

  const ModelConfig& m = c.model;
  j["model"] = {{"type", m.type},
                {"complexity", ""},
                {"hidden", m.hidden},
                {"activation", m.activation},
                {"dropout", m.dropout},
                {"layer_norm", m.layer_norm},
                {"init", m.init},
                {"loss", m.loss},
                {"input_features", m.input_features},
                {"num_classes", m.num_classes}};

  const DataConfig& d = c.data;
  nlohmann::json& dj = j["data"];
  dj["format"] = d.format;
  dj["train"] = split_json(d.train);
  dj["test"] = split_json(d.test);
  dj["test_fraction"] = d.test_fraction;
  dj["batch_size"] = d.batch_size;
  dj["eval_batch_size"] = d.eval_batch_size;
  dj["shuffle"] = d.shuffle;
  dj["drop_last"] = d.drop_last;
  dj["normalize"] = d.normalize;
  dj["csv"] = {{"header", d.csv.header},
               {"label_column", d.csv.label_column},
               {"delimiter", std::string(1, d.csv.delimiter)}};
  dj["synthetic"] = {{"samples", d.synthetic.samples},
                     {"features", d.synthetic.features},
                     {"classes", d.synthetic.classes},
                     {"noise", d.synthetic.noise},
                     {"seed", d.synthetic.seed}};

  const OptimizerConfig& o = c.optimizer;
  nlohmann::json& oj = j["optimizer"];
  oj["type"] = o.type;
  oj["lr"] = o.lr;
  oj["momentum"] = o.momentum;
  oj["nesterov"] = o.nesterov;
  oj["weight_decay"] = o.weight_decay;
  oj["beta1"] = o.beta1;
  oj["beta2"] = o.beta2;
  oj["eps"] = o.eps;
  oj["scale_lr"] = o.scale_lr;
  oj["clip_grad_norm"] = o.clip_grad_norm;
  oj["schedule"] = {{"type", o.schedule.type},
                    {"warmup_steps", o.schedule.warmup_steps},
                    {"step_size", o.schedule.step_size},
                    {"gamma", o.schedule.gamma},
                    {"min_lr", o.schedule.min_lr}};

  const TrainConfig& t = c.train;
  j["train"] = {
      {"epochs", t.epochs},
      {"max_steps", t.max_steps},
      {"log_every", t.log_every},
      {"eval_every", t.eval_every},
      {"grad_accum_steps", t.grad_accum_steps},
      {"nonfinite", t.nonfinite},
      {"checkpoint",
       {{"every_steps", t.checkpoint.every_steps}, {"keep_last", t.checkpoint.keep_last}}}};

  const DistributedConfig& dc = c.distributed;
  j["distributed"] = {{"backend", dc.backend},
                      {"world_size", dc.world_size},
                      {"strategy", dc.strategy},
                      {"timeout_s", dc.timeout_s},
                      {"heartbeat_s", dc.heartbeat_s},
                      {"rendezvous_timeout_s", dc.rendezvous_timeout_s},
                      {"token_file", dc.token_file},
                      {"bind", dc.bind},
                      {"shm", dc.shm},
                      {"tls", {{"cert", dc.tls.cert}, {"key", dc.tls.key}, {"ca", dc.tls.ca}}},
                      {"ddp", {{"bucket_mb", dc.ddp.bucket_mb}}},
                      {"local_sgd",
                       {{"sync_every", dc.local_sgd.sync_every},
                        {"sync_optimizer_state", dc.local_sgd.sync_optimizer_state},
                        {"outer_lr", dc.local_sgd.outer_lr},
                        {"outer_momentum", dc.local_sgd.outer_momentum}}},
                      {"compression",
                       {{"type", dc.compression.type},
                        {"ratio", dc.compression.ratio},
                        {"rank", dc.compression.rank},
                        {"error_feedback", dc.compression.error_feedback}}},
                      {"fsdp",
                       {{"unit", dc.fsdp.unit},
                        {"layers_per_unit", dc.fsdp.layers_per_unit},
                        {"reshard_after_forward", dc.fsdp.reshard_after_forward}}},
                      {"pipeline",
                       {{"stages", dc.pipeline.stages},
                        {"micro_batches", dc.pipeline.micro_batches},
                        {"schedule", dc.pipeline.schedule},
                        {"partition", dc.pipeline.partition},
                        {"activation_checkpointing", dc.pipeline.activation_checkpointing}}}};
  j["runtime"] = {{"threads", c.runtime.threads}};
  return j;
}

std::string config_hash(const Config& c) {
  nlohmann::json j = config_to_json(c);
  for (const char* k : {"epochs", "max_steps", "log_every", "eval_every", "checkpoint"}) {
    j["train"].erase(k);
  }
  j["runtime"].erase("threads");
  // Failure-detection timings are per host, like the timeouts: they never change what is
  // computed, and a resumed or relaunched job may tune them (ranks with different heartbeat_s
  // still agree: each waits for the longer of its own limit and 3 of the peer's intervals).
  for (const char* k :
       {"timeout_s", "heartbeat_s", "rendezvous_timeout_s", "token_file", "bind", "shm", "tls"})
    j["distributed"].erase(k);
  return fnv1a_hex(j.dump());
}

std::vector<std::pair<std::string, std::string>> config_input_files(const Config& c) {
  std::vector<std::pair<std::string, std::string>> out;
  const auto add = [&out](const char* key, const std::string& path) {
    if (!path.empty()) out.emplace_back(key, path);
  };
  add("data.train.images", c.data.train.images);
  add("data.train.labels", c.data.train.labels);
  add("data.train.path", c.data.train.path);
  add("data.test.images", c.data.test.images);
  add("data.test.labels", c.data.test.labels);
  add("data.test.path", c.data.test.path);
  add("distributed.token_file", c.distributed.token_file);
  add("distributed.tls.cert", c.distributed.tls.cert);
  add("distributed.tls.key", c.distributed.tls.key);
  add("distributed.tls.ca", c.distributed.tls.ca);
  return out;
}

void check_input_files(const Config& c) {
  for (const auto& [key, path] : config_input_files(c)) {
    const std::string why = input_file_problem(path);
    if (why.empty()) continue;
    const auto it = c.origins.find(key);
    const std::string where = it != c.origins.end()    ? it->second
                              : !c.source_path.empty() ? c.source_path
                                                       : std::string("config");
    throw UserError(where + ": " + key + ": '" + path + "' " + why);
  }
}

}  // namespace dtrain
