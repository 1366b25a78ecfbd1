// The config codec against hostile text: nesting, size, duplicate keys, huge numbers and long
// values give an Error naming the field with a short message, never a crash or a hang.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "tessel/core/error.h"
#include "tessel/sparse/config.h"
#include "hostile_text.h"

namespace tessel {
namespace {

using testing::nested;

TEST(SparseConfigLimits, HostileJsonGivesShortErrorsNamingTheField) {
  const struct {
    const char* name;
    std::string arg;
    std::string fragment;
  } cases[] = {
      {"nested objects", nested(50000, "{\"options\":", "{}", "}"), "nested deeper than 16"},
      {"nested arrays", "{\"children\": " + nested(100000, "[", "1", "]") + "}", "nested deeper than 16"},
      {"nested option value", "{\"options\": {\"a\": " + nested(20, "[", "1", "]") + "}}", "nested deeper than 16"},
      {"moderate nesting in an option", "{\"options\": {\"a\": " + nested(10, "[", "1", "]") + "}}", "sparse_attn.options.a"},
      {"oversized text", "{\"backend\": \"" + std::string(2 << 20, 'a') + "\"}", "at most 1048576 bytes"},
      {"duplicate key", R"({"topk_ratio": 0.5, "topk_ratio": 0.7})", "'topk_ratio' appears twice"},
      {"unsigned past int64", R"({"block_size_q": 18446744073709551615})", "sparse_attn.block_size_q: expected an integer of magnitude below 2^31"},
      {"float for an integer", R"({"stride": 1e20})", "sparse_attn.stride: expected an integer"},
      {"number overflow", R"({"topk_ratio": 1e400})", "invalid JSON"},
      {"long unknown key", "{\"" + std::string(100000, 'k') + "\": 1}", "(100000 bytes): expected a known key"},
      {"long array value", "{\"topk_ratio\": [" + nested(10000, "1,", "1", "") + "]}", "sparse_attn.topk_ratio"},
  };
  for (const auto& c : cases) {
    try {
      parse_sparse_attn_json(c.arg);
      ADD_FAILURE() << c.name << ": accepted";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(c.fragment), std::string::npos) << c.name << ": " << message.substr(0, 500);
      EXPECT_LT(message.size(), 600u) << c.name << ": " << message.substr(0, 600);
    }
  }
}

TEST(SparseConfigLimits, RealConfigsStillParse) {
  const SparseAttnConfig c = parse_sparse_attn_json(
      R"({"pattern": {"type": "composite", "children": ["radial", "local"]}, "options": {"a": 1, "b": "x"},
          "geometry": {"spatial_layout": {"frames": 2, "height": 8, "width": 8}}})");
  EXPECT_EQ(c.pattern.children.size(), 2u);
  EXPECT_EQ(c.options.at("b"), "x");
  EXPECT_EQ(parse_sparse_attn_json(c.to_json()).to_json(), c.to_json());
}

}  // namespace
}  // namespace tessel
