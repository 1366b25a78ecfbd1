// The prompt cleaning diffusers' WanPipeline applies before tokenizing (its prompt_clean: ftfy's
// fix_text, html.unescape twice, whitespace runs collapsed to one space, ends stripped), so the same
// prompt gives the same tokens as there.
#pragma once

#include <string>
#include <string_view>

namespace tessel {

// Of ftfy's fix_text, per line: HTML entities with a semicolon decoded until none is left (capitalized
// Latin-1 names too; not from the first line with a '<' on), C1 controls read as Windows-1252, Latin ligatures split, fullwidth forms and
// the ideographic space made standard width, curly quotes made straight, ANSI terminal escapes and
// the control characters ftfy strips removed. Then Python's html.unescape twice (numeric
// references and the common named entities, with or without a semicolon where HTML allows it),
// every run of Unicode whitespace replaced by one space, and the ends stripped.
// Not reproduced: ftfy's mojibake repair and its NFC normalization (the tokenizer's own NFKC
// normalization makes the tokens the same for composed and decomposed accents), and the rarer
// named HTML entities (left as text).
// Throws Error naming `argument` when `text` is not valid UTF-8.
std::string wan_prompt_clean(std::string_view text, std::string_view argument = "prompt");

}  // namespace tessel
