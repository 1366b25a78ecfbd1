// Times ggml's CPU flash_attn_ext (what stable-diffusion.cpp runs) on one attention shape, for
// comparison with `tessel bench --device cpu`. Only calls ggml's public API; ggml itself is built
// outside this repository (see bench/ggml_compare.sh).
//
// Usage: ggml_flash_attn_bench <threads> <heads> <seq> <head_dim> <kv_type f16|f32> <runs>
// Prints the median milliseconds and GFLOP/s (4*H*S*S*D / time).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "ggml-cpu.h"
#include "ggml.h"

static double process_cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return 1e3 * static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_nsec);
}

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s threads heads seq head_dim f16|f32 runs\n", argv[0]);
    return 2;
  }
  const int threads = std::atoi(argv[1]);
  const int64_t heads = std::atoll(argv[2]), seq = std::atoll(argv[3]), dim = std::atoll(argv[4]);
  const bool kv_f16 = std::strcmp(argv[5], "f16") == 0;
  const int runs = std::atoi(argv[6]);
  const ggml_type kv_type = kv_f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;

  const size_t kv_bytes = static_cast<size_t>(seq * heads * dim) * (kv_f16 ? 2 : 4);
  ggml_init_params params{};
  params.mem_size = static_cast<size_t>(seq * heads * dim) * 4 * 3 + 2 * kv_bytes + (size_t{64} << 20);
  params.mem_buffer = nullptr;
  params.no_alloc = false;
  ggml_context* ctx = ggml_init(params);

  // ggml order is fastest-first: q [D, S, H, 1]; k, v [D, S_kv, H_kv, 1].
  ggml_tensor* q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, dim, seq, heads, 1);
  ggml_tensor* k = ggml_new_tensor_4d(ctx, kv_type, dim, seq, heads, 1);
  ggml_tensor* v = ggml_new_tensor_4d(ctx, kv_type, dim, seq, heads, 1);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> values(static_cast<size_t>(seq * heads * dim));
  auto fill = [&](ggml_tensor* t) {
    for (float& x : values) x = normal(rng);
    if (t->type == GGML_TYPE_F32)
      std::memcpy(t->data, values.data(), values.size() * 4);
    else
      ggml_fp32_to_fp16_row(values.data(), static_cast<ggml_fp16_t*>(t->data), static_cast<int64_t>(values.size()));
  };
  fill(q);
  fill(k);
  fill(v);
  ggml_tensor* out = ggml_flash_attn_ext(ctx, q, k, v, nullptr, 1.0f / std::sqrt(static_cast<float>(dim)), 0.0f, 0.0f);
  ggml_cgraph* graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, out);

  ggml_graph_compute_with_ctx(ctx, graph, threads);  // warm-up
  // Wall time, plus process CPU time: on a shared machine CPU time / threads shows the speed
  // without the slices other processes took.
  std::vector<double> ms, cpu_ms;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_ms();
    ggml_graph_compute_with_ctx(ctx, graph, threads);
    cpu_ms.push_back(process_cpu_ms() - c0);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::sort(cpu_ms.begin(), cpu_ms.end());
  const double median = ms[ms.size() / 2], cpu_median = cpu_ms[cpu_ms.size() / 2];
  const double flops = 4.0 * static_cast<double>(heads) * static_cast<double>(seq) * static_cast<double>(seq) *
                       static_cast<double>(dim);
  std::printf("ggml flash_attn_ext cpu threads=%d H=%lld S=%lld D=%lld q=f32 kv=%s: median %.1f ms over %d runs, "
              "%.1f GFLOP/s; CPU time %.1f ms, %.1f GFLOP/s per CPU-second\n",
              threads, static_cast<long long>(heads), static_cast<long long>(seq), static_cast<long long>(dim), argv[5],
              median, runs, flops / (median * 1e-3) * 1e-9, cpu_median, flops / (cpu_median * 1e-3) * 1e-9);
  ggml_free(ctx);
  return 0;
}
