#include "tessel/engine/pipeline_runner.h"

#include <filesystem>

#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/limited_json.h"

namespace tessel::engine {

RunnerOutput PipelineRunner::run(const GenerationRequest& request, const RunControl& control) {
  const std::unique_ptr<RunnerJob> job = begin(request, control);
  RunnerJob* const jobs[] = {job.get()};
  while (!job->done()) step(jobs);
  return finish(*job);
}

void RunnerRegistry::add(const std::string& model_type, RunnerFactory factory) { factories_[model_type] = std::move(factory); }

std::unique_ptr<PipelineRunner> RunnerRegistry::make(const std::string& model_type, const RunnerSetup& setup) const {
  const auto it = factories_.find(model_type);
  if (it == factories_.end()) {
    std::string known;
    for (const auto& [name, factory] : factories_) known += (known.empty() ? "" : ", ") + name;
    fail_argument("model type", "one of: " + (known.empty() ? std::string("(none registered)") : known), quoted_excerpt(model_type));
  }
  return it->second(setup);
}

std::vector<std::string> RunnerRegistry::model_types() const {
  std::vector<std::string> names;
  for (const auto& [name, factory] : factories_) names.push_back(name);
  return names;
}

std::string read_model_type(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "model_index.json").string();
  if (!std::filesystem::is_regular_file(path))
    fail_argument("model directory", "a directory with model_index.json", quoted_excerpt(model_dir));
  const nlohmann::json index = parse_json_limited(read_file_bounded(path, 1 << 20, "model_index.json"), JsonLimits{}, path);
  if (!index.is_object() || !index.contains("_class_name") || !index["_class_name"].is_string())
    fail_argument(path, "a JSON object with a string _class_name", json_excerpt(index));
  return index["_class_name"].get<std::string>();
}

}  // namespace tessel::engine
