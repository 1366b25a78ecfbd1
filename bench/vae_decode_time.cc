// Wall time of WanVae::decode on the CPU at a given config and latent size, with random weights
// (the time does not depend on their values). Built and run by bench/vae_decode_time.sh.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "tessel/core/random.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/wan_vae.h"

int main(int argc, char** argv) {
  using namespace tessel;
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s wan21|tiny LATENT_FRAMES LATENT_HEIGHT LATENT_WIDTH THREADS\n", argv[0]);
    return 2;
  }
  const std::string preset = argv[1];
  const WanVaeConfig config = preset == "tiny" ? tiny_wan_vae_config() : WanVaeConfig{};
  const int64_t frames = std::atoll(argv[2]), height = std::atoll(argv[3]), width = std::atoll(argv[4]);
  ExecContext ctx;
  ctx.num_threads = std::atoi(argv[5]);

  std::map<std::string, Tensor> weights;
  uint64_t seed = 1;
  for (const WeightSpec& spec : wan_vae_weight_specs(config)) {
    Tensor t = Tensor::empty(spec.shape, DType::kF32);
    int64_t fan_in = 1;
    for (size_t d = 1; d < spec.shape.size(); ++d) fan_in *= spec.shape[d];
    fill_normal(t.view(), seed++, spec.name.find("gamma") != std::string::npos ? 1.0 : 0.0,
                1.0 / std::sqrt(static_cast<double>(fan_in)));
    weights[spec.name] = std::move(t);
  }
  const WanVae vae(config, weights);
  weights.clear();
  Tensor latents = Tensor::empty({1, config.z_dim, frames, height, width}, DType::kF32);
  fill_normal(latents.view(), 7);
  const auto start = std::chrono::steady_clock::now();
  const Tensor video = vae.decode(ctx, latents);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s VAE, latents (1, %lld, %lld, %lld, %lld) -> video (1, 3, %lld, %lld, %lld), %d threads: %.2f s (%.2f s per frame)\n",
              preset.c_str(), static_cast<long long>(config.z_dim), static_cast<long long>(frames),
              static_cast<long long>(height), static_cast<long long>(width), static_cast<long long>(video.size(2)),
              static_cast<long long>(video.size(3)), static_cast<long long>(video.size(4)), ctx.threads(), seconds,
              seconds / static_cast<double>(video.size(2)));
  return 0;
}
