// diffusers' FlowMatchEulerDiscreteScheduler (no dynamic shifting, no stochastic sampling).
#include <cmath>

#include "scheduler_kinds.h"

namespace tessel {
namespace {

// numpy.linspace(start, stop, count): start + i * step, the last value exactly `stop`.
std::vector<double> numpy_linspace(double start, double stop, int64_t count) {
  std::vector<double> values(static_cast<size_t>(count));
  const double step = count > 1 ? (stop - start) / static_cast<double>(count - 1) : 0.0;
  for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = static_cast<double>(i) * step + start;
  if (count > 1) values.back() = stop;
  return values;
}

class FlowMatchEulerScheduler final : public Scheduler {
 public:
  explicit FlowMatchEulerScheduler(const SchedulerConfig& config) : Scheduler(config) {
    // The constructor's training sigmas (float32 tensors in diffusers) are shifted once; their ends
    // bound the inference schedule, which set_timesteps shifts again, as diffusers does.
    const float train_steps = static_cast<float>(config.num_train_timesteps);
    const float shift = static_cast<float>(config.shift);
    const float shift_minus_one = static_cast<float>(config.shift - 1.0);
    auto shifted = [&](float timestep) {
      const float sigma = timestep / train_steps;
      return shift * sigma / (1.0f + shift_minus_one * sigma);
    };
    sigma_max_ = shifted(train_steps);
    sigma_min_ = shifted(1.0f);
  }

 protected:
  void compute_schedule(int64_t num_inference_steps) override {
    const double train_steps = static_cast<double>(config().num_train_timesteps);
    const std::vector<double> grid =
        numpy_linspace(static_cast<double>(sigma_max_) * train_steps, static_cast<double>(sigma_min_) * train_steps,
                       num_inference_steps);
    std::vector<float> sigmas;
    std::vector<double> timesteps;
    for (double t : grid) {
      const float sigma = static_cast<float>(shift_flow_sigma(config().shift, t / train_steps));
      sigmas.push_back(sigma);
      timesteps.push_back(static_cast<double>(sigma * static_cast<float>(config().num_train_timesteps)));
    }
    sigmas.push_back(0.0f);
    reset_schedule(std::move(timesteps), std::move(sigmas));
  }

  void step_values(const float* model_output, const float* sample, float* prev_sample, int64_t count) override {
    const auto index = static_cast<size_t>(step_index());
    const float dt = sigmas()[index + 1] - sigmas()[index];
    for (int64_t i = 0; i < count; ++i) {
      const float delta = dt * model_output[i];  // two roundings, as torch's two operations
      prev_sample[i] = sample[i] + delta;
    }
  }

 private:
  float sigma_max_ = 1.0f;
  float sigma_min_ = 0.0f;
};

}  // namespace

std::unique_ptr<Scheduler> make_flow_match_euler_scheduler(const SchedulerConfig& config) {
  return std::make_unique<FlowMatchEulerScheduler>(config);
}

}  // namespace tessel
