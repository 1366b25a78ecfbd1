// Writing decoded frames as files: PNG through libpng (always built), MP4 through libav
// (libavformat, libavcodec, libswscale; built when CMake finds them, see mp4_available()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/diffusion/video_frames.h"

namespace tessel {

// One frame as the bytes of an 8-bit RGB PNG file. Throws Error naming a bad frame index.
std::string encode_png(const VideoFrames& frames, int64_t index = 0);
// Writes encode_png(frames, index) to `path`. Throws Error naming the path it cannot write.
void write_png(const std::string& path, const VideoFrames& frames, int64_t index = 0);
// Every frame: `path` itself for a single frame, else `path` with _00000, _00001, ... inserted
// before its extension ("out.png" -> "out_00000.png"). Returns the paths written, in frame order.
std::vector<std::string> write_png_frames(const std::string& path, const VideoFrames& frames);
// A PNG file as one 8-bit RGB frame (gray, palette and alpha images are converted, alpha dropped on
// black). Throws Error naming the path when it is missing or not a PNG.
VideoFrames read_png(const std::string& path);

// Whether this build can write MP4 files (tessel was built with libav).
bool mp4_available();
// The encoder write_mp4 uses in this process: "libx264" (H.264) when libavcodec has it, else
// "mpeg4" (MPEG-4 Part 2). Throws Error saying so when the build has no libav or neither encoder.
std::string mp4_encoder_name();

struct Mp4Options {
  // x264's constant rate factor (0 lossless .. 51); the mpeg4 encoder gets a matching quantizer.
  int crf = 18;
  // Empty: mp4_encoder_name()'s choice; "libx264" or "mpeg4" to ask for one.
  std::string encoder;
};

// Writes `frames` as an MP4 file playable by browsers: yuv420p, the moov atom first (faststart),
// frames.fps frames per second. Width and height must be even (yuv420p). Throws Error naming the
// argument: odd sizes, no MP4 support in this build, an encoder libavcodec lacks, an unwritable
// path. libav's own messages below errors are silenced (its log level is process-wide).
void write_mp4(const std::string& path, const VideoFrames& frames, const Mp4Options& options = {});

struct VideoFileInfo {
  std::string codec;  // libavcodec's name: "h264", "mpeg4", ...
  int64_t width = 0;
  int64_t height = 0;
  int64_t frames = 0;  // video packets read through the file
  double fps = 0.0;    // the stream's average frame rate
};

// Reads a video file's first video stream through libavformat. Throws Error naming the path when
// it cannot be opened or has no video stream, or when this build has no libav.
VideoFileInfo probe_video(const std::string& path);

}  // namespace tessel
