// The CLI's parallel flags and the process group they start (see parallel_flags.h).
#include "parallel_flags.h"

#include <cstdlib>
#include <exception>
#include <string>

#include "option_checks.h"
#include "tessel/core/current_device.h"
#include "tessel/core/error.h"
#include "tessel/core/sync_trace.h"
#include "tessel/parallel/traced_communicator.h"

namespace tessel::cli {

ParallelConfig ParallelFlags::config() const {
  ParallelConfig config;
  config.sp_ulysses_degree = ulysses;
  config.sp_ring_degree = ring;
  config.cfg_parallel_size = cfg_parallel ? 2 : 1;
  config.ring_sm_margin = ring_sm_margin;
  config.ulysses_head_groups = ulysses_head_groups;
  config.ulysses_sm_margin = ulysses_sm_margin;
  check_ring_sm_margin_used(ring > 1);
  check_ulysses_head_groups_used(ulysses > 1 && ring == 1);
  return config;
}

void ParallelFlags::check_ulysses_head_groups_used(bool any_ulysses_alone) const {
  check_ulysses_head_groups_flag(ulysses_head_groups, ulysses_sm_margin, any_ulysses_alone, describe());
}

void check_ulysses_head_groups_flag(int groups, int sm_margin, bool any_ulysses_alone, const std::string& layout) {
  if (groups > 1 && !any_ulysses_alone)
    fail_argument("--ulysses-head-groups",
                  "1 unless Ulysses runs alone (--ulysses > 1 without --ring): the groups pipeline its all-to-alls",
                  detail::concat(groups, " with ", layout));
  if (sm_margin > 0 && groups == 1)
    fail_argument("--ulysses-sm-margin", "together with --ulysses-head-groups > 1: it only changes their overlap",
                  detail::concat(sm_margin, " without head groups"));
}

void ParallelFlags::check_ring_sm_margin_used(bool any_ring) const {
  if (ring_sm_margin_option != nullptr && ring_sm_margin_option->count() > 0 && !any_ring)
    fail_argument("--ring-sm-margin", "together with a Ring layout (--ring > 1): it only changes Ring attention's overlap",
                  detail::concat(ring_sm_margin, " without one"));
}

std::string ParallelFlags::describe() const {
  return detail::concat("ulysses ", ulysses, " x ring ", ring, " x cfg ", cfg_parallel ? 2 : 1);
}

void add_parallel_flags(CLI::App& app, ParallelFlags& flags) {
  app.add_option("--ulysses", flags.ulysses, "Ulysses sequence-parallel degree (divides the heads; launch with mpirun)")
      ->capture_default_str()
      ->check(integer_in(1, 4096));
  app.add_option("--ring", flags.ring, "Ring sequence-parallel degree (launch with mpirun)")->capture_default_str()->check(integer_in(1, 4096));
  app.add_flag("--cfg-parallel", flags.cfg_parallel, "the two guidance branches on two ranks (launch with mpirun)");
  flags.ring_sm_margin_option = app.add_option("--ring-sm-margin", flags.ring_sm_margin,
                 "multiprocessors Ring attention leaves free for its K/V exchange (changes timing only)")
      ->capture_default_str()
      ->check(integer_in(0, 1024));
  app.add_option("--ulysses-head-groups", flags.ulysses_head_groups,
                 "Ulysses alone: pipeline its all-to-alls with the attention in this many groups of each rank's heads "
                 "(divides them; changes timing only)")
      ->capture_default_str()
      ->check(integer_in(1, 1024));
  app.add_option("--ulysses-sm-margin", flags.ulysses_sm_margin,
                 "with --ulysses-head-groups: multiprocessors each group's attention leaves to the all-to-alls beside it "
                 "(changes timing only)")
      ->capture_default_str()
      ->check(integer_in(0, 1024));
}

namespace {

std::optional<int> env_int(const char* name, int low, int high) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < low || value > high)
    fail_argument(std::string("environment variable ") + name, detail::concat("an integer in [", low, ", ", high, "]"),
                  quoted_excerpt(text));
  return static_cast<int>(value);
}

// The rendezvous of a job launched without mpirun, when TESSEL_WORLD_SIZE says there is one.
std::optional<TcpRendezvous> rendezvous_from_env() {
  const std::optional<int> size = env_int("TESSEL_WORLD_SIZE", 1, 1 << 20);
  if (!size) {
    // A rank without a world would run as one process, silently: refuse it as every command does.
    for (const char* name : {"TESSEL_RANK", "TESSEL_LOCAL_RANK"})
      if (const char* value = std::getenv(name); value != nullptr && *value != '\0')
        fail_argument(std::string("environment variable ") + name, "set together with TESSEL_WORLD_SIZE", "TESSEL_WORLD_SIZE unset");
    return std::nullopt;
  }
  TcpRendezvous r;
  r.size = *size;
  const std::optional<int> rank = env_int("TESSEL_RANK", 0, *size - 1);
  if (!rank) fail_argument("environment variable TESSEL_RANK", "set with TESSEL_WORLD_SIZE", "unset");
  r.rank = *rank;
  if (const char* address = std::getenv("TESSEL_MASTER_ADDR"); address != nullptr && *address != '\0') r.address = address;
  r.port = env_int("TESSEL_MASTER_PORT", 1, 65535).value_or(r.port);
  return r;
}

// TESSEL_TRACE_SYNC=1: every collective and every device-wide wait of this process is logged
// (tessel/core/sync_trace.h), to find which call a hung rank sits in.
void trace_sync_from_env() {
  if (const std::optional<int> on = env_int("TESSEL_TRACE_SYNC", 0, 1)) set_sync_trace(*on == 1);
}

}  // namespace

// Every communicator of a run: traced (written only under TESSEL_TRACE_SYNC=1), then metered.
std::unique_ptr<Communicator> ParallelRun::wrap(std::unique_ptr<Communicator> inner, const char* label) const {
  return make_metered_communicator(make_traced_communicator(std::move(inner), label), meter_);
}

ParallelRun::ParallelRun(const ParallelFlags& flags) : ParallelRun(flags, Device::cpu()) {}

ParallelRun::ParallelRun(const ParallelFlags& flags, Device device) : device_(device) {
  trace_sync_from_env();
  const ParallelConfig config = flags.config();
  if (device.is_cuda()) {
    start_nccl_groups(config);
    return;
  }
  // The environment is checked whatever the degrees: a rank or world set for a CPU run is an error,
  // not one process that silently ignores it.
  if (rendezvous_from_env())
    fail_argument("TESSEL_WORLD_SIZE", "unset: the model's CPU tensors move over MPI (launch with mpirun)", "set");
  if (config.world_size() == 1) return;
  if (!mpi_compiled())
    fail_argument("--ulysses / --ring / --cfg-parallel", "1 rank (tessel was built without MPI)", flags.describe());
  mpi_ = std::make_unique<MpiSession>();
  world_ = wrap(make_mpi_world_communicator(), "mpi-world");
  if (world_->size() != config.world_size())
    fail_argument("--ulysses x --ring (x 2 with --cfg-parallel)",
                  detail::concat("the ", world_->size(), " processes mpirun started"),
                  detail::concat(config.world_size(), " (", flags.describe(), ")"));
  groups_ = initialize_parallel_groups(*world_, config);
  meter_->reset();  // the group set-up is not part of what a command measures
}

void ParallelRun::start_nccl_groups(const ParallelConfig& config) {
  rendezvous_ = rendezvous_from_env();
  if (!rendezvous_ && config.world_size() == 1) return;
  const std::string degrees = "--ulysses x --ring (x 2 with --cfg-parallel)";
  const std::string asked = detail::concat(config.world_size(), " (ulysses ", config.sp_ulysses_degree, " x ring ", config.sp_ring_degree,
                                           " x cfg ", config.cfg_parallel_size, ")");
  if (rendezvous_) {
    if (rendezvous_->size != config.world_size())
      fail_argument(degrees, detail::concat("TESSEL_WORLD_SIZE = ", rendezvous_->size), asked);
  } else {
    if (!mpi_compiled())
      fail_argument("--ulysses / --ring / --cfg-parallel on " + device_.str(),
                    "1 rank, or TESSEL_RANK / TESSEL_WORLD_SIZE set (tessel was built without MPI)", asked);
    mpi_ = std::make_unique<MpiSession>();
    bootstrap_ = make_mpi_world_communicator();
    if (bootstrap_->size() != config.world_size())
      fail_argument(degrees, detail::concat("the ", bootstrap_->size(), " processes mpirun started"), asked);
  }
  if (config.world_size() > 1) {
    device_ = Device::cuda(local_rank());
    make_current_device(device_);  // kernels, streams and the NCCL communicator on this rank's GPU
  }
  ExecContext ctx;
  ctx.device = device_;
  world_ = wrap(rendezvous_ ? make_nccl_communicator(ctx, *rendezvous_, device_) : make_nccl_communicator(ctx, *bootstrap_, device_),
                "nccl-world");
  groups_ = initialize_parallel_groups(*world_, config);
  meter_->reset();
}

ParallelRun::ParallelRun(WholeWorld) {
  trace_sync_from_env();
  rendezvous_ = rendezvous_from_env();
  if (rendezvous_) return;
  if (!mpi_compiled()) {
    world_ = wrap(make_single_rank_communicator(Device::cpu()), "single-rank");
    return;
  }
  mpi_ = std::make_unique<MpiSession>();
  world_ = wrap(make_mpi_world_communicator(), "mpi-world");
}

ParallelRun::~ParallelRun() {
  // Leaving by an error while other ranks may wait in a collective: MPI_Finalize (the session's
  // destructor) and ncclCommDestroy (which waits for the operations in flight, some of them paired
  // with a peer's that will never come) would wait forever, and the error would never be printed:
  // on 2 H200s a Ring rank that failed sat in ncclCommDestroy while its peer spun in its NCCL
  // kernel. Leave the communicators as they are instead; the error reaches the user, the process
  // exits, and the launcher (mpirun, or the timeout around the TESSEL_* ranks) ends the others.
  if (std::uncaught_exceptions() > 0 && world_size() > 1) {
    new std::optional<ParallelGroups>(std::move(groups_));  // never freed: no collective on the way out
    static_cast<void>(world_.release());
    static_cast<void>(bootstrap_.release());
    static_cast<void>(mpi_.release());
  }
}

int ParallelRun::local_rank() const {
  if (const std::optional<int> local = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, 1 << 20)) return *local;
  if (const std::optional<int> local = env_int("TESSEL_LOCAL_RANK", 0, 1 << 20)) return *local;
  return world_rank();
}

std::unique_ptr<Communicator> ParallelRun::device_world(const ExecContext& ctx, Device device) const {
  make_current_device(device);  // the communicator, and the caller's kernels, on the GPU it names
  if (rendezvous_) {
    if (!device.is_cuda())
      fail_argument("--device", "cuda when launched without mpirun (CPU tensors move over MPI)", device.str());
    return wrap(make_nccl_communicator(ctx, *rendezvous_, device), "nccl-device-world");
  }
  if (!world_) fail_argument("parallel run", "a world of processes (sp-bench's)", "one process without a world");
  if (device.is_cpu()) return world_->split(0, world_->rank());
  return wrap(make_nccl_communicator(ctx, *world_, device), "nccl-device-world");
}

void ParallelRun::barrier() const {
  if (!world_) return;
  ExecContext ctx;
  ctx.device = world_->device();
  world_->barrier(ctx);
}

}  // namespace tessel::cli
