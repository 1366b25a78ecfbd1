#include "tessel/sparse/planners/token_layout.h"

#include <sstream>
#include <vector>

#include "tessel/core/error.h"

namespace tessel {

TokenGrid parse_token_grid(const std::string& text, const std::string& argument) {
  std::vector<int64_t> parts;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, 'x')) {
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || value < 1)
      fail_argument(argument, "FxHxW or HxW with positive integers", quoted_excerpt(text));
    parts.push_back(value);
  }
  if (parts.size() != 2 && parts.size() != 3) fail_argument(argument, "FxHxW or HxW with positive integers", quoted_excerpt(text));
  // Token positions are int32 in block masks: refuse a grid with more tokens before any product overflows.
  constexpr int64_t kMaxGridTokens = (int64_t{1} << 31) - 1;
  int64_t tokens = 1;
  for (const int64_t part : parts) {
    if (part > kMaxGridTokens / tokens)
      fail_argument(argument, detail::concat("a grid of at most ", kMaxGridTokens, " tokens"), quoted_excerpt(text));
    tokens *= part;
  }
  if (parts.size() == 2) return TokenGrid{1, parts[0], parts[1]};
  return TokenGrid{parts[0], parts[1], parts[2]};
}

void validate_token_layout(const TokenLayout& layout, const std::string& argument) {
  const TokenGrid& g = layout.grid;
  if (g.frames < 1 || g.height < 1 || g.width < 1)
    fail_argument(argument + ".grid", "frames, height, width >= 1",
                  detail::concat(g.frames, "x", g.height, "x", g.width));
  if (layout.text_tokens < 0) fail_argument(argument + ".text_tokens", ">= 0", layout.text_tokens);
}

}  // namespace tessel
