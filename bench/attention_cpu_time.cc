// CPU attention timed two ways on a shared machine: wall clock (what `tessel bench` reports) and
// process CPU time, which leaves out the time slices other processes took. GFLOP/s per
// CPU-second = FLOPs / CPU time is comparable across runs even when the machine is busy.
// Build and run: bash bench/attention_cpu_time.sh [threads] [dtype] [seq] [runs] [dense]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "tessel/core/parallel.h"
#include "tessel/core/random.h"
#include "tessel/kernels/attention.h"
#include "tessel/sparse/block_mask.h"

using namespace tessel;

namespace {
double process_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const DType dtype = parse_dtype(argc > 2 ? argv[2] : "bf16");
  const int64_t seq = argc > 3 ? std::atoll(argv[3]) : 4096;
  const int runs = argc > 4 ? std::atoi(argv[4]) : 7;
  const bool dense_only = argc > 5 && std::string(argv[5]) == "dense";
  const int64_t heads = 8, dim = 128;
  set_num_threads(threads);
  Tensor q = Tensor::empty({1, seq, heads, dim}, dtype), k = Tensor::empty({1, seq, heads, dim}, dtype);
  Tensor v = Tensor::empty({1, seq, heads, dim}, dtype), out = Tensor::empty({1, seq, heads, dim}, dtype);
  Tensor lse = Tensor::empty({1, heads, seq}, DType::kF32);
  fill_normal(q.view(), 1);
  fill_normal(k.view(), 2);
  fill_normal(v.view(), 3);
  double dense_wall = 0, dense_cpu = 0;
  std::printf("threads=%d %s B=1 H=%lld S=%lld D=%lld, medians of %d runs\n", threads, argv[2] ? argv[2] : "bf16",
              static_cast<long long>(heads), static_cast<long long>(seq), static_cast<long long>(dim), runs);
  for (double density : {1.0, 0.25, 0.1}) {
    if (dense_only && density < 1.0) break;
    const BlockMask mask = BlockMask::random({1, heads, seq, seq, 128, 64}, density, 7);
    auto run = [&] {
      if (density >= 1.0)
        attention_forward(ExecContext{}, q, k, v, out, lse);
      else
        block_sparse_attention_forward(ExecContext{}, q, k, v, mask.view(), out, lse);
    };
    run();  // warm-up
    std::vector<double> wall, cpu;
    for (int r = 0; r < runs; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = process_cpu_seconds();
      run();
      cpu.push_back(process_cpu_seconds() - c0);
      wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(wall.begin(), wall.end());
    std::sort(cpu.begin(), cpu.end());
    const double w = wall[wall.size() / 2], c = cpu[cpu.size() / 2];
    if (density >= 1.0) dense_wall = w, dense_cpu = c;
    const double flops = 4.0 * heads * static_cast<double>(seq) * static_cast<double>(seq) * dim;
    const double kept = density >= 1.0 ? 1.0 : mask.token_density();
    std::printf("density %.4f: wall %8.1f ms (%.3fx dense), CPU %8.1f ms (%.3fx dense), %.1f GFLOP/s per CPU-second "
                "(dense-equivalent %.1f)\n",
                density >= 1.0 ? 1.0 : mask.density(), w * 1e3, w / dense_wall, c * 1e3, c / dense_cpu,
                flops * kept / c * 1e-9, flops / c * 1e-9);
  }
  return 0;
}
