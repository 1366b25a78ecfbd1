// Internal: loads a plugin shared library and wraps its C table as a tessel::Backend.
#pragma once

#include <memory>
#include <string>

#include "tessel/sparse/backend.h"

namespace tessel::plugin {

// dlopen + entry symbol + init + table checks. Throws Error naming the path and what failed
// (file missing, not loadable, missing symbol, init status and message, ABI version, incomplete
// table); the library is closed again in that case.
std::shared_ptr<Backend> load_plugin_backend(const std::string& path, const std::string& symbol);

}  // namespace tessel::plugin
