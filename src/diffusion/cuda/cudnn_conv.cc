// cuDNN's convolution API of descriptors (see cudnn_conv.h): compact, and what PyTorch's own
// fp32 Conv3d ran on for years; cuDNN 9 still ships it.
#include "cuda/cudnn_conv.h"

#include <array>

#include "cuda/cudnn_library.h"
#include "tessel/core/error.h"

namespace tessel::vae::cuda {
namespace {

std::array<int, 5> packed_strides(const std::array<int, 5>& dims) {
  std::array<int, 5> strides{};
  int stride = 1;
  for (int d = 4; d >= 0; --d) {
    strides[static_cast<size_t>(d)] = stride;
    stride *= dims[static_cast<size_t>(d)];
  }
  return strides;
}

int as_int(int64_t value, const char* what) {
  if (value <= 0 || value > (int64_t{1} << 31) - 1)
    throw Error(detail::concat("Wan VAE convolution: ", what, " ", value, " is outside cuDNN's int range"));
  return static_cast<int>(value);
}

}  // namespace

struct CudnnConvolutions::Plan {
  cudnnTensorDescriptor_t input = nullptr, output = nullptr;
  cudnnFilterDescriptor_t filter = nullptr;
  cudnnConvolutionDescriptor_t convolution = nullptr;
  cudnnConvolutionFwdAlgo_t algorithm{};
  size_t workspace_bytes = 0;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (convolution) cudnn().cudnnDestroyConvolutionDescriptor(convolution);
    if (filter) cudnn().cudnnDestroyFilterDescriptor(filter);
    if (output) cudnn().cudnnDestroyTensorDescriptor(output);
    if (input) cudnn().cudnnDestroyTensorDescriptor(input);
  }
};

CudnnConvolutions::CudnnConvolutions() {
  cudnnHandle_t handle = nullptr;
  check_cudnn(cudnn().cudnnCreate(&handle), "cudnnCreate");
  handle_ = handle;
}

CudnnConvolutions::~CudnnConvolutions() {
  plans_.clear();
  if (handle_) cudnn().cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

const CudnnConvolutions::Plan& CudnnConvolutions::plan_for(const ConvGeometry& g) {
  const auto found = plans_.find(g);
  if (found != plans_.end()) return *found->second;
  const cudnnHandle_t handle = static_cast<cudnnHandle_t>(handle_);
  auto plan = std::make_unique<Plan>();
  const std::array<int, 5> in_dims = {1, as_int(g.in_channels, "input channels"), as_int(g.frames, "frames"),
                                      as_int(g.height, "height"), as_int(g.width, "width")};
  const std::array<int, 5> out_dims = {1, as_int(g.out_channels, "output channels"), as_int(g.out_frames(), "output frames"),
                                       as_int(g.out_height(), "output height"), as_int(g.out_width(), "output width")};
  const std::array<int, 5> filter_dims = {out_dims[1], in_dims[1], as_int(g.kt, "kt"), as_int(g.kh, "kh"), as_int(g.kw, "kw")};
  const std::array<int, 5> in_strides = packed_strides(in_dims), out_strides = packed_strides(out_dims);
  const std::array<int, 3> padding = {0, static_cast<int>(g.row_padding()), g.pad_space ? static_cast<int>(g.kw / 2) : 0};
  const std::array<int, 3> strides = {as_int(g.time_stride, "time stride"), as_int(g.space_stride, "space stride"),
                                      as_int(g.space_stride, "space stride")};
  const std::array<int, 3> ones = {1, 1, 1};

  check_cudnn(cudnn().cudnnCreateTensorDescriptor(&plan->input), "tensor descriptor");
  check_cudnn(cudnn().cudnnSetTensorNdDescriptor(plan->input, CUDNN_DATA_FLOAT, 5, in_dims.data(), in_strides.data()), "input descriptor");
  check_cudnn(cudnn().cudnnCreateTensorDescriptor(&plan->output), "tensor descriptor");
  check_cudnn(cudnn().cudnnSetTensorNdDescriptor(plan->output, CUDNN_DATA_FLOAT, 5, out_dims.data(), out_strides.data()),
              "output descriptor");
  check_cudnn(cudnn().cudnnCreateFilterDescriptor(&plan->filter), "filter descriptor");
  check_cudnn(cudnn().cudnnSetFilterNdDescriptor(plan->filter, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 5, filter_dims.data()),
              "filter descriptor");
  check_cudnn(cudnn().cudnnCreateConvolutionDescriptor(&plan->convolution), "convolution descriptor");
  check_cudnn(cudnn().cudnnSetConvolutionNdDescriptor(plan->convolution, 3, padding.data(), strides.data(), ones.data(),
                                                      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
              "convolution descriptor");
  // FMA math keeps every product in fp32; default math lets fp32 convolutions use TF32 tensor cores,
  // as PyTorch does unless torch.backends.cudnn.allow_tf32 is turned off.
  const cudnnMathType_t math = g.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  check_cudnn(cudnn().cudnnSetConvolutionMathType(plan->convolution, math), "math type");

  std::array<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT> candidates{};
  int returned = 0;
  check_cudnn(cudnn().cudnnGetConvolutionForwardAlgorithm_v7(handle, plan->input, plan->filter, plan->convolution, plan->output,
                                                             static_cast<int>(candidates.size()), &returned, candidates.data()),
              "algorithm heuristic");
  // The heuristic's order, best first: the first that is supported under the math type asked for
  // and fits the scratch limit. PyTorch likewise applies the math type a TF32 candidate carries.
  bool chosen = false;
  for (int i = 0; i < returned && !chosen; ++i) {
    const cudnnConvolutionFwdAlgoPerf_t& candidate = candidates[static_cast<size_t>(i)];
    if (candidate.status != CUDNN_STATUS_SUCCESS) continue;
    // Never a candidate that may convert fp32 data down to fp16 or bf16.
    if (candidate.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
    if (!g.tf32 && candidate.mathType == CUDNN_TENSOR_OP_MATH) continue;
    if (g.tf32 && cudnn().cudnnSetConvolutionMathType(plan->convolution, candidate.mathType) != CUDNN_STATUS_SUCCESS) continue;
    size_t bytes = 0;
    if (cudnn().cudnnGetConvolutionForwardWorkspaceSize(handle, plan->input, plan->filter, plan->convolution, plan->output,
                                                        candidate.algo, &bytes) != CUDNN_STATUS_SUCCESS ||
        bytes > kMaxWorkspaceBytes)
      continue;
    plan->algorithm = candidate.algo;
    plan->workspace_bytes = bytes;
    chosen = true;
  }
  if (!chosen)
    throw Error(detail::concat("cuDNN has no fp32 algorithm for the Wan VAE convolution (", g.in_channels, " -> ", g.out_channels,
                               " channels, kernel ", g.kt, "x", g.kh, "x", g.kw, ", input ", g.frames, "x", g.height, "x", g.width,
                               g.tf32 ? ", TF32 allowed" : ", no TF32", ") within ", kMaxWorkspaceBytes, " bytes of scratch"));
  return *plans_.emplace(g, std::move(plan)).first->second;
}

void CudnnConvolutions::forward(const ConvGeometry& geometry, const float* x, const float* weight, float* y,
                                DeviceBufferPool& buffers, cudaStream_t stream) {
  const Plan& plan = plan_for(geometry);
  const cudnnHandle_t handle = static_cast<cudnnHandle_t>(handle_);
  check_cudnn(cudnn().cudnnSetStream(handle, stream), "cudnnSetStream");
  const DeviceBuffer scratch = plan.workspace_bytes > 0 ? buffers.take(static_cast<int64_t>((plan.workspace_bytes + 3) / 4))
                                                        : DeviceBuffer();
  const float alpha = 1.0f, beta = 0.0f;
  check_cudnn(cudnn().cudnnConvolutionForward(handle, &alpha, plan.input, x, plan.filter, weight, plan.convolution, plan.algorithm,
                                              scratch.data(), plan.workspace_bytes, &beta, plan.output, y),
              "convolution forward");
}

}  // namespace tessel::vae::cuda
