// Parallel groups: the rank order and its validation, and the split of the world communicator.
#include "tessel/parallel/parallel_config.h"

#include <array>

#include "tessel/core/error.h"

namespace tessel {
namespace {

// Dimensions in rank order, fastest first.
enum Axis { kTp, kUlysses, kRing, kCfg, kDp, kAxes };

std::array<int, kAxes> extents(const ParallelConfig& c) {
  return {c.tensor_parallel_size, c.sp_ulysses_degree, c.sp_ring_degree, c.cfg_parallel_size, c.data_parallel_size};
}

std::array<int, kAxes> coordinates_of(const ParallelConfig& c, int world_rank) {
  const auto extent = extents(c);
  std::array<int, kAxes> coordinate{};
  for (int axis = 0; axis < kAxes; ++axis) {
    coordinate[axis] = world_rank % extent[axis];
    world_rank /= extent[axis];
  }
  return coordinate;
}

int rank_of(const ParallelConfig& c, const std::array<int, kAxes>& coordinate) {
  const auto extent = extents(c);
  int rank = 0;
  for (int axis = kAxes - 1; axis >= 0; --axis) rank = rank * extent[axis] + coordinate[axis];
  return rank;
}

// The axes a group dimension spans, fastest first (the group rank follows the same order).
std::vector<Axis> axes_of(ParallelDim dim) {
  switch (dim) {
    case ParallelDim::kTensor: return {kTp};
    case ParallelDim::kUlysses: return {kUlysses};
    case ParallelDim::kRing: return {kRing};
    case ParallelDim::kSequence: return {kUlysses, kRing};
    case ParallelDim::kCfg: return {kCfg};
    case ParallelDim::kData: return {kDp};
  }
  return {};
}

}  // namespace

int ParallelConfig::world_size() const {
  return tensor_parallel_size * sp_ulysses_degree * sp_ring_degree * cfg_parallel_size * data_parallel_size;
}

void ParallelConfig::validate(int world_size_) const {
  const std::pair<const char*, int> degrees[] = {{"sp_ulysses_degree", sp_ulysses_degree},
                                                 {"sp_ring_degree", sp_ring_degree},
                                                 {"cfg_parallel_size", cfg_parallel_size},
                                                 {"data_parallel_size", data_parallel_size},
                                                 {"tensor_parallel_size", tensor_parallel_size}};
  for (const auto& [name, degree] : degrees)
    if (degree < 1) fail_argument(std::string("ParallelConfig.") + name, ">= 1", degree);
  if (tensor_parallel_size != 1)
    fail_argument("ParallelConfig.tensor_parallel_size", "1 (tensor parallelism is not implemented)", tensor_parallel_size);
  if (ring_sm_margin < 0 || ring_sm_margin > 1024)
    fail_argument("ParallelConfig.ring_sm_margin", "in [0, 1024] (multiprocessors left free)", ring_sm_margin);
  if (ulysses_head_groups < 1 || ulysses_head_groups > 1024)
    fail_argument("ParallelConfig.ulysses_head_groups", "in [1, 1024]", ulysses_head_groups);
  if (ulysses_head_groups > 1 && (sp_ulysses_degree == 1 || sp_ring_degree > 1))
    fail_argument("ParallelConfig.ulysses_head_groups",
                  "1 unless Ulysses runs alone (sp_ulysses_degree > 1 and sp_ring_degree 1): the groups pipeline its all-to-alls",
                  detail::concat(ulysses_head_groups, " with ulysses ", sp_ulysses_degree, " x ring ", sp_ring_degree));
  if (ulysses_sm_margin < 0 || ulysses_sm_margin > 1024)
    fail_argument("ParallelConfig.ulysses_sm_margin", "in [0, 1024] (multiprocessors left free)", ulysses_sm_margin);
  if (ulysses_sm_margin > 0 && ulysses_head_groups == 1)
    fail_argument("ParallelConfig.ulysses_sm_margin", "0 without Ulysses head groups (ulysses_head_groups 1: nothing overlaps)",
                  ulysses_sm_margin);
  if (cfg_parallel_size > 2)
    fail_argument("ParallelConfig.cfg_parallel_size", "1 or 2 (one rank per guidance branch)", cfg_parallel_size);
  for (const auto& [name, degree] : degrees)
    if (world_size_ % degree != 0)
      fail_argument(std::string("ParallelConfig.") + name, detail::concat("a divisor of the world size ", world_size_), degree);
  if (static_cast<long long>(tensor_parallel_size) * sp_ulysses_degree * sp_ring_degree * cfg_parallel_size *
          data_parallel_size != world_size_)
    fail_argument("ParallelConfig",
                  detail::concat("degrees whose product (ulysses x ring x cfg x data x tensor) is the world size ",
                                 world_size_),
                  detail::concat(sp_ulysses_degree, " x ", sp_ring_degree, " x ", cfg_parallel_size, " x ",
                                 data_parallel_size, " x ", tensor_parallel_size));
}

ParallelCoordinates parallel_coordinates(const ParallelConfig& config, int world_rank) {
  if (world_rank < 0 || world_rank >= config.world_size())
    fail_argument("world_rank", detail::concat("in [0, ", config.world_size(), ")"), world_rank);
  const auto c = coordinates_of(config, world_rank);
  return {c[kTp], c[kUlysses], c[kRing], c[kCfg], c[kDp], c[kUlysses] + config.sp_ulysses_degree * c[kRing]};
}

std::vector<int> parallel_group_ranks(const ParallelConfig& config, ParallelDim dim, int world_rank) {
  parallel_coordinates(config, world_rank);  // range check
  const auto extent = extents(config);
  const auto axes = axes_of(dim);
  int members = 1;
  for (Axis axis : axes) members *= extent[axis];
  std::vector<int> ranks;
  ranks.reserve(static_cast<size_t>(members));
  auto coordinate = coordinates_of(config, world_rank);
  for (int member = 0; member < members; ++member) {
    int rest = member;
    for (Axis axis : axes) {
      coordinate[axis] = rest % extent[axis];
      rest /= extent[axis];
    }
    ranks.push_back(rank_of(config, coordinate));
  }
  return ranks;
}

ParallelGroups initialize_parallel_groups(const Communicator& world, const ParallelConfig& config) {
  config.validate(world.size());
  ParallelGroups groups;
  groups.config = config;
  groups.coordinates = parallel_coordinates(config, world.rank());
  const auto split = [&](ParallelDim dim, const SplitOptions& options = {}) {
    const std::vector<int> ranks = parallel_group_ranks(config, dim, world.rank());
    int key = 0;
    while (ranks[static_cast<size_t>(key)] != world.rank()) ++key;
    return world.split(/*color=*/ranks.front(), key, options);  // the group's first rank names it
  };
  groups.tensor = split(ParallelDim::kTensor);
  // Under head groups the all-to-alls run beside the attention, which leaves them ulysses_sm_margin.
  groups.ulysses = split(ParallelDim::kUlysses, SplitOptions{config.ulysses_sm_margin});
  // The ring's exchange runs beside the attention, which leaves it ring_sm_margin multiprocessors.
  groups.ring = split(ParallelDim::kRing, SplitOptions{config.ring_sm_margin});
  groups.sequence = split(ParallelDim::kSequence);
  groups.cfg = split(ParallelDim::kCfg);
  groups.data = split(ParallelDim::kData);
  return groups;
}

}  // namespace tessel
