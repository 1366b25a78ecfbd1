#include "tessel/core/parallel.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace tessel {
namespace {
int default_threads() {
#ifdef _OPENMP
  static const int value = omp_get_max_threads();
  return value;
#else
  return 1;
#endif
}
}  // namespace

int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void set_num_threads(int threads) {
#ifdef _OPENMP
  omp_set_num_threads(threads > 0 ? threads : default_threads());
#else
  (void)threads;
  (void)default_threads;
#endif
}

void parallel_for(int threads, int64_t count, const std::function<void(int64_t item, int thread)>& body) {
#ifdef _OPENMP
  const int team = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
  for (int64_t i = 0; i < count; ++i) body(i, omp_get_thread_num());
#else
  (void)threads;
  for (int64_t i = 0; i < count; ++i) body(i, 0);
#endif
}

void parallel_for(int64_t count, const std::function<void(int64_t)>& body) {
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < count; ++i) body(i);
#else
  for (int64_t i = 0; i < count; ++i) body(i);
#endif
}

}  // namespace tessel
