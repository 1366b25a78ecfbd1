// Several generations' steps in one forward (see wan_batch_predictor.h).
#include "wan_batch_predictor.h"

#include <algorithm>
#include <cstring>

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "tessel/core/allocator.h"
#include "tessel/core/error.h"
#include "wan_flow_predictor.h"

namespace tessel {

WanBatchFlowPredictor::WanBatchFlowPredictor(const WanTransformer& transformer)
    : transformer_(transformer), workspace_(transformer.device()) {}

void WanBatchFlowPredictor::predict(const ExecContext& ctx, const StepInfo& step, std::span<const WanBatchEntry> entries,
                                    const WanLoraBank* lora_bank) {
  if (entries.empty()) fail_argument("entries", "at least one", 0);
  const WanBatchEntry& first = entries.front();
  const Shape& latent_shape = first.latents.shape();
  const int64_t text_len = first.prompt_embeds.size(1), text_dim = first.prompt_embeds.size(2);
  int64_t rows = 0;
  for (const WanBatchEntry& e : entries) {
    // WanPipeline groups entries so that these hold; a mismatch here is a bug of the caller.
    if (e.latents.shape() != latent_shape || e.prompt_embeds.shape() != first.prompt_embeds.shape() || e.flow == nullptr)
      fail_argument("entries", "one latent shape and text length, each with a flow tensor", e.latents.describe());
    rows += e.negative_prompt_embeds.empty() ? 1 : 2;
  }
  // Each entry's adapter on each of its rows (the transformer checks them against the bank).
  WanLoraSelection lora{lora_bank, {}};
  for (const WanBatchEntry& e : entries) lora.adapters.insert(lora.adapters.end(), e.negative_prompt_embeds.empty() ? 1 : 2, e.lora_adapter);
  const bool with_lora = lora.any();
  const Device device = transformer_.device();
  const int64_t count = shape_numel(latent_shape), text_count = text_len * text_dim;
  Shape batch_shape = latent_shape;
  batch_shape[0] = rows;
  if (rows != rows_ || latent_shape != latent_shape_ || text_len != text_len_) {
    host_input_ = Tensor::empty(batch_shape, DType::kF32);
    host_timestep_ = Tensor::empty({rows}, DType::kF32);
    host_text_ = Tensor::empty({rows, text_len, text_dim}, DType::kF32);
    host_prediction_ = Tensor::empty(batch_shape, DType::kF32);
    if (device.is_cpu()) {
      input_ = host_input_, timestep_ = host_timestep_, text_ = host_text_, prediction_ = host_prediction_;
    } else {
      input_ = Tensor::empty(batch_shape, DType::kF32, device);
      timestep_ = Tensor::empty({rows}, DType::kF32, device);
      text_ = Tensor::empty({rows, text_len, text_dim}, DType::kF32, device);
      prediction_ = Tensor::empty(batch_shape, DType::kF32, device);
    }
    workspace_.reserve(transformer_.workspace_bytes(ctx, rows, latent_shape[2], latent_shape[3], latent_shape[4], text_len, false, 0,
                                                    lora_bank != nullptr ? lora_bank->max_rank() : 0));
    rows_ = rows, latent_shape_ = latent_shape, text_len_ = text_len;
    text_ids_.clear();
  }
  std::vector<uint64_t> text_ids;
  for (const WanBatchEntry& e : entries) text_ids.push_back(e.text_id);
  const bool same_texts = text_ids == text_ids_ && std::find(text_ids.begin(), text_ids.end(), 0) == text_ids.end();
  // Rows in entry order: an entry's conditional row, then its unconditional one (as the
  // single-generation predictors order a CFG batch).
  int64_t row = 0;
  const auto put = [&](const WanBatchEntry& e, const TensorView& text) {
    std::memcpy(host_input_.data_as<float>() + row * count, e.latents.data(), e.latents.nbytes());
    host_timestep_.data_as<float>()[row] = static_cast<float>(e.timestep);
    if (!same_texts) std::memcpy(host_text_.data_as<float>() + row * text_count, text.data(), text.nbytes());
    ++row;
  };
  for (const WanBatchEntry& e : entries) {
    put(e, e.prompt_embeds);
    if (!e.negative_prompt_embeds.empty()) put(e, e.negative_prompt_embeds);
  }
  if (!device.is_cpu()) {
    copy_bytes(input_.data(), device, host_input_.data(), Device::cpu(), host_input_.nbytes());
    copy_bytes(timestep_.data(), device, host_timestep_.data(), Device::cpu(), host_timestep_.nbytes());
    if (!same_texts) copy_bytes(text_.data(), device, host_text_.data(), Device::cpu(), host_text_.nbytes());
  }
  text_ids_ = std::move(text_ids);
  ExecContext run_ctx = ctx.with_workspace(&workspace_);
  run_ctx.device = device;
  transformer_.forward(run_ctx, step, input_, timestep_, text_, prediction_, nullptr, nullptr, with_lora ? &lora : nullptr);
#ifdef TESSEL_WITH_CUDA
  // copy_bytes is ordered after the legacy default stream only: wait for the caller's stream.
  if (!device.is_cpu() && cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream)) != cudaSuccess)
    throw Error("Wan batched step: the forward failed on " + device.str());
#endif
  if (!device.is_cpu()) copy_bytes(host_prediction_.data(), Device::cpu(), prediction_.data(), device, host_prediction_.nbytes());
  row = 0;
  for (const WanBatchEntry& e : entries) {
    if (!e.flow->defined() || e.flow->shape() != latent_shape) *e.flow = Tensor::empty(latent_shape, DType::kF32);
    const float* cond = host_prediction_.data_as<const float>() + row * count;
    float* out = e.flow->data_as<float>();
    if (e.negative_prompt_embeds.empty()) {
      std::memcpy(out, cond, static_cast<size_t>(count) * sizeof(float));
      row += 1;
      continue;
    }
    combine_guidance(cond, cond + count, e.guidance_scale, out, count);
    row += 2;
  }
}

}  // namespace tessel
