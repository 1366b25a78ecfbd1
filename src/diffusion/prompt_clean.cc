#include "tessel/diffusion/prompt_clean.h"

#include <array>
#include <optional>
#include <string>
#include <utility>

#include "tessel/core/error.h"
#include "tessel/core/utf8.h"

namespace tessel {
namespace {

// Windows-1252's characters for 0x80..0x9f; the five bytes it leaves undefined map to themselves, as
// ftfy's "sloppy" codec and Python's html.unescape keep them.
constexpr std::array<char32_t, 32> kWindows1252High = {
    0x20AC, 0x0081, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160,
    0x2039, 0x0152, 0x008D, 0x017D, 0x008F, 0x0090, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022,
    0x2013, 0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x009D, 0x017E, 0x0178};

// HTML's names for U+00A0..U+00FF, in order; HTML accepts each of them without the semicolon too.
constexpr std::array<const char*, 96> kLatin1EntityNames = {
    "nbsp",   "iexcl",  "cent",   "pound",  "curren", "yen",    "brvbar", "sect",   "uml",    "copy",   "ordf",
    "laquo",  "not",    "shy",    "reg",    "macr",   "deg",    "plusmn", "sup2",   "sup3",   "acute",  "micro",
    "para",   "middot", "cedil",  "sup1",   "ordm",   "raquo",  "frac14", "frac12", "frac34", "iquest", "Agrave",
    "Aacute", "Acirc",  "Atilde", "Auml",   "Aring",  "AElig",  "Ccedil", "Egrave", "Eacute", "Ecirc",  "Euml",
    "Igrave", "Iacute", "Icirc",  "Iuml",   "ETH",    "Ntilde", "Ograve", "Oacute", "Ocirc",  "Otilde", "Ouml",
    "times",  "Oslash", "Ugrave", "Uacute", "Ucirc",  "Uuml",   "Yacute", "THORN",  "szlig",  "agrave", "aacute",
    "acirc",  "atilde", "auml",   "aring",  "aelig",  "ccedil", "egrave", "eacute", "ecirc",  "euml",   "igrave",
    "iacute", "icirc",  "iuml",   "eth",    "ntilde", "ograve", "oacute", "ocirc",  "otilde", "ouml",   "divide",
    "oslash", "ugrave", "uacute", "ucirc",  "uuml",   "yacute", "thorn",  "yuml"};

struct NamedEntity {
  const char* name;
  char32_t code_point;
  bool semicolon_optional;  // one of HTML's legacy names, decoded by html.unescape without ';'
};

// The other named entities decoded: HTML's legacy ASCII names and the common typographic ones.
constexpr std::array<NamedEntity, 46> kOtherEntities = {{
    {"amp", U'&', true},       {"AMP", U'&', true},        {"lt", U'<', true},         {"LT", U'<', true},
    {"gt", U'>', true},        {"GT", U'>', true},         {"quot", U'"', true},       {"QUOT", U'"', true},
    {"COPY", 0xA9, true},      {"REG", 0xAE, true},        {"apos", U'\'', false},     {"hellip", 0x2026, false},
    {"mdash", 0x2014, false},  {"ndash", 0x2013, false},   {"lsquo", 0x2018, false},   {"rsquo", 0x2019, false},
    {"sbquo", 0x201A, false},  {"ldquo", 0x201C, false},   {"rdquo", 0x201D, false},   {"bdquo", 0x201E, false},
    {"lsaquo", 0x2039, false}, {"rsaquo", 0x203A, false},  {"trade", 0x2122, false},   {"euro", 0x20AC, false},
    {"bull", 0x2022, false},   {"prime", 0x2032, false},   {"Prime", 0x2033, false},   {"dagger", 0x2020, false},
    {"Dagger", 0x2021, false}, {"permil", 0x2030, false},  {"larr", 0x2190, false},    {"rarr", 0x2192, false},
    {"uarr", 0x2191, false},   {"darr", 0x2193, false},    {"harr", 0x2194, false},    {"hearts", 0x2665, false},
    {"ensp", 0x2002, false},   {"emsp", 0x2003, false},    {"thinsp", 0x2009, false},  {"OElig", 0x152, false},
    {"oelig", 0x153, false},   {"Scaron", 0x160, false},   {"scaron", 0x161, false},   {"Yuml", 0x178, false},
    {"circ", 0x2C6, false},    {"tilde", 0x2DC, false},
}};

struct EntityMatch {
  char32_t code_point;
  bool semicolon_optional;
};

std::optional<EntityMatch> find_entity(std::u32string_view name) {
  for (size_t i = 0; i < kLatin1EntityNames.size(); ++i)
    if (equals_ascii(name, kLatin1EntityNames[i])) return EntityMatch{static_cast<char32_t>(0xA0 + i), true};
  for (const NamedEntity& entity : kOtherEntities)
    if (equals_ascii(name, entity.name)) return EntityMatch{entity.code_point, entity.semicolon_optional};
  return std::nullopt;
}

// str.upper() of the characters the entity table holds.
std::u32string upper_case(char32_t c) {
  if (c == 0xDF) return U"SS";
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return std::u32string(1, c - 0x20);
  if (c == 0xFF) return U"\u0178";
  if (c == 0xB5) return U"\u039C";
  if (c == 0x153 || c == 0x161) return std::u32string(1, c - 1);
  return std::u32string(1, c);
}

// ftfy also reads an all-lowercase entity name written in capitals ("&EACUTE;" as "É") when the
// capitals are not a name of their own. Empty when `name` is no such name.
std::u32string uppercased_entity(std::u32string_view name) {
  std::u32string lower(name);
  for (char32_t& c : lower) {
    if (c >= 'a' && c <= 'z') return {};
    if (c >= 'A' && c <= 'Z') c += 'a' - 'A';
  }
  const auto entity = find_entity(lower);
  return entity ? upper_case(entity->code_point) : std::u32string{};
}

bool is_ascii_alnum(char32_t c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

bool is_hex_digit(char32_t c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f'); }

// Python's html._replace_charref for a numeric reference: C1 and NUL references read as
// Windows-1252 (NUL as U+FFFD), surrogates and values past U+10FFFF as U+FFFD, noncharacters and
// other control characters dropped.
std::u32string numeric_reference(std::u32string_view digits, int base) {
  uint64_t value = 0;
  for (char32_t c : digits) {
    const uint64_t digit = c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
    value = value * base + digit;
    if (value > 0x10FFFF) return U"\uFFFD";
  }
  if (value == 0) return U"\uFFFD";
  if (value == 0x0D) return U"\r";
  if (value >= 0x80 && value <= 0x9F) return std::u32string(1, kWindows1252High[value - 0x80]);
  if (value >= 0xD800 && value <= 0xDFFF) return U"\uFFFD";
  const bool control = (value >= 0x01 && value <= 0x08) || value == 0x0B || (value >= 0x0E && value <= 0x1F) ||
                       (value >= 0x7F && value <= 0x9F);
  const bool noncharacter = (value >= 0xFDD0 && value <= 0xFDEF) || (value & 0xFFFE) == 0xFFFE;
  if (control || noncharacter) return U"";
  return std::u32string(1, static_cast<char32_t>(value));
}

// Python's html.unescape, once over the text.
std::u32string python_html_unescape(std::u32string_view text) {
  std::u32string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] != U'&') {
      out.push_back(text[i++]);
      continue;
    }
    const size_t start = i + 1;
    if (start < text.size() && text[start] == U'#') {
      const bool hex = start + 1 < text.size() && (text[start + 1] == U'x' || text[start + 1] == U'X');
      const size_t digits_begin = start + (hex ? 2 : 1);
      size_t end = digits_begin;
      while (end < text.size() && (hex ? is_hex_digit(text[end]) : (text[end] >= '0' && text[end] <= '9'))) ++end;
      if (end > digits_begin) {
        out += numeric_reference(text.substr(digits_begin, end - digits_begin), hex ? 16 : 10);
        i = end < text.size() && text[end] == U';' ? end + 1 : end;
        continue;
      }
      out.push_back(text[i++]);  // "&#" not followed by digits: kept as text
      continue;
    }
    // A name: up to 32 characters other than tab, newline, form feed, space, '<', '&', '#', ';'.
    size_t end = start;
    while (end < text.size() && end - start < 32 && std::u32string_view(U"\t\n\f <&#;").find(text[end]) == std::u32string_view::npos)
      ++end;
    if (end == start) {
      out.push_back(text[i++]);
      continue;
    }
    const bool semicolon = end < text.size() && text[end] == U';';
    const std::u32string_view name = text.substr(start, end - start);
    if (const auto entity = find_entity(name); entity && (semicolon || entity->semicolon_optional)) {
      out.push_back(entity->code_point);
      i = semicolon ? end + 1 : end;
      continue;
    }
    // The longest legacy name the text starts with, as html.unescape looks for one.
    bool replaced = false;
    for (size_t length = name.size() - (semicolon ? 0 : 1); length >= 2 && !replaced; --length) {
      const auto entity = find_entity(name.substr(0, length));
      if (entity && entity->semicolon_optional) {
        out.push_back(entity->code_point);
        i = start + length;
        replaced = true;
      }
    }
    if (!replaced) out.push_back(text[i++]);
  }
  return out;
}

// ftfy's unescape_html: "&name;" or "&#...;" with 1 to 24 ASCII letters or digits, the semicolon
// required; a numeric reference that does not decode stays as it is.
std::u32string ftfy_html_unescape(std::u32string_view text) {
  std::u32string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == U'&') {
      const bool numeric = i + 1 < text.size() && text[i + 1] == U'#';
      const size_t start = i + (numeric ? 2 : 1);
      size_t end = start;
      while (end < text.size() && end - start < 24 && is_ascii_alnum(text[end])) ++end;
      if (end > start && end < text.size() && text[end] == U';') {
        if (!numeric) {
          const std::u32string_view name = text.substr(start, end - start);
          if (const auto entity = find_entity(name)) {
            out.push_back(entity->code_point);
            i = end + 1;
            continue;
          }
          if (const std::u32string upper = uppercased_entity(name); !upper.empty()) {
            out += upper;
            i = end + 1;
            continue;
          }
        } else if (std::u32string decoded = python_html_unescape(text.substr(i, end + 1 - i));
                   decoded.find(U';') == std::u32string::npos) {
          out += decoded;
          i = end + 1;
          continue;
        }
      }
    }
    out.push_back(text[i++]);
  }
  return out;
}

std::u32string ligature_expansion(char32_t c) {
  switch (c) {
    case 0x0132: return U"IJ";
    case 0x0133: return U"ij";
    case 0x0149: return U"\u02BCn";
    case 0x01F1: return U"DZ";
    case 0x01F2: return U"Dz";
    case 0x01F3: return U"dz";
    case 0x01C4: return U"D\u017D";
    case 0x01C5: return U"D\u017E";
    case 0x01C6: return U"d\u017E";
    case 0x01C7: return U"LJ";
    case 0x01C8: return U"Lj";
    case 0x01C9: return U"lj";
    case 0x01CA: return U"NJ";
    case 0x01CB: return U"Nj";
    case 0x01CC: return U"nj";
    case 0xFB00: return U"ff";
    case 0xFB01: return U"fi";
    case 0xFB02: return U"fl";
    case 0xFB03: return U"ffi";
    case 0xFB04: return U"ffl";
    case 0xFB05: return U"\u017Ft";
    case 0xFB06: return U"st";
    default: return {};
  }
}

// ftfy's fix_character_width for the forms prompts meet: fullwidth ASCII, the fullwidth signs
// (U+FFE0..U+FFE6) and the ideographic space.
char32_t standard_width(char32_t c) {
  if (c == 0x3000) return U' ';
  if (c >= 0xFF01 && c <= 0xFF5E) return c - 0xFEE0;
  constexpr std::array<char32_t, 7> kFullwidthSigns = {0xA2, 0xA3, 0xAC, 0xAF, 0xA6, 0xA5, 0x20A9};
  if (c >= 0xFFE0 && c <= 0xFFE6) return kFullwidthSigns[c - 0xFFE0];
  return c;
}

bool is_ftfy_control(char32_t c) {
  return c <= 0x08 || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F || (c >= 0x206A && c <= 0x206F) ||
         c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFC);
}

// ftfy's ANSI_RE: ESC '[' (digits or ';')* letter. Returns its length at `i`, or 0.
size_t terminal_escape_length(std::u32string_view text, size_t i) {
  if (text[i] != 0x1B || i + 1 >= text.size() || text[i + 1] != U'[') return 0;
  size_t j = i + 2;
  while (j < text.size() && ((text[j] >= '0' && text[j] <= '9') || text[j] == U';')) ++j;
  if (j < text.size() && ((text[j] >= 'A' && text[j] <= 'Z') || (text[j] >= 'a' && text[j] <= 'z'))) return j + 1 - i;
  return 0;
}

// One pass of ftfy's character fixes after unescaping, in its order.
std::u32string fix_characters(std::u32string_view text) {
  std::u32string fixed;
  for (char32_t c : text) {
    if (c >= 0x80 && c <= 0x9F) c = kWindows1252High[c - 0x80];
    if (const std::u32string expansion = ligature_expansion(c); !expansion.empty()) {
      fixed += expansion;
      continue;
    }
    c = standard_width(c);
    if (c == 0x02BC || (c >= 0x2018 && c <= 0x201B)) c = U'\'';
    if (c >= 0x201C && c <= 0x201F) c = U'"';
    fixed.push_back(c);
  }
  std::u32string out;
  for (size_t i = 0; i < fixed.size();) {
    if (const size_t escape = terminal_escape_length(fixed, i)) {
      i += escape;
      continue;
    }
    if (!is_ftfy_control(fixed[i])) out.push_back(fixed[i]);
    ++i;
  }
  return out;
}

// ftfy's fix_text on one line: its fixes repeated until the line stops changing.
std::u32string ftfy_fix_line(std::u32string line, bool unescape) {
  for (int round = 0; round < 64; ++round) {
    std::u32string next = unescape ? ftfy_html_unescape(line) : line;
    next = fix_characters(next);
    if (next == line) break;
    line = std::move(next);
  }
  return line;
}

// Python's str.isspace, which `\s` and strip() use on text.
bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace

std::string wan_prompt_clean(std::string_view text, std::string_view argument) {
  const std::u32string decoded = utf8_decode(text, argument);
  std::u32string fixed;
  size_t line_start = 0;
  bool unescape = true;  // ftfy stops unescaping from the first line with a '<' on
  while (line_start <= decoded.size()) {
    const size_t newline = decoded.find(U'\n', line_start);
    const size_t line_end = newline == std::u32string::npos ? decoded.size() : newline;
    std::u32string line = decoded.substr(line_start, line_end - line_start);
    if (line.find(U'<') != std::u32string::npos) unescape = false;
    fixed += ftfy_fix_line(std::move(line), unescape);
    if (newline == std::u32string::npos) break;
    fixed.push_back(U'\n');
    line_start = newline + 1;
  }
  const std::u32string unescaped = python_html_unescape(python_html_unescape(fixed));
  std::u32string collapsed;
  for (char32_t c : unescaped) {
    if (is_python_space(c)) {
      if (!collapsed.empty() && collapsed.back() != U' ') collapsed.push_back(U' ');
      continue;
    }
    collapsed.push_back(c);
  }
  if (!collapsed.empty() && collapsed.back() == U' ') collapsed.pop_back();
  return utf8_encode(collapsed);
}

}  // namespace tessel
