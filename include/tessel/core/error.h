// tessel::Error — the single exception type of the public C++ API.
// Messages name the argument, what was expected and what was found, so a user
// can fix the call without reading tessel's source.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace tessel {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// User text for an error message: quoted, and cut to `max_chars` characters (with the full length)
// when longer, so a huge or binary value is never echoed back whole. Control bytes become '?'.
inline std::string quoted_excerpt(std::string_view text, size_t max_chars = 60) {
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < max_chars; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    out.push_back(c < 0x20 || c == 0x7f ? '?' : static_cast<char>(c));
  }
  out += text.size() > max_chars ? "'... (" + std::to_string(text.size()) + " bytes)" : "'";
  return out;
}

// Throws Error("<argument>: expected <expected>, got <actual>").
template <typename E, typename A>
[[noreturn]] void fail_argument(const std::string& argument, const E& expected, const A& actual) {
  throw Error(detail::concat(argument, ": expected ", expected, ", got ", actual));
}

}  // namespace tessel

// TESSEL_CHECK(cond, parts...) throws tessel::Error built from the parts when cond is false.
#define TESSEL_CHECK(cond, ...)                                      \
  do {                                                               \
    if (!(cond)) throw ::tessel::Error(::tessel::detail::concat(__VA_ARGS__)); \
  } while (0)
