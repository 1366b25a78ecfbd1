// Fuzzes the sparse-attention config JSON codec. Properties: any text either parses or throws
// tessel::Error (nothing else escapes: no crash, no other exception); a parsed config's JSON
// parses back to an equal config with the same JSON; resolving it (validation and the derived
// PatternSpec) either succeeds or says why not with an Error.
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
  const std::string json = config.to_json();
  tessel::SparseAttnConfig again;
  try {
    again = tessel::parse_sparse_attn_json(json);
  } catch (const tessel::Error& e) {
    std::fprintf(stderr, "a parsed config's own JSON does not parse again: %s\n%s\n", e.what(), json.c_str());
    std::abort();
  }
  if (!(again == config) || again.to_json() != json) {
    std::fprintf(stderr, "JSON round trip changed the config:\n%s\n%s\n", json.c_str(), again.to_json().c_str());
    std::abort();
  }
  try {
    const tessel::ResolvedSparseAttnConfig resolved(config);
    resolved.pattern().validate();
  } catch (const tessel::Error&) {
  }
  return 0;
}
