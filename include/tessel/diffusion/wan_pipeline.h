// The Wan text-to-video denoising loop, as diffusers' WanPipeline runs it after the text encoder:
// from seeded noise, every scheduler step calls the transformer once on the conditional and
// unconditional branches together (batch 2) and combines them with the guidance scale, then the
// scheduler steps the latents; with a VAE the final latents are decoded into frames. Wan 2.2's
// A14B layout has two experts: the transformer for the high-noise steps, a second one below a
// boundary timestep.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/diffusion/cache_backend.h"
#include "tessel/diffusion/scheduler.h"
#include "tessel/diffusion/umt5_encoder.h"
#include "tessel/diffusion/video_frames.h"
#include "tessel/diffusion/wan_vae.h"
#include "tessel/dit/wan_lora_bank.h"
#include "tessel/dit/wan_model.h"
#include "tessel/parallel/communicator.h"

namespace tessel {

// Wan's VAE maps 4k + 1 frames to k + 1 latent frames and vae_spatial_stride x vae_spatial_stride
// pixels to one latent pixel (8 for Wan 2.1's VAE, 16 for Wan 2.2's patched one: diffusers'
// vae_scale_factor_spatial); the transformer's 2 x 2 patches make twice that the unit of height and
// width (16 or 32 pixels).
struct WanVideoSize {
  int64_t frames = 81;
  int64_t height = 480;
  int64_t width = 832;
  int64_t vae_spatial_stride = 8;
  // Throws Error naming the field: frames not 4k + 1, height or width not a positive multiple of
  // 2 vae_spatial_stride, vae_spatial_stride not 8 or 16.
  void validate() const;
  // (1, channels, latent frames, latent height, latent width).
  Shape latent_shape(int64_t channels) const;
};

struct WanStepProgress {
  int64_t step = 0;         // steps finished, 1..total_steps
  int64_t total_steps = 0;
  double timestep = 0.0;    // the timestep of the step just finished
  double step_seconds = 0.0;
  // The part of step_seconds the scheduler's update of the latents took (on the host).
  double scheduler_seconds = 0.0;
  double elapsed_seconds = 0.0;
  double eta_seconds = 0.0;  // the mean step time so far times the steps left
  TensorView latents;        // the latents after this step; valid during the callback only
};

struct WanGenerationOptions {
  int64_t num_inference_steps = 50;
  // Above 1: classifier-free guidance, noise = uncond + scale * (cond - uncond); otherwise only
  // the conditional branch runs (batch 1) and the negative embeddings are not used.
  double guidance_scale = 5.0;
  uint64_t seed = 0;  // the starting noise when no initial latents are given
  WanVideoSize size;
  std::function<void(const WanStepProgress&)> on_step;  // after every step, when set
  // During the VAE decode, after each latent frame (chunk) the device finished; `cancel` is also
  // read between chunks (a cancelled decode returns no frames and result.cancelled).
  std::function<void(int64_t chunks_done, int64_t chunks)> on_decode_chunk;
  // Checked before every step; when it reads true the loop stops and returns what it has.
  const std::atomic<bool>* cancel = nullptr;
  // Wan 2.2's two experts: the low-noise expert's guidance scale (diffusers' guidance_scale_2);
  // unset: guidance_scale. Whether the branches run at all follows guidance_scale alone (as
  // diffusers). An Error for a pipeline with one expert.
  std::optional<double> guidance_scale_2;
  // A cache backend (make_cache_backend) to skip work between steps: refreshed at the start, its
  // hook handed to every transformer call, its statistics returned. Null: every step computes.
  // With two experts it serves the high-noise one and `cache_2` (its own state: one expert's
  // residuals mean nothing to the other) the low-noise one; a null one computes every step.
  CacheBackend* cache = nullptr;
  CacheBackend* cache_2 = nullptr;
  // false: finish returns the latents only, without the VAE decode (diffusers' output_type="latent").
  bool decode = true;
  // CFG-parallel (not owned): with guidance and a group of two ranks, CFG rank 0 runs the
  // conditional branch and rank 1 the unconditional one (the transformer at batch 1, StepInfo's
  // cfg_branch set), and the two noise predictions are gathered on both; every rank passes the same
  // arguments and gets the same latents. Null or a group of one: both branches here, as batch 2.
  Communicator* cfg_group = nullptr;
  // The ranks that share the VAE decode (not owned; WanVae::decode's group): each decodes a band of
  // the rows and every rank gets the whole video. A communicator of the decode's device (on a CUDA
  // context, should the CUDA decoder be unavailable, each rank decodes whole frames on the CPU).
  // Every rank of it calls finish with the same latents. Null: this rank decodes alone.
  Communicator* decode_group = nullptr;
  // Image-to-video (diffusers' WanImageToVideoPipeline), fp32 CPU, empty for text-to-video:
  // `condition` (1, in_channels - out_channels, latent frames, latent height, latent width) is what
  // every forward takes after the noisy latents on the channel axis (the 4-channel frame mask and
  // the encoded conditioning video: wan_image_condition); `image_embeds` (1, I, image_dim) the CLIP
  // features a transformer with an image branch attends to (Wan 2.1 I2V), the same for both CFG
  // branches. Each is required exactly when the transformer takes it.
  Tensor condition;
  Tensor image_embeds;
  // Wan 2.2 TI2V-5B's image to video (diffusers' expand_timesteps): the image's normalized latents
  // (1, out_channels, 1, latent height, latent width), fp32 CPU. Every forward sees them as the
  // first latent frame, whose tokens get timestep 0 (the others t); the loop's own first frame is
  // replaced by them before the decode. For a transformer that takes the latents alone, with a
  // patch of one frame.
  Tensor first_frame;
  // Per-request LoRA (not owned; outlives the generation): adapter `lora_adapter` of `lora_bank`
  // (on the transformer's device, loaded for its config) runs unmerged in every forward of this
  // generation, both CFG branches; -1: none. Batched steps mix generations of different adapters
  // of one bank. One-expert pipelines only (Wan 2.2's experts would each need their own adapter).
  const WanLoraBank* lora_bank = nullptr;
  int32_t lora_adapter = -1;
};

struct WanGenerationResult {
  Tensor latents;  // (1, channels, latent frames, latent height, latent width), fp32 CPU
  // The decoded video, when the pipeline has a VAE and the loop was not cancelled; empty otherwise.
  VideoFrames frames;
  int64_t steps_done = 0;
  bool cancelled = false;
  CacheStats cache_stats;    // the cache backend's, when one was given (backend empty otherwise)
  CacheStats cache_stats_2;  // cache_2's (the low-noise expert's), when one was given
  // Per step: the expert that ran it (0 the transformer, 1 the low-noise expert).
  std::vector<int> experts;
};

// Wan 2.2's low-noise expert (`transformer_2/`): it denoises the steps whose timestep t is below
// boundary_ratio * num_train_timesteps (compared in float32, as diffusers compares its timestep
// tensor); the pipeline's transformer takes t at or above it.
struct WanLowNoiseExpert {
  const WanTransformer* transformer = nullptr;
  double boundary_ratio = 0.875;  // Wan 2.2 T2V-A14B's
  int64_t num_train_timesteps = 1000;  // the scheduler config's
};

// The standard-normal starting latents for `seed`: the same seed gives the same numbers on every
// platform (not torch's generator: the same seed does not give diffusers' noise).
Tensor wan_initial_noise(const Shape& latent_shape, uint64_t seed);

// The text embeddings WanPipeline hands the transformer: the encoder's output (B, L, d_model) with
// every position from a row's token count on (the count of non-zero mask entries; the tokenizer
// pads on the right) set to zero, as diffusers' _get_t5_prompt_embeds cuts and zero-pads them.
Tensor wan_prompt_embeddings(const ExecContext& ctx, const UMT5Encoder& encoder, const TensorView& input_ids,
                             const TensorView& attention_mask);

// One generation in flight through WanPipeline's step-level door: its latents, its scheduler, its
// predictors (one per expert, each holding the generation's inputs on the transformer's device),
// its options and what it has produced so far. Made by WanPipeline::begin, advanced by step, ended
// by finish; not copyable. Opaque but for what a caller that interleaves generations needs.
class WanDenoiseState {
 public:
  ~WanDenoiseState();
  WanDenoiseState(const WanDenoiseState&) = delete;
  WanDenoiseState& operator=(const WanDenoiseState&) = delete;

  int64_t steps_done() const;
  int64_t total_steps() const;
  // Every step ran, or the options' cancel flag was seen set before a step.
  bool done() const;
  bool cancelled() const;

 private:
  friend class WanPipeline;
  struct Impl;
  explicit WanDenoiseState(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class WanPipeline {
 public:
  // All are borrowed for the pipeline's lifetime; the scheduler is restarted by each generate. The
  // VAE may be null: generate then returns latents only. Throws Error when the transformer's
  // in_channels are fewer than its out_channels (the latents; image-to-video models take more: the
  // options' condition), or when the VAE's latent channels
  // are not the transformer's or it does not map 4 frames and 8 x 8 (Wan 2.1) or 16 x 16 (Wan 2.2's
  // TI2V VAE) pixels of 3 colours to one latent. generate then wants WanVideoSize's
  // vae_spatial_stride to be the VAE's.
  WanPipeline(const WanTransformer& transformer, Scheduler& scheduler, const WanVae* vae = nullptr);
  // The two-expert layout: `transformer` is the high-noise expert. Throws Error when the low-noise
  // expert is null, its channels or text width differ from the transformer's, or boundary_ratio is
  // not in (0, 1) or num_train_timesteps not positive.
  WanPipeline(const WanTransformer& transformer, const WanLowNoiseExpert& low_noise, Scheduler& scheduler,
              const WanVae* vae = nullptr);
  // Without a scheduler of its own, for callers that give every generation its own (begin's
  // `scheduler`; WanGenerator does): generate, and begin without one, are then an Error.
  WanPipeline(const WanTransformer& transformer, const WanVae* vae);
  WanPipeline(const WanTransformer& transformer, const WanLowNoiseExpert& low_noise, const WanVae* vae);

  // prompt_embeds and negative_prompt_embeds: (1, L, text_dim) fp32 CPU contiguous, the same L
  // (they run as one batch); the negative may be empty without guidance. initial_latents: the
  // starting noise of the latent shape (fp32 CPU contiguous), or empty for wan_initial_noise(seed).
  // Each transformer call gets StepInfo::at(step, steps), so sparse schedules and dense warm-up
  // steps apply. Throws Error naming a bad argument before the first step.
  // With a transformer on a CUDA device the text, the batched model input, the prediction and the
  // CFG combination stay on that device (ctx.stream; a workspace of the generation's own): each
  // step uploads the latents and downloads the guided flow once, and the scheduler steps the
  // latents on the host (WanStepProgress::scheduler_seconds). The VAE then decodes on the context's
  // device (the CPU, with a warning, when the CUDA decoder is unavailable). The
  // noise of a seed is the same on every device. Under CFG-parallel on CUDA each rank's GPU runs its
  // branch at batch 1 and the predictions are gathered over the group's NCCL communicator.
  // generate() is begin, step until done, finish.
  WanGenerationResult generate(const ExecContext& ctx, const TensorView& prompt_embeds,
                               const TensorView& negative_prompt_embeds, const WanGenerationOptions& options,
                               const TensorView& initial_latents = {}) const;

  // The step-level door (the serving engine interleaves generations step by step). begin checks
  // everything generate checks and prepares a generation without running a step; the state keeps
  // copies of the embeddings and latents, and `scheduler` (owned) when given, else the
  // pipeline's own scheduler (then one generation at a time: set_timesteps restarts it). step runs
  // the next denoising step of each state that is not done (checking its cancel flag first and
  // calling its on_step after). States that can share a forward run as one batch (each its own
  // timestep, text, guidance and scheduler): one expert, latent shape and text length, no step
  // cache, no CFG-parallel group, and the same step when the attention reads it (sparse
  // schedules). A batch's result equals each state stepped alone up to the kernels' rounding at
  // another batch size (fp32 CPU: rel-L2 about 4e-7 in the tests; bf16 CUDA: GEMM tiles may differ).
  // finish decodes (when the pipeline has a VAE and the state was not
  // cancelled) and returns the result; the state is spent after it.
  std::unique_ptr<WanDenoiseState> begin(const ExecContext& ctx, const TensorView& prompt_embeds,
                                         const TensorView& negative_prompt_embeds, const WanGenerationOptions& options,
                                         const TensorView& initial_latents = {},
                                         std::unique_ptr<Scheduler> scheduler = nullptr) const;
  void step(const ExecContext& ctx, std::span<WanDenoiseState* const> states) const;
  WanGenerationResult finish(const ExecContext& ctx, WanDenoiseState& state) const;

  // The frames of the loop's latents (1, channels, frames, height, width) through the VAE, as
  // WanPipeline's output_type "pil" gives them. Throws Error when the pipeline has no VAE, or naming
  // bad latents.
  VideoFrames decode(const ExecContext& ctx, const TensorView& latents) const;

 private:
  // Empty frames when `control` cancelled the decode.
  VideoFrames decode_on(const ExecContext& ctx, const Tensor& host_latents, const WanDecodeControl* control = nullptr,
                        Communicator* group = nullptr) const;
  const WanTransformer& transformer_;
  Scheduler* scheduler_ = nullptr;  // borrowed; null: every begin brings one
  const WanVae* vae_;
  WanLowNoiseExpert low_noise_;  // transformer null: one expert
  struct BatchPredictors;  // step's batched forwards, one per expert, kept between steps
  std::shared_ptr<BatchPredictors> batch_;
};

}  // namespace tessel
