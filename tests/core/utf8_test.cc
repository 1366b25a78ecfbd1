// The one UTF-8 rule (core/utf8.h): valid text of every sequence length decodes and re-encodes to
// itself; each kind of invalid byte (a stray continuation, a lead without its continuations, an
// overlong form, a surrogate, past U+10FFFF, bytes 0xF8..0xFF) is an Error naming the argument and
// the offset, and utf8_replace_invalid replaces exactly those bytes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "error_of.h"
#include "tessel/core/utf8.h"

namespace tessel {
namespace {

using testing::error_of;

TEST(Utf8, ValidTextOfEverySequenceLengthRoundTrips) {
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z";  // a, é, €, 😀, z
  const std::u32string decoded = utf8_decode(text, "text");
  EXPECT_EQ(decoded, (std::u32string{U'a', U'\u00E9', U'\u20AC', U'\U0001F600', U'z'}));
  EXPECT_EQ(utf8_encode(decoded), text);
  utf8_check(text, "text");
  EXPECT_EQ(utf8_replace_invalid(text, "?"), text);
}

TEST(Utf8, EachInvalidByteIsNamedWithItsOffsetAndReplaced) {
  struct Case {
    std::string text;
    size_t offset;
    std::string replaced;
  };
  const std::vector<Case> cases = {
      {"ab\x80" "c", 2, "ab?c"},                  // a stray continuation byte
      {"ab\xC3", 2, "ab?"},                       // a lead byte at the end
      {"\xE2\x82" "x", 0, "??x"},                 // a lead whose continuation is missing
      {"x\xC0\xAF", 1, "x??"},                    // an overlong form of '/'
      {"\xED\xA0\x80", 0, "???"},                 // a surrogate (U+D800)
      {"\xF4\x90\x80\x80", 0, "????"},            // past U+10FFFF
      {"ok\xFF", 2, "ok?"},                       // never valid
  };
  for (const Case& c : cases) {
    const std::string message = error_of([&] { utf8_check(c.text, "prompt"); });
    EXPECT_NE(message.find("prompt"), std::string::npos) << message;
    EXPECT_NE(message.find("at offset " + std::to_string(c.offset)), std::string::npos) << message;
    EXPECT_EQ(error_of([&] { utf8_decode(c.text, "prompt"); }), message);
    EXPECT_EQ(utf8_replace_invalid(c.text, "?"), c.replaced) << message;
  }
}

}  // namespace
}  // namespace tessel
