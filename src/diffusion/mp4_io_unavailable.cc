// MP4 output in a build without libav: every entry point says how to get it.
#include "tessel/core/error.h"
#include "tessel/diffusion/video_io.h"

namespace tessel {
namespace {

[[noreturn]] void fail_no_libav() {
  throw Error(
      "MP4 output: this tessel was built without libav (install libavcodec-dev, libavformat-dev and libswscale-dev "
      "and rebuild), write PNG frames instead");
}

}  // namespace

bool mp4_available() { return false; }
std::string mp4_encoder_name() { fail_no_libav(); }
void write_mp4(const std::string&, const VideoFrames&, const Mp4Options&) { fail_no_libav(); }
VideoFileInfo probe_video(const std::string&) { fail_no_libav(); }

}  // namespace tessel
