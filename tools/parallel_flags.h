// The CLI's parallel flags, shared by `tessel generate`, `tessel dit-bench` and `tessel sp-bench`:
//   --ulysses N      Ulysses degree of the sequence parallelism (divides the attention heads)
//   --ring M         Ring degree
//   --cfg-parallel   the two classifier-free guidance branches on two ranks
//   --ring-sm-margin N          multiprocessors Ring attention leaves to its exchange
//   --ulysses-head-groups G     Ulysses alone: its all-to-alls pipelined with the attention in G
//                               groups of each rank's heads (divides the heads of a Ulysses rank)
//   --ulysses-sm-margin N       with head groups: multiprocessors each group's attention leaves to
//                               the all-to-alls beside it
// and the process group they start. More than one rank needs the job launched by mpirun with
// exactly N x M (x 2 with --cfg-parallel) processes: `mpirun -n 4 tessel dit-bench --ulysses 2 --ring 2`.
//
// Without mpirun (GPUs only: `tessel sp-bench|dit-bench --device cuda`), every process is started with
//   TESSEL_RANK=r TESSEL_WORLD_SIZE=n [TESSEL_MASTER_ADDR=host of rank 0 (127.0.0.1)]
//   [TESSEL_MASTER_PORT=29511] [TESSEL_LOCAL_RANK=its GPU on the node (default: r)]
// and the NCCL communicator is bootstrapped over TCP.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "tessel/parallel/communicator.h"
#include "tessel/parallel/metered_communicator.h"
#include "tessel/parallel/parallel_config.h"

namespace tessel::cli {

struct ParallelFlags {
  int ulysses = 1;
  int ring = 1;
  bool cfg_parallel = false;
  int ring_sm_margin = ParallelConfig{}.ring_sm_margin;
  const CLI::Option* ring_sm_margin_option = nullptr;  // set by add_parallel_flags: given or not
  int ulysses_head_groups = ParallelConfig{}.ulysses_head_groups;
  int ulysses_sm_margin = ParallelConfig{}.ulysses_sm_margin;

  // Throws when --ring-sm-margin is given to a run without a ring (it would change nothing), and
  // when --ulysses-head-groups is above 1 without Ulysses alone (--ulysses > 1, no --ring).
  ParallelConfig config() const;
  void check_ring_sm_margin_used(bool any_ring) const;
  void check_ulysses_head_groups_used(bool any_ulysses_alone) const;
  std::string describe() const;  // "ulysses 2 x ring 2 x cfg 2"
};

void add_parallel_flags(CLI::App& app, ParallelFlags& flags);

// Throws Error naming --ulysses-head-groups when `groups` is above 1 and no layout of the run is
// Ulysses alone (`layout` describes the run's degrees in the message), and naming
// --ulysses-sm-margin when `sm_margin` is set with `groups` 1. serve's worker group too.
void check_ulysses_head_groups_flag(int groups, int sm_margin, bool any_ulysses_alone, const std::string& layout);

// The ranks of a run. One rank (every degree 1): no MPI at all, groups() is null. Otherwise an MPI
// session, the world communicator (metered: meter() counts every group's traffic) and the groups.
class ParallelRun {
 public:
  // Throws Error naming the flag when the degrees' product is not the number of processes mpirun
  // started, and when tessel was built without MPI.
  explicit ParallelRun(const ParallelFlags& flags);
  // The same for tensors on `device`. cpu: as above. cuda: the groups are NCCL communicators,
  // bootstrapped over MPI (mpirun) or over TCP (the TESSEL_* environment; then even a world of one
  // process gets groups, so that a one-GPU run goes through the sharded path), each process on
  // its local GPU (device()).
  ParallelRun(const ParallelFlags& flags, Device device);
  // Every process mpirun started, in one world and no groups (`tessel sp-bench` builds its own per
  // layout); one process of its own without MPI.
  struct WholeWorld {};
  static constexpr WholeWorld kWholeWorld{};
  explicit ParallelRun(WholeWorld);
  ~ParallelRun();

  // A metered communicator over the world's ranks for tensors on `device`: for cpu a split of the
  // world, for cuda a NCCL communicator bootstrapped over it. Collective over the world.
  std::unique_ptr<Communicator> device_world(const ExecContext& ctx, Device device) const;

  // The device this process computes on: the one asked for, or its local GPU under several ranks.
  Device device() const { return device_; }
  const ParallelGroups* groups() const { return groups_ ? &*groups_ : nullptr; }
  Communicator* cfg_group() const { return groups_ ? groups_->cfg.get() : nullptr; }
  int world_rank() const { return world_ ? world_->rank() : rendezvous_ ? rendezvous_->rank : 0; }
  int world_size() const { return world_ ? world_->size() : rendezvous_ ? rendezvous_->size : 1; }
  // This process's GPU on its node: mpirun's local rank, TESSEL_LOCAL_RANK, else the world rank.
  int local_rank() const;
  bool is_root() const { return world_rank() == 0; }
  CommunicationMeter& meter() { return *meter_; }
  // Returns when every rank got here (nothing for one rank).
  void barrier() const;

 private:
  void start_nccl_groups(const ParallelConfig& config);
  std::unique_ptr<Communicator> wrap(std::unique_ptr<Communicator> inner, const char* label) const;

  Device device_ = Device::cpu();
  std::unique_ptr<MpiSession> mpi_;
  std::unique_ptr<Communicator> bootstrap_;  // the MPI world a NCCL world was bootstrapped over
  std::shared_ptr<CommunicationMeter> meter_ = std::make_shared<CommunicationMeter>();
  std::unique_ptr<Communicator> world_;
  std::optional<ParallelGroups> groups_;
  std::optional<TcpRendezvous> rendezvous_;  // launched without mpirun
};

}  // namespace tessel::cli
