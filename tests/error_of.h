// The message of the tessel::Error a call throws: what the tests of every layer check error texts with.
#pragma once

#include <functional>
#include <string>

#include "tessel/core/error.h"

namespace tessel::testing {

// The message of the tessel::Error `call` throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace tessel::testing
