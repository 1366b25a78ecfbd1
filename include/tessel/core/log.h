// Logging: one line per message to stderr (or a sink a test or an application installs).
// Messages below the minimum level (default: info) are dropped. The library reads no environment:
// an application that wants a TESSEL_LOG_LEVEL variable reads it and calls set_log_level. An
// ExecContext may carry its own sink and level (exec_context.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

namespace tessel {

enum class LogLevel : uint8_t { kDebug, kInfo, kWarning, kError };

std::string_view log_level_name(LogLevel level);  // "debug", "info", "warning", "error"
// The level named "debug", "info", "warning" or "error"; throws Error listing them otherwise.
LogLevel parse_log_level(std::string_view name);

void log_message(LogLevel level, std::string_view message);
inline void log_warning(std::string_view message) { log_message(LogLevel::kWarning, message); }

using LogSink = std::function<void(LogLevel level, std::string_view message)>;
// Installs a sink (an empty one restores stderr) and returns the previous sink.
LogSink set_log_sink(LogSink sink);
void set_log_level(LogLevel minimum);
LogLevel log_level();  // the process-wide minimum level
// Writes to the process-wide sink whatever the minimum level (for callers that filtered already).
void emit_log(LogLevel level, std::string_view message);

}  // namespace tessel
