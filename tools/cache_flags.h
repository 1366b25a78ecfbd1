// The step-cache flags that `tessel generate` and `tessel serve` share: --cache, --teacache-thresh
// and the --dbcache-* settings, into one CacheConfig.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "tessel/diffusion/cache_backend.h"

namespace tessel::cli {

// --cache NAME (checked against the registered cache backends), --teacache-thresh and --dbcache-*.
// `what` ends the --cache help text ("", or e.g. " (a request may ask for none)").
void add_cache_flags(CLI::App& app, std::string& cache, CacheConfig& config, const std::string& what = "");

}  // namespace tessel::cli
