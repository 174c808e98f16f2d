// Names of enum values, for enums parsed from text once (config) and printed back (config.json,
// messages). An enum opts in by declaring, next to it, an ADL-visible
//   constexpr std::span<const EnumName<E>> enum_names(E);
// listing every value with its canonical name first; further entries marked `alias` are accepted
// by parse_enum and never printed.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "util/check.h"

namespace dtrain {

template <class E>
struct EnumName {
  E value;
  std::string_view name;
  bool alias = false;
};

template <class E>
concept NamedEnum = std::is_enum_v<E> && requires(E e) {
  enum_names(e);
};

// The canonical name of `e`. Every value has one (an enum lists them all).
template <NamedEnum E>
std::string to_string(E e) {
  for (const EnumName<E>& n : enum_names(E{})) {
    if (n.value == e && !n.alias) return std::string(n.name);
  }
  DT_CHECK_MSG(false, "enum value " << static_cast<long long>(e) << " has no name");
  return {};
}

// The value named `s` (a canonical name or an alias), or nullopt.
template <NamedEnum E>
std::optional<E> parse_enum(std::string_view s) {
  for (const EnumName<E>& n : enum_names(E{})) {
    if (n.name == s) return n.value;
  }
  return std::nullopt;
}

// The canonical names in declaration order (aliases and the empty name of a "none" value left
// out), for "must be one of" messages.
template <NamedEnum E>
std::vector<std::string_view> enum_choices() {
  std::vector<std::string_view> out;
  for (const EnumName<E>& n : enum_names(E{})) {
    if (!n.alias && !n.name.empty()) out.push_back(n.name);
  }
  return out;
}

}  // namespace dtrain
