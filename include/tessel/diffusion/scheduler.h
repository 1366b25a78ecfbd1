// Flow-matching schedulers with diffusers' numbers: the timesteps handed to the transformer, the
// sigmas, the shift, and the update of one denoising step, as diffusers 0.42.1 computes them.
//   - FlowMatchEulerDiscreteScheduler: sigma_{i+1} - sigma_i times the predicted flow.
//   - UniPCMultistepScheduler in flow-prediction mode (Wan's default scheduler): use_flow_sigmas,
//     flow_shift, predict_x0, a predictor of order up to solver_order and the UniC corrector,
//     B(h) of the bh1 or bh2 variant.
// A scheduler holds the history of a multistep solver, so one instance runs one generation at a
// time; set_timesteps starts it again.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/tensor.h"

namespace tessel {

enum class SchedulerKind { unipc, flow_match_euler };

// The fields of a scheduler_config.json that change a flow-matching schedule. Both kinds share
// num_train_timesteps and the shift (UniPC's "flow_shift", Euler's "shift"); the rest is UniPC's.
struct SchedulerConfig {
  SchedulerKind kind = SchedulerKind::unipc;
  int64_t num_train_timesteps = 1000;
  double shift = 1.0;
  int64_t solver_order = 2;       // 1..3
  bool solver_bh2 = true;         // "bh2": B(h) = e^-h - 1; "bh1": B(h) = -h
  bool lower_order_final = true;  // lower the order over the last steps
  bool final_sigma_zero = true;   // "zero"; false: "sigma_min" (the last sigma repeated)
  std::vector<int64_t> disable_corrector;  // step indices whose following corrector is skipped
  // Throws Error naming the field when a value is out of range.
  void validate() const;
};

// Parses a diffusers scheduler_config.json ("_class_name" UniPCMultistepScheduler or
// FlowMatchEulerDiscreteScheduler). Options that change nothing in flow mode (the beta schedule,
// timestep_spacing, ...) are accepted and ignored; an option tessel does not implement (Karras
// sigmas, dynamic shifting, thresholding, a prediction type other than flow_prediction, ...) or an
// unknown key is an Error naming it. `source` names the text in error messages.
SchedulerConfig parse_scheduler_config(std::string_view json_text, const std::string& source = "scheduler_config.json");
// Reads `<scheduler_dir>/scheduler_config.json`.
SchedulerConfig load_scheduler_config(const std::string& scheduler_dir);
// "unipc" or "euler" (the names the CLI takes); Error listing them otherwise.
SchedulerKind scheduler_kind_from_name(std::string_view name);
std::string_view scheduler_class_name(SchedulerKind kind);

class Scheduler {
 public:
  virtual ~Scheduler() = default;

  // The configuration the scheduler was made from (make_scheduler).
  const SchedulerConfig& config() const { return config_; }

  // Prepares `num_inference_steps` steps (1..100000) and starts again at the first.
  void set_timesteps(int64_t num_inference_steps);
  // The value handed to the transformer at each step (int64 values for UniPC, float32 for Euler,
  // both exact in a double), and the sigmas: one per step and the final one.
  const std::vector<double>& timesteps() const { return timesteps_; }
  const std::vector<float>& sigmas() const { return sigmas_; }
  int64_t num_inference_steps() const { return static_cast<int64_t>(timesteps_.size()); }
  // Steps taken since set_timesteps.
  int64_t step_index() const { return step_index_; }

  // One denoising step: from the flow the model predicted at this step and the current sample,
  // the next sample. All three fp32, CPU, contiguous, the same shape; prev_sample may be sample.
  // Throws Error before set_timesteps, after the last step, for a bad argument, or when the shape
  // differs from the previous steps' (a multistep solver keeps their outputs).
  void step(const TensorView& model_output, const TensorView& sample, const TensorView& prev_sample);

 protected:
  explicit Scheduler(const SchedulerConfig& config) : config_(config) {}
  // Fills the schedule (through reset_schedule) and clears the solver's history.
  virtual void compute_schedule(int64_t num_inference_steps) = 0;
  virtual void step_values(const float* model_output, const float* sample, float* prev_sample, int64_t count) = 0;
  void reset_schedule(std::vector<double> timesteps, std::vector<float> sigmas);

 private:
  SchedulerConfig config_;
  std::vector<double> timesteps_;
  std::vector<float> sigmas_;
  int64_t step_index_ = 0;
  Shape step_shape_;  // the sample shape of this generation's first step
};

std::unique_ptr<Scheduler> make_scheduler(const SchedulerConfig& config);

}  // namespace tessel
