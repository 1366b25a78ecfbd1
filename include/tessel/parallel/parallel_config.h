// Parallel groups: how the ranks of a job are arranged into sequence-parallel (Ulysses x Ring),
// CFG-parallel, data-parallel and tensor-parallel groups.
//
// Rank order "tp-sp-pp-cfg-dp", the first dimension varying fastest, and inside the sequence
// dimension Ulysses before Ring:
//   world_rank = tp + T * (ulysses + U * (ring + R * (cfg + C * dp)))      (pipeline parallel is 1)
// so a Ulysses group is U consecutive ranks (its all-to-all stays on the fastest links) and a ring
// group strides by T*U. The sequence-parallel rank, sp = ulysses + U * ring, is the index of the
// shard of the token sequence a rank holds.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessel/parallel/communicator.h"

namespace tessel {

struct ParallelConfig {
  int sp_ulysses_degree = 1;
  int sp_ring_degree = 1;
  int cfg_parallel_size = 1;   // 1 or 2 (the conditional and the unconditional branch)
  int data_parallel_size = 1;
  int tensor_parallel_size = 1;  // a named dimension of the rank order; only 1 is supported
  // Multiprocessors Ring attention's block-sparse steps leave free while a K/V exchange is in
  // flight, and the most thread blocks the ring's NCCL kernels take (AttentionOptions::sm_margin,
  // SplitOptions), so that the exchange runs beside the attention instead of taking turns with it.
  // 0: no reservation and NCCL's own block count. Changes no result, only the overlap. 0 by
  // default because the Wan step is faster without it (4 x H200, 14B 720p: top-k and radial under
  // Ring 4 lose 3.5 and 5.6 % at 32), while attention alone at batch 1 gains 15 % at 32 (8 and 16
  // starve the exchange); docs/benchmarks.md, "Ring's exchange beside the attention".
  int ring_sm_margin = 0;
  // Ulysses alone (sp_ulysses_degree > 1, sp_ring_degree 1): each rank's heads are split into this
  // many groups that are pipelined, the all-to-alls of one group on the communicator's own stream
  // while another group's attention runs (ParallelAttention). 1: one all-to-all per tensor,
  // serialised with the attention. It must divide the query and the kv heads of each Ulysses rank
  // (checked where the heads are known: ParallelAttention's constructor). Changes no result.
  int ulysses_head_groups = 1;
  // With ulysses_head_groups > 1: multiprocessors each group's attention leaves free for the
  // all-to-alls in flight beside it, and the most thread blocks the Ulysses group's NCCL kernels
  // take (as ring_sm_margin for Ring). 0: no reservation. Changes no result, only the overlap.
  int ulysses_sm_margin = 0;

  int sequence_parallel_size() const { return sp_ulysses_degree * sp_ring_degree; }
  // The number of ranks the configuration spans (the product of every degree).
  int world_size() const;
  // Throws Error naming the degree when one is below 1, tensor_parallel_size is not 1,
  // cfg_parallel_size is not 1 or 2, or the degrees' product is not `world_size`; naming
  // ulysses_head_groups when it is below 1 or above 1 without Ulysses alone, and ulysses_sm_margin
  // when it is out of range or set without head groups.
  void validate(int world_size) const;
};

// A rank's position along every dimension.
struct ParallelCoordinates {
  int tensor = 0, ulysses = 0, ring = 0, cfg = 0, data = 0;
  int sequence = 0;  // ulysses + U * ring: the index of this rank's sequence shard
};

enum class ParallelDim { kTensor, kUlysses, kRing, kSequence, kCfg, kData };

// Pure rank arithmetic (no communication); `config` must be valid for `world_size`.
ParallelCoordinates parallel_coordinates(const ParallelConfig& config, int world_rank);
// The world ranks of the `dim` group that holds `world_rank`, in group-rank order.
std::vector<int> parallel_group_ranks(const ParallelConfig& config, ParallelDim dim, int world_rank);

// One communicator per dimension for the calling rank (each a split of the world communicator);
// size 1 where the degree is 1.
struct ParallelGroups {
  ParallelConfig config;
  ParallelCoordinates coordinates;
  std::unique_ptr<Communicator> tensor, ulysses, ring, sequence, cfg, data;
};

// Validates `config` against world.size() and splits `world` into the groups. Collective over
// `world`: every rank calls it with the same config.
ParallelGroups initialize_parallel_groups(const Communicator& world, const ParallelConfig& config);

}  // namespace tessel
