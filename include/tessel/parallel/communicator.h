// Communicator: the collective and point-to-point operations the parallel attention strategies
// need, over one group of processes (ranks 0 .. size()-1). Three engines implement it:
//   MPI            for CPU tensors (make_mpi_world_communicator), launched with mpirun;
//   shared memory  for CPU tensors of processes on one host started by another process (the
//                  engine's workers; make_shm_communicator), without MPI;
//   NCCL           for CUDA tensors (make_nccl_communicator), bootstrapped over another communicator.
// Every operation that moves data takes the execution context first: on CUDA it is enqueued on
// ctx.stream (no host synchronization), on the CPU it has completed when the call returns.
//
// Tensors are moved as bytes: they must be contiguous and on the communicator's device. Every rank
// of the group must call the same operations in the same order with the same sizes (a rank that
// throws before a collective leaves the others waiting: check arguments on every rank alike).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/io/shm_region.h"
#include "tessel/core/tensor.h"

namespace tessel {

// A transfer in flight (ring_exchange_async, all_to_all_async). wait() makes the received data
// visible to work run under ctx: on the CPU it blocks until the transfer is done, on CUDA it makes
// ctx.stream wait for it (no host synchronization). Destroying a pending exchange without wait()
// waits on the CPU; on CUDA nothing waits for it then (the caller must not read recv).
class PendingExchange {
 public:
  virtual ~PendingExchange() = default;
  virtual void wait(const ExecContext& ctx) = 0;
};

// How a split's communicator runs its transfers (hints; communicators without the notion ignore them).
struct SplitOptions {
  // The most thread blocks one of its GPU kernels may take (NCCL's maxCTAs); 0 = the library's
  // choice. Ring attention caps its exchange at the multiprocessors its attention leaves free.
  int max_kernel_blocks = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The device whose tensors this communicator moves (cpu for MPI, cuda:N for NCCL).
  virtual Device device() const = 0;
  // "mpi" or "nccl".
  virtual std::string engine() const = 0;

  // send holds size() equal chunks (bytes); chunk i goes to rank i, and recv's chunk i comes from
  // rank i. recv has send's byte size.
  virtual void all_to_all(const ExecContext& ctx, const TensorView& send, const TensorView& recv) = 0;
  // all_to_all that returns at once so that work on ctx.stream can overlap it: on NCCL it runs on
  // the communicator's own stream (the one of ring exchanges), after the work already on
  // ctx.stream; several may be in flight and they run in the order they were issued, so every rank
  // must issue them (and the collectives on ctx.stream) in the same order. send must stay
  // untouched and recv unread until wait(). Engines without a second stream (MPI, shared memory,
  // single rank) run it to completion here and wait() returns at once.
  virtual std::unique_ptr<PendingExchange> all_to_all_async(const ExecContext& ctx, const TensorView& send,
                                                            const TensorView& recv);
  // recv = the send tensors of ranks 0 .. size()-1, concatenated (size() times send's bytes).
  virtual void all_gather(const ExecContext& ctx, const TensorView& send, const TensorView& recv) = 0;
  // Elementwise sum over the ranks, in place (fp32 or fp64; NCCL also fp16 and bf16).
  virtual void all_reduce_sum(const ExecContext& ctx, const TensorView& tensor) = 0;
  // Sends `send` to rank (rank()+1) % size() and receives into `recv` (same byte size) from rank
  // (rank()-1+size()) % size(): one step of a ring. The async form returns at once so that work can
  // overlap the transfer; send must stay untouched and recv unread until wait().
  virtual std::unique_ptr<PendingExchange> ring_exchange_async(const ExecContext& ctx, const TensorView& send,
                                                               const TensorView& recv) = 0;
  void ring_exchange(const ExecContext& ctx, const TensorView& send, const TensorView& recv);
  // The halo exchange of ranks in a line (rank order, not a ring: a split by rows, where each rank
  // needs its neighbours' edge rows): sends `to_previous` to rank()-1 and `to_next` to rank()+1, and
  // receives into `from_previous` what rank()-1 sent as its to_next and into `from_next` what
  // rank()+1 sent as its to_previous. The first rank has no previous and the last no next: their
  // buffers on that side are neither read nor written. All four have the same byte size on every
  // rank, distinct memory. On CUDA enqueued on ctx.stream, as the collectives.
  virtual void neighbour_exchange(const ExecContext& ctx, const TensorView& to_previous, const TensorView& to_next,
                                  const TensorView& from_previous, const TensorView& from_next) = 0;
  // Returns when every rank has called it (on CUDA: after ctx.stream's work before it is done).
  virtual void barrier(const ExecContext& ctx) = 0;

  // A communicator over the ranks that pass the same `color`, ordered by `key` (then by rank).
  // Collective over this communicator: every rank calls it.
  virtual std::unique_ptr<Communicator> split(int color, int key, const SplitOptions& options = {}) const = 0;
};

// A group of one process on `device` (cpu or cuda:N): every operation is a local copy (on CUDA,
// enqueued on ctx.stream). For single-process runs through the parallel code, and to bootstrap a
// one-rank NCCL communicator without MPI.
std::unique_ptr<Communicator> make_single_rank_communicator(Device device);

// ---- MPI -------------------------------------------------------------------------------------

// True when tessel was built with MPI.
bool mpi_compiled();

// Initializes MPI (thread level "funneled") unless the application already did, and finalizes it
// on destruction if it initialized it. Create one in main() before any MPI communicator and let
// every communicator die before it. Throws Error when tessel was built without MPI.
class MpiSession {
 public:
  MpiSession();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  bool finalize_ = false;
};

// A communicator over every process of the MPI job (a duplicate of MPI_COMM_WORLD), for CPU
// tensors. Needs an MpiSession (or MPI initialized by the application). Throws Error when tessel
// was built without MPI or MPI is not initialized.
std::unique_ptr<Communicator> make_mpi_world_communicator();

// ---- ranks launched without mpirun ---------------------------------------------------------------

// Where the processes of a job started by another launcher (a shell loop, a cluster scheduler)
// meet: rank 0 listens on `port` (all interfaces), the others connect to address:port. The app
// reads these from its environment (the `tessel` CLI: TESSEL_RANK, TESSEL_WORLD_SIZE,
// TESSEL_MASTER_ADDR, TESSEL_MASTER_PORT); the library does not.
struct TcpRendezvous {
  int rank = 0;
  int size = 1;
  std::string address = "127.0.0.1";  // rank 0's host
  int port = 29511;
  double timeout_s = 120.0;  // how long to wait for the other ranks
  // Throws Error naming the field when a value is out of range.
  void validate() const;
};

// Rank 0's `payload`, delivered to every rank (the others' argument is ignored); returns once
// every rank has received it. Throws Error naming the address when a rank does not arrive within
// the timeout or a connection fails.
std::vector<uint8_t> tcp_broadcast(const TcpRendezvous& rendezvous, const std::vector<uint8_t>& payload);

// ---- processes of one host, without MPI ------------------------------------------------------

// The shared memory through which `size` processes of one host communicate (make_shm_communicator):
// a barrier table, each rank's pid and one staging slot per rank. The process that starts the
// others (the engine) creates it before they join and unlinks it when this object dies; processes
// that joined keep their mapping until their communicators die.
class ShmWorld {
 public:
  // `name`: '/' then up to 199 characters without '/' (an existing object of that name is
  // replaced). `size`: 1..256 ranks. `slot_bytes`: each rank's staging buffer (rounded up to 64
  // bytes, at least 4 KiB); a larger transfer passes through it in pieces. Throws Error naming the
  // argument.
  static ShmWorld create(const std::string& name, int size, size_t slot_bytes = size_t{4} << 20);
  const std::string& name() const { return region_.name(); }
  int size() const { return size_; }

 private:
  ShmRegion region_;
  int size_ = 0;
};

// A communicator over the processes of the ShmWorld `name`, for CPU tensors, as rank `rank`;
// returns once every rank has joined (Error when they have not within `join_timeout_s`). Each
// collective moves its data through the staging slots (two barriers per piece) and waits on
// futexes, so waiting ranks use no CPU. A member that exits while others wait for it makes their
// call throw Error naming it instead of hanging; the world is unusable after that (start another).
// split() gives groups within the world, as the parallel groups need.
std::unique_ptr<Communicator> make_shm_communicator(const std::string& name, int rank, double join_timeout_s = 120.0);

// ---- NCCL ------------------------------------------------------------------------------------

// True when tessel was built with NCCL (a CUDA build whose toolkit has libnccl).
bool nccl_compiled();

// A NCCL communicator over the same ranks as `bootstrap` (any engine; typically the MPI world),
// for CUDA tensors on `device`: rank 0 creates the NCCL id and `bootstrap` hands it to the others.
// Collective over `bootstrap`. Throws Error when tessel was built without NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(const ExecContext& ctx, Communicator& bootstrap, Device device);
// The same without MPI: rank 0's NCCL id travels over the TCP rendezvous.
std::unique_ptr<Communicator> make_nccl_communicator(const ExecContext& ctx, const TcpRendezvous& rendezvous, Device device);

}  // namespace tessel
