// The CPU offload engine: the "device" is a second host arena and every copy between it and the
// host cache runs on one copy thread, in issue order. Compute runs synchronously in the caller's
// thread, so "compute done" is complete when recorded; the fences below give the other ordering
// rules of offload_engine.h: a load or an offload is a ticket of the FIFO copy queue, waiting on a
// slot or an offload means waiting until that ticket is done, and a load can never overtake an
// offload issued before it. Tasks run one at a time in ticket order, normally on the copy thread;
// a caller that has to wait runs queued tasks itself while the copy thread is idle.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>

#include "tessel/core/error.h"
#include "tessel/kv/offload_engine.h"

namespace tessel::kv {
namespace {

using Clock = std::chrono::steady_clock;

class CpuOffloadEngine final : public OffloadEngine {
 public:
  CpuOffloadEngine(const OffloadConfig& config, CpuCopyOptions options)
      : OffloadEngine(config, Device::cpu()), options_(options) {
    if (options.bandwidth_gb_per_s < 0) fail_argument("options.bandwidth_gb_per_s", ">= 0", options.bandwidth_gb_per_s);
    if (options.latency_us < 0) fail_argument("options.latency_us", ">= 0", options.latency_us);
    allocate_buffers(MemoryKind::kHost);
    slot_ticket_.assign(static_cast<size_t>(config.num_slots), 0);
    prefill_offload_ticket_.assign(static_cast<size_t>(config.num_layers), 0);
    decode_offload_ticket_.assign(static_cast<size_t>(config.num_layers), 0);
    thread_ = std::thread([this] { copy_loop(); });
  }

  ~CpuOffloadEngine() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    thread_.join();
  }

  void wait_offloads(int64_t layer) override {
    if (layer < 0 || layer >= config_.num_layers)
      fail_argument("layer", detail::concat("in [0, ", config_.num_layers, ")"), layer);
    wait_ticket(std::max(prefill_offload_ticket_[static_cast<size_t>(layer)],
                         decode_offload_ticket_[static_cast<size_t>(layer)]));
  }

  void synchronize() override { wait_ticket(issued_); }

  StreamHandle compute_stream() const override { return nullptr; }

  double measure_peak_h2d_bandwidth() override {
    // Large copies from the host cache into a separate arena on the copy thread, as loads run
    // (including the simulated link, if any); the best of a few repeats.
    const size_t bytes = std::min(host_k_.nbytes(), static_cast<size_t>(64) << 20);
    Tensor target = Tensor::empty({static_cast<int64_t>(bytes)}, DType::kU8, Device::cpu());
    synchronize();
    double best = 0;
    for (int i = 0; i < 3; ++i) {
      const auto start = Clock::now();
      enqueue(false, [this, &target, bytes] { paced_copy(static_cast<char*>(target.data()), static_cast<const char*>(host_k_.data()), bytes); });
      synchronize();
      best = std::max(best, static_cast<double>(bytes) / std::chrono::duration<double>(Clock::now() - start).count() / 1e9);
    }
    return best;
  }

 protected:
  void do_load(int64_t slot, int64_t layer, int64_t host_block) override {
    char* dk = slot_k_ptr(slot);
    char* dv = slot_v_ptr(slot);
    const char* sk = host_k_ptr(layer, host_block);
    const char* sv = host_v_ptr(layer, host_block);
    const size_t bytes = block_bytes();
    slot_ticket_[static_cast<size_t>(slot)] = enqueue(true, [this, dk, dv, sk, sv, bytes] {
      paced_copy(dk, sk, bytes);
      paced_copy(dv, sv, bytes);
    });
  }

  void do_wait_slot(int64_t slot) override {
    const auto start = Clock::now();
    wait_ticket(slot_ticket_[static_cast<size_t>(slot)]);
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    std::lock_guard lock(stats_mutex_);
    stats_.wait_seconds += waited;
  }

  // Compute is synchronous on this engine: it is done when recorded.
  void do_record_compute_done(int64_t) override {}

  void do_store(int64_t layer, bool decode_buffer, char* dst_k, char* dst_v, const TensorView& k,
                const TensorView& v) override {
    // The buffer may still be read by an offload issued earlier for this layer.
    const auto& tickets = decode_buffer ? decode_offload_ticket_ : prefill_offload_ticket_;
    wait_ticket(tickets[static_cast<size_t>(layer)]);
    std::memcpy(dst_k, k.data(), k.nbytes());
    std::memcpy(dst_v, v.data(), v.nbytes());
  }

  // A ticket after every offload issued so far (so the keys are those offloaded), then waited for:
  // compute is synchronous, so the copy must be done before the caller scores.
  void do_load_keys(int64_t layer, std::span<const int32_t> host_blocks, char* dst) override {
    std::vector<KeyCopy> copies = key_copies(layer, host_blocks, dst, [](size_t) { return true; });
    wait_ticket(enqueue(false, [this, copies = std::move(copies)] {
      for (const KeyCopy& c : copies) paced_copy(c.dst, c.src, c.bytes);
    }));
  }

  void do_record_keys_consumed() override {}

  void do_offload(int64_t layer, bool decode_buffer, std::span<const BlockCopy> copies) override {
    std::vector<BlockCopy> owned(copies.begin(), copies.end());
    const uint64_t ticket = enqueue(false, [this, owned = std::move(owned)] {
      for (const BlockCopy& c : owned) {
        paced_copy(c.dst_k, c.src_k, c.bytes);
        paced_copy(c.dst_v, c.src_v, c.bytes);
      }
    });
    auto& tickets = decode_buffer ? decode_offload_ticket_ : prefill_offload_ticket_;
    tickets[static_cast<size_t>(layer)] = ticket;
  }

 private:
  struct Task {
    uint64_t ticket;
    bool is_load;
    std::function<void()> work;
  };

  uint64_t enqueue(bool is_load, std::function<void()> work) {
    uint64_t ticket;
    {
      std::lock_guard lock(mutex_);
      ticket = ++issued_;
      queue_.push_back({ticket, is_load, std::move(work)});
      if (is_load) {
        ++loads_in_flight_;
        std::lock_guard stats_lock(stats_mutex_);
        stats_.max_loads_in_flight = std::max(stats_.max_loads_in_flight, loads_in_flight_);
      }
    }
    work_cv_.notify_one();
    return ticket;
  }

  // Blocks until `ticket` is done. A caller that must wait anyway runs queued copies itself when
  // the copy thread is not mid-task (tasks still run one at a time, in order): on an oversubscribed
  // machine the copy thread may not be scheduled for a long time, and waiting for it would
  // serialize far worse than copying.
  void wait_ticket(uint64_t ticket) {
    std::unique_lock lock(mutex_);
    while (completed_ < ticket) {
      if (!executing_ && !queue_.empty()) {
        run_front_task(lock);
      } else {
        done_cv_.wait(lock);
      }
    }
  }

  // Runs the queue's first task with `lock` (on mutex_) released meanwhile.
  void run_front_task(std::unique_lock<std::mutex>& lock) {
    Task task = std::move(queue_.front());
    queue_.pop_front();
    executing_ = true;
    lock.unlock();
    const auto start = Clock::now();
    task.work();
    const double busy = std::chrono::duration<double>(Clock::now() - start).count();
    lock.lock();
    executing_ = false;
    completed_ = task.ticket;
    if (task.is_load) --loads_in_flight_;
    {
      std::lock_guard stats_lock(stats_mutex_);
      stats_.copy_busy_seconds += busy;
    }
    done_cv_.notify_all();
    work_cv_.notify_all();
  }

  // memcpy, then hold the copy thread until the simulated link would have finished.
  void paced_copy(char* dst, const char* src, size_t bytes) {
    const auto start = Clock::now();
    std::memcpy(dst, src, bytes);
    double seconds = options_.latency_us * 1e-6;
    if (options_.bandwidth_gb_per_s > 0) seconds += static_cast<double>(bytes) / (options_.bandwidth_gb_per_s * 1e9);
    if (seconds > 0) std::this_thread::sleep_until(start + std::chrono::duration<double>(seconds));
  }

  void copy_loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      work_cv_.wait(lock, [&] { return !executing_ && (stopping_ || !queue_.empty()); });
      if (queue_.empty()) return;  // stopping, all issued copies done
      run_front_task(lock);
    }
  }

  CpuCopyOptions options_;
  std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Task> queue_;
  uint64_t issued_ = 0;     // guarded by mutex_
  uint64_t completed_ = 0;  // guarded by mutex_; tickets finish in order
  bool executing_ = false;  // guarded by mutex_; a task is running (on the copy thread or a caller)
  int64_t loads_in_flight_ = 0;
  bool stopping_ = false;
  // Tickets below are written only by the caller's thread.
  std::vector<uint64_t> slot_ticket_;
  std::vector<uint64_t> prefill_offload_ticket_;
  std::vector<uint64_t> decode_offload_ticket_;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<OffloadEngine> make_cpu_offload_engine(const OffloadConfig& config, CpuCopyOptions options) {
  return std::make_unique<CpuOffloadEngine>(config, options);
}

}  // namespace tessel::kv
