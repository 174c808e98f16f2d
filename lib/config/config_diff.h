// What changed between two resolved configs (config.json's form, config_to_json): used when a
// run resumes a checkpoint written under another config, so the user sees the keys, not a hash.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dtrain {

// One line per leaf key whose value differs, in key order: "optimizer.lr: 0.05 -> 0.1". A key
// config.json leaves out at its default value compares as that default; any other key present
// on one side only shows "(absent)" on the other. Lists compare as whole values. Either side may be
// any JSON (a checkpoint's stored config is input): a section that is not an object compares as
// a value of its own. Never throws.
std::vector<std::string> config_differences(const nlohmann::json& before,
                                            const nlohmann::json& after);

}  // namespace dtrain
