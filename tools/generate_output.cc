#include "generate_output.h"

#include <cstdio>
#include <filesystem>

#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/video_io.h"

namespace tessel::cli {

GenerateOutput check_generate_output(const std::string& path, const std::string& model_dir) {
  const std::string extension = std::filesystem::path(path).extension().string();
  GenerateOutput kind;
  if (extension == ".safetensors") return GenerateOutput::kLatents;
  if (extension == ".png") {
    kind = GenerateOutput::kPng;
  } else if (extension == ".mp4") {
    kind = GenerateOutput::kMp4;
    if (!mp4_available())
      fail_argument("--out", "a .png or .safetensors file (this tessel was built without libav, so no MP4)", quoted_excerpt(path));
  } else {
    fail_argument("--out", "a file ending in .mp4 (video), .png (frames) or .safetensors (latents)", quoted_excerpt(path));
  }
  if (!std::filesystem::is_directory(std::filesystem::path(model_dir) / "vae"))
    fail_argument("--model", "a directory with vae/ (to decode frames for --out " + extension + ")", quoted_excerpt(model_dir));
  return kind;
}

void write_generate_output(GenerateOutput kind, const std::string& path, const WanGenerationResult& result,
                           const std::string& scheduler_name) {
  const long long steps = static_cast<long long>(result.steps_done);
  if (kind == GenerateOutput::kLatents) {
    write_safetensors(path, {{"latents", result.latents.view()}}, {{"scheduler", scheduler_name}, {"steps", std::to_string(steps)}});
    std::printf("wrote %s: latents %s after %lld steps (%s)\n", path.c_str(), shape_str(result.latents.shape()).c_str(), steps,
                scheduler_name.c_str());
    return;
  }
  const VideoFrames& frames = result.frames;
  if (kind == GenerateOutput::kMp4) {
    write_mp4(path, frames);
    std::printf("wrote %s: %lld frames of %lldx%lld at %g fps (%s) after %lld steps (%s)\n", path.c_str(),
                static_cast<long long>(frames.count), static_cast<long long>(frames.width),
                static_cast<long long>(frames.height), frames.fps, mp4_encoder_name().c_str(), steps, scheduler_name.c_str());
    return;
  }
  const std::vector<std::string> written = write_png_frames(path, frames);
  std::printf("wrote %s%s: %lld frames of %lldx%lld after %lld steps (%s)\n", written.front().c_str(),
              written.size() > 1 ? (" ... " + written.back()).c_str() : "", static_cast<long long>(frames.count),
              static_cast<long long>(frames.width), static_cast<long long>(frames.height), steps, scheduler_name.c_str());
}

}  // namespace tessel::cli
