// UTF-8 <-> code points for the diffusion layer's text handling (prompt cleaning, tokenizing).
#pragma once

#include <string>
#include <string_view>

namespace tessel {

// Throws Error naming `argument` and the byte offset when `text` is not valid UTF-8 (overlong
// forms, surrogates and values past U+10FFFF included).
std::u32string utf8_decode(std::string_view text, std::string_view argument);
std::string utf8_encode(std::u32string_view code_points);
// Whether `text` is exactly the ASCII string `ascii`.
bool equals_ascii(std::u32string_view text, const char* ascii);

}  // namespace tessel
