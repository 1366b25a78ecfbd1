// Internal: typed reads of a PatternSpec's backend options (PatternSpec::options, strings), shared
// by the pattern backends. A malformed value throws Error naming pattern.options.<key>.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/sparse/pattern.h"

namespace tessel {

double option_double(const PatternSpec& spec, const std::string& key, double fallback);
int64_t option_int(const PatternSpec& spec, const std::string& key, int64_t fallback);
std::vector<double> option_list(const PatternSpec& spec, const std::string& key);  // comma-separated
bool option_bool(const PatternSpec& spec, const std::string& key, bool fallback);  // true/false/1/0

}  // namespace tessel
