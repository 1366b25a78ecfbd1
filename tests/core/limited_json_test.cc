// The limited JSON parser and the bounded file reader: hostile text (deep nesting, oversized,
// duplicate keys, special files) gives an Error with a short message, never a crash or a hang.
#include "tessel/core/io/limited_json.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"
#include "hostile_text.h"

namespace tessel {
namespace {

using testing::nested;

// Returns the message of the Error `body` throws (fails the test when it throws nothing).
template <typename Body>
std::string error_of(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no Error thrown";
  return "";
}

struct RejectCase {
  const char* name;
  std::string text;
  const char* message_part;
};

TEST(LimitedJson, RejectsHostileTextWithShortMessages) {
  const JsonLimits limits{1 << 22, 8};
  const RejectCase cases[] = {
      {"deep arrays", nested(200000, "[", "1", "]"), "nested deeper than 8"},
      {"deep objects", nested(200000, "{\"a\":", "1", "}"), "nested deeper than 8"},
      {"one level too deep", nested(9, "[", "", "]"), "nested deeper than 8"},
      {"too long", "\"" + std::string(5 << 20, 'x') + "\"", "at most 4194304 bytes"},
      {"duplicate key", R"({"a": 1, "b": 2, "a": 3})", "'a' appears twice"},
      {"duplicate nested key", R"({"a": {"k": 1, "k": 2}})", "'k' appears twice"},
      {"syntax", "{not json", "invalid JSON at byte"},
      {"trailing text", "{} trailing", "invalid JSON"},
      {"empty", "", "invalid JSON"},
      {"overflowing number", "[1e400]", "invalid JSON"},
      {"long bad literal", "[" + std::string(50000, 't') + "]", "invalid JSON"},
  };
  for (const RejectCase& c : cases) {
    const std::string message = error_of([&] { parse_json_limited(c.text, limits, "input.json"); });
    EXPECT_EQ(message.rfind("input.json: ", 0), 0u) << c.name << ": " << message;
    EXPECT_NE(message.find(c.message_part), std::string::npos) << c.name << ": " << message;
    EXPECT_LT(message.size(), 400u) << c.name << ": the message echoes the input: " << message.substr(0, 400);
  }
}

TEST(LimitedJson, AcceptsTextWithinTheLimits) {
  const JsonLimits limits{1 << 16, 8};
  EXPECT_EQ(parse_json_limited(nested(8, "[", "1", "]"), limits, "x").dump(), nested(8, "[", "1", "]"));
  EXPECT_EQ(parse_json_limited(R"({"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]})", limits, "x")["b"][1]["a"], 3);
  EXPECT_EQ(parse_json_limited("7", limits, "x"), 7);
}

TEST(LimitedJson, ExcerptCutsLongValues) {
  const nlohmann::json long_array = nlohmann::json::parse("[" + nested(500, "1,", "1", "") + "]");
  const std::string excerpt = json_excerpt(long_array, 20);
  EXPECT_EQ(excerpt.rfind("[1,1,", 0), 0u);
  EXPECT_NE(excerpt.find("(1003 characters)"), std::string::npos) << excerpt;
  EXPECT_EQ(json_excerpt(nlohmann::json{1, 2}), "[1,2]");
  EXPECT_EQ(quoted_excerpt(std::string(100, 'a'), 3), "'aaa'... (100 bytes)");
  EXPECT_EQ(quoted_excerpt(std::string("a\nb")), "'a?b'");
}

TEST(BoundedRead, RefusesSpecialFilesAndOversizedFiles) {
  const std::string dir = std::string(TESSEL_BINARY_DIR) + "/bounded_read_test_" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0700);
  const std::string fifo = dir + "/fifo";
  ::mkfifo(fifo.c_str(), 0600);
  const std::string big = dir + "/big.json";
  std::ofstream(big) << std::string(5000, ' ');
  const struct {
    const char* name;
    std::string path;
    const char* message_part;
  } cases[] = {
      {"device", "/dev/zero", "a character device"},
      {"fifo", fifo, "a FIFO"},
      {"directory", dir, "a directory"},
      {"missing", dir + "/missing.json", "No such file"},
      {"empty path", "", "a file path"},
      {"over the limit", big, "at most 4096 bytes"},
  };
  for (const auto& c : cases) {
    const std::string message = error_of([&] { read_file_bounded(c.path, 4096, "--config"); });
    EXPECT_EQ(message.rfind("--config: ", 0), 0u) << c.name << ": " << message;
    EXPECT_NE(message.find(c.message_part), std::string::npos) << c.name << ": " << message;
  }
  EXPECT_EQ(read_file_bounded(big, 5000, "--config").size(), 5000u);
  std::remove(fifo.c_str());
  std::remove(big.c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace tessel
