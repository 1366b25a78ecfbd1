// Thread-count control and a parallel loop (OpenMP when available, serial otherwise).
#pragma once

#include <cstdint>
#include <functional>

namespace tessel {

int max_threads();
void set_num_threads(int threads);  // <= 0 restores the default

// Runs body(i) for i in [0, count) across threads with dynamic scheduling.
void parallel_for(int64_t count, const std::function<void(int64_t)>& body);
// The same on `threads` threads (<= 0: the OpenMP default); body(i, thread) also receives the index
// of the thread running it, in [0, threads), for per-thread scratch.
void parallel_for(int threads, int64_t count, const std::function<void(int64_t item, int thread)>& body);

}  // namespace tessel
