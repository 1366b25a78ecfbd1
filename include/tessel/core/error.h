// tessel::Error — the single exception type of the public C++ API.
// Messages name the argument, what was expected and what was found, so a user
// can fix the call without reading tessel's source.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
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
