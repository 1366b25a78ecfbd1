// The MPI communicator for CPU tensors. Compiled to a clear run-time error when tessel is built
// without MPI, so that the public API is the same in every build.
#include "communicator_checks.h"
#include "tessel/core/error.h"

#ifdef TESSEL_WITH_MPI
#include <mpi.h>

#include <vector>
#endif

namespace tessel {

#ifndef TESSEL_WITH_MPI

namespace {
[[noreturn]] void fail_no_mpi(const char* what) {
  throw Error(detail::concat(what, ": tessel was built without MPI (install libopenmpi-dev and reconfigure)"));
}
}  // namespace

bool mpi_compiled() { return false; }
MpiSession::MpiSession() { fail_no_mpi("MpiSession"); }
MpiSession::~MpiSession() = default;
std::unique_ptr<Communicator> make_mpi_world_communicator() { fail_no_mpi("make_mpi_world_communicator"); }

#else

namespace {

using parallel_detail::checked_count;

void check_mpi(int status, const char* call) {
  if (status == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(status, text, &length);
  throw Error(detail::concat(call, " failed: ", std::string(text, static_cast<size_t>(length))));
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

class MpiPendingExchange final : public PendingExchange {
 public:
  explicit MpiPendingExchange(std::vector<MPI_Request> requests) : requests_(std::move(requests)) {}
  ~MpiPendingExchange() override {
    if (!requests_.empty() && !mpi_finalized()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  void wait(const ExecContext&) override {
    const int status = MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
    requests_.clear();
    check_mpi(status, "MPI_Waitall (ring exchange)");
  }

 private:
  std::vector<MPI_Request> requests_;
};

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`; errors are returned, not fatal, so they become tessel::Error.
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  ~MpiCommunicator() override {
    if (!mpi_finalized()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cpu(); }
  std::string engine() const override { return "mpi"; }

  void all_to_all(const ExecContext&, const TensorView& send, const TensorView& recv) override {
    const int chunk = checked_count(parallel_detail::check_all_to_all(*this, send, recv), "all_to_all chunk");
    check_mpi(MPI_Alltoall(send.data(), chunk, MPI_BYTE, recv.data(), chunk, MPI_BYTE, comm_), "MPI_Alltoall");
  }

  void all_gather(const ExecContext&, const TensorView& send, const TensorView& recv) override {
    parallel_detail::check_all_gather(*this, send, recv);
    const int bytes = checked_count(send.nbytes(), "all_gather send");
    check_mpi(MPI_Allgather(send.data(), bytes, MPI_BYTE, recv.data(), bytes, MPI_BYTE, comm_), "MPI_Allgather");
  }

  void all_reduce_sum(const ExecContext&, const TensorView& tensor) override {
    parallel_detail::check_comm_tensor(*this, tensor, "tensor");
    MPI_Datatype type = MPI_DATATYPE_NULL;
    if (tensor.dtype() == DType::kF32) type = MPI_FLOAT;
    if (tensor.dtype() == DType::kF64) type = MPI_DOUBLE;
    if (type == MPI_DATATYPE_NULL) fail_argument("tensor", "dtype fp32 or fp64 (MPI sum)", dtype_name(tensor.dtype()));
    const int count = checked_count(static_cast<size_t>(tensor.numel()), "all_reduce_sum elements");
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, tensor.data(), count, type, MPI_SUM, comm_), "MPI_Allreduce");
  }

  std::unique_ptr<PendingExchange> ring_exchange_async(const ExecContext&, const TensorView& send,
                                                       const TensorView& recv) override {
    parallel_detail::check_ring_exchange(*this, send, recv);
    const int bytes = checked_count(send.nbytes(), "ring exchange");
    const int next = (rank_ + 1) % size_, previous = (rank_ + size_ - 1) % size_;
    std::vector<MPI_Request> requests(2, MPI_REQUEST_NULL);
    check_mpi(MPI_Irecv(recv.data(), bytes, MPI_BYTE, previous, kRingTag, comm_, &requests[0]), "MPI_Irecv");
    const int status = MPI_Isend(send.data(), bytes, MPI_BYTE, next, kRingTag, comm_, &requests[1]);
    if (status != MPI_SUCCESS) {  // nothing will arrive for the posted receive: withdraw it
      MPI_Cancel(&requests[0]);
      MPI_Request_free(&requests[0]);
      check_mpi(status, "MPI_Isend");
    }
    return std::make_unique<MpiPendingExchange>(std::move(requests));
  }

  // Messages travelling to the next rank carry kDownTag, to the previous kUpTag.
  void neighbour_exchange(const ExecContext&, const TensorView& to_previous, const TensorView& to_next, const TensorView& from_previous,
                          const TensorView& from_next) override {
    const int bytes = checked_count(parallel_detail::check_neighbour_exchange(*this, to_previous, to_next, from_previous, from_next),
                                    "neighbour exchange");
    std::vector<MPI_Request> requests;
    requests.reserve(4);  // MPI writes each handle through its address
    // A failed post withdraws what was posted (nothing will match it), as the ring exchange does.
    const auto post = [&](int status, const char* call) {
      if (status == MPI_SUCCESS) return;
      for (MPI_Request& request : requests)
        if (request != MPI_REQUEST_NULL) {
          MPI_Cancel(&request);
          MPI_Request_free(&request);
        }
      check_mpi(status, call);
    };
    if (rank_ > 0) {
      requests.push_back(MPI_REQUEST_NULL);
      post(MPI_Irecv(from_previous.data(), bytes, MPI_BYTE, rank_ - 1, kDownTag, comm_, &requests.back()), "MPI_Irecv");
      requests.push_back(MPI_REQUEST_NULL);
      post(MPI_Isend(to_previous.data(), bytes, MPI_BYTE, rank_ - 1, kUpTag, comm_, &requests.back()), "MPI_Isend");
    }
    if (rank_ + 1 < size_) {
      requests.push_back(MPI_REQUEST_NULL);
      post(MPI_Irecv(from_next.data(), bytes, MPI_BYTE, rank_ + 1, kUpTag, comm_, &requests.back()), "MPI_Irecv");
      requests.push_back(MPI_REQUEST_NULL);
      post(MPI_Isend(to_next.data(), bytes, MPI_BYTE, rank_ + 1, kDownTag, comm_, &requests.back()), "MPI_Isend");
    }
    check_mpi(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall (neighbour exchange)");
  }

  void barrier(const ExecContext&) override { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

  std::unique_ptr<Communicator> split(int color, int key, const SplitOptions&) const override {
    if (color < 0) fail_argument("color", ">= 0", color);
    MPI_Comm sub = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    return std::make_unique<MpiCommunicator>(sub);
  }

 private:
  static constexpr int kRingTag = 7301, kDownTag = 7302, kUpTag = 7303;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

bool mpi_compiled() { return true; }

MpiSession::MpiSession() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  finalize_ = true;
}

MpiSession::~MpiSession() {
  if (finalize_ && !mpi_finalized()) MPI_Finalize();
}

std::unique_ptr<Communicator> make_mpi_world_communicator() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized || mpi_finalized())
    throw Error("make_mpi_world_communicator: MPI is not initialized (create a tessel::MpiSession in main first)");
  MPI_Comm world = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup");
  return std::make_unique<MpiCommunicator>(world);
}

#endif

}  // namespace tessel
