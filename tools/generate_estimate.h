// The memory and work of a `tessel generate` run, estimated from the model directory's configs and
// the flags before any weight is read (work_budget.h checks it).
#pragma once

#include <cstdint>

#include "parallel_flags.h"
#include "tessel/core/device.h"
#include "tessel/diffusion/wan_generator.h"
#include "tessel/diffusion/wan_pipeline.h"
#include "work_budget.h"

namespace tessel::cli {

struct GenerateShape {
  WanVideoSize size;
  int64_t steps = 50;
  int64_t num_outputs = 1;
  bool guided = true;        // --guidance > 1: two rows per output
  bool text_encoder = true;  // --prompt: the text encoder is loaded
  bool decode = true;        // the output is a video (not latents): the VAE decodes it
  // Image to video: the frames the VAE encodes on the CPU (I2V's condition video: all of them;
  // TI2V's first frame: 1); 0 without an image.
  int64_t encoded_frames = 0;
  bool fp8_weights = false;  // --weights fp8 (CUDA): the block linears in e4m3
  bool fp8_attention = false;  // --attention-dtype fp8 (CUDA): the self-attention's e4m3 operands
};

// One rank's share under sequence parallelism and CFG-parallel (`parallel`). On the CPU: the
// transformers in fp32, the text encoder in fp32, one forward's activations and the VAE's weights,
// with the VAE decode's activations and the video after the loop. On CUDA the same on the device
// (bf16 transformers and text encoder, the CUDA decoder's pool), the VAE and the video on the host.
WorkEstimate generate_estimate(const WanModelDir& model, const GenerateShape& shape, const ParallelFlags& parallel, Device device);

}  // namespace tessel::cli
