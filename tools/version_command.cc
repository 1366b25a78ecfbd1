// `tessel version`: build facts a bug report needs.
#include <iostream>

#include "command.h"
#include "tessel/core/device.h"
#include "tessel/core/parallel.h"
#include "tessel/diffusion/video_io.h"
#include "tessel/kernels/cpu_isa.h"

namespace tessel::cli {
namespace {
CommandRegistration registration{"version", "Print version and build configuration", [](CLI::App&) {
  return CommandRunner([] {
    std::cout << "tessel 0.1.0\n"
              << "cuda compiled: " << (cuda_compiled() ? "yes" : "no") << "\n"
              << "cuda available: " << (cuda_available() ? "yes" : "no") << "\n"
              << "cpu threads: " << max_threads() << "\n"
              << "cpu kernels: " << cpu_kernels_isa()
              << (cpu_kernels_native_build() ? " (native build, this machine only)" : " (chosen at run time)") << "\n"
              << "mp4 output: " << (mp4_available() ? mp4_encoder_name() : std::string("no (built without libav)")) << "\n";
    return 0;
  });
}};
}  // namespace
}  // namespace tessel::cli
