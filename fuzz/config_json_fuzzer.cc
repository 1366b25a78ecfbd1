// Fuzzes the sparse-attention config JSON codec. Properties: any text either parses into a valid
// config or throws tessel::Error (nothing else escapes: no crash, no other exception); a parsed
// config converts to a PatternSpec or says why not with an Error, and its JSON round-trips to the
// same JSON.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tessel/core/error.h"
#include "tessel/sparse/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  tessel::SparseAttnConfig config;
  try {
    config = tessel::parse_sparse_attn_json(text);
  } catch (const tessel::Error&) {
    return 0;
  }
  try {
    (void)config.to_pattern_spec();
  } catch (const tessel::Error&) {
  }
  const std::string json = config.to_json();
  std::string again;
  try {
    again = tessel::parse_sparse_attn_json(json).to_json();
  } catch (const tessel::Error& e) {
    std::fprintf(stderr, "a parsed config's own JSON does not parse again: %s\n%s\n", e.what(), json.c_str());
    std::abort();
  }
  if (again != json) {
    std::fprintf(stderr, "JSON round trip changed the config:\n%s\n%s\n", json.c_str(), again.c_str());
    std::abort();
  }
  return 0;
}
