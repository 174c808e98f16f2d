// The config's keys, each declared once: dotted path, type, where it lives in Config, default
// (the struct's), value check, whether it enters config_hash, which choice of another key it
// belongs to, and its one-line doc. The table drives parsing (config.cc), validation
// (validate.cc), config_to_json and config_hash (json.cc), and README's "Config reference"
// table (config_reference_table, compared with README.md by tests/config/test_config_schema.cc).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"

namespace dtrain {

// kPathList: one path or a list of paths (files or glob patterns), as data.train.path of format
// text; YAML gives a string or a sequence of strings, config.json writes "" for none, a string for
// one (so single-file configs keep their JSON and hash) and an array for more. Relative entries
// resolve like kPath.
enum class KeyType {
  kInt,
  kFloat,
  kBool,
  kString,
  kPath,
  kChar,
  kIntList,
  kEnum,
  kLayerList,
  kPathList
};

// A check of one key's own value, applied after parsing: "PATH: must be >= 1 (got 0)".
struct KeyCheck {
  enum Kind {
    kNone,
    kMin,          // >= lo
    kRange,        // in [lo, hi]
    kPositive,     // > 0
    kNonNegative,  // >= 0
    kUnit,         // in [0, 1)
    kUnitOpenLow,  // in (0, 1]
  };
  Kind kind = kNone;
  double lo = 0;
  double hi = 0;
  std::string_view note;  // said after the bound: "must be >= 1: NOTE (got 0)"
};

// The key is only used when the enum key `key` has one of `values` (or, when `when` is given,
// when `when` holds); set to anything but its default otherwise, it is refused:
// "only used PHRASE (SHOWN is VALUE)", VALUE the value of `key`.
struct BelongsTo {
  std::string_view key;
  std::vector<std::string_view> values;
  std::string_view phrase;  // "by optimizer sgd"
  std::string_view shown;   // how the message names `key`; empty: its path
  std::function<bool(const Config&)> when = nullptr;

  bool holds(const Config& c) const;          // c's `key` is one of `values`, or `when` says so
  std::string choice(const Config& c) const;  // c's value of `key`, as a message shows it
};

// An enum field, type-erased: its names and conversions.
struct EnumRef {
  std::vector<std::string_view> choices;  // canonical names, for "must be one of"
  std::function<std::string(const Config&)> get;
  std::function<bool(Config&, std::string_view)> set;  // false: not a name (or alias) of it
};

// Where a key's value lives in a Config.
using KeyRef =
    std::variant<int64_t& (*)(Config&), double& (*)(Config&), bool& (*)(Config&),
                 std::string& (*)(Config&), char& (*)(Config&), std::vector<int64_t>& (*)(Config&),
                 std::vector<LayerSpec>& (*)(Config&), std::vector<std::string>& (*)(Config&),
                 EnumRef>;

// model.layers as config.json writes it: each entry a kind name ("relu") or a one-key map of the
// kind to its value ({"linear": 128}, {"conv2d": {"out_channels": 32, "kernel": 3, ...}}),
// reading back through the YAML parser to the same list.
void to_json(nlohmann::json& j, const LayerSpec& l);

struct KeyDecl {
  std::string path;  // "optimizer.schedule.type"
  KeyType type = KeyType::kString;
  KeyRef ref;
  std::string doc;  // README's meaning column (plain text; '|' is escaped when rendered)
  KeyCheck check;
  bool in_hash = true;  // false: may differ between ranks or resumes without changing the math
  std::vector<BelongsTo> belongs;
  // config.json writes the default instead of the value (model.complexity: load_config resolves
  // the preset into model.hidden, and giving both is an error).
  bool json_as_default = false;
  // config.json (and so config_hash) leaves the key out while it has its default: keys added
  // after config.json's format was pinned (tests/config/test_config_schema.cc), so configs that
  // do not use them keep their JSON and hash, and old checkpoints still resume.
  bool omitted_at_default = false;

  nlohmann::json get(const Config& c) const;  // the value as config.json writes it
  // Whether c uses the key: every BelongsTo holds (the choice it belongs to is c's, or its
  // `when` says so); a key without owners applies always.
  bool applies_to(const Config& c) const;

  // Builders, for the declaration table.
  KeyDecl&& min(double lo) && { return with({KeyCheck::kMin, lo, 0, {}}); }
  KeyDecl&& min(double lo, std::string_view note) && { return with({KeyCheck::kMin, lo, 0, note}); }
  KeyDecl&& range(double lo, double hi) && { return with({KeyCheck::kRange, lo, hi, {}}); }
  KeyDecl&& positive() && { return with({KeyCheck::kPositive, 0, 0, {}}); }
  KeyDecl&& non_negative() && { return with({KeyCheck::kNonNegative, 0, 0, {}}); }
  KeyDecl&& unit() && { return with({KeyCheck::kUnit, 0, 0, {}}); }
  KeyDecl&& unit_open_low() && { return with({KeyCheck::kUnitOpenLow, 0, 0, {}}); }
  KeyDecl&& file() && {
    type = KeyType::kPath;
    return std::move(*this);
  }
  KeyDecl&& not_hashed() && {
    in_hash = false;
    return std::move(*this);
  }
  KeyDecl&& by(BelongsTo b) && {
    belongs.push_back(std::move(b));
    return std::move(*this);
  }
  KeyDecl&& omitted_at_default_value() && {
    omitted_at_default = true;
    return std::move(*this);
  }
  KeyDecl&& written_as_default() && {
    json_as_default = true;
    return std::move(*this);
  }

 private:
  KeyDecl&& with(KeyCheck c) {
    check = c;
    return std::move(*this);
  }
};

// Every key, in the order of config.h (the order "expected a mapping of keys (...)" lists).
const std::vector<KeyDecl>& config_keys();
// The declaration of a leaf key, or null.
const KeyDecl* find_key(std::string_view path);
// Every section ("" is the top level) with its child keys in declaration order.
const std::map<std::string, std::vector<std::string_view>, std::less<>>& config_sections();

// README's "Config reference" table (header, separator and one row per key), generated from
// config_keys(): key, type, default of a default Config, doc.
std::string config_reference_table();

}  // namespace dtrain
