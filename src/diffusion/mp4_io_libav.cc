// MP4 writing and probing through libav (FFmpeg's libavformat, libavcodec, libswscale).
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>
}

#include <algorithm>
#include <memory>
#include <mutex>

#include "tessel/core/error.h"
#include "tessel/diffusion/video_io.h"

namespace tessel {
namespace {

std::string av_error_text(int code) {
  char text[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(code, text, sizeof(text));
  return text;
}

void check_av(int code, const std::string& what) {
  if (code < 0) throw Error(detail::concat(what, ": ", av_error_text(code)));
}

struct CodecContextFree {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct FrameFree {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketFree {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct SwsFree {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};
// An output file: the muxer context and, once opened, its I/O.
struct OutputFormatFree {
  void operator()(AVFormatContext* f) const {
    if (f->pb) avio_closep(&f->pb);
    avformat_free_context(f);
  }
};
struct InputFormatClose {
  void operator()(AVFormatContext* f) const { avformat_close_input(&f); }
};

const AVCodec* find_mp4_encoder() {
  if (const AVCodec* h264 = avcodec_find_encoder_by_name("libx264")) return h264;
  return avcodec_find_encoder(AV_CODEC_ID_MPEG4);
}

const AVCodec* requested_encoder(const std::string& name) {
  if (name.empty()) {
    const AVCodec* codec = find_mp4_encoder();
    if (!codec) throw Error("MP4 output: this libavcodec has neither the libx264 nor the mpeg4 encoder");
    return codec;
  }
  if (name != "libx264" && name != "mpeg4") fail_argument("encoder", "\"libx264\", \"mpeg4\" or empty", quoted_excerpt(name));
  const AVCodec* codec = avcodec_find_encoder_by_name(name.c_str());
  if (!codec) fail_argument("encoder", "an encoder this libavcodec has", quoted_excerpt(name));
  return codec;
}

// x264 and the muxer report every file at info level; tessel's users see only libav's errors.
void quiet_libav() {
  static std::once_flag once;
  std::call_once(once, [] { av_log_set_level(AV_LOG_ERROR); });
}

// Sends one frame (or the end: nullptr) to the encoder and writes every packet it gives back.
void encode_and_write(AVCodecContext* encoder, AVFrame* frame, AVFormatContext* format, AVStream* stream,
                      AVPacket* packet, const std::string& path) {
  check_av(avcodec_send_frame(encoder, frame), path + ": encoding a frame");
  while (true) {
    const int status = avcodec_receive_packet(encoder, packet);
    if (status == AVERROR(EAGAIN) || status == AVERROR_EOF) return;
    check_av(status, path + ": encoding a frame");
    av_packet_rescale_ts(packet, encoder->time_base, stream->time_base);
    packet->stream_index = stream->index;
    check_av(av_interleaved_write_frame(format, packet), path + ": writing a packet");
  }
}

}  // namespace

bool mp4_available() { return true; }

std::string mp4_encoder_name() { return requested_encoder("")->name; }

void write_mp4(const std::string& path, const VideoFrames& frames, const Mp4Options& options) {
  frames.validate();
  if (frames.width % 2 != 0 || frames.height % 2 != 0)
    fail_argument("frames", "an even width and height (MP4 in yuv420p)", detail::concat(frames.width, "x", frames.height));
  if (options.crf < 0 || options.crf > 51) fail_argument("crf", "0 to 51", options.crf);
  const AVCodec* codec = requested_encoder(options.encoder);
  quiet_libav();

  AVFormatContext* raw_format = nullptr;
  check_av(avformat_alloc_output_context2(&raw_format, nullptr, "mp4", path.c_str()), path + ": MP4 muxer");
  std::unique_ptr<AVFormatContext, OutputFormatFree> format(raw_format);
  AVStream* stream = avformat_new_stream(format.get(), nullptr);
  std::unique_ptr<AVCodecContext, CodecContextFree> encoder(avcodec_alloc_context3(codec));
  if (!stream || !encoder) throw Error(path + ": out of memory setting up the MP4 encoder");

  const AVRational rate = av_d2q(frames.fps, 1 << 20);
  encoder->width = static_cast<int>(frames.width);
  encoder->height = static_cast<int>(frames.height);
  encoder->pix_fmt = AV_PIX_FMT_YUV420P;
  encoder->framerate = rate;
  encoder->time_base = av_inv_q(rate);
  encoder->gop_size = 16;
  if (format->oformat->flags & AVFMT_GLOBALHEADER) encoder->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  AVDictionary* codec_options = nullptr;
  if (std::string(codec->name) == "libx264") {
    av_dict_set_int(&codec_options, "crf", options.crf, 0);
    av_dict_set(&codec_options, "preset", "medium", 0);
  } else {
    // mpeg4 has no CRF: a fixed quantizer of similar quality (2 best .. 31 worst).
    encoder->flags |= AV_CODEC_FLAG_QSCALE;
    encoder->global_quality = FF_QP2LAMBDA * std::max(2, std::min(31, 2 + options.crf / 4));
  }
  const int opened = avcodec_open2(encoder.get(), codec, &codec_options);
  av_dict_free(&codec_options);
  check_av(opened, path + ": opening the " + codec->name + " encoder");
  check_av(avcodec_parameters_from_context(stream->codecpar, encoder.get()), path + ": stream parameters");
  stream->time_base = encoder->time_base;
  stream->avg_frame_rate = rate;

  const int opened_file = avio_open(&format->pb, path.c_str(), AVIO_FLAG_WRITE);
  if (opened_file < 0) fail_argument("path", "a writable file", quoted_excerpt(path) + " (" + av_error_text(opened_file) + ")");
  AVDictionary* muxer_options = nullptr;
  av_dict_set(&muxer_options, "movflags", "+faststart", 0);
  const int header = avformat_write_header(format.get(), &muxer_options);
  av_dict_free(&muxer_options);
  check_av(header, path + ": writing the MP4 header");

  std::unique_ptr<SwsContext, SwsFree> convert(sws_getContext(encoder->width, encoder->height, AV_PIX_FMT_RGB24,
                                                              encoder->width, encoder->height, AV_PIX_FMT_YUV420P,
                                                              SWS_BICUBIC, nullptr, nullptr, nullptr));
  std::unique_ptr<AVFrame, FrameFree> frame(av_frame_alloc());
  std::unique_ptr<AVPacket, PacketFree> packet(av_packet_alloc());
  if (!convert || !frame || !packet) throw Error(path + ": out of memory setting up the MP4 encoder");
  frame->format = AV_PIX_FMT_YUV420P;
  frame->width = encoder->width;
  frame->height = encoder->height;
  check_av(av_frame_get_buffer(frame.get(), 0), path + ": frame buffer");
  for (int64_t i = 0; i < frames.count; ++i) {
    check_av(av_frame_make_writable(frame.get()), path + ": frame buffer");
    const uint8_t* source[1] = {frames.frame(i)};
    const int source_stride[1] = {static_cast<int>(frames.width * 3)};
    sws_scale(convert.get(), source, source_stride, 0, encoder->height, frame->data, frame->linesize);
    frame->pts = i;
    encode_and_write(encoder.get(), frame.get(), format.get(), stream, packet.get(), path);
  }
  encode_and_write(encoder.get(), nullptr, format.get(), stream, packet.get(), path);
  check_av(av_write_trailer(format.get()), path + ": writing the MP4 index");
}

VideoFileInfo probe_video(const std::string& path) {
  quiet_libav();
  AVFormatContext* raw = nullptr;
  const int opened = avformat_open_input(&raw, path.c_str(), nullptr, nullptr);
  if (opened < 0) fail_argument("path", "a video file libavformat can open", quoted_excerpt(path) + " (" + av_error_text(opened) + ")");
  std::unique_ptr<AVFormatContext, InputFormatClose> format(raw);
  check_av(avformat_find_stream_info(format.get(), nullptr), path + ": reading stream information");
  const int index = av_find_best_stream(format.get(), AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
  if (index < 0) fail_argument("path", "a file with a video stream", quoted_excerpt(path));
  const AVStream* stream = format->streams[index];
  VideoFileInfo info;
  info.codec = avcodec_get_name(stream->codecpar->codec_id);
  info.width = stream->codecpar->width;
  info.height = stream->codecpar->height;
  info.fps = stream->avg_frame_rate.den != 0 ? av_q2d(stream->avg_frame_rate) : 0.0;
  std::unique_ptr<AVPacket, PacketFree> packet(av_packet_alloc());
  if (!packet) throw Error(path + ": out of memory reading packets");
  while (av_read_frame(format.get(), packet.get()) >= 0) {
    if (packet->stream_index == index) ++info.frames;
    av_packet_unref(packet.get());
  }
  return info;
}

}  // namespace tessel
