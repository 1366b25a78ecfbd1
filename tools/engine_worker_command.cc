// `tessel engine-worker`: the worker process `tessel serve` starts, one per rank. Not for direct
// use: the engine passes the shared-memory channel and the rank, then the model and settings
// through the channel.
#include <memory>
#include <string>

#include "command.h"
#include "option_checks.h"
#include "tessel/engine/wan_serving.h"
#include "tessel/engine/worker.h"

namespace tessel::cli {
namespace {

CommandRegistration registration{
    "engine-worker", "(started by `tessel serve`) one worker process of the serving engine", [](CLI::App& app) {
      auto args = std::make_shared<engine::WorkerArgs>();
      app.add_option("--channel", args->channel, "the engine's shared-memory channel")->required()->check(non_empty_path());
      app.add_option("--rank", args->rank, "this worker's rank")->required()->check(integer_in(0, 63));
      return CommandRunner([args] {
        engine::RunnerRegistry runners;
        engine::register_wan_runner(runners);
        return engine::run_worker(*args, runners);
      });
    }};

}  // namespace
}  // namespace tessel::cli
