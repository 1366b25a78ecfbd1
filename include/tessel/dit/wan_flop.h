// The size and arithmetic of a Wan transformer, from its config alone: what the CLI's work budgets
// and the server's request deadlines estimate a run's time from.
#pragma once

#include "tessel/dit/wan_config.h"

namespace tessel {

// The checkpoint's parameters (every tensor of wan_weight_specs).
double wan_parameter_count(const WanConfig& config);

// The arithmetic of one forward over `batch` x `tokens` latent tokens and `text_tokens` of text:
// every linear (2 x parameters per row), self-attention over the tokens and cross-attention to the
// text (4 x query rows x key rows x dim per layer, dense).
double wan_forward_flop(const WanConfig& config, double batch, double tokens, double text_tokens);

}  // namespace tessel
