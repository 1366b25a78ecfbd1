// The CUDA flow predictor of the Wan denoising loop (see wan_flow_predictor.h): the transformer's
// inputs and outputs stay on the device; one upload of the latents and one download of the guided
// flow per step, through pinned host buffers so both copies run at the bus's speed. Under
// CFG-parallel (a group of two ranks, one GPU each) each rank runs its guidance branch at batch 1
// and the two predictions are gathered over NCCL before the guidance kernel.
//
// Image to video: what is constant over a request goes to the device once, at construction — the
// condition channels (mask and encoded video) into the tail of every batch row of the model input,
// where no step overwrites them, and the CLIP features once per row. TI2V's first frame is put over
// the latents on the host, in the pinned buffer the step uploads anyway, and its timestep 0 travels
// in the per-frame timesteps uploaded with the step.
#include <cuda_runtime.h>

#include <cstring>

#include "cuda/vector_ops.h"
#include "tessel/core/allocator.h"
#include "tessel/core/error.h"
#include "tessel/kernels/cuda/device_guard.h"
#include "tessel/kernels/cuda/launch_check.h"
#include "tessel/parallel/cfg_parallel.h"
#include "wan_flow_predictor.h"

namespace tessel {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(detail::concat("Wan CUDA denoising loop: ", what, ": ", cudaGetErrorString(status)));
}

class CudaFlowPredictor final : public WanFlowPredictor {
 public:
  CudaFlowPredictor(const ExecContext& ctx, const WanFlowRequest& request)
      : request_(request),
        device_(request.transformer->device()),
        guided_(request.guided),
        cfg_parallel_(guided_ && request.cfg_group != nullptr && request.cfg_group->size() == 2),
        branch_(cfg_parallel_ ? cfg_branch(*request.cfg_group) : 0),
        batch_(guided_ && !cfg_parallel_ ? 2 : 1),
        count_(shape_numel(request.latent_shape)),
        row_(count_ + (request.condition.empty() ? 0 : request.condition.numel())),  // an empty view's numel is 1
        workspace_(device_) {
    if (cfg_parallel_ && !(request.cfg_group->device() == device_))
      fail_argument("cfg_group", "a communicator of " + device_.str() + " tensors (NCCL)", request.cfg_group->device().str());
    if (ctx.device.is_cuda() && ctx.device != device_)
      fail_argument("ctx.device", "the transformer's device " + device_.str(), ctx.device.str());
    const tessel::cuda::DeviceGuard guard(device_.index);
    const TensorView& prompt = request.prompt_embeds;
    text_len_ = prompt.size(1);
    const size_t branch_bytes = static_cast<size_t>(count_) * sizeof(float);
    text_ = allocate(prompt.nbytes() * static_cast<size_t>(batch_), MemoryKind::kDevice, device_.index);
    // This rank's branch (CFG-parallel), else the conditional one first and the unconditional second.
    const TensorView& first = cfg_parallel_ && branch_ == 1 ? request.negative_prompt_embeds : prompt;
    copy_bytes(text_.get(), device_, first.data(), Device::cpu(), prompt.nbytes());
    if (batch_ == 2)
      copy_bytes(static_cast<char*>(text_.get()) + prompt.nbytes(), device_, request.negative_prompt_embeds.data(), Device::cpu(),
                 prompt.nbytes());
    model_input_ = allocate(static_cast<size_t>(row_ * batch_) * sizeof(float), MemoryKind::kDevice, device_.index);
    auto* input = static_cast<float*>(model_input_.get());
    for (int64_t b = 0; b < batch_ && !request.condition.empty(); ++b)
      copy_bytes(input + b * row_ + count_, device_, request.condition.data(), Device::cpu(), request.condition.nbytes());
    if (!request.image_embeds.empty()) {
      const size_t image_bytes = request.image_embeds.nbytes();
      image_ = allocate(image_bytes * static_cast<size_t>(batch_), MemoryKind::kDevice, device_.index);
      for (int64_t b = 0; b < batch_; ++b)
        copy_bytes(static_cast<char*>(image_.get()) + b * image_bytes, device_, request.image_embeds.data(), Device::cpu(), image_bytes);
    }
    prediction_ = allocate(branch_bytes * static_cast<size_t>(batch_), MemoryKind::kDevice, device_.index);
    guided_flow_ = allocate(branch_bytes, MemoryKind::kDevice, device_.index);
    if (cfg_parallel_) branches_ = allocate(2 * branch_bytes, MemoryKind::kDevice, device_.index);
    // One timestep per row, or with a given first frame one per latent frame (the first at 0; the
    // pipeline checked the patch spans one frame).
    const Shape& latent = request.latent_shape;
    if (!request.first_frame.empty()) timesteps_per_row_ = latent[2];
    const size_t timestep_bytes = sizeof(float) * static_cast<size_t>(batch_ * timesteps_per_row_);
    timestep_ = allocate(timestep_bytes, MemoryKind::kDevice, device_.index);
    host_latents_ = allocate(branch_bytes, MemoryKind::kPinnedHost);
    host_flow_ = allocate(branch_bytes, MemoryKind::kPinnedHost);
    host_timestep_ = allocate(timestep_bytes, MemoryKind::kPinnedHost);
    // The transformer's activations: sized once here, so no step allocates.
    workspace_.reserve(request.transformer->workspace_bytes(ctx, batch_, latent[2], latent[3], latent[4], text_len_,
                                                            !request.first_frame.empty(),
                                                            request.image_embeds.empty() ? 0 : request.image_embeds.size(1),
                                                            request.lora_bank != nullptr ? request.lora_bank->max_rank() : 0));
  }

  TensorView predict(const ExecContext& ctx, int64_t step, int64_t total_steps, const TensorView& latents,
                     double timestep) override {
    const tessel::cuda::DeviceGuard guard(device_.index);
    const auto stream = static_cast<cudaStream_t>(ctx.stream);
    const size_t branch_bytes = static_cast<size_t>(count_) * sizeof(float);
    auto* host_latents = static_cast<float*>(host_latents_.get());
    std::memcpy(host_latents, latents.data(), branch_bytes);
    if (!request_.first_frame.empty()) put_first_frame(request_.first_frame, request_.latent_shape[2], host_latents);
    auto* host_timestep = static_cast<float*>(host_timestep_.get());
    fill_step_timesteps(host_timestep, batch_, timesteps_per_row_, request_.first_frame.empty() ? 0 : 1, static_cast<float>(timestep));
    // The latents into the head of each row (the condition channels after them stay as uploaded).
    auto* input = static_cast<float*>(model_input_.get());
    check_cuda(cudaMemcpyAsync(input, host_latents, branch_bytes, cudaMemcpyHostToDevice, stream), "latents upload");
    if (batch_ == 2)
      check_cuda(cudaMemcpyAsync(input + row_, input, branch_bytes, cudaMemcpyDeviceToDevice, stream), "latents batch copy");
    check_cuda(cudaMemcpyAsync(timestep_.get(), host_timestep, sizeof(float) * static_cast<size_t>(batch_ * timesteps_per_row_),
                               cudaMemcpyHostToDevice, stream),
               "timestep upload");

    Shape batch_shape = request_.latent_shape;
    batch_shape[0] = batch_;
    Shape input_shape = batch_shape;
    input_shape[1] += request_.condition.empty() ? 0 : request_.condition.size(1);
    const Shape text_shape{batch_, text_len_, request_.prompt_embeds.size(2)};
    const Shape timestep_shape = request_.first_frame.empty() ? Shape{batch_} : Shape{batch_, timesteps_per_row_};
    const ExecContext run_ctx = device_context(ctx);
    const StepInfo info = StepInfo::at(step, total_steps, 0, branch_);
    WanLoraSelection selection;
    const WanLoraSelection* lora = flow_lora(request_, batch_, selection);
    const TensorView input_view(input, DType::kF32, device_, input_shape), timestep_view(timestep_.get(), DType::kF32, device_, timestep_shape);
    const TensorView text_view(text_.get(), DType::kF32, device_, text_shape), out_view(prediction_.get(), DType::kF32, device_, batch_shape);
    if (image_) {
      const Shape image_shape{batch_, request_.image_embeds.size(1), request_.image_embeds.size(2)};
      request_.transformer->forward(run_ctx, info, input_view, timestep_view, text_view, TensorView(image_.get(), DType::kF32, device_, image_shape),
                                    out_view, nullptr, request_.block_cache, lora);
    } else {
      request_.transformer->forward(run_ctx, info, input_view, timestep_view, text_view, out_view, nullptr, request_.block_cache, lora);
    }
    const auto* prediction = static_cast<const float*>(prediction_.get());
    if (cfg_parallel_) {  // both branches on both ranks, in branch order
      Shape both = batch_shape;
      both.insert(both.begin(), 2);
      gather_cfg_branches(run_ctx, *request_.cfg_group, TensorView(prediction_.get(), DType::kF32, device_, batch_shape),
                          TensorView(branches_.get(), DType::kF32, device_, both));
      prediction = static_cast<const float*>(branches_.get());
    }
    const float* flow = prediction;  // without guidance: the conditional branch
    if (guided_) {
      diffusion::cuda::launch_cfg_guidance(prediction, prediction + count_, static_cast<float>(request_.guidance_scale),
                                           static_cast<float*>(guided_flow_.get()), count_, stream);
      tessel::cuda::check_launch("CFG guidance");
      flow = static_cast<const float*>(guided_flow_.get());
    }
    check_cuda(cudaMemcpyAsync(host_flow_.get(), flow, branch_bytes, cudaMemcpyDeviceToHost, stream), "flow download");
    check_cuda(cudaStreamSynchronize(stream), "step synchronization");
    return TensorView(host_flow_.get(), DType::kF32, Device::cpu(), request_.latent_shape);
  }

 private:
  // The caller's context on the transformer's device with this predictor's workspace.
  ExecContext device_context(const ExecContext& ctx) {
    ExecContext run_ctx = ctx.with_workspace(&workspace_);
    run_ctx.device = device_;
    return run_ctx;
  }

  WanFlowRequest request_;
  Device device_;
  bool guided_, cfg_parallel_;
  int branch_;
  // Elements of the latents and of one model-input row (the latents, then the condition channels).
  int64_t batch_, count_, row_, text_len_ = 0;
  int64_t timesteps_per_row_ = 1;  // a given first frame: a timestep per latent frame
  Workspace workspace_;
  std::shared_ptr<void> text_, image_, model_input_, prediction_, guided_flow_, timestep_, branches_;
  std::shared_ptr<void> host_latents_, host_flow_, host_timestep_;
};

}  // namespace

std::unique_ptr<WanFlowPredictor> make_cuda_flow_predictor(const ExecContext& ctx, const WanFlowRequest& request) {
  return std::make_unique<CudaFlowPredictor>(ctx, request);
}

}  // namespace tessel
