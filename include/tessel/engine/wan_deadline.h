// A Wan request's deadline for its run (the engine's automatic request timeout, `tessel serve
// --request-timeout auto`), sized from the model and the request: the arithmetic the request asks
// for (its denoising steps' transformer forwards over its rows, the text encoding of its prompts,
// the VAE's decode of each output and the encode of its reference images), at a deliberately low
// device rate, times a safety factor and the batch that may share the device, plus a fixed floor.
// A backstop against a run that goes on far past any sane time, never a limit a healthy run meets:
// a worker that stops stepping is caught by the heartbeat within seconds instead.
#pragma once

#include <optional>

#include "tessel/core/device.h"
#include "tessel/diffusion/umt5_encoder.h"
#include "tessel/diffusion/wan_vae.h"
#include "tessel/dit/wan_config.h"
#include "tessel/engine/request.h"
#include "tessel/engine/wan_serving.h"

namespace tessel {
struct WanModelDir;
}

namespace tessel::engine {

// The constants, stated once (docs/server.md repeats them):
// - CPU: 2 GFLOP/s per worker thread, 25x below the ~50 the fp32 kernels reach with AVX-512 (the
//   CLI's work estimate): CPUs without AVX-512, cores shared with the other ranks and processes.
// - CUDA: 30 TFLOP/s, a tenth of what a bf16 Wan forward reaches on an H100/H200 (300): block
//   offload's weight streaming, the fp32 VAE, sequence parallelism's communication, a busy GPU.
// - The VAE's encode of reference images runs on the CPU whatever the device (wan_vae_memory.h).
// - x 2 for what the rates still miss, x max_batch since up to that many requests step together
//   and share the device (a request batched with larger ones can still be slowed beyond it).
// - + 120 s for the run's costs no FLOP count sees: a sparse setting or LoRA adapter loaded from
//   disk the first time a request names it, the first use of the text encoder and the VAE.
inline constexpr double kWanDeadlineCpuFlopPerThread = 2e9;
inline constexpr double kWanDeadlineCudaFlop = 30e12;
inline constexpr double kWanDeadlineSafetyFactor = 2.0;
inline constexpr double kWanDeadlineFloorSeconds = 120.0;

// What a deadline is sized from: the model's shapes and where and how the workers run it.
struct WanDeadlineModel {
  WanConfig transformer;
  std::optional<WanConfig> transformer_2;   // Wan 2.2's low-noise expert (its steps' forwards)
  std::optional<WanVaeConfig> vae;          // none: the latents are the output (no decode)
  std::optional<UMT5Config> text_encoder;   // none: an embeddings file conditions every request
  int64_t vae_spatial_stride = 8;
  Device device = Device::cpu();
  int threads = 1;            // CPU threads of each worker
  int sequence_ranks = 1;     // Ulysses x Ring: the ranks sharing a forward's tokens
  bool cfg_parallel = false;  // the two guidance branches on two ranks
  int max_batch = 1;          // requests stepping together on the workers
};
// From a model directory, the workers' runner config (device, threads, parallel layout, an
// embeddings file instead of the text encoder) and the engine's max_batch.
WanDeadlineModel wan_deadline_model(const WanModelDir& model, const WanRunnerConfig& runner, int max_batch);

// The request's own work in seconds at the rates above (alone on the workers, no safety factor).
double wan_request_work_seconds(const WanDeadlineModel& model, const GenerationRequest& request);
// Its deadline: floor + safety factor x max_batch x its work, whole seconds.
double wan_request_deadline_seconds(const WanDeadlineModel& model, const GenerationRequest& request);

}  // namespace tessel::engine
