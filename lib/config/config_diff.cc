#include "config/config_diff.h"

#include <map>

#include "config/schema.h"

namespace dtrain {

namespace {

// j with every key that config.json leaves out at its default (KeyDecl::omitted_at_default) set
// to that default, so a key changed from or to its default shows both values, not "(absent)".
// Only where the sections on the key's path are objects or absent: a checkpoint's stored config
// is input, and one whose `model` is 5 is shown as it is (a JSON pointer through it threw).
nlohmann::json with_omitted_defaults(nlohmann::json j) {
  const Config defaults;
  for (const KeyDecl& d : config_keys()) {
    if (!d.omitted_at_default) continue;
    nlohmann::json* at = &j;
    size_t begin = 0;
    for (;;) {
      if (!at->is_object()) break;
      const size_t dot = d.path.find('.', begin);
      const std::string name = d.path.substr(begin, dot - begin);
      if (dot == std::string::npos) {
        if (!at->contains(name)) (*at)[name] = d.get(defaults);
        break;
      }
      if (!at->contains(name)) (*at)[name] = nlohmann::json::object();
      at = &(*at)[name];
      begin = dot + 1;
    }
  }
  return j;
}

void flatten(const nlohmann::json& j, const std::string& prefix,
             std::map<std::string, std::string>& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    return;
  }
  out[prefix] = j.dump();
}

}  // namespace

std::vector<std::string> config_differences(const nlohmann::json& before,
                                            const nlohmann::json& after) {
  std::map<std::string, std::string> a, b;
  flatten(with_omitted_defaults(before), "", a);
  flatten(with_omitted_defaults(after), "", b);
  std::vector<std::string> out;
  auto ia = a.begin();
  auto ib = b.begin();
  // Both maps are sorted by key: one merge pass.
  while (ia != a.end() || ib != b.end()) {
    if (ib == b.end() || (ia != a.end() && ia->first < ib->first)) {
      out.push_back(ia->first + ": " + ia->second + " -> (absent)");
      ++ia;
    } else if (ia == a.end() || ib->first < ia->first) {
      out.push_back(ib->first + ": (absent) -> " + ib->second);
      ++ib;
    } else {
      if (ia->second != ib->second)
        out.push_back(ia->first + ": " + ia->second + " -> " + ib->second);
      ++ia;
      ++ib;
    }
  }
  return out;
}

}  // namespace dtrain
