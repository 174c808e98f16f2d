// What is derived from a Config through the key declarations (schema.cc): config.json, the
// config hash and the list of input files.
#include <filesystem>
#include <string>

#include "config/schema.h"
#include "util/check.h"
#include "util/fs.h"

namespace dtrain {
namespace {

nlohmann::json::json_pointer pointer(const std::string& dotted) {
  std::string p = "/" + dotted;
  for (char& ch : p) {
    if (ch == '.') ch = '/';
  }
  return nlohmann::json::json_pointer(p);
}

// Erases the leaf at `dotted` and then every nested section it leaves empty. A top-level section
// stays, as {}: the hash of every earlier dtrain kept `"runtime":{}`, and checkpoints and
// rendezvous compare hashes across versions.
void erase_leaf(nlohmann::json& j, const std::string& dotted) {
  nlohmann::json::json_pointer p = pointer(dotted);
  if (!j.contains(p)) return;  // omitted at its default value (KeyDecl::omitted_at_default)
  while (!p.parent_pointer().empty()) {
    nlohmann::json& parent = j[p.parent_pointer()];
    parent.erase(p.back());
    p = p.parent_pointer();
    if (!parent.empty() || p.parent_pointer().empty()) return;
  }
  j.erase(p.back());
}

}  // namespace

// Every declared key, by its path; `complexity` is written as "" and `hidden` as the resolved
// widths: the JSON must load back as a config (giving both is an error), and a preset hashes the
// same as its explicit widths.
nlohmann::json config_to_json(const Config& c) {
  const Config defaults;
  nlohmann::json j = nlohmann::json::object();
  for (const KeyDecl& d : config_keys()) {
    nlohmann::json v = d.get(d.json_as_default ? defaults : c);
    if (d.omitted_at_default && v == d.get(defaults)) continue;
    j[pointer(d.path)] = std::move(v);
  }
  return j;
}

// Keys declared not_hashed never change what is computed: cadence, threads, and the per-host
// distributed settings (a resumed or relaunched job may tune them; ranks with different
// heartbeat_s still agree: each waits for the longer of its own limit and 3 of the peer's
// intervals).
// data.synthetic.seed equal to the top-level seed is the default's data (-1: the top-level
// seed): hashed as -1, so spelling it out is no change to what is computed.
nlohmann::json hashed_config_json(const Config& c) {
  Config same = c;
  if (same.data.synthetic.seed == same.seed) same.data.synthetic.seed = -1;
  nlohmann::json j = config_to_json(same);
  for (const KeyDecl& d : config_keys()) {
    if (!d.in_hash) erase_leaf(j, d.path);
  }
  return j;
}

std::string config_hash(const Config& c) {
  return fnv1a_hex(hashed_config_json(c).dump());
}

std::vector<std::pair<std::string, std::string>> config_input_files(const Config& c) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const KeyDecl& d : config_keys()) {
    if (d.type == KeyType::kPathList) {
      // Glob patterns (format text only: CSV paths are literal) are expanded, and a pattern
      // matching nothing reported, by the loader.
      const bool globs = c.data.format == DataFormat::kText;
      const nlohmann::json v = d.get(c);
      for (const auto& e : v.is_array() ? v : nlohmann::json::array({v})) {
        std::string path = e.get<std::string>();
        if (!path.empty() && (!globs || path.find_first_of("*?[") == std::string::npos))
          out.emplace_back(d.path, std::move(path));
      }
    }
    if (d.type != KeyType::kPath) continue;
    std::string path = d.get(c).get<std::string>();
    if (!path.empty()) out.emplace_back(d.path, std::move(path));
  }
  return out;
}

void check_input_files(const Config& c, bool without_training_files, bool training) {
  for (const auto& [key, path] : config_input_files(c)) {
    if (without_training_files && key.starts_with("data.train.")) continue;
    if (!training && key == "train.init_from") continue;
    // (a checkpoint folder, as --resume takes it: resolve_checkpoint reads it)
    if (std::error_code ec; key == "train.init_from" && std::filesystem::is_directory(path, ec))
      continue;
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
