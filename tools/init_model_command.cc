// `tessel init-model`: writes a diffusers-layout Wan model directory with random weights, so
// `tessel generate` runs on a fresh machine with nothing downloaded.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "command.h"
#include "option_checks.h"
#include "tessel/core/error.h"
#include "tessel/dit/wan_config.h"
#include "tessel/dit/wan_transformer_file.h"
#include "tessel/diffusion/tiny_model.h"

namespace tessel::cli {
namespace {

struct InitModelOptions {
  std::string preset = "tiny";
  std::string out;
  int64_t seed = 0;
  int64_t threads = 0;
  std::string weights = "bf16";
  std::string fp8_format = "lightx2v";
};

// Beside each transformer of the directory, its weights as one FP8 file in the original Wan names
// (<component>_fp8_<format>.safetensors), quantised from the bf16 values the directory holds.
void write_fp8_transformer_files(const std::string& out, const std::string& format_name) {
  const WanFp8FileFormat format = parse_wan_fp8_file_format(format_name, "--fp8-format");
  for (const char* component : {"transformer", "transformer_2"}) {
    const std::string dir = out + "/" + component;
    if (!std::filesystem::exists(dir + "/config.json")) continue;
    const std::string path = out + "/" + component + "_fp8_" + format_name + ".safetensors";
    write_wan_fp8_transformer_file(Checkpoint::open(dir), load_wan_config(dir), path, format);
    std::printf("wrote %s: %s's weights in FP8 (%s layout; give it as --transformer%s-file with --weights fp8)\n", path.c_str(),
                component, format_name.c_str(), std::string(component) == "transformer" ? "" : "-2");
  }
}

CommandRegistration registration{
    "init-model", "Write a Wan model directory (diffusers layout) with random weights",
    [](CLI::App& app) {
      auto options = std::make_shared<InitModelOptions>();
      app.add_option("--preset", options->preset,
                     "model size: tiny (2 layers, a few hundred kB), tiny-a14b (Wan 2.2's two-expert layout of tiny "
                     "transformers), tiny-cuda (tiny with heads of 64, for the CUDA path), tiny-ti2v (Wan 2.2 TI2V-5B's layout: "
                     "48 latent channels, the residual patched VAE, expand_timesteps), tiny-i2v (Wan 2.1 I2V's image-to-video "
                     "layout: 36 input channels, a tiny CLIP image_encoder and its image_processor), tiny-flf2v (tiny-i2v with "
                     "FLF2V's first-and-last-frame position table, for --last-image), tiny-i2v-a14b (Wan 2.2 I2V-A14B's: two "
                     "experts of 36 input channels, no CLIP), wan-1.3b (about 14 GB) or wan-14b "
                     "(about 40 GB): Wan2.1-T2V sizes with UMT5-XXL and the Wan 2.1 VAE, wan-ti2v-5b (about 24 GB): "
                     "Wan2.2-TI2V-5B's sizes with UMT5-XXL and the Wan 2.2 VAE, or wan-i2v-14b (about 46 GB): "
                     "Wan2.1-I2V-14B-480P's with CLIP ViT-H/14; bf16 (VAE fp32)")
          ->capture_default_str()
          ->check(one_of(random_wan_model_presets()));
      app.add_option("--out", options->out, "the directory to write (created when missing)")->required()->check(non_empty_path());
      app.add_option("--seed", options->seed, "seed of the random weights")->capture_default_str()->check(integer_in(0, INT64_MAX));
      app.add_option("--threads", options->threads, "threads drawing the weights (default: all)")->check(integer_in(1, 4096));
      app.add_option("--weights", options->weights,
                     "bf16, or fp8: also write each transformer's weights as one FP8 file in the original Wan names "
                     "(<out>/transformer_fp8_<format>.safetensors, block linear weights in float8 e4m3 quantised from the "
                     "directory's bf16 values), for --transformer-file")
          ->capture_default_str()
          ->check(one_of({"bf16", "fp8"}));
      CLI::Option* fp8_format = app.add_option("--fp8-format", options->fp8_format,
                     "with --weights fp8: lightx2v (a weight_scale per output channel: the bytes --weights fp8 would quantise) or "
                     "comfyui (scaled fp8: one scale_weight per tensor and the scaled_fp8 marker)")
          ->capture_default_str()
          ->check(one_of({"comfyui", "lightx2v"}));
      return CommandRunner([options, fp8_format] {
        if (fp8_format->count() > 0 && options->weights != "fp8")
          fail_argument("--fp8-format", "given with --weights fp8 (it says how the FP8 file stores its scales)", "--weights " + options->weights);
        const auto start = std::chrono::steady_clock::now();
        const uint64_t bytes = write_random_wan_model(options->out, options->preset, static_cast<uint64_t>(options->seed),
                                                      static_cast<int>(options->threads));
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const std::string& preset = options->preset;  // *i2v* (not ti2v) and tiny-flf2v take an image
        const bool i2v = (preset.find("i2v") != std::string::npos && preset.find("ti2v") == std::string::npos) || preset == "tiny-flf2v";
        std::printf("wrote %s: a %s Wan %s model with RANDOM weights (it generates noise, not pictures)", options->out.c_str(),
                    preset.c_str(), i2v ? "image-to-video" : "text-to-video");
        if (bytes > 0)
          std::printf(", %s of weights in %.1f s (%s/s)", format_bytes(static_cast<double>(bytes)).c_str(), seconds,
                      format_bytes(static_cast<double>(bytes) / seconds).c_str());
        std::printf("\n");
        if (options->weights == "fp8") write_fp8_transformer_files(options->out, options->fp8_format);
        return 0;
      });
    }};

}  // namespace
}  // namespace tessel::cli
