// The worker processes of worker_group.h.
#include "worker_group.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "tessel/core/error.h"
#include "tessel/core/io/shm_region.h"
#include "tessel/core/log.h"
#include "wire_format.h"
#include "worker_channel.h"

extern char** environ;

namespace tessel::engine {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr milliseconds kSendTimeout{5000};
// The request ring holds small JSON messages; the result ring carries output tensors in slices.
constexpr MessageQueueShape kRequestRing{1, 8, 64 * 1024};
constexpr MessageQueueShape kResultRing{1, 16, 1024 * 1024};

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return detail::concat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return detail::concat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  return "stopped";
}

}  // namespace

struct WorkerGroup::Channel {
  ShmRegion control_region;
  std::optional<ShmWorld> world;  // the ranks' communicator world, with more than one worker
  MessageQueue requests;
  MessageQueue results;
  WorkerControlBlock& control() const { return *static_cast<WorkerControlBlock*>(control_region.data()); }
};

WorkerGroup::WorkerGroup(WorkerGroupConfig config) : config_(std::move(config)) {
  if (config_.worker_command.empty()) fail_argument("WorkerGroupConfig.worker_command", "a program and its arguments", "nothing");
  if (config_.num_workers < 1 || config_.num_workers > static_cast<int>(MessageQueue::kMaxReaders))
    fail_argument("WorkerGroupConfig.num_workers", detail::concat("1..", MessageQueue::kMaxReaders), config_.num_workers);
  if (config_.channel_prefix.empty()) {
    config_.channel_prefix = detail::concat("/tessel-", getpid());
    // A server killed by a signal left its channels ("/tessel-<its pid>-...") in /dev/shm: those of
    // exited processes go, once per process.
    static std::once_flag swept;
    std::call_once(swept, [] {
      if (const size_t removed = remove_stale_shm_regions("tessel-"))
        log_message(LogLevel::kInfo, detail::concat("removed ", removed, " shared-memory channel(s) left by exited tessel processes"));
    });
  }
  config_.setup.world_size = config_.num_workers;
}

WorkerGroup::~WorkerGroup() { stop(); }

std::vector<pid_t> WorkerGroup::pids() const { return pids_; }

void WorkerGroup::start() {
  ++generation_;
  const std::string prefix = detail::concat(config_.channel_prefix, "-g", generation_);
  auto channel = std::make_unique<Channel>();
  channel->control_region = ShmRegion::create(control_block_name(prefix), sizeof(WorkerControlBlock));
  channel->control().magic = WorkerControlBlock::kMagic;
  MessageQueueShape request_ring = kRequestRing;
  request_ring.num_readers = static_cast<uint32_t>(config_.num_workers);
  // The engine keeps at most max_batch requests unanswered, each under a slot's bytes (two prompts
  // of at most 4 KiB, JSON-escaped), in at most max_batch messages: 2 x max_batch slots hold them
  // all with each message's last slot part-filled, so a send never waits for a worker in the middle
  // of a long step (and the shutdown message has a slot of its own).
  // Requests with reference images need room for those bytes too: max_batch times the most one
  // request carries (slots of the ring's size, untouched until used).
  const size_t image_slots = (config_.max_reference_bytes + kRequestRing.slot_bytes - 1) / kRequestRing.slot_bytes;
  request_ring.num_slots = std::max<uint32_t>(
      kRequestRing.num_slots, static_cast<uint32_t>((2 + image_slots) * static_cast<size_t>(config_.max_batch) + 2));
  channel->requests = MessageQueue::create(request_queue_name(prefix), request_ring);
  channel->results = MessageQueue::create(result_queue_name(prefix), kResultRing, 0);
  RunnerSetup setup = config_.setup;
  if (config_.num_workers > 1) {
    channel->world.emplace(ShmWorld::create(prefix + "-world", config_.num_workers));
    setup.group_world = channel->world->name();
  }
  const nlohmann::json init = {{"type", "init"}, {"model_type", config_.model_type}, {"setup", wire::setup_to_json(setup)}};
  TESSEL_CHECK(channel->requests.send(wire::encode(init), kSendTimeout), "worker group: cannot queue the init message");
  channel_ = std::move(channel);

  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t no_signals, default_signals;
  sigemptyset(&no_signals);
  sigemptyset(&default_signals);
  for (int signal_number : {SIGTERM, SIGINT, SIGPIPE, SIGHUP}) sigaddset(&default_signals, signal_number);
  posix_spawnattr_setsigmask(&attributes, &no_signals);
  posix_spawnattr_setsigdefault(&attributes, &default_signals);
  // Own process group: a terminal's Ctrl-C reaches the engine, which then stops its workers in order.
  posix_spawnattr_setpgroup(&attributes, 0);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);  // no listening socket leaks into a worker
  pids_.assign(config_.num_workers, -1);
  std::string spawn_error;
  for (int rank = 0; rank < config_.num_workers && spawn_error.empty(); ++rank) {
    std::vector<std::string> args = config_.worker_command;
    for (const std::string& extra : {std::string("--channel"), prefix, std::string("--rank"), std::to_string(rank)})
      args.push_back(extra);
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int rc = posix_spawnp(&pid, argv[0], &actions, &attributes, argv.data(), environ);
    if (rc != 0) spawn_error = detail::concat("cannot start worker ", quoted_excerpt(args[0]), ": ", std::strerror(rc));
    else pids_[rank] = pid;
  }
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (!spawn_error.empty()) {
    kill_all();
    throw Error(spawn_error);
  }

  const auto deadline = Clock::now() + config_.start_timeout;
  for (;;) {
    WorkerControlBlock& control = channel_->control();
    if (control.startup_failed.load()) {
      const std::string message(control.startup_error);
      kill_all();
      throw Error("a worker could not start: " + message);
    }
    if (const std::string dead = reap_dead_worker(); !dead.empty()) {
      kill_all();
      throw Error("a worker could not start: " + dead);
    }
    int ready = 0;
    for (int rank = 0; rank < config_.num_workers; ++rank) ready += control.ready[rank].load() != 0;
    if (ready == config_.num_workers) break;
    if (Clock::now() > deadline) {
      kill_all();
      throw Error(detail::concat("workers not ready after ", config_.start_timeout.count(), " ms (", ready, " of ",
                                 config_.num_workers, " reported)"));
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  healthy_ = true;
  last_error_.clear();
}

std::string WorkerGroup::reap_dead_worker() {
  for (size_t rank = 0; rank < pids_.size(); ++rank) {
    if (pids_[rank] <= 0) continue;
    int status = 0;
    if (waitpid(pids_[rank], &status, WNOHANG) == pids_[rank]) {
      const std::string what = detail::concat("worker rank ", rank, " (pid ", pids_[rank], ") ", describe_exit(status));
      pids_[rank] = -1;
      return what;
    }
  }
  return "";
}

std::string WorkerGroup::stalled_worker() const {
  if (!channel_) return "";
  const int64_t now = heartbeat_now_ms();
  for (size_t rank = 0; rank < pids_.size(); ++rank) {
    if (pids_[rank] <= 0) continue;
    const int64_t silent = now - channel_->control().heartbeat_ms[rank].load();
    if (silent > config_.stall_timeout.count())
      return detail::concat("worker rank ", rank, " (pid ", pids_[rank], ") made no progress for ", silent,
                            " ms (its heartbeat stopped: stopped by a signal, or hung; the stall timeout is ",
                            config_.stall_timeout.count(), " ms)");
  }
  return "";
}

void WorkerGroup::kill_all() {
  for (pid_t& pid : pids_) {
    if (pid <= 0) continue;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
  if (channel_) {
    channel_->requests.close();
    channel_->results.close();
  }
  channel_.reset();
  healthy_ = false;
}

void WorkerGroup::restart(const std::string& reason) {
  ++restarts_;
  log_message(LogLevel::kWarning, "restarting the workers: " + reason);
  kill_all();
  last_error_ = reason;
  try {
    start();
  } catch (const Error& e) {
    healthy_ = false;
    last_error_ = reason + "; the restart failed: " + e.what();
    log_message(LogLevel::kError, last_error_);
  }
}

bool WorkerGroup::check_health() {
  if (healthy_) {
    const std::string dead = reap_dead_worker();
    const std::string stalled = dead.empty() ? stalled_worker() : "";
    if (dead.empty() && stalled.empty()) return true;
    restart((dead.empty() ? stalled : dead) + " while idle");
  } else if (!config_.worker_command.empty()) {
    restart(last_error_);
  }
  return healthy_;
}

uint64_t WorkerGroup::send_requests(std::span<const SentRequest> requests) {
  if (!healthy_ && !check_health()) return 0;
  const uint64_t first_seq = next_seq_;
  nlohmann::json list = nlohmann::json::array();
  std::string payload;  // the requests' reference images
  for (const SentRequest& sent : requests) {
    TESSEL_CHECK(sent.lane >= 0 && sent.lane < kMaxBatchLanes, "WorkerGroup::send_requests: lane ", sent.lane, " outside 0..",
                 kMaxBatchLanes - 1);
    channel_->control().cancel_seq[sent.lane] = 0;  // the lane's previous request is answered: its cancel is stale
    nlohmann::json entry = {{"seq", next_seq_++}, {"lane", sent.lane}, {"request", wire::request_to_json(*sent.request)}};
    wire::images_to_payload(*sent.request, entry, payload);
    list.push_back(std::move(entry));
  }
  if (!channel_->requests.send(wire::encode({{"type", "generate"}, {"requests", std::move(list)}}, payload), kSendTimeout)) {
    restart("the workers took no request within 5 s");
    return 0;
  }
  return first_seq;
}

void WorkerGroup::cancel(uint64_t seq, int lane) {
  if (channel_ && lane >= 0 && lane < kMaxBatchLanes) channel_->control().cancel_seq[lane] = seq;
}

std::optional<WorkerReply> WorkerGroup::receive(milliseconds timeout) {
  if (!channel_) return std::nullopt;
  const std::optional<std::string> bytes = channel_->results.receive(timeout);
  if (!bytes) return std::nullopt;
  const wire::Message message = wire::decode(*bytes);
  WorkerReply reply;
  const std::string type = message.type();
  if (type == "step") {
    reply.kind = WorkerReply::kStep;
    reply.batch_size = message.header.at("batch").get<int64_t>();
    reply.step_seconds = message.header.at("seconds").get<double>();
    return reply;
  }
  reply.seq = message.header.at("seq").get<uint64_t>();
  if (type == "progress") {
    reply.kind = WorkerReply::kProgress;
    reply.progress = wire::progress_from_json(message.header.at("progress"));
    return reply;
  }
  TESSEL_CHECK(type == "result", "engine message: expected progress, step or result from the workers, got ", quoted_excerpt(type));
  reply.kind = WorkerReply::kResult;
  const std::string status = message.header.at("status").get<std::string>();
  reply.outcome.error = message.header.at("error").get<std::string>();
  reply.outcome.steps_done = message.header.at("steps_done").get<int64_t>();
  if (status == "succeeded") {
    reply.outcome.status = RequestStatus::kSucceeded;
    reply.outcome.outputs = wire::tensors_from_payload(message.header, message.payload);
  } else if (status == "cancelled") {
    reply.outcome.status = RequestStatus::kCancelled;
  }
  return reply;
}

std::string WorkerGroup::running_failure() {
  if (std::string dead = reap_dead_worker(); !dead.empty()) return dead;
  return stalled_worker();
}

void WorkerGroup::stop(milliseconds grace) {
  if (channel_) channel_->requests.send(wire::encode({{"type", "shutdown"}}), milliseconds(1000));
  const auto deadline = Clock::now() + grace;
  for (pid_t& pid : pids_) {
    while (pid > 0) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) pid = -1;
      else if (Clock::now() > deadline) break;
      else std::this_thread::sleep_for(milliseconds(5));
    }
  }
  kill_all();
}

}  // namespace tessel::engine
