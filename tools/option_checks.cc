#include "option_checks.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <tuple>

#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"

namespace tessel::cli {
namespace {

// Up to this many characters of a bad value are echoed back.
constexpr size_t kEchoChars = 40;

std::string echo(const std::string& text) { return quoted_excerpt(text, kEchoChars); }

std::string interval(double low, double high, Bounds bounds) {
  const bool open_low = bounds == Bounds::kOpenLow || bounds == Bounds::kOpen;
  const bool open_high = bounds == Bounds::kOpenHigh || bounds == Bounds::kOpen;
  std::ostringstream out;
  out << (open_low ? "(" : "[") << low << ", " << high << (open_high ? ")" : "]");
  return out.str();
}

}  // namespace

CLI::Validator integer_in(int64_t low, int64_t high) {
  const std::string expected = detail::concat("an integer in [", low, ", ", high, "]");
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long value = text.empty() ? 0 : std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || end == nullptr || *end != '\0' || errno == ERANGE || value < low || value > high)
          return "expected " + expected + ", got " + echo(text);
        return "";
      },
      expected, "INTEGER_IN");
}

CLI::Validator number_in(double low, double high, Bounds bounds) {
  const std::string expected = "a finite number in " + interval(low, high, bounds);
  const bool open_low = bounds == Bounds::kOpenLow || bounds == Bounds::kOpen;
  const bool open_high = bounds == Bounds::kOpenHigh || bounds == Bounds::kOpen;
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = text.empty() ? NAN : std::strtod(text.c_str(), &end);
        const bool parsed = !text.empty() && end != nullptr && *end == '\0';
        const bool inside = std::isfinite(value) && (open_low ? value > low : value >= low) &&
                            (open_high ? value < high : value <= high);
        if (!parsed || !inside) return "expected " + expected + ", got " + echo(text);
        return "";
      },
      expected, "NUMBER_IN");
}

CLI::Validator one_of(std::vector<std::string> names) {
  std::string list;
  for (const std::string& name : names) list += (list.empty() ? "" : ", ") + name;
  return CLI::Validator(
      [names, list](std::string& text) -> std::string {
        for (const std::string& name : names)
          if (text == name) return "";
        return "expected one of " + list + ", got " + echo(text);
      },
      "one of " + list, "ONE_OF");
}

CLI::Validator parsed_by(const std::string& description, std::function<void(const std::string&)> parse) {
  return CLI::Validator(
      [description, parse](std::string& text) -> std::string {
        try {
          parse(text);
        } catch (const Error& e) {
          return "expected " + description + ", got " + echo(text) + " (" + e.what() + ")";
        }
        return "";
      },
      description, "PARSED_BY");
}

CLI::Validator regular_file() {
  return parsed_by("a regular file", [](const std::string& path) { require_regular_file(path, "path"); });
}

CLI::Validator writable_file_path() {
  return parsed_by("a file path in a writable directory", [](const std::string& path) {
    if (path.empty()) throw Error("an empty path");
    const std::filesystem::path file(path);
    std::error_code error;
    if (std::filesystem::is_directory(file, error)) throw Error(quoted_excerpt(path, 200) + " is a directory, not a file");
    const std::filesystem::path parent = file.parent_path().empty() ? std::filesystem::path(".") : file.parent_path();
    if (!std::filesystem::is_directory(parent, error)) throw Error("no directory " + quoted_excerpt(parent.string(), 200));
    if (::access(parent.c_str(), W_OK) != 0) throw Error("the directory " + quoted_excerpt(parent.string(), 200) + " is not writable");
  });
}

CLI::Validator device_name() {
  return parsed_by("cpu, cuda or cuda:N", [](const std::string& text) { parse_device(text); });
}

CLI::Validator non_empty_path() {
  return CLI::Validator([](std::string& text) -> std::string { return text.empty() ? "expected a non-empty path, got ''" : ""; },
                        "a non-empty path", "PATH");
}

WanVideoSize parse_video_size(const std::string& text, int64_t frames, int64_t vae_spatial_stride) {
  WanVideoSize size;
  size.frames = frames;
  size.vae_spatial_stride = vae_spatial_stride;
  std::tie(size.width, size.height) = parse_width_height(text, "--size");
  try {
    size.validate();
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + (std::string(e.what()).rfind("frames", 0) == 0 ? " (--frames)" : " (--size)"));
  }
  return size;
}

void check_applies(const CLI::Option* option, bool applies, const std::string& when) {
  if (option != nullptr && option->count() > 0 && !applies) throw Error(option->get_name() + ": applies to " + when + " only");
}

CLI::Validator even_integer_in(int64_t low, int64_t high) {
  return CLI::Validator(
      [low, high](std::string& text) -> std::string {
        const std::string range = integer_in(low, high)(text);
        if (!range.empty()) return range;
        return std::stoll(text) % 2 == 0 ? "" : "expected an even integer, got " + text;
      },
      detail::concat("an even integer in [", low, ", ", high, "]"), "EVEN");
}

std::pair<int64_t, int64_t> parse_width_height(const std::string& text, const std::string& flag) {
  const size_t x = text.find('x');
  const auto number = [](const std::string& part) -> int64_t {
    if (part.empty() || part.size() > 9 || part.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoll(part);
  };
  const int64_t width = x == std::string::npos ? -1 : number(text.substr(0, x));
  const int64_t height = x == std::string::npos ? -1 : number(text.substr(x + 1));
  if (width < 1 || height < 1) fail_argument(flag, "WIDTHxHEIGHT in pixels, two positive integers, e.g. 832x480", quoted_excerpt(text));
  return {width, height};
}

CLI::Validator width_height() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          parse_width_height(text, "size");
        } catch (const Error&) {
          return "expected WIDTHxHEIGHT in pixels, two positive integers, e.g. 832x480, got " + echo(text);
        }
        return "";
      },
      "WIDTHxHEIGHT", "WIDTH_HEIGHT");
}

void check_list_values(const CLI::App& command, int argc, char** argv) {
  for (const CLI::Option* option : command.get_options()) {
    if (option->get_delimiter() != ',') continue;
    for (const std::string& name : option->get_lnames()) {
      const std::string flag = "--" + name;
      for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        std::string value;
        if (arg == flag && i + 1 < argc) value = argv[i + 1];
        else if (arg.rfind(flag + "=", 0) == 0) value = arg.substr(flag.size() + 1);
        else continue;
        if (value.find(",,") != std::string::npos || value.front() == ',' || value.back() == ',')
          fail_argument(flag, "a comma-separated list without empty elements", quoted_excerpt(value));
      }
    }
  }
}

CLI::Validator attention_dtype_name() {
  return one_of({"fp32", "fp16", "bf16", "float32", "float16", "bfloat16", "f32", "f16", "half"});
}

void require_multiple(const std::string& option, int64_t value, const std::string& of_option, int64_t of_value) {
  if (of_value <= 0 || value % of_value != 0)
    fail_argument(option, detail::concat("a multiple of ", of_option, " ", of_value), value);
}

Device present_device(const std::string& text, const std::string& flag) { return present_device(parse_device(text), flag); }

Device present_device(Device device, const std::string& flag) {
  if (device.is_cuda() && !cuda_compiled()) fail_argument(flag, "cpu (tessel was built without CUDA)", device.str());
  if (device.is_cuda() && !cuda_available()) fail_argument(flag, "a device present (no CUDA GPU found)", device.str());
  return device;
}

uint64_t memory_budget_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 8ull << 30;  // unknown machine: a conservative 8 GiB
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size) / 2;
}

std::string format_bytes(double bytes) {
  char text[64];
  if (bytes >= 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0)
    std::snprintf(text, sizeof text, "%.3g PiB", bytes / (1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0));
  else if (bytes >= 1024.0 * 1024.0 * 1024.0)
    std::snprintf(text, sizeof text, "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  else
    std::snprintf(text, sizeof text, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return text;
}

}  // namespace tessel::cli
