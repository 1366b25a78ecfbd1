// The CPU flow predictor of the Wan denoising loop (see wan_flow_predictor.h).
#include "wan_flow_predictor.h"

#include <cstring>
#include <vector>

#include "tessel/parallel/cfg_parallel.h"

namespace tessel {
namespace {

// Stacks the rows of `parts` (each (1, ...), the same shape) along the batch axis.
Tensor stack_batch(const std::vector<const TensorView*>& parts) {
  Shape shape = parts.front()->shape();
  shape[0] = static_cast<int64_t>(parts.size());
  Tensor out = Tensor::empty(shape, DType::kF32);
  char* destination = static_cast<char*>(out.data());
  for (const TensorView* part : parts) {
    std::memcpy(destination, part->data(), part->nbytes());
    destination += part->nbytes();
  }
  return out;
}

class CpuFlowPredictor final : public WanFlowPredictor {
 public:
  explicit CpuFlowPredictor(const WanFlowRequest& request)
      : request_(request),
        guided_(request.guided),
        cfg_parallel_(guided_ && request.cfg_group != nullptr && request.cfg_group->size() == 2),
        branch_(cfg_parallel_ ? cfg_branch(*request.cfg_group) : 0),
        batch_(guided_ && !cfg_parallel_ ? 2 : 1) {
    const TensorView& prompt = request.prompt_embeds;
    const TensorView& negative = request.negative_prompt_embeds;
    text_ = !guided_       ? stack_batch({&prompt})
            : cfg_parallel_ ? stack_batch({branch_ == 0 ? &prompt : &negative})
                            : stack_batch({&prompt, &negative});
    if (!request.image_embeds.empty()) image_ = stack_batch(std::vector<const TensorView*>(static_cast<size_t>(batch_), &request.image_embeds));
    Shape batch_shape = request.latent_shape;
    batch_shape[0] = batch_;
    Shape input_shape = batch_shape;
    input_shape[1] += request.condition.empty() ? 0 : request.condition.size(1);
    model_input_ = Tensor::empty(input_shape, DType::kF32);
    prediction_ = Tensor::empty(batch_shape, DType::kF32);
    Shape branches_shape = batch_shape;  // (2, 1, ...): the gathered branches, in branch order
    branches_shape.insert(branches_shape.begin(), 2);
    if (cfg_parallel_) branches_ = Tensor::empty(branches_shape, DType::kF32);
    // With a given first frame each latent frame has its timestep: 0 on the first, the step's t
    // on the others (the pipeline checked the patch spans one frame).
    if (request.first_frame.empty())
      timestep_ = Tensor::empty({batch_}, DType::kF32);
    else
      timestep_ = Tensor::empty({batch_, request.latent_shape[2]}, DType::kF32);
    guided_prediction_ = Tensor::empty(request.latent_shape, DType::kF32);
  }

  TensorView predict(const ExecContext& ctx, int64_t step, int64_t total_steps, const TensorView& latents,
                     double timestep) override {
    const int64_t count = latents.numel();
    // A row of the model input: the latents' channels, then the condition's (image-to-video).
    const TensorView& condition = request_.condition;
    const int64_t row = count + (condition.empty() ? 0 : condition.numel());
    for (int64_t b = 0; b < batch_; ++b) {
      float* input_row = model_input_.data_as<float>() + b * row;
      std::memcpy(input_row, latents.data(), latents.nbytes());
      if (!condition.empty()) std::memcpy(input_row + count, condition.data(), condition.nbytes());
      if (!request_.first_frame.empty()) put_first_frame(request_.first_frame, request_.latent_shape[2], input_row);
    }
    fill_step_timesteps(timestep_.data_as<float>(), batch_, timestep_.numel() / batch_, request_.first_frame.empty() ? 0 : 1,
                        static_cast<float>(timestep));
    const StepInfo info = StepInfo::at(step, total_steps, 0, branch_);
    WanLoraSelection selection;
    const WanLoraSelection* lora = flow_lora(request_, batch_, selection);
    if (image_.defined())
      request_.transformer->forward(ctx, info, model_input_, timestep_, text_, image_, prediction_, nullptr, request_.block_cache, lora);
    else
      request_.transformer->forward(ctx, info, model_input_, timestep_, text_, prediction_, nullptr, request_.block_cache, lora);
    if (cfg_parallel_) gather_cfg_branches(ctx, *request_.cfg_group, prediction_.view(), branches_.view());
    // Without guidance the prediction is the conditional branch's alone, of the latent shape.
    if (!guided_) return TensorView(prediction_.data(), DType::kF32, Device::cpu(), request_.latent_shape);
    const float* cond = (cfg_parallel_ ? branches_ : prediction_).data_as<const float>();
    const float* uncond = cond + count;
    combine_guidance(cond, uncond, request_.guidance_scale, guided_prediction_.data_as<float>(), count);
    return guided_prediction_.view();
  }

 private:
  WanFlowRequest request_;
  bool guided_, cfg_parallel_;
  int branch_;
  int64_t batch_;
  Tensor text_, image_, model_input_, prediction_, branches_, timestep_, guided_prediction_;
};

}  // namespace

const WanLoraSelection* flow_lora(const WanFlowRequest& request, int64_t rows, WanLoraSelection& storage) {
  if (request.lora_bank == nullptr || request.lora_adapter < 0) return nullptr;
  storage.bank = request.lora_bank;
  storage.adapters.assign(static_cast<size_t>(rows), request.lora_adapter);
  return &storage;
}

void combine_guidance(const float* cond, const float* uncond, double scale, float* out, int64_t count) {
  const auto s = static_cast<float>(scale);
  for (int64_t i = 0; i < count; ++i) out[i] = uncond[i] + s * (cond[i] - uncond[i]);
}

void put_first_frame(const TensorView& first_frame, int64_t frames, float* video) {
  const int64_t channels = first_frame.size(1), plane = first_frame.size(3) * first_frame.size(4);
  for (int64_t channel = 0; channel < channels; ++channel)
    std::memcpy(video + channel * frames * plane, first_frame.data_as<float>() + channel * plane, static_cast<size_t>(plane) * sizeof(float));
}

void fill_step_timesteps(float* out, int64_t rows, int64_t per_row, int64_t zeros, float timestep) {
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t i = 0; i < per_row; ++i) out[row * per_row + i] = i < zeros ? 0.0f : timestep;
}

std::unique_ptr<WanFlowPredictor> make_cpu_flow_predictor(const WanFlowRequest& request) {
  return std::make_unique<CpuFlowPredictor>(request);
}

}  // namespace tessel
