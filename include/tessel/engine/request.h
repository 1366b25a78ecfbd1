// What a client asks the engine for and what it gets back: the request (prompt, size, steps,
// guidance, seed, ...), its status and progress while queued or running, and the output (encoded
// media, or an error). The HTTP server maps its JSON bodies onto these; the engine passes them to
// the workers and back.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::engine {

enum class OutputKind : uint8_t { kImage, kVideo };
std::string_view output_kind_name(OutputKind kind);  // "image", "video"

struct GenerationRequest {
  std::string id;  // assigned by the engine at submission
  OutputKind kind = OutputKind::kImage;
  std::string prompt;
  std::string negative_prompt;
  int64_t width = 832;
  int64_t height = 480;
  int64_t frames = 1;        // 1 for an image
  int64_t num_outputs = 1;   // images per request (the OpenAI `n`), each its own seed (seed + i)
  int64_t num_inference_steps = 50;
  double guidance_scale = 5.0;
  // Wan 2.2's two experts: the low-noise expert's guidance scale; negative: unset (guidance_scale).
  double guidance_scale_2 = -1.0;
  uint64_t seed = 0;
  double fps = 16.0;         // video frame rate of the encoded output
  // The name of a sparse-attention setting the server offers (empty: the server's default).
  std::string sparse_attention;
  // The step cache: empty for the server's, or "none", or the server's own name.
  std::string cache;
  // The per-request LoRA adapter: empty for none, else a name the server was started with
  // (`tessel serve --lora-adapter NAME=PATH`). Requests of different adapters share batches.
  std::string lora;
  // Image to video: the first frame (the API's input_reference) and the last frame (last_frame), as
  // the client sent them: PNG or JPEG bytes the HTTP layer has decoded once to check them. Null:
  // none. Shared, since snapshots copy requests; they reach the workers as a message's payload
  // (wire_format.h) and are decoded there.
  std::shared_ptr<const std::string> image, last_image;
  // The request's deadline for its run, counted from its admission to the workers (its time in the
  // queue is not counted): set by the engine at submission (EngineConfig::request_timeout), not by
  // the client. 0: none. Past it the request is stopped between steps and fails.
  double timeout_seconds = 0.0;
};

enum class RequestStatus : uint8_t { kQueued, kRunning, kSucceeded, kFailed, kCancelled };
std::string_view request_status_name(RequestStatus status);  // "queued", "running", "succeeded", ...
inline bool is_final(RequestStatus status) { return status >= RequestStatus::kSucceeded; }

struct RequestProgress {
  std::string phase;  // "text encoding", "denoising", "decoding i/n" (the runner's phases); empty: unknown
  bool step_finished = true;  // false: a phase change or a decode chunk, not a denoising step
  int64_t step = 0;  // denoising steps finished over all outputs of the request
  int64_t total_steps = 0;
  double step_seconds = 0.0;  // the last step's time
  double elapsed_seconds = 0.0;
  double eta_seconds = 0.0;
  double attention_density = 1.0;  // mean self-attention density of the last step (1: dense)
  int64_t device_memory_used_bytes = -1;  // on rank 0's GPU after the last step; -1: no GPU
};

// One encoded picture or video.
struct EncodedMedia {
  std::string mime_type;  // e.g. "image/png", "video/mp4", "application/x-safetensors"
  std::string bytes;
};

struct GenerationOutput {
  RequestStatus status = RequestStatus::kSucceeded;
  std::string error;  // why, when failed or cancelled
  std::vector<EncodedMedia> media;
  int64_t steps_done = 0;
  double seconds = 0.0;  // from the start of the run to the output
};

}  // namespace tessel::engine
