#include "util/json_limits.h"

#include <set>
#include <string>
#include <vector>

#include "util/strings.h"

namespace dtrain {

namespace {

// A SAX pass that builds nothing: counts values and holds each open object's keys. (nlohmann's
// parser callback does the same checks while it builds the tree, but takes time quadratic in an
// array's length: 15 s for 200,000 elements.)
struct LimitScan {
  using json = nlohmann::json;
  int64_t max_values = 0, values = 0;
  std::vector<std::set<std::string>> keys;  // the keys of each open object, outermost first

  bool count() {
    if (++values > max_values)
      throw JsonLimitError("holds more than " + std::to_string(max_values) + " values");
    return true;
  }
  bool null() { return count(); }
  bool boolean(bool) { return count(); }
  bool number_integer(json::number_integer_t) { return count(); }
  bool number_unsigned(json::number_unsigned_t) { return count(); }
  bool number_float(json::number_float_t, const json::string_t&) { return count(); }
  bool string(json::string_t&) { return count(); }
  bool binary(json::binary_t&) { return count(); }
  bool start_object(std::size_t) {
    keys.emplace_back();
    return count();
  }
  bool key(json::string_t& k) {
    if (!keys.back().insert(k).second)
      throw JsonLimitError("names the key '" + shown_text(k, 200) + "' twice in one object");
    return true;
  }
  bool end_object() {
    keys.pop_back();
    return true;
  }
  bool start_array(std::size_t) { return count(); }
  bool end_array() { return true; }
  // (the tree's parse below reports it, as it would without this pass)
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    return false;
  }
};

}  // namespace

nlohmann::json parse_limited_json(std::string_view text, int64_t max_values) {
  LimitScan scan;
  scan.max_values = max_values;
  if (nlohmann::json::sax_parse(text, &scan)) {
    scan.keys.clear();  // (the key sets' memory, before the tree's)
    scan.keys.shrink_to_fit();
  }
  return nlohmann::json::parse(text);
}

}  // namespace dtrain
