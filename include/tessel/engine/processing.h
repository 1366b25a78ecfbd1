// Pre- and post-processing by model type, in the engine's process (as the workers only denoise):
// a pre-processor checks and completes a request before it is queued (size and frame rules of the
// model, prompt length, bounds on steps) and throws Error naming the field it refuses, so a bad
// request never reaches a worker; a post-processor encodes a runner's raw outputs (PNG pictures,
// an MP4 video, or the latents as safetensors for a model without a decoder).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tessel/core/tensor.h"
#include "tessel/engine/request.h"

namespace tessel::engine {

using PreProcessor = std::function<void(GenerationRequest& request)>;
using PostProcessor = std::function<std::vector<EncodedMedia>(const GenerationRequest& request, const std::vector<Tensor>& outputs)>;
// A pre-processed request's deadline for its run in seconds (> 0), sized from the model and the
// request: the engine's automatic request timeout (EngineConfig::request_timeout_auto).
using DeadlineEstimator = std::function<double(const GenerationRequest& request)>;

class ProcessorRegistry {
 public:
  // `deadline` may be empty: the model type then takes fixed request timeouts only.
  void add(const std::string& model_type, PreProcessor pre, PostProcessor post, DeadlineEstimator deadline = {});
  bool has(const std::string& model_type) const { return entries_.count(model_type) != 0; }
  bool has_deadline(const std::string& model_type) const { return has(model_type) && entry(model_type).deadline; }
  // Throws Error naming the model type when it has no deadline estimator.
  double deadline_seconds(const std::string& model_type, const GenerationRequest& request) const;
  // Throw Error naming the model type when none is registered.
  void pre_process(const std::string& model_type, GenerationRequest& request) const;
  std::vector<EncodedMedia> post_process(const std::string& model_type, const GenerationRequest& request,
                                         const std::vector<Tensor>& outputs) const;

 private:
  struct Entry {
    PreProcessor pre;
    PostProcessor post;
    DeadlineEstimator deadline;
  };
  const Entry& entry(const std::string& model_type) const;
  std::map<std::string, Entry> entries_;
};

// Encodes tensors as one safetensors file in memory ("output_0", "output_1", ...), with `metadata`.
EncodedMedia encode_safetensors(const std::vector<Tensor>& outputs, const std::map<std::string, std::string>& metadata);

}  // namespace tessel::engine
