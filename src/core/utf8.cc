// See utf8.h.
#include "tessel/core/utf8.h"

#include <cstdio>

#include "tessel/core/error.h"

namespace tessel {

namespace {

// Calls emit(code point) for each character of `text` and invalid(offset) at each byte that does not
// begin a valid UTF-8 sequence (overlong forms, surrogates and values past U+10FFFF included); the
// walk goes on at the next byte when invalid() returns.
template <class Emit, class Invalid>
void walk_utf8(std::string_view text, Emit emit, Invalid invalid) {
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char lead = static_cast<unsigned char>(text[i]);
    int length = 0;
    char32_t value = 0, minimum = 0;
    if (lead < 0x80) {
      emit(lead);
      ++i;
      continue;
    } else if ((lead & 0xE0) == 0xC0) {
      length = 2, value = lead & 0x1F, minimum = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3, value = lead & 0x0F, minimum = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4, value = lead & 0x07, minimum = 0x10000;
    }
    bool valid = length > 0 && i + length <= text.size();
    for (int k = 1; valid && k < length; ++k) {
      const unsigned char continuation = static_cast<unsigned char>(text[i + k]);
      valid = (continuation & 0xC0) == 0x80;
      value = (value << 6) | (continuation & 0x3F);
    }
    valid = valid && value >= minimum && value <= 0x10FFFF && !(value >= 0xD800 && value <= 0xDFFF);
    if (!valid) {
      invalid(i);
      ++i;
      continue;
    }
    emit(value);
    i += length;
  }
}

// The Error of the first invalid byte, naming `argument` and the byte's offset.
[[noreturn]] void fail_invalid(std::string_view text, std::string_view argument, size_t offset) {
  char byte[8];
  std::snprintf(byte, sizeof(byte), "0x%02x", static_cast<unsigned char>(text[offset]));
  fail_argument(std::string(argument), "UTF-8 text", detail::concat("an invalid byte ", byte, " at offset ", offset));
}

}  // namespace

std::u32string utf8_decode(std::string_view text, std::string_view argument) {
  std::u32string out;
  out.reserve(text.size());
  walk_utf8(text, [&](char32_t c) { out.push_back(c); }, [&](size_t offset) { fail_invalid(text, argument, offset); });
  return out;
}

void utf8_check(std::string_view text, std::string_view argument) {
  walk_utf8(text, [](char32_t) {}, [&](size_t offset) { fail_invalid(text, argument, offset); });
}

std::string utf8_replace_invalid(std::string_view text, std::string_view replacement) {
  std::string out;
  out.reserve(text.size());
  size_t copied = 0;
  walk_utf8(text, [](char32_t) {}, [&](size_t offset) {
    out.append(text.substr(copied, offset - copied));
    out.append(replacement);
    copied = offset + 1;
  });
  out.append(text.substr(copied));
  return out;
}

std::string utf8_encode(std::u32string_view code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (char32_t c : code_points) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

bool equals_ascii(std::u32string_view text, const char* ascii) {
  size_t i = 0;
  for (; ascii[i] != '\0'; ++i)
    if (i >= text.size() || text[i] != static_cast<unsigned char>(ascii[i])) return false;
  return i == text.size();
}

}  // namespace tessel
