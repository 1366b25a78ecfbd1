#include "tessel/engine/processing.h"

#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"

namespace tessel::engine {

void ProcessorRegistry::add(const std::string& model_type, PreProcessor pre, PostProcessor post, DeadlineEstimator deadline) {
  entries_[model_type] = Entry{std::move(pre), std::move(post), std::move(deadline)};
}

const ProcessorRegistry::Entry& ProcessorRegistry::entry(const std::string& model_type) const {
  const auto it = entries_.find(model_type);
  if (it == entries_.end()) fail_argument("model type", "one with processors registered", quoted_excerpt(model_type));
  return it->second;
}

void ProcessorRegistry::pre_process(const std::string& model_type, GenerationRequest& request) const {
  entry(model_type).pre(request);
}

double ProcessorRegistry::deadline_seconds(const std::string& model_type, const GenerationRequest& request) const {
  const Entry& found = entry(model_type);
  if (!found.deadline) fail_argument("model type", "one with a deadline estimator registered", quoted_excerpt(model_type));
  return found.deadline(request);
}

std::vector<EncodedMedia> ProcessorRegistry::post_process(const std::string& model_type, const GenerationRequest& request,
                                                          const std::vector<Tensor>& outputs) const {
  return entry(model_type).post(request, outputs);
}

EncodedMedia encode_safetensors(const std::vector<Tensor>& outputs, const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, TensorView>> named;
  for (size_t i = 0; i < outputs.size(); ++i) named.emplace_back("output_" + std::to_string(i), outputs[i].view());
  return EncodedMedia{"application/x-safetensors", safetensors_bytes(named, metadata)};
}

}  // namespace tessel::engine
