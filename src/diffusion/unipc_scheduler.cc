// diffusers' UniPCMultistepScheduler with use_flow_sigmas, prediction_type "flow_prediction" and
// predict_x0: the model's flow becomes an x0 prediction, then the UniC corrector refines the
// sample the previous step predicted and the UniP predictor takes the next step. The scalar
// coefficients are float32 as in diffusers (its sigmas are a float32 tensor), the elementwise
// updates follow its operations one by one.
#include <algorithm>
#include <array>
#include <cmath>

#include "scheduler_kinds.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {

constexpr int64_t kMaxOrder = 3;

// Solves the order x order system R rho = b (Gaussian elimination with partial pivoting).
std::array<float, kMaxOrder> solve(std::array<std::array<double, kMaxOrder>, kMaxOrder> r,
                                   std::array<double, kMaxOrder> b, int64_t order) {
  for (int64_t col = 0; col < order; ++col) {
    int64_t pivot = col;
    for (int64_t row = col + 1; row < order; ++row)
      if (std::fabs(r[row][col]) > std::fabs(r[pivot][col])) pivot = row;
    std::swap(r[col], r[pivot]);
    std::swap(b[col], b[pivot]);
    for (int64_t row = col + 1; row < order; ++row) {
      const double factor = r[row][col] / r[col][col];
      for (int64_t k = col; k < order; ++k) r[row][k] -= factor * r[col][k];
      b[row] -= factor * b[col];
    }
  }
  std::array<float, kMaxOrder> rho{};
  for (int64_t row = order - 1; row >= 0; --row) {
    double value = b[row];
    for (int64_t k = row + 1; k < order; ++k) value -= r[row][k] * rho[k];
    rho[row] = static_cast<float>(value / r[row][row]);
  }
  return rho;
}

class UniPCScheduler final : public Scheduler {
 public:
  explicit UniPCScheduler(const SchedulerConfig& config) : Scheduler(config) {}

 protected:
  void compute_schedule(int64_t num_inference_steps) override {
    const double train_steps = static_cast<double>(config().num_train_timesteps);
    // numpy.linspace(1, 1 / train_steps, steps + 1)[:-1], shifted, in float64.
    std::vector<double> shifted(static_cast<size_t>(num_inference_steps));
    const double step = (1.0 / train_steps - 1.0) / static_cast<double>(num_inference_steps);
    for (int64_t i = 0; i < num_inference_steps; ++i)
      shifted[static_cast<size_t>(i)] = shift_flow_sigma(config().shift, static_cast<double>(i) * step + 1.0);
    // Keeps log(1 - sigma) finite at the first step.
    constexpr double kEps = 1e-6;
    if (std::fabs(shifted[0] - 1.0) < kEps) shifted[0] -= kEps;
    std::vector<double> timesteps;
    std::vector<float> sigmas;
    for (double sigma : shifted) {
      timesteps.push_back(std::trunc(sigma * train_steps));  // numpy float64 -> int64 truncates
      sigmas.push_back(static_cast<float>(sigma));
    }
    sigmas.push_back(config().final_sigma_zero ? 0.0f : sigmas.back());
    reset_schedule(std::move(timesteps), std::move(sigmas));
    model_outputs_.assign(static_cast<size_t>(config().solver_order), {});
    last_sample_.clear();
    lower_order_nums_ = 0;
    this_order_ = 1;
  }

  void step_values(const float* model_output, const float* sample, float* prev_sample, int64_t count) override {
    const int64_t index = step_index();
    const float sigma = sigmas()[static_cast<size_t>(index)];
    std::vector<float> x0(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      const float scaled = sigma * model_output[i];
      x0[i] = sample[i] - scaled;
    }
    std::vector<float> current(sample, sample + count);
    const bool corrector_disabled = std::find(config().disable_corrector.begin(), config().disable_corrector.end(),
                                              index - 1) != config().disable_corrector.end();
    if (index > 0 && !corrector_disabled && !last_sample_.empty()) correct(x0, current);

    std::rotate(model_outputs_.begin(), model_outputs_.begin() + 1, model_outputs_.end());
    model_outputs_.back() = std::move(x0);
    const int64_t remaining = num_inference_steps() - index;
    const int64_t order = config().lower_order_final ? std::min(config().solver_order, remaining) : config().solver_order;
    this_order_ = std::min(order, lower_order_nums_ + 1);
    last_sample_ = current;
    predict(current, prev_sample);
    lower_order_nums_ = std::min(lower_order_nums_ + 1, config().solver_order);
  }

 private:
  float lambda(float sigma) const { return std::log(1.0f - sigma) - std::log(sigma); }

  // The coefficients both updates share: h = lambda_t - lambda_s0 between two sigmas, the ratios
  // r_k of the earlier steps' lambda offsets, phi_1 and the right-hand side b of the order system.
  struct Coefficients {
    float alpha_t, sigma_t, sigma_s0, h_phi_1, b_h;
    // x_t = sample_scale * x - m0_scale * m0 - residual_scale * (weighted model-output differences)
    float sample_scale, m0_scale, residual_scale;
    std::array<float, kMaxOrder> rks{};
    std::array<std::array<double, kMaxOrder>, kMaxOrder> r{};
    std::array<double, kMaxOrder> b{};
  };

  // `target` is the sigma index stepped to, `source` the one stepped from, and earlier model
  // outputs sit at sigma indices source - 1, source - 2, ...
  Coefficients coefficients(int64_t target, int64_t source, int64_t order) const {
    Coefficients c;
    c.sigma_t = sigmas()[static_cast<size_t>(target)];
    c.sigma_s0 = sigmas()[static_cast<size_t>(source)];
    c.alpha_t = 1.0f - c.sigma_t;
    const float lambda_s0 = lambda(c.sigma_s0);
    const float h = lambda(c.sigma_t) - lambda_s0;
    for (int64_t i = 1; i < order; ++i)
      c.rks[i - 1] = (lambda(sigmas()[static_cast<size_t>(source - i)]) - lambda_s0) / h;
    c.rks[order - 1] = 1.0f;
    const float hh = -h;
    c.h_phi_1 = std::expm1(hh);
    float h_phi_k = c.h_phi_1 / hh - 1.0f;
    float factorial = 1.0f;
    c.b_h = config().solver_bh2 ? std::expm1(hh) : hh;
    for (int64_t i = 1; i <= order; ++i) {
      for (int64_t k = 0; k < order; ++k) c.r[i - 1][k] = std::pow(static_cast<double>(c.rks[k]), static_cast<double>(i - 1));
      c.b[i - 1] = static_cast<double>(h_phi_k * factorial / c.b_h);
      factorial *= static_cast<float>(i + 1);
      h_phi_k = h_phi_k / hh - 1.0f / factorial;
    }
    c.sample_scale = c.sigma_t / c.sigma_s0;
    c.m0_scale = c.alpha_t * c.h_phi_1;
    c.residual_scale = c.alpha_t * c.b_h;
    return c;
  }

  // D1s[k] = (m_k - m0) / r_k for the earlier model outputs, summed with weights rho.
  float weighted_differences(const Coefficients& c, const std::array<float, kMaxOrder>& rho, int64_t terms,
                             int64_t element) const {
    const std::vector<float>& m0 = model_outputs_.back();
    float sum = 0.0f;
    for (int64_t k = 0; k < terms; ++k) {
      const std::vector<float>& mk = model_outputs_[model_outputs_.size() - 2 - static_cast<size_t>(k)];
      sum += rho[k] * ((mk[element] - m0[element]) / c.rks[k]);
    }
    return sum;
  }

  void predict(const std::vector<float>& x, float* out) const {
    const int64_t index = step_index();
    const Coefficients c = coefficients(index + 1, index, this_order_);
    std::array<float, kMaxOrder> rho{};
    if (this_order_ == 2) rho[0] = 0.5f;
    if (this_order_ > 2) {
      // diffusers solves the leading (order - 1) block.
      rho = solve(c.r, c.b, this_order_ - 1);
    }
    const std::vector<float>& m0 = model_outputs_.back();
    for (size_t i = 0; i < x.size(); ++i) {
      const float base = c.sample_scale * x[i] - c.m0_scale * m0[i];
      if (this_order_ == 1) {
        out[i] = base - c.residual_scale * 0.0f;
      } else {
        out[i] = base - c.residual_scale * weighted_differences(c, rho, this_order_ - 1, static_cast<int64_t>(i));
      }
    }
  }

  // Refines `current` (the sample the last step predicted) with the model output at it.
  void correct(const std::vector<float>& model_t, std::vector<float>& current) const {
    const int64_t index = step_index();
    const int64_t order = this_order_;
    const Coefficients c = coefficients(index, index - 1, order);
    std::array<float, kMaxOrder> rho{};
    if (order == 1) {
      rho[0] = 0.5f;
    } else {
      rho = solve(c.r, c.b, order);
    }
    const std::vector<float>& m0 = model_outputs_.back();
    for (size_t i = 0; i < current.size(); ++i) {
      const float base = c.sample_scale * last_sample_[i] - c.m0_scale * m0[i];
      const float history = order > 1 ? weighted_differences(c, rho, order - 1, static_cast<int64_t>(i)) : 0.0f;
      const float d1_t = model_t[i] - m0[i];
      current[i] = base - c.residual_scale * (history + rho[order - 1] * d1_t);
    }
  }

  std::vector<std::vector<float>> model_outputs_;  // x0 predictions, oldest first
  std::vector<float> last_sample_;
  int64_t lower_order_nums_ = 0;
  int64_t this_order_ = 1;
};

}  // namespace

std::unique_ptr<Scheduler> make_unipc_scheduler(const SchedulerConfig& config) {
  return std::make_unique<UniPCScheduler>(config);
}

}  // namespace tessel
