// Name tables of the sparse layer's enumerations (pattern types, module types, orderings,
// composite ops): each enumeration is numbered in the order of its names, so one array gives
// the name of a value, the value of a name (with an Error listing the names) and every value.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/error.h"

namespace tessel::detail {

template <size_t N>
std::string join_names(const std::array<std::string_view, N>& names) {
  std::string out;
  for (size_t i = 0; i < N; ++i) out += (i ? ", " : "") + std::string(names[i]);
  return out;
}

template <typename Enum, size_t N>
std::string_view name_of(const std::array<std::string_view, N>& names, Enum value) {
  const auto index = static_cast<size_t>(value);
  return index < N ? names[index] : "unknown";
}

// Throws Error "<argument>: expected one of <names>, got '<name>'".
template <typename Enum, size_t N>
Enum parse_name(const std::array<std::string_view, N>& names, std::string_view name, const std::string& argument) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == name) return static_cast<Enum>(i);
  fail_argument(argument, "one of " + join_names(names), quoted_excerpt(name));
}

template <typename Enum, size_t N>
std::vector<Enum> all_values(const std::array<std::string_view, N>&) {
  std::vector<Enum> out;
  for (size_t i = 0; i < N; ++i) out.push_back(static_cast<Enum>(i));
  return out;
}

}  // namespace tessel::detail
