// What one step of the Wan denoising loop asks of the transformer (internal to WanPipeline): the
// guided flow for the current latents. The loop keeps the latents and the scheduler on the host;
// a predictor owns everything else of a generation on the transformer's device (the batched
// inputs, the output, the CFG combination), so the loop is the same for every device.
//
// The CPU predictor batches both CFG branches into one fp32 forward (or runs one branch per rank
// under CFG-parallel). The CUDA predictor keeps the text, the batched latents, the prediction and
// the guided flow on the device: per step it uploads the latents once (both batch rows copied on
// the device), runs the batch-2 forward, combines the branches with a kernel and downloads the
// guided flow once. The scheduler's update then runs on the host (a few element-wise passes over
// one latent; WanStepProgress::scheduler_seconds reports what it costs).
#pragma once

#include <memory>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/dit/wan_lora_bank.h"
#include "tessel/dit/wan_model.h"
#include "tessel/parallel/communicator.h"

namespace tessel {

struct WanFlowRequest {
  const WanTransformer* transformer = nullptr;
  TensorView prompt_embeds;           // (1, L, text_dim) fp32 CPU
  TensorView negative_prompt_embeds;  // the same shape, with guidance
  Shape latent_shape;                 // (1, C, F, H, W)
  TensorView condition;               // image-to-video: (1, C_in - C, F, H, W) fp32 CPU, after the latents' channels
  TensorView image_embeds;            // (1, I, image_dim) fp32 CPU for a transformer with an image branch
  TensorView first_frame;             // TI2V image to video: (1, C, 1, H, W) fp32 CPU, the input's first frame, at timestep 0
  bool guided = false;                // both branches, combined with guidance_scale
  double guidance_scale = 1.0;        // this transformer's scale (Wan 2.2's experts have one each)
  Communicator* cfg_group = nullptr;  // a group of two: one branch per rank
  WanBlockCache* block_cache = nullptr;
  const WanLoraBank* lora_bank = nullptr;  // per-request LoRA: lora_adapter of it on every row, -1 none
  int32_t lora_adapter = -1;
};

// The per-request LoRA selection of a predictor's forward of `rows` rows (every row the request's
// adapter), or null when the request has none.
const WanLoraSelection* flow_lora(const WanFlowRequest& request, int64_t rows, WanLoraSelection& storage);

class WanFlowPredictor {
 public:
  virtual ~WanFlowPredictor() = default;
  // The flow the scheduler steps `latents` (latent shape, fp32 CPU contiguous) with at
  // `timestep`: uncond + scale * (cond - uncond) when guided, the conditional prediction without.
  // fp32 CPU contiguous of the latent shape, valid until the next call.
  virtual TensorView predict(const ExecContext& ctx, int64_t step, int64_t total_steps, const TensorView& latents,
                             double timestep) = 0;
};

// The guided flow on the host: out = uncond + scale * (cond - uncond), in fp32 (the CPU predictors').
void combine_guidance(const float* cond, const float* uncond, double scale, float* out, int64_t count);

// TI2V's image (diffusers' expand_timesteps): `first_frame` (1, C, 1, H, W) fp32 CPU over latent
// frame 0 of every channel of `video`, one batch row (C, frames, H, W) of latents.
void put_first_frame(const TensorView& first_frame, int64_t frames, float* video);
// The (rows, per_row) timesteps of a step: each row's first `zeros` at 0, the others at
// `timestep`. A given first frame is clean: with one timestep per latent frame (the transformer
// computes its conditioning once per frame, not per token) frame 0 is at 0 (zeros = 1); without
// one, per_row = 1 and zeros = 0.
void fill_step_timesteps(float* out, int64_t rows, int64_t per_row, int64_t zeros, float timestep);

std::unique_ptr<WanFlowPredictor> make_cpu_flow_predictor(const WanFlowRequest& request);
#ifdef TESSEL_WITH_CUDA
// For a transformer on a CUDA device; under CFG-parallel the group must be a NCCL communicator of
// that device.
std::unique_ptr<WanFlowPredictor> make_cuda_flow_predictor(const ExecContext& ctx, const WanFlowRequest& request);
#endif

}  // namespace tessel
