// The worker busy loop of worker.h.
#include "tessel/engine/worker.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#if TESSEL_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "tessel/core/error.h"
#include "tessel/core/log.h"
#include "wire_format.h"
#include "worker_channel.h"

namespace tessel::engine {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kPollInterval{200};
constexpr milliseconds kSendTimeout{30000};

WorkerControlBlock& open_control(ShmRegion& region) {
  auto* block = static_cast<WorkerControlBlock*>(region.data());
  TESSEL_CHECK(block->magic == WorkerControlBlock::kMagic, region.name(), ": not a worker control block");
  return *block;
}

// The next message for this rank; nullopt when the engine process is gone (the worker then exits
// rather than linger as an orphan).
std::optional<wire::Message> receive_while_parent_lives(MessageQueue& requests, pid_t parent) {
  for (;;) {
    if (std::optional<std::string> bytes = requests.receive(kPollInterval)) return wire::decode(*bytes);
    if (getppid() != parent) return std::nullopt;
  }
}

void record_startup_failure(WorkerControlBlock& control, int rank, const std::string& message) {
  const std::string text = detail::concat("worker rank ", rank, ": ", message);
  uint32_t expected = 0;
  if (control.startup_failed.compare_exchange_strong(expected, 1)) {
    std::strncpy(control.startup_error, text.c_str(), sizeof(control.startup_error) - 1);
    control.startup_error[sizeof(control.startup_error) - 1] = '\0';
  }
  log_message(LogLevel::kError, text);
}

// Device memory in use on this process's current GPU (all processes' use of that GPU, as the
// driver reports it), -1 without a GPU.
int64_t device_memory_used_bytes() {
#if TESSEL_WITH_CUDA
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return -1;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return -1;
  return static_cast<int64_t>(total_bytes - free_bytes);
#else
  return -1;
#endif
}

// Runs one generation; rank 0 sends the progress and the result. False when the runner threw.
bool serve_generation(const wire::Message& message, PipelineRunner& runner, WorkerControlBlock& control,
                      MessageQueue* results, int rank, pid_t parent) {
  const auto engine_gone = [parent] { return getppid() != parent; };
  const uint64_t seq = message.header.at("seq").get<uint64_t>();
  const GenerationRequest request = wire::request_from_json(message.header.at("request"));
  std::atomic<bool> cancel{control.cancel_seq.load() == seq};
  RunControl run_control;
  run_control.cancel = &cancel;
  run_control.on_progress = [&](RequestProgress progress) {
    if (control.cancel_seq.load() == seq) cancel = true;
    if (results == nullptr) return;
    progress.device_memory_used_bytes = device_memory_used_bytes();
    results->send(wire::encode({{"type", "progress"}, {"seq", seq}, {"progress", wire::progress_to_json(progress)}}),
                    kSendTimeout, engine_gone);
  };
  nlohmann::json header = {{"type", "result"}, {"seq", seq}};
  std::string payload;
  bool ran = true;
  try {
    RunnerOutput output = runner.run(request, run_control);
    header["status"] = output.cancelled ? "cancelled" : "succeeded";
    header["error"] = output.cancelled ? "cancelled while running" : "";
    header["steps_done"] = output.steps_done;
    if (!output.cancelled) payload = wire::tensors_to_payload(output.outputs, header);
  } catch (const std::exception& e) {
    header["status"] = "failed";
    header["error"] = e.what();
    header["steps_done"] = 0;
    ran = false;
    // Every rank says why (only rank 0 answers the engine): in a group the first failure may be another rank's.
    log_message(LogLevel::kError, detail::concat("worker rank ", rank, ": request ", request.id, " failed: ", e.what()));
  }
  if (results != nullptr && !results->send(wire::encode(header, payload), kSendTimeout, engine_gone))
    log_message(LogLevel::kError, detail::concat("worker rank ", rank, ": the engine took no result for request ",
                                                 request.id, " (result queue full or closed)"));
  return ran;
}

}  // namespace

int run_worker(const WorkerArgs& args, const RunnerRegistry& runners) {
  const pid_t parent = getppid();
  ShmRegion control_region = ShmRegion::open(control_block_name(args.channel), sizeof(WorkerControlBlock), "worker control block");
  WorkerControlBlock& control = open_control(control_region);
  // The heartbeat runs from the start (loading a model can take minutes) until this function returns.
  std::atomic<bool> done{false};
  const int heartbeat_rank = std::clamp(args.rank, 0, static_cast<int>(MessageQueue::kMaxReaders) - 1);
  std::thread heartbeat([&] {
    while (!done.load()) {
      control.heartbeat_ms[heartbeat_rank] = heartbeat_now_ms();
      std::this_thread::sleep_for(kHeartbeatPeriod);
    }
  });
  struct JoinOnExit {
    std::atomic<bool>& done;
    std::thread& thread;
    ~JoinOnExit() {
      done = true;
      thread.join();
    }
  } join_heartbeat{done, heartbeat};
  std::unique_ptr<PipelineRunner> runner;
  int world_size = 1;
  MessageQueue requests;
  std::optional<MessageQueue> results;
  try {
    if (args.rank < 0 || args.rank >= static_cast<int>(MessageQueue::kMaxReaders))
      fail_argument("worker rank", detail::concat("0..", MessageQueue::kMaxReaders - 1), args.rank);
    requests = MessageQueue::open(request_queue_name(args.channel), args.rank);
    if (args.rank == 0) results = MessageQueue::open(result_queue_name(args.channel), -1);
    const std::optional<wire::Message> init = receive_while_parent_lives(requests, parent);
    if (!init) return 0;
    TESSEL_CHECK(init->type() == "init", "expected an init message first, got ", quoted_excerpt(init->type()));
    RunnerSetup setup = wire::setup_from_json(init->header.at("setup"));
    setup.rank = args.rank;
    world_size = setup.world_size;
    runner = runners.make(init->header.at("model_type").get<std::string>(), setup);
  } catch (const std::exception& e) {
    record_startup_failure(control, args.rank, e.what());
    return 1;
  }
  control.ready[args.rank] = 1;
  for (;;) {
    const std::optional<wire::Message> message = receive_while_parent_lives(requests, parent);
    if (!message || message->type() == "shutdown") return 0;
    if (message->type() != "generate") continue;
    const bool ran = serve_generation(*message, *runner, control, results ? &*results : nullptr, args.rank, parent);
    // A rank of a parallel group that failed may have left its peers waiting in a collective (or
    // been left by them): it exits, so that their collectives fail too and the engine restarts the
    // whole group in a known state.
    if (!ran && world_size > 1) {
      log_message(LogLevel::kError, detail::concat("worker rank ", args.rank, ": leaving the group after a failed request"));
      return 3;
    }
  }
}

}  // namespace tessel::engine
