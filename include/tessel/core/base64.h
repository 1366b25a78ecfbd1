// Standard base64 (RFC 4648, "+/" and "=" padding): the server's b64_json answers and the images
// its requests bring as base64 or data URLs.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tessel {

std::string base64_encode(std::string_view bytes);
// The bytes of `text` (padding optional); nullopt when it is not base64 (another character, or a
// length no encoding has).
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace tessel
