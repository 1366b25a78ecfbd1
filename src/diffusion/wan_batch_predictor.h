// Several generations' denoising steps in one transformer forward (internal to WanPipeline): the
// step-level batching the serving engine and request-level `n > 1` build on. Each entry brings its
// own latents, timestep, text embeddings and guidance scale; the forward runs every entry's
// conditional row (and its unconditional one when guided) as one batch, with one timestep per row,
// and each entry gets its own guided flow back.
//
// Entries share the transformer, the latent shape and the text length. What cannot be shared is
// the caller's to keep out: block caches (their skip decisions are per generation), CFG-parallel
// groups, and, for a transformer with sparse attention, different denoising steps (its schedules
// read the step; WanPipeline groups by it).
//
// The same code runs on CPU and CUDA: the latents are stacked on the host and copied to the
// transformer's device once per step; the texts (8 MB per row at Wan's 512 x 4096) only when the
// batch's generations change. Buffers and the activation workspace are kept for the next step of
// the same batch size.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/dit/wan_lora_bank.h"
#include "tessel/dit/wan_model.h"

namespace tessel {

struct WanBatchEntry {
  TensorView latents;                 // (1, C, F, H, W) fp32 CPU contiguous
  double timestep = 0.0;
  TensorView prompt_embeds;           // (1, L, text_dim) fp32 CPU
  TensorView negative_prompt_embeds;  // the same shape when guided, else empty
  double guidance_scale = 1.0;        // used when guided
  Tensor* flow = nullptr;             // out: fp32 CPU of the latent shape (allocated when empty)
  // Names the entry's texts for as long as they live (a generation's id): a batch of the same ids
  // in the same order as the last step reuses the text already on the device.
  uint64_t text_id = 0;
  int32_t lora_adapter = -1;  // per-request LoRA: an adapter of predict's bank for the entry's rows, -1 none
};

class WanBatchFlowPredictor {
 public:
  explicit WanBatchFlowPredictor(const WanTransformer& transformer);

  // One forward for every entry (at least one) at `step`; writes each entry's flow:
  // uncond + scale * (cond - uncond) when guided, the conditional prediction without. `lora_bank`
  // holds the entries' adapters (null when none names one); a batch mixes them, row by row.
  void predict(const ExecContext& ctx, const StepInfo& step, std::span<const WanBatchEntry> entries,
               const WanLoraBank* lora_bank = nullptr);

 private:
  const WanTransformer& transformer_;
  int64_t rows_ = 0;  // the batch the buffers below are sized for
  Shape latent_shape_;
  int64_t text_len_ = 0;
  Tensor host_input_, host_timestep_, host_text_, host_prediction_;
  Tensor input_, timestep_, text_, prediction_;  // on the transformer's device (views of host_* on CPU)
  std::vector<uint64_t> text_ids_;               // whose texts text_ holds, in row order
  Workspace workspace_;
};

}  // namespace tessel
