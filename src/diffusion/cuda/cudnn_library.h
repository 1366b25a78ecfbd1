// cuDNN for the Wan VAE's convolutions (internal), opened at run time rather than linked: a build
// machine may have no cuDNN at all, and a GPU machine often has it only inside PyTorch's
// nvidia-cudnn wheel. A missing library fails the CUDA decode with a message saying where to find
// it, not every program that loads libtessel.
#pragma once

#include <cudnn.h>

namespace tessel::vae::cuda {

// The cuDNN functions the VAE calls, resolved once from libcudnn.so.<major> (the major version of
// the headers tessel was compiled against).
struct CudnnApi {
#define TESSEL_CUDNN_FUNCTIONS(X)           \
  X(cudnnGetVersion)                        \
  X(cudnnGetErrorString)                    \
  X(cudnnCreate)                            \
  X(cudnnDestroy)                           \
  X(cudnnSetStream)                         \
  X(cudnnCreateTensorDescriptor)            \
  X(cudnnDestroyTensorDescriptor)           \
  X(cudnnSetTensorNdDescriptor)             \
  X(cudnnCreateFilterDescriptor)            \
  X(cudnnDestroyFilterDescriptor)           \
  X(cudnnSetFilterNdDescriptor)             \
  X(cudnnCreateConvolutionDescriptor)       \
  X(cudnnDestroyConvolutionDescriptor)      \
  X(cudnnSetConvolutionNdDescriptor)        \
  X(cudnnSetConvolutionMathType)            \
  X(cudnnGetConvolutionForwardAlgorithm_v7) \
  X(cudnnGetConvolutionForwardWorkspaceSize) \
  X(cudnnConvolutionForward)
#define TESSEL_CUDNN_MEMBER(name) decltype(&::name) name = nullptr;
  TESSEL_CUDNN_FUNCTIONS(TESSEL_CUDNN_MEMBER)
#undef TESSEL_CUDNN_MEMBER
};

// Opens the library on the first call; throws Error naming the library and the fix when it cannot
// be opened or lacks a function.
const CudnnApi& cudnn();

// Throws Error "cuDNN <what> failed: <cuDNN's message>" unless `status` is success.
void check_cudnn(cudnnStatus_t status, const char* what);

}  // namespace tessel::vae::cuda
