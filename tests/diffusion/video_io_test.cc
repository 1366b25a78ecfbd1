// Frames out: the VAE tensor to 8-bit frames as diffusers rounds them, PNG written and read back
// through libpng bit-exactly, MP4 written and probed back through libavformat (codec, size, frame
// count, frame rate), and the errors for odd sizes, bad indices and unreadable files.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tessel/core/error.h"
#include "tessel/diffusion/video_io.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

fs::path temp_path(const std::string& name) {
  return fs::path(::testing::TempDir()) / (std::to_string(::getpid()) + "_" + name);
}

// A moving gradient, so encoders see motion and every byte value class appears.
VideoFrames test_frames(int64_t count, int64_t height, int64_t width) {
  VideoFrames frames;
  frames.count = count;
  frames.height = height;
  frames.width = width;
  frames.rgb.resize(static_cast<size_t>(count * height * width * 3));
  for (int64_t f = 0; f < count; ++f)
    for (int64_t y = 0; y < height; ++y)
      for (int64_t x = 0; x < width; ++x) {
        uint8_t* p = frames.frame(f) + (y * width + x) * 3;
        p[0] = static_cast<uint8_t>((x * 255) / (width - 1));
        p[1] = static_cast<uint8_t>((y * 255) / (height - 1));
        p[2] = static_cast<uint8_t>((f * 40 + x + y) % 256);
      }
  return frames;
}

TEST(VideoFrames, FromTheVaeTensorAsDiffusersRounds) {
  Tensor video = Tensor::empty({1, 3, 2, 1, 3}, DType::kF32);
  const float values[] = {-1.0f, -2.0f, 1.0f, 2.0f, 0.0f, 0.5f};  // channel 0 of 2 frames x 3 pixels
  float* v = video.data_as<float>();
  for (int64_t i = 0; i < 18; ++i) v[i] = values[i % 6];
  const VideoFrames frames = video_frames_from_tensor(video.view(), 16.0);
  EXPECT_EQ(frames.count, 2);
  EXPECT_EQ(frames.height, 1);
  EXPECT_EQ(frames.width, 3);
  // (x / 2 + 0.5) clamped, times 255, rounded half to even: 0, 0, 255 | 255, 127.5 -> 128, 191.25 -> 191.
  const uint8_t expected[] = {0, 0, 255, 255, 128, 191};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(frames.rgb[i * 3], expected[i]) << i;
  EXPECT_THROW(video_frames_from_tensor(Tensor::empty({1, 4, 2, 1, 3}, DType::kF32).view()), Error);
  EXPECT_THROW(video_frames_from_tensor(Tensor::empty({3, 2, 1, 3}, DType::kF32).view()), Error);
}

TEST(PngIo, RoundTripsThroughLibpng) {
  const VideoFrames frames = test_frames(3, 12, 10);
  const std::vector<std::string> paths = write_png_frames(temp_path("frames.png").string(), frames);
  ASSERT_EQ(paths.size(), 3u);
  EXPECT_NE(paths[2].find("frames_00002.png"), std::string::npos) << paths[2];
  for (int64_t i = 0; i < 3; ++i) {
    const VideoFrames back = read_png(paths[i]);
    ASSERT_EQ(back.width, 10);
    ASSERT_EQ(back.height, 12);
    EXPECT_TRUE(std::equal(back.rgb.begin(), back.rgb.end(), frames.frame(i))) << "frame " << i;
  }
  const VideoFrames single = test_frames(1, 4, 6);
  EXPECT_EQ(write_png_frames(temp_path("one.png").string(), single), std::vector<std::string>{temp_path("one.png").string()});
  EXPECT_EQ(read_png(temp_path("one.png").string()).rgb, single.rgb);
}

TEST(PngIo, BadInputIsAnError) {
  const VideoFrames frames = test_frames(2, 4, 4);
  EXPECT_THROW(encode_png(frames, 2), Error);
  VideoFrames short_buffer = frames;
  short_buffer.rgb.pop_back();
  EXPECT_THROW(encode_png(short_buffer), Error);
  EXPECT_THROW(write_png(temp_path("missing_dir/x.png").string(), frames), Error);
  const fs::path not_png = temp_path("not.png");
  std::ofstream(not_png) << "plain text";
  try {
    read_png(not_png.string());
    FAIL() << "text read as PNG";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not.png"), std::string::npos) << e.what();
  }
}

TEST(Mp4Io, WritesAFileLibavformatReadsBack) {
  if (!mp4_available()) {
    EXPECT_THROW(write_mp4(temp_path("x.mp4").string(), test_frames(2, 16, 16)), Error);
    GTEST_SKIP() << "built without libav";
  }
  const VideoFrames frames = test_frames(9, 48, 64);
  const fs::path path = temp_path("video.mp4");
  write_mp4(path.string(), frames);
  const VideoFileInfo info = probe_video(path.string());
  EXPECT_EQ(info.codec, mp4_encoder_name() == "libx264" ? "h264" : "mpeg4");
  EXPECT_EQ(info.width, 64);
  EXPECT_EQ(info.height, 48);
  EXPECT_EQ(info.frames, 9);
  EXPECT_NEAR(info.fps, 16.0, 1e-9);
  VideoFrames other_rate = test_frames(5, 16, 16);
  other_rate.fps = 24.0;
  write_mp4(path.string(), other_rate);
  EXPECT_NEAR(probe_video(path.string()).fps, 24.0, 1e-9);
  EXPECT_EQ(probe_video(path.string()).frames, 5);
  // The fallback encoder, when libx264 is missing.
  write_mp4(path.string(), frames, Mp4Options{.crf = 18, .encoder = "mpeg4"});
  const VideoFileInfo mpeg4 = probe_video(path.string());
  EXPECT_EQ(mpeg4.codec, "mpeg4");
  EXPECT_EQ(mpeg4.frames, 9);
}

TEST(Mp4Io, BadInputIsAnError) {
  if (!mp4_available()) GTEST_SKIP() << "built without libav";
  try {
    write_mp4(temp_path("odd.mp4").string(), test_frames(2, 15, 16));
    FAIL() << "odd height accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("even"), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_mp4(temp_path("missing_dir/x.mp4").string(), test_frames(2, 16, 16)), Error);
  EXPECT_THROW(probe_video(temp_path("absent.mp4").string()), Error);
  EXPECT_THROW(write_mp4(temp_path("x.mp4").string(), test_frames(2, 16, 16), Mp4Options{.crf = 60}), Error);
  EXPECT_THROW(write_mp4(temp_path("x.mp4").string(), test_frames(2, 16, 16), Mp4Options{.crf = 18, .encoder = "vp9"}), Error);
}

}  // namespace
}  // namespace tessel
