// The one JSON parser for untrusted text (config strings and files, safetensors headers): limits the
// text's size and its nesting depth before any value is built, so hostile input cannot exhaust the
// stack or memory, and rejects duplicate object keys (which JSON leaves ambiguous). Error messages
// quote at most a short prefix of the offending text.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tessel/core/error.h"

namespace tessel {

struct JsonLimits {
  size_t max_bytes = 1 << 20;  // length of the text
  int max_depth = 32;          // nested objects and arrays; a scalar at top level has depth 0
};

// Parses `text`; throws Error starting with `what` when it is over a limit, not valid JSON, or
// repeats a key within one object.
nlohmann::json parse_json_limited(std::string_view text, const JsonLimits& limits, const std::string& what);

// `config` after its validate(), whose Error is rethrown starting with `source` (the file or string
// the config was read from), so a bad value names where it came from.
template <typename Config>
Config validated_config(Config config, const std::string& source);

// A JSON value for an error message: its compact text, cut to about `max_chars` characters.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 60);

template <typename Config>
Config validated_config(Config config, const std::string& source) {
  try {
    config.validate();
  } catch (const std::exception& e) {
    throw Error(source + ": " + e.what());
  }
  return config;
}

}  // namespace tessel
