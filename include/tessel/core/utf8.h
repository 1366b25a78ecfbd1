// UTF-8 <-> code points: the one validity rule for text the library and its doors take (prompts,
// tokenizer vocabularies, HTTP request fields).
#pragma once

#include <string>
#include <string_view>

namespace tessel {

// Throws Error naming `argument` and the byte offset when `text` is not valid UTF-8 (overlong
// forms, surrogates and values past U+10FFFF included).
std::u32string utf8_decode(std::string_view text, std::string_view argument);
// The same check without decoding.
void utf8_check(std::string_view text, std::string_view argument);
// `text` with each byte that is not part of valid UTF-8 replaced by `replacement`.
std::string utf8_replace_invalid(std::string_view text, std::string_view replacement);
std::string utf8_encode(std::u32string_view code_points);
// Whether `text` is exactly the ASCII string `ascii`.
bool equals_ascii(std::u32string_view text, const char* ascii);

}  // namespace tessel
