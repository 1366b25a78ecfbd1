// The scheduler implementations behind make_scheduler, one file each.
#pragma once

#include <memory>

#include "tessel/diffusion/scheduler.h"

namespace tessel {

std::unique_ptr<Scheduler> make_flow_match_euler_scheduler(const SchedulerConfig& config);
std::unique_ptr<Scheduler> make_unipc_scheduler(const SchedulerConfig& config);

// diffusers shifts flow sigmas as shift * s / (1 + (shift - 1) * s).
inline double shift_flow_sigma(double shift, double sigma) { return shift * sigma / (1.0 + (shift - 1.0) * sigma); }

}  // namespace tessel
