#include "tessel/diffusion/video_frames.h"

#include <algorithm>
#include <cmath>

#include "tessel/core/error.h"

namespace tessel {

void VideoFrames::validate() const {
  for (const auto& [name, value] : {std::pair{"count", count}, std::pair{"height", height}, std::pair{"width", width}})
    if (value < 1) fail_argument(detail::concat("frames.", name), "a positive size", value);
  if (!(fps > 0.0) || !std::isfinite(fps)) fail_argument("frames.fps", "a positive frame rate", fps);
  const uint64_t expected = static_cast<uint64_t>(count) * static_cast<uint64_t>(frame_bytes());
  if (rgb.size() != expected)
    fail_argument("frames.rgb", detail::concat(expected, " bytes (", count, " x ", height, " x ", width, " x 3)"),
                  detail::concat(rgb.size(), " bytes"));
}

VideoFrames video_frames_from_tensor(const TensorView& video, double fps) {
  if (video.dtype() != DType::kF32 || !video.device().is_cpu() || video.dim() != 5 || video.size(0) != 1 ||
      video.size(1) != 3 || !video.is_contiguous())
    fail_argument("video", "a contiguous fp32 CPU tensor (1, 3, frames, height, width)", video.describe());
  VideoFrames out;
  out.count = video.size(2);
  out.height = video.size(3);
  out.width = video.size(4);
  out.fps = fps;
  const int64_t plane = out.count * out.height * out.width;
  out.rgb.resize(static_cast<size_t>(plane) * 3);
  const float* x = video.data_as<const float>();
  for (int64_t channel = 0; channel < 3; ++channel)
    for (int64_t i = 0; i < plane; ++i) {
      const float unit = std::clamp(x[channel * plane + i] * 0.5f + 0.5f, 0.0f, 1.0f);
      out.rgb[static_cast<size_t>(i) * 3 + channel] = static_cast<uint8_t>(std::nearbyint(unit * 255.0f));
    }
  out.validate();
  return out;
}

}  // namespace tessel
