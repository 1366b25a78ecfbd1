// The worker busy loop of worker.h.
#include "tessel/engine/worker.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "tessel/core/error.h"
#include "tessel/core/log.h"
#include "wire_format.h"
#include "worker_batch.h"
#include "worker_channel.h"

namespace tessel::engine {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kPollInterval{200};

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
  WorkerBatch batch(*runner, control, results ? &*results : nullptr, args.rank, world_size, parent);
  // A rank of a parallel group whose request failed may have left its peers waiting in a collective
  // (or been left by them): it exits, so that their collectives fail too and the engine restarts the
  // whole group in a known state.
  const auto leave_group = [&] {
    log_message(LogLevel::kError, detail::concat("worker rank ", args.rank, ": leaving the group after a failed request"));
    return 3;
  };
  // Takes one message; an exit code when the worker is to stop.
  const auto take = [&](const wire::Message& message) -> std::optional<int> {
    if (message.type() == "shutdown") return 0;
    if (message.type() == "generate" && !batch.admit(message) && world_size > 1) return leave_group();
    return std::nullopt;
  };
  for (;;) {
    if (batch.empty()) {
      const std::optional<wire::Message> message = receive_while_parent_lives(requests, parent);
      if (!message) return 0;
      if (const std::optional<int> code = take(*message)) return *code;
    }
    // Between steps one process admits every request that arrived meanwhile. A group's ranks take
    // requests only when idle, so that all of them step the same requests (the engine sends a
    // group one request at a time: EngineConfig::max_batch is 1 there).
    while (world_size == 1) {
      const std::optional<std::string> bytes = requests.receive(milliseconds(0));
      if (!bytes) break;
      if (const std::optional<int> code = take(wire::decode(*bytes))) return *code;
    }
    if (getppid() != parent) return 0;
    if (!batch.empty() && !batch.step() && world_size > 1) return leave_group();
  }
}

}  // namespace tessel::engine
