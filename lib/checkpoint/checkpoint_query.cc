// Header-only queries of a resolved checkpoint (a file's safetensors header, a sharded folder's
// manifest.json): its optimizer, state buffers, stored config, a parameter's shape and its
// content id, for checking a config and naming a failed load's cause before anything is loaded.
// Each answers "unknown" (empty, nullopt) when the checkpoint cannot be read: the load says why.
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_internal.h"
#include "checkpoint/safetensors.h"

namespace dtrain {

using namespace checkpoint_internal;

std::string checkpoint_optimizer(const std::string& resolved) {
  try {
    if (is_sharded_dir(resolved)) return read_manifest(resolved).value("optimizer", std::string());
    const auto meta = read_safetensors_metadata(resolved);
    const auto it = meta.find("optimizer");
    return it == meta.end() ? std::string() : it->second;
  } catch (const std::exception&) {
    return "";
  }
}

std::optional<std::vector<std::string>> checkpoint_state_names(const std::string& resolved) {
  std::set<std::string> names;
  try {
    if (is_sharded_dir(resolved)) {
      const nlohmann::json m = read_manifest(resolved);
      for (const auto& n : m.at("optimizer_state")) names.insert(n.get<std::string>());
    } else {
      for (const auto& [name, t] : read_safetensors(resolved).tensors)
        if (name.rfind("optim.", 0) == 0) {
          const size_t dot = name.find('.', 6);
          names.insert(name.substr(6, dot == std::string::npos ? dot : dot - 6));
        }
    }
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return std::vector<std::string>(names.begin(), names.end());
}

namespace {

// A JSON-valued metadata entry (a file's header string, a sharded folder's manifest member) as
// text; "" when it has none or cannot be read.
std::string json_entry(const std::string& resolved, const std::string& key) {
  try {
    if (is_sharded_dir(resolved)) {
      const nlohmann::json m = read_manifest(resolved);
      return m.contains(key) ? m.at(key).dump() : std::string();
    }
    const auto meta = read_safetensors_metadata(resolved);
    const auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace

std::string checkpoint_config_json(const std::string& resolved) {
  return json_entry(resolved, "config");
}

std::string checkpoint_input_record(const std::string& resolved) {
  return json_entry(resolved, "normalizer");
}

std::optional<std::vector<int64_t>> checkpoint_param_shape(const std::string& resolved,
                                                           const std::string& name) {
  try {
    if (!is_sharded_dir(resolved)) return read_safetensors_shape(resolved, name);
    // (named: a range-for over .at() of a temporary reads the freed manifest, C++20 does not
    // extend its lifetime)
    const nlohmann::json manifest = read_manifest(resolved);
    for (const nlohmann::json& e : manifest.at("params"))
      if (e.at("name").get<std::string>() == name) return e.at("shape").get<std::vector<int64_t>>();
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

std::string checkpoint_identity(const std::string& resolved) {
  try {
    if (is_sharded_dir(resolved)) {
      const nlohmann::json m = read_manifest(resolved);
      return m.contains("save_id") ? "save:" + m.at("save_id").get<std::string>() : std::string();
    }
    const std::string crc = read_safetensors_header_crc(resolved);
    return crc.empty() ? crc : "crc:" + crc;
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace dtrain
