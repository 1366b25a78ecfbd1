// The Wan video VAE, as diffusers' AutoencoderKLWan computes it (Wan 2.1's layout and Wan 2.2's
// residual, patched one), fp32 on the CPU or on a CUDA device (cuDNN convolutions, TF32 allowed by
// default as PyTorch allows it), for decoding and encoding alike.
//
// Encoding runs as diffusers' encode: the encoder on the first frame alone, then on chunks of 4
// frames, with a feature cache like the decoder's below, into the posterior's mean.
//
// Decoding runs the way diffusers runs it: post_quant_conv over all latent frames, then the decoder
// one latent frame at a time. Every causal 3-D convolution keeps the last two frames it was given
// (the feature cache) and prepends them to the next frame, so decoding frame by frame equals a
// causal convolution over the whole video; each temporal upsampler skips its time convolution on
// the first frame. The first latent frame becomes one video frame and every later one four, so
// T latent frames give 4 (T - 1) + 1 frames of 8x the latent height and width, clamped to [-1, 1].
// Wan 2.2's residual VAE (is_residual) adds to each up block's output its input duplicated up to the
// output's size (diffusers' DupUp3D), and its decoder's 12 channels are 2 x 2 patches of the 3
// colour channels (patch_size 2), unpatchified into 16x the latent height and width.
#pragma once

#include <atomic>
#include <functional>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/dit/checkpoint.h"

namespace tessel {

// diffusers' AutoencoderKLWan config (vae/config.json); the defaults are Wan 2.1's VAE (the latent
// statistics those of its 16 channels). Attention inside the down/up blocks (attn_scales, which no
// Wan VAE has) is rejected by the parser.
struct WanVaeConfig {
  int64_t base_dim = 96;
  int64_t decoder_base_dim = 96;  // base_dim when the config has null
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  // Per stage but the last: the encoder halves the frame count there; the decoder doubles it in the
  // reverse order.
  std::vector<bool> temporal_downsample = {false, true, true};
  std::vector<float> latents_mean = {-0.7571f, -0.7089f, -0.9113f, 0.1075f,  -0.1745f, 0.9653f,  -0.1517f, 1.5508f,
                                     0.4134f,  -0.0715f, 0.5517f,  -0.3632f, -0.1922f, -0.9497f, 0.2503f,  -0.2921f};
  std::vector<float> latents_std = {2.8184f, 1.4541f, 2.3275f, 2.6558f, 1.2196f, 1.7708f, 2.6052f, 2.0743f,
                                    3.2687f, 2.1526f, 2.8652f, 1.5579f, 1.6382f, 1.1253f, 2.8251f, 1.9160f};
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  // Wan 2.2's VAE: residual down and up blocks (AvgDown3D / DupUp3D shortcuts, up blocks that keep
  // their channels through the upsampler) and in/out channels that are patch_size x patch_size
  // patches of the 3 colour channels (12 for patch 2). patch_size 1 is diffusers' null.
  bool is_residual = false;
  int64_t patch_size = 1;
  // Pixels per latent pixel (2 per upsampling stage, times patch_size) and frames per latent frame
  // after the first: diffusers' scale_factor_spatial and scale_factor_temporal.
  int64_t spatial_compression() const;
  int64_t temporal_compression() const;
  // Throws Error naming the field when a value is out of range or the lists disagree in length.
  void validate() const;
};

// Wan 2.2's VAE as Wan-AI/Wan2.2-TI2V-5B-Diffusers configures it: residual, patch 2 (12 in/out
// channels), encoder width 160, decoder width 256, 48 latent channels with their statistics.
WanVaeConfig wan22_vae_config();

WanVaeConfig parse_wan_vae_config(std::string_view json_text, const std::string& source = "config.json");
// Pixels per latent pixel of a diffusers model directory's VAE, as WanPipeline takes them from
// vae/config.json (scale_factor_spatial: 8 for Wan 2.1's VAE, 16 for Wan 2.2's); 8 without vae/.
// Throws Error naming the file when it is malformed.
int64_t wan_model_vae_spatial_stride(const std::string& model_dir);
// The config of a diffusers model directory's vae/ (nullopt without vae/config.json). Throws Error
// naming the file when it is malformed.
std::optional<WanVaeConfig> wan_model_vae_config(const std::string& model_dir);
// The config.json diffusers writes for `config` (parse_wan_vae_config reads it back).
std::string wan_vae_config_json(const WanVaeConfig& config);

// Every tensor of a diffusers AutoencoderKLWan checkpoint (encoder, quant_conv, post_quant_conv,
// decoder), with diffusers' names and shapes.
std::vector<WeightSpec> wan_vae_weight_specs(const WanVaeConfig& config);

// Progress and cancellation of a decode or an encode, checked between chunks (see WanVae::decode and
// WanVae::encode).
struct WanDecodeControl {
  std::function<void(int64_t chunks_done, int64_t chunks)> on_chunk;
  const std::atomic<bool>* cancel = nullptr;
  bool cancelled() const { return cancel != nullptr && cancel->load(); }
};

namespace vae {
class Encoder;
}
class Communicator;

// Which halves of the VAE a WanVae builds: text to video only decodes, and the encoder's weights
// (about 214 MB in fp32 for Wan 2.1's VAE, 600 MB for Wan 2.2's) are then neither read nor kept.
enum class WanVaeParts {
  kDecoder,
  kDecoderAndEncoder,
};

class WanVae {
 public:
  // `weights` holds the tensors of wan_vae_weight_specs(config) that `parts` needs (the
  // encoder's and quant_conv's only with the encoder; given without it, they are ignored), any
  // float dtype.
  WanVae(WanVaeConfig config, const std::map<std::string, Tensor>& weights, WanVaeParts parts = WanVaeParts::kDecoderAndEncoder);
  ~WanVae();
  WanVae(WanVae&&) noexcept;
  WanVae& operator=(WanVae&&) noexcept;

  // Reads a diffusers vae/ directory: config.json and diffusion_pytorch_model.safetensors (or its
  // sharded index). Throws Error naming a missing file or tensor, or a tensor of another shape.
  static WanVae load(const std::string& directory, WanVaeParts parts = WanVaeParts::kDecoderAndEncoder);
  bool has_encoder() const { return encoder_ != nullptr; }

  // The video shape decoded from latents of `latent_shape` (1, z_dim, T, h, w):
  // (1, out_channels / patch_size^2, 4 (T - 1) + 1, s h, s w) for Wan's three upsampling stages,
  // s = spatial_compression() (8 for Wan 2.1's VAE, 16 for Wan 2.2's).
  Shape decoded_shape(const Shape& latent_shape) const;

  // latents: (1, z_dim, T, h, w) fp32 contiguous, normalized as the denoising loop produces
  // them; they are de-normalized (latents * latents_std + latents_mean, as WanPipeline does before
  // calling the VAE) and decoded. video: decoded_shape(latents), fp32 contiguous on the latents'
  // device, values in [-1, 1]. Throws Error naming a bad argument before writing anything.
  //
  // Runs where the latents are: on the CPU, or on a CUDA device (ctx.device, when not the default
  // CPU context, must be that device), where the first decode uploads the decoder's weights once
  // and later decodes reuse them. A CUDA decode enqueues on ctx.stream and returns when the stream
  // has finished it; it needs cuDNN (libcudnn.so.9, opened at run time: a missing one is an Error,
  // and WanPipeline then decodes on the CPU, with a warning).
  //
  // `control` (optional): the decoder runs one latent frame (chunk) at a time and, between chunks,
  // reads control->cancel (set: the decode stops and returns false, the video incomplete; the
  // Tensor form returns an empty tensor) and calls control->on_chunk(chunks done, chunks). With a
  // callback a CUDA decode waits for each chunk, so that the count is what the device finished.
  //
  // `group` (optional, not owned): the ranks of a sequence-parallel group share the decode, split
  // by height. Every rank of the group calls decode with the same latents and gets the whole video;
  // each decodes a band of the latent rows (balanced, the first height % size ranks one row
  // taller), exchanging one row above and below its band with its neighbours before every 3x3
  // convolution (zeros only at the frame's true top and bottom) and gathering the whole frame for
  // the mid block's attention, so the video equals the one-rank decode up to fp32 summation order
  // (on the CPU it is bit-equal). The decoded bands of each chunk are gathered on every rank. The
  // causal feature cache stays per rank (the split is spatial only). A cancel (control->cancel) is
  // agreed on by the group between chunks: every rank stops at the same chunk. The group's
  // communicator must move tensors of the latents' device (CPU: MPI or shared memory; CUDA: NCCL on
  // that device). A group of one rank, or latents of fewer rows than the group has ranks, decodes
  // whole frames on each rank, as without a group.
  bool decode(const ExecContext& ctx, const TensorView& latents, const TensorView& video,
              const WanDecodeControl* control = nullptr, Communicator* group = nullptr) const;
  Tensor decode(const ExecContext& ctx, const TensorView& latents, const WanDecodeControl* control = nullptr,
                Communicator* group = nullptr) const;

  // The latent shape encoded from a video of `video_shape` (B, colours, F, H, W): (B, z_dim, 1 + (F - 1) / 4,
  // H / s, W / s), s = spatial_compression() (for Wan's VAEs, whose temporal_compression() is 4).
  Shape encoded_shape(const Shape& video_shape) const;

  // diffusers' AutoencoderKLWan.encode followed by retrieve_latents(..., sample_mode="argmax"): the
  // posterior's mode, its mean `mu`, not normalized (normalize_latents does it). video: (B, colours,
  // F, H, W) fp32 contiguous, values in [-1, 1], colours = in_channels / patch_size^2 (3), F = 1 + 4k,
  // H and W multiples of spatial_compression(); each video of the batch is encoded on its own, as
  // diffusers' sliced encode. mu: encoded_shape(video), fp32 contiguous on the video's device. Throws
  // Error naming a bad argument before writing anything, or saying the VAE was built without its
  // encoder (WanVaeParts::kDecoder).
  //
  // Runs as diffusers runs it, fp32: the video patchified (Wan 2.2: 2 x 2 pixels of 3 colours into
  // 12 channels), then the encoder on the first frame alone and on each later chunk of 4 frames,
  // every causal convolution keeping the last two frames it was given; each temporal downsampler
  // passes the first chunk's frame through and halves the frames of every later chunk (4 frames make
  // one latent frame); then quant_conv's mu half. `control` as for decode, per chunk (chunks of all
  // the batch's videos counted together).
  //
  // Runs where the video is, as decode does: on the CPU, or on a CUDA device (ctx.device, when not
  // the default CPU context, must be that device), where the first encode uploads the encoder's
  // weights once; the whole encode is enqueued on ctx.stream and waited for at the end (and after
  // each chunk when control has an on_chunk callback). It needs cuDNN as the CUDA decoder does.
  bool encode(const ExecContext& ctx, const TensorView& video, const TensorView& mu,
              const WanDecodeControl* control = nullptr) const;
  Tensor encode(const ExecContext& ctx, const TensorView& video, const WanDecodeControl* control = nullptr) const;

  // (mu - latents_mean) * (1 / latents_std) per channel, as WanImageToVideoPipeline normalizes the
  // latents of its conditioning image: the scale the denoising loop works at (decode undoes it).
  // mu: (B, z_dim, T, h, w) fp32 contiguous on the CPU; throws Error naming `mu` otherwise.
  Tensor normalize_latents(const TensorView& mu) const;

  // Whether the CUDA decoder's and encoder's convolutions may use TF32 tensor cores (default true,
  // PyTorch's torch.backends.cudnn.allow_tf32 default, so diffusers' fp32 decode and encode do too);
  // false keeps every product in fp32. The attention's products are fp32 either way.
  void set_cuda_tf32(bool allowed) { cuda_tf32_ = allowed; }

  const WanVaeConfig& config() const { return config_; }

 private:
  struct Decoder;
  struct DeviceModels;  // the CUDA decoders and encoders, one per device, made by its first decode / encode
  bool decode_on_device(const ExecContext& ctx, const TensorView& latents, const TensorView& video,
                        const WanDecodeControl* control, Communicator* group) const;
  bool encode_on_device(const ExecContext& ctx, const TensorView& video, const TensorView& mu,
                        const WanDecodeControl* control) const;
  WanVaeConfig config_;
  std::unique_ptr<Decoder> decoder_;
  std::unique_ptr<vae::Encoder> encoder_;
  std::unique_ptr<DeviceModels> device_models_;
  bool cuda_tf32_ = true;
};

}  // namespace tessel
