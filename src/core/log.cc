#include "tessel/core/log.h"

#include <iostream>
#include <mutex>
#include <string>
#include <utility>

#include "tessel/core/error.h"

namespace tessel {
namespace {

struct LogState {
  std::mutex mutex;
  LogSink sink;
  LogLevel minimum = LogLevel::kInfo;
};

LogState& state() {
  static LogState instance;
  return instance;
}

}  // namespace

// Each level with its name, in increasing severity.
constexpr std::pair<LogLevel, std::string_view> kLevelNames[] = {
    {LogLevel::kDebug, "debug"}, {LogLevel::kInfo, "info"}, {LogLevel::kWarning, "warning"}, {LogLevel::kError, "error"}};

std::string_view log_level_name(LogLevel level) {
  for (const auto& [value, name] : kLevelNames)
    if (value == level) return name;
  return "unknown";
}

LogLevel parse_log_level(std::string_view name) {
  for (const auto& [level, level_name] : kLevelNames)
    if (level_name == name) return level;
  fail_argument("log level", "debug, info, warning or error", "'" + std::string(name) + "'");
}

namespace {

void write_locked(LogState& s, LogLevel level, std::string_view message) {
  if (s.sink) {
    s.sink(level, message);
  } else {
    std::cerr << "tessel: " << log_level_name(level) << ": " << message << "\n";
  }
}

}  // namespace

void log_message(LogLevel level, std::string_view message) {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (level >= s.minimum) write_locked(s, level, message);
}

void emit_log(LogLevel level, std::string_view message) {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  write_locked(s, level, message);
}

LogSink set_log_sink(LogSink sink) {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  LogSink previous = std::move(s.sink);
  s.sink = std::move(sink);
  return previous;
}

void set_log_level(LogLevel minimum) {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.minimum = minimum;
}

LogLevel log_level() {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.minimum;
}

}  // namespace tessel
