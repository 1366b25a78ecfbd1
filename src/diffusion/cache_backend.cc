#include "tessel/diffusion/cache_backend.h"

#include "cache_backend_kinds.h"
#include "tessel/core/error.h"

namespace tessel {

std::vector<std::string> cache_backend_names() { return {"none", "teacache", "dbcache"}; }

std::unique_ptr<CacheBackend> make_cache_backend(std::string_view name, const CacheConfig& config, const WanConfig& transformer,
                                                 int64_t height, int64_t width) {
  if (name == "none") return nullptr;
  if (name == "teacache") return make_teacache(config, transformer, height, width);
  if (name == "dbcache") return make_dbcache(config, transformer);
  fail_argument("cache backend", "one of none, teacache, dbcache", quoted_excerpt(name));
}

}  // namespace tessel
