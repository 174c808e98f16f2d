// Parsing JSON that a user or another program can write (safetensors headers, checkpoint
// manifests) with limits on what the parsed tree may cost and mean.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dtrain {

// Why parse_limited_json refused the text: what() completes "the JSON ..." ("names the key 'x'
// twice in one object", "holds more than 2000000 values").
class JsonLimitError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `text` parsed (nlohmann::json::parse_error and friends for text that is not JSON), refusing
// with JsonLimitError:
// - an object naming a key twice: nlohmann keeps the last one silently, so a safetensors header
//   naming a tensor twice loaded the second entry's bytes under the name;
// - more than max_values values (containers included): a parsed value costs 16 to ~80 bytes, so
//   text of empty objects ("{},{},...", 3 bytes each) grows ~30-fold in memory (a 99 MB header
//   took 3.1 GB before any check of what it held). A first pass counts (and checks keys) without
//   building anything; the tree is parsed only after it.
// Nesting depth is json_depth's (util/strings.h): check it first.
nlohmann::json parse_limited_json(std::string_view text, int64_t max_values);

}  // namespace dtrain
