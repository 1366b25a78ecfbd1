// A decoded video as 8-bit RGB frames: what the VAE's output becomes before it is written as PNG
// images or an MP4 file (video_io.h), and what a server sends back.
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/core/tensor.h"

namespace tessel {

// Wan 2.1 and 2.2 (T2V-A14B) videos play at 16 frames per second.
constexpr double kWanFramesPerSecond = 16.0;

struct VideoFrames {
  int64_t count = 0;   // frames
  int64_t height = 0;  // pixels
  int64_t width = 0;   // pixels
  double fps = kWanFramesPerSecond;
  std::vector<uint8_t> rgb;  // count x height x width x 3, row-major, R G B interleaved

  int64_t frame_bytes() const { return height * width * 3; }
  const uint8_t* frame(int64_t index) const { return rgb.data() + index * frame_bytes(); }
  uint8_t* frame(int64_t index) { return rgb.data() + index * frame_bytes(); }
  // Throws Error naming the field when a size is not positive or rgb holds another byte count.
  void validate() const;
};

// The VAE's output (1, 3, frames, height, width) fp32 CPU, values in [-1, 1], as 8-bit frames the
// way diffusers' VideoProcessor makes images of it: (x / 2 + 0.5) clamped to [0, 1], times 255,
// rounded. Throws Error naming `video` when its shape, dtype or device is another.
VideoFrames video_frames_from_tensor(const TensorView& video, double fps = kWanFramesPerSecond);

}  // namespace tessel
