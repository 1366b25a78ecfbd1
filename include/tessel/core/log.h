// Logging: one line per message to stderr (or a sink a test or an application installs).
// Messages below the minimum level (default: info; env TESSEL_LOG_LEVEL=debug|info|warning|error)
// are dropped.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

namespace tessel {

enum class LogLevel : uint8_t { kDebug, kInfo, kWarning, kError };

std::string_view log_level_name(LogLevel level);  // "debug", "info", "warning", "error"

void log_message(LogLevel level, std::string_view message);
inline void log_warning(std::string_view message) { log_message(LogLevel::kWarning, message); }

using LogSink = std::function<void(LogLevel level, std::string_view message)>;
// Installs a sink (an empty one restores stderr) and returns the previous sink.
LogSink set_log_sink(LogSink sink);
void set_log_level(LogLevel minimum);

}  // namespace tessel
