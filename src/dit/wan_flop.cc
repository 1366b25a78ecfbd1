#include "tessel/dit/wan_flop.h"

#include "tessel/dit/wan_weights.h"

namespace tessel {

double wan_parameter_count(const WanConfig& config) {
  double parameters = 0.0;
  for (const WeightSpec& spec : wan_weight_specs(config)) parameters += static_cast<double>(shape_numel(spec.shape));
  return parameters;
}

double wan_forward_flop(const WanConfig& config, double batch, double tokens, double text_tokens) {
  const double dim = static_cast<double>(config.inner_dim()), layers = static_cast<double>(config.num_layers);
  return 2.0 * wan_parameter_count(config) * batch * tokens + 4.0 * layers * batch * tokens * (tokens + text_tokens) * dim;
}

}  // namespace tessel
