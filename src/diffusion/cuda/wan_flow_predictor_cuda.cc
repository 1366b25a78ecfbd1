// The CUDA flow predictor of the Wan denoising loop (see wan_flow_predictor.h): the transformer's
// inputs and outputs stay on the device; one upload of the latents and one download of the guided
// flow per step, through pinned host buffers so both copies run at the bus's speed. Under
// CFG-parallel (a group of two ranks, one GPU each) each rank runs its guidance branch at batch 1
// and the two predictions are gathered over NCCL before the guidance kernel.
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
    model_input_ = allocate(branch_bytes * static_cast<size_t>(batch_), MemoryKind::kDevice, device_.index);
    prediction_ = allocate(branch_bytes * static_cast<size_t>(batch_), MemoryKind::kDevice, device_.index);
    guided_flow_ = allocate(branch_bytes, MemoryKind::kDevice, device_.index);
    if (cfg_parallel_) branches_ = allocate(2 * branch_bytes, MemoryKind::kDevice, device_.index);
    timestep_ = allocate(sizeof(float) * static_cast<size_t>(batch_), MemoryKind::kDevice, device_.index);
    host_latents_ = allocate(branch_bytes, MemoryKind::kPinnedHost);
    host_flow_ = allocate(branch_bytes, MemoryKind::kPinnedHost);
    host_timestep_ = allocate(sizeof(float) * static_cast<size_t>(batch_), MemoryKind::kPinnedHost);
    // The transformer's activations: sized once here, so no step allocates.
    const Shape& latent = request.latent_shape;
    workspace_.reserve(request.transformer->workspace_bytes(ctx, batch_, latent[2], latent[3], latent[4], text_len_));
  }

  TensorView predict(const ExecContext& ctx, int64_t step, int64_t total_steps, const TensorView& latents,
                     double timestep) override {
    const tessel::cuda::DeviceGuard guard(device_.index);
    const auto stream = static_cast<cudaStream_t>(ctx.stream);
    const size_t branch_bytes = static_cast<size_t>(count_) * sizeof(float);
    std::memcpy(host_latents_.get(), latents.data(), branch_bytes);
    auto* host_timestep = static_cast<float*>(host_timestep_.get());
    for (int64_t b = 0; b < batch_; ++b) host_timestep[b] = static_cast<float>(timestep);
    auto* input = static_cast<float*>(model_input_.get());
    check_cuda(cudaMemcpyAsync(input, host_latents_.get(), branch_bytes, cudaMemcpyHostToDevice, stream), "latents upload");
    if (batch_ == 2)
      check_cuda(cudaMemcpyAsync(input + count_, input, branch_bytes, cudaMemcpyDeviceToDevice, stream), "latents batch copy");
    check_cuda(cudaMemcpyAsync(timestep_.get(), host_timestep, sizeof(float) * static_cast<size_t>(batch_), cudaMemcpyHostToDevice,
                               stream),
               "timestep upload");

    Shape batch_shape = request_.latent_shape;
    batch_shape[0] = batch_;
    const Shape text_shape{batch_, text_len_, request_.prompt_embeds.size(2)};
    const ExecContext run_ctx = device_context(ctx);
    request_.transformer->forward(run_ctx, StepInfo::at(step, total_steps, 0, branch_),
                                  TensorView(input, DType::kF32, device_, batch_shape),
                                  TensorView(timestep_.get(), DType::kF32, device_, {batch_}),
                                  TensorView(text_.get(), DType::kF32, device_, text_shape),
                                  TensorView(prediction_.get(), DType::kF32, device_, batch_shape), nullptr, request_.block_cache);
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
  int64_t batch_, count_, text_len_ = 0;
  Workspace workspace_;
  std::shared_ptr<void> text_, model_input_, prediction_, guided_flow_, timestep_, branches_;
  std::shared_ptr<void> host_latents_, host_flow_, host_timestep_;
};

}  // namespace

std::unique_ptr<WanFlowPredictor> make_cuda_flow_predictor(const ExecContext& ctx, const WanFlowRequest& request) {
  return std::make_unique<CudaFlowPredictor>(ctx, request);
}

}  // namespace tessel
