#include "cache_flags.h"

#include "option_checks.h"

namespace tessel::cli {

void add_cache_flags(CLI::App& app, std::string& cache, CacheConfig& c, const std::string& what) {
  CLI::Option* cache_option = app.add_option("--cache", cache,
                 "step cache: none, teacache (skips the blocks while the time conditioning barely changes) or dbcache "
                 "(skips the middle blocks while the first blocks' residual barely changes)" + what)
      ->capture_default_str()
      ->check(one_of(cache_backend_names()));
  app.add_option("--teacache-thresh", c.teacache_thresh,
                 "TeaCache's threshold on the accumulated rescaled change (0: never skip; higher skips more)")
      ->capture_default_str()
      ->check(number_in(0.0, 100.0));
  app.add_option("--dbcache-fn", c.dbcache_first_blocks, "DBCache: first blocks always computed; their residual decides (Fn)")
      ->capture_default_str()
      ->check(integer_in(1, 4096));
  app.add_option("--dbcache-bn", c.dbcache_last_blocks, "DBCache: last blocks always computed (Bn)")
      ->capture_default_str()
      ->check(integer_in(0, 4096));
  app.add_option("--dbcache-thresh", c.dbcache_thresh,
                 "DBCache: relative L1 change of the first blocks' residual below which the middle blocks are reused (0: never)")
      ->capture_default_str()
      ->check(number_in(0.0, 100.0));
  app.add_option("--dbcache-warmup", c.dbcache_warmup_steps, "DBCache: first steps always computed")
      ->capture_default_str()
      ->check(integer_in(0, 100000));
  app.add_option("--dbcache-max-cached", c.dbcache_max_cached_steps, "DBCache: most steps reused per branch (-1: no limit)")
      ->capture_default_str()
      ->check(integer_in(-1, 100000));
  app.add_option("--dbcache-max-consecutive", c.dbcache_max_consecutive_cached_steps,
                 "DBCache: most steps reused in a row before one computes (-1: no limit)")
      ->capture_default_str()
      ->check(integer_in(-1, 100000));
  // A setting of the cache that does not run would be silently ignored: refuse it, naming both.
  static_cast<void>(cache_option);
  app.parse_complete_callback([&app, &cache] {
    for (const CLI::Option* option : app.get_options()) {
      const std::string name = option->get_name();
      const bool teacache_setting = name == "--teacache-thresh";
      const bool dbcache_setting = name.rfind("--dbcache-", 0) == 0;
      if (option->count() == 0 || !(teacache_setting || dbcache_setting)) continue;
      const std::string needed = teacache_setting ? "teacache" : "dbcache";
      if (cache != needed)
        throw CLI::ValidationError(name, "applies to --cache " + needed + " only, got --cache " + cache);
    }
  });
}

}  // namespace tessel::cli
