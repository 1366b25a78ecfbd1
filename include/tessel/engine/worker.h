// The worker process's side: `run_worker` is the main function of a worker that the engine
// started (the `tessel engine-worker` command, or any program calling it). It joins the engine's
// shared-memory channel as its rank, builds its PipelineRunner from the init message, reports
// ready, then runs the busy loop: between steps, admit the requests the engine sent, step every
// request in flight at once, answer those done (rank 0 returns progress and the results), until a
// shutdown message or the engine's exit.
#pragma once

#include <string>

#include "tessel/engine/pipeline_runner.h"

namespace tessel::engine {

struct WorkerArgs {
  std::string channel;  // the shared-memory name prefix the engine passed
  int rank = 0;
};

// Returns the process exit code: 0 after a shutdown message or when the engine went away, 1 when
// the runner could not be built (the error is in the control block for the engine to report).
int run_worker(const WorkerArgs& args, const RunnerRegistry& runners);

}  // namespace tessel::engine
