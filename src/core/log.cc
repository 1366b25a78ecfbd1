#include "tessel/core/log.h"

#include <cstdlib>
#include <iostream>
#include <mutex>
#include <string>

namespace tessel {
namespace {

LogLevel level_from_env() {
  const char* env = std::getenv("TESSEL_LOG_LEVEL");
  const std::string value = env ? env : "";
  if (value == "debug") return LogLevel::kDebug;
  if (value == "warning") return LogLevel::kWarning;
  if (value == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

struct LogState {
  std::mutex mutex;
  LogSink sink;
  LogLevel minimum = level_from_env();
};

LogState& state() {
  static LogState instance;
  return instance;
}

}  // namespace

std::string_view log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "unknown";
}

void log_message(LogLevel level, std::string_view message) {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (level < s.minimum) return;
  if (s.sink) {
    s.sink(level, message);
  } else {
    std::cerr << "tessel: " << log_level_name(level) << ": " << message << "\n";
  }
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

}  // namespace tessel
