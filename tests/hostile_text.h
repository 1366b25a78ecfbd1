// Text for hostile-input tests, shared by the library and CLI tests.
#pragma once

#include <string>

namespace tessel::testing {

// `open` x depth, then `inner`, then `close` x depth: JSON nested `depth` levels deep.
inline std::string nested(int depth, const std::string& open, const std::string& inner, const std::string& close) {
  std::string out;
  out.reserve(static_cast<size_t>(depth) * (open.size() + close.size()) + inner.size());
  for (int i = 0; i < depth; ++i) out += open;
  out += inner;
  for (int i = 0; i < depth; ++i) out += close;
  return out;
}

}  // namespace tessel::testing
