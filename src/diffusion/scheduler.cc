#include "tessel/diffusion/scheduler.h"

#include <cmath>
#include <functional>
#include <map>

#include "scheduler_kinds.h"
#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/limited_json.h"

namespace tessel {
namespace {

constexpr uint64_t kMaxConfigBytes = 1 << 20;
constexpr int64_t kMaxTrainTimesteps = 1 << 20;
constexpr int64_t kMaxInferenceSteps = 100000;

std::string field(const std::string& source, const std::string& key) { return source + ": " + key; }

int64_t integer(const nlohmann::json& value, const std::string& name) {
  if (!value.is_number_integer()) fail_argument(name, "an integer", json_excerpt(value));
  return value.get<int64_t>();
}

double number(const nlohmann::json& value, const std::string& name) {
  if (!value.is_number()) fail_argument(name, "a number", json_excerpt(value));
  return value.get<double>();
}

bool boolean(const nlohmann::json& value, const std::string& name) {
  if (!value.is_boolean()) fail_argument(name, "true or false", json_excerpt(value));
  return value.get<bool>();
}

std::string text(const nlohmann::json& value, const std::string& name) {
  if (!value.is_string()) fail_argument(name, "a string", json_excerpt(value));
  return value.get<std::string>();
}

// A string option with two allowed values: true for `second`, Error naming both for anything else.
bool is_second_choice(const nlohmann::json& value, const std::string& name, const char* first, const char* second) {
  const std::string chosen = text(value, name);
  if (chosen != first && chosen != second)
    fail_argument(name, detail::concat("\"", first, "\" or \"", second, "\""), quoted_excerpt(chosen));
  return chosen == second;
}

// Options tessel does not implement: accepted only at the value that leaves them off.
void require(const nlohmann::json& value, const nlohmann::json& supported, const std::string& name) {
  if (value != supported)
    throw Error(detail::concat(name, ": only ", supported.dump(), " is supported, got ", json_excerpt(value)));
}

// Keys that change nothing once sigmas are flow sigmas (the DDPM beta schedule, the spacing of
// non-flow timesteps, the bounds of dynamic shifting, ...): any value is accepted.
const char* const kIgnoredKeys[] = {
    "beta_start", "beta_end", "beta_schedule", "trained_betas", "rescale_betas_zero_snr", "timestep_spacing",
    "steps_offset", "dynamic_thresholding_ratio", "sample_max_value", "time_shift_type", "sigma_min",
    "sigma_max", "base_shift", "max_shift", "base_image_seq_len", "max_image_seq_len"};

}  // namespace

void SchedulerConfig::validate() const {
  if (num_train_timesteps < 1 || num_train_timesteps > kMaxTrainTimesteps)
    fail_argument("num_train_timesteps", detail::concat("an integer in [1, ", kMaxTrainTimesteps, "]"),
                  num_train_timesteps);
  if (!(std::isfinite(shift) && shift > 0.0)) fail_argument(kind == SchedulerKind::unipc ? "flow_shift" : "shift",
                                                            "a finite number > 0", shift);
  if (solver_order < 1 || solver_order > 3) fail_argument("solver_order", "1, 2 or 3", solver_order);
}

SchedulerConfig parse_scheduler_config(std::string_view json_text, const std::string& source) {
  const nlohmann::json json = parse_json_limited(json_text, JsonLimits{}, source);
  if (!json.is_object()) fail_argument(source, "a JSON object", json_excerpt(json));
  const auto class_name = json.find("_class_name");
  if (class_name == json.end()) fail_argument(field(source, "_class_name"), "a scheduler class name", "none");
  const std::string name = text(*class_name, field(source, "_class_name"));
  SchedulerConfig config;
  if (name == scheduler_class_name(SchedulerKind::unipc)) {
    config.kind = SchedulerKind::unipc;
  } else if (name == scheduler_class_name(SchedulerKind::flow_match_euler)) {
    config.kind = SchedulerKind::flow_match_euler;
  } else {
    fail_argument(field(source, "_class_name"), "UniPCMultistepScheduler or FlowMatchEulerDiscreteScheduler",
                  quoted_excerpt(name));
  }
  const bool unipc = config.kind == SchedulerKind::unipc;

  using Setter = std::function<void(const nlohmann::json&, const std::string&)>;
  std::map<std::string, Setter> setters = {
      {"num_train_timesteps", [&](auto& v, auto& n) { config.num_train_timesteps = integer(v, n); }},
      {"use_karras_sigmas", [](auto& v, auto& n) { require(v, false, n); }},
      {"use_exponential_sigmas", [](auto& v, auto& n) { require(v, false, n); }},
      {"use_beta_sigmas", [](auto& v, auto& n) { require(v, false, n); }},
      {"use_dynamic_shifting", [](auto& v, auto& n) { require(v, false, n); }},
      {"shift_terminal", [](auto& v, auto& n) { require(v, nullptr, n); }},
  };
  if (unipc) {
    setters.insert({
        {"flow_shift", [&](auto& v, auto& n) { config.shift = number(v, n); }},
        {"solver_order", [&](auto& v, auto& n) { config.solver_order = integer(v, n); }},
        {"solver_type", [&](auto& v, auto& n) { config.solver_bh2 = is_second_choice(v, n, "bh1", "bh2"); }},
        {"lower_order_final", [&](auto& v, auto& n) { config.lower_order_final = boolean(v, n); }},
        {"final_sigmas_type", [&](auto& v, auto& n) { config.final_sigma_zero = !is_second_choice(v, n, "zero", "sigma_min"); }},
        {"disable_corrector",
         [&](auto& v, auto& n) {
           if (!v.is_array()) fail_argument(n, "an array of step indices", json_excerpt(v));
           config.disable_corrector.clear();
           for (const auto& index : v) config.disable_corrector.push_back(integer(index, n));
         }},
        {"prediction_type", [](auto& v, auto& n) { require(v, "flow_prediction", n); }},
        {"use_flow_sigmas", [](auto& v, auto& n) { require(v, true, n); }},
        {"predict_x0", [](auto& v, auto& n) { require(v, true, n); }},
        {"thresholding", [](auto& v, auto& n) { require(v, false, n); }},
        {"solver_p", [](auto& v, auto& n) { require(v, nullptr, n); }},
    });
  } else {
    setters.insert({
        {"shift", [&](auto& v, auto& n) { config.shift = number(v, n); }},
        {"invert_sigmas", [](auto& v, auto& n) { require(v, false, n); }},
        {"stochastic_sampling", [](auto& v, auto& n) { require(v, false, n); }},
    });
  }
  // A UniPC config without use_flow_sigmas / prediction_type would be a DDPM-style schedule.
  if (unipc)
    for (const char* needed : {"use_flow_sigmas", "prediction_type"})
      if (!json.contains(needed))
        throw Error(detail::concat(source, ": ", needed,
                                   " is missing; only the flow-matching UniPC of Wan (use_flow_sigmas true, "
                                   "prediction_type \"flow_prediction\") is supported"));

  for (const auto& [key, value] : json.items()) {
    if (!key.empty() && key[0] == '_') continue;
    bool ignored = false;
    for (const char* ignored_key : kIgnoredKeys) ignored = ignored || key == ignored_key;
    if (ignored) continue;
    const auto setter = setters.find(key);
    if (setter == setters.end())
      throw Error(detail::concat(source, ": unknown key ", quoted_excerpt(key), " for ", name));
    setter->second(value, field(source, key));
  }
  return validated_config(std::move(config), source);
}

SchedulerConfig load_scheduler_config(const std::string& scheduler_dir) {
  const std::string path = scheduler_dir + "/scheduler_config.json";
  return parse_scheduler_config(read_file_bounded(path, kMaxConfigBytes, "scheduler config"), path);
}

SchedulerKind scheduler_kind_from_name(std::string_view name) {
  if (name == "unipc") return SchedulerKind::unipc;
  if (name == "euler") return SchedulerKind::flow_match_euler;
  fail_argument("scheduler", "unipc or euler", quoted_excerpt(name));
}

std::string_view scheduler_class_name(SchedulerKind kind) {
  return kind == SchedulerKind::unipc ? "UniPCMultistepScheduler" : "FlowMatchEulerDiscreteScheduler";
}

void Scheduler::set_timesteps(int64_t num_inference_steps) {
  if (num_inference_steps < 1 || num_inference_steps > kMaxInferenceSteps)
    fail_argument("num_inference_steps", detail::concat("an integer in [1, ", kMaxInferenceSteps, "]"),
                  num_inference_steps);
  compute_schedule(num_inference_steps);
}

void Scheduler::reset_schedule(std::vector<double> timesteps, std::vector<float> sigmas) {
  timesteps_ = std::move(timesteps);
  sigmas_ = std::move(sigmas);
  step_index_ = 0;
  step_shape_.clear();
}

void Scheduler::step(const TensorView& model_output, const TensorView& sample, const TensorView& prev_sample) {
  if (timesteps_.empty()) throw Error("Scheduler::step: set_timesteps was not called");
  if (step_index_ >= num_inference_steps())
    throw Error(detail::concat("Scheduler::step: all ", num_inference_steps(),
                               " steps are taken; call set_timesteps to start again"));
  const std::pair<const char*, const TensorView*> arguments[] = {
      {"model_output", &model_output}, {"sample", &sample}, {"prev_sample", &prev_sample}};
  for (const auto& [name, view] : arguments) {
    if (view->dtype() != DType::kF32 || !view->device().is_cpu() || !view->is_contiguous())
      fail_argument(name, "a contiguous fp32 CPU tensor", view->describe());
    if (view->shape() != sample.shape()) fail_argument(name, "the shape of sample " + sample.describe(), view->describe());
  }
  if (step_index_ == 0) step_shape_ = sample.shape();
  if (sample.shape() != step_shape_)
    fail_argument("sample", "the shape of the first step's sample " + shape_str(step_shape_), sample.describe());
  step_values(model_output.data_as<const float>(), sample.data_as<const float>(), prev_sample.data_as<float>(),
              sample.numel());
  ++step_index_;
}

std::unique_ptr<Scheduler> make_scheduler(const SchedulerConfig& config) {
  config.validate();
  return config.kind == SchedulerKind::unipc ? make_unipc_scheduler(config) : make_flow_match_euler_scheduler(config);
}

}  // namespace tessel
