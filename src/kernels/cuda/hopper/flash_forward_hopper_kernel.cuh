// Warp-specialized Hopper forward kernel (sm_90a) for dense and block-sparse attention, D = 64, 96,
// 128, 192 or 256 (96 runs in the 128 layout: the copy engine zero-fills columns 96..127).
//
// A persistent grid (one CTA per SM) walks work items of 128 query rows of one (batch, head)
// (work_items.h: a static stride, or ranks claimed from a longest-first list); each CTA has three
// warpgroups:
//  - warpgroup 0, the producer, gives up registers (setmaxnreg) and one of its threads picks the
//    items and issues bulk tensor copies (TMA): K and V tiles of kBlockN keys into a ring of kStages
//    shared-memory stages, each guarded by a "full" and an "empty" mbarrier, and per item Q
//    (after the item's first stage, into one of kQBuffers buffers once the consumers hand it
//    back). The ring runs on across items, so the next item's first stages and Q load while the
//    current item finishes;
//  - warpgroups 1 and 2, the consumers, take the registers and own 64 query rows each: per stage
//    S = Q K^T (wgmma, both operands in shared memory), the online softmax in registers, then
//    O += P V (wgmma with P from registers and V read transposed from shared memory); per item
//    the normalized O, stored from registers or (kTmaStore) through shared memory by the copy
//    engine.
// A stage holds one or two 64-key sub-tiles (HopperConfig), each at its own key offset: for dense
// attention they are adjacent, for a block mask they are the next 64-key pieces of the row's kept
// blocks, so one kernel serves both. The producer writes each stage's StageInfo next to the barriers: the two
// offsets (-1 marks a missing second sub-tile, whose columns are masked), the item and whether
// the stage is the item's last. The consumers learn their items from it: a first stage with
// offset -1 is an item with no tiles (empty mask row: no Q is loaded, the rows get output 0 and
// LSE -inf), a stage with item -1 ends the kernel.
//
// Shared tiles are what the copy engine writes with the 128-byte swizzle: boxes of 64 rows x 64
// columns (128 bytes a row), 8-row groups 1024 bytes apart, which wgmma reads K-major (Q, K) or
// MN-major (V). A D-column operand is kPaddedD / 64 such column halves (kQHalfBytes apart in the Q
// tile of 128 rows, kStageHalfBytes in a stage of kBlockN keys), where
// kPaddedD rounds D up to 64: the columns past D read as zeros (outside the tensor map), so
// QK^T stops at D and PV yields zero columns that are never stored.
//
// FP8 mode (kFp8, D = 128; fp8_operands.h): Q, K and a transposed V are e4m3 copies with
// per-block (Q, K: 64 tokens) and per-channel (V) scales. A Q or K row is then 128 bytes, one
// 128-byte swizzled box wide; S = Q K^T is 4 m64n128k32 FP8 wgmmas; each S sub-tile is multiplied
// by its q scale x k scale before the softmax; P (scaled so that a row's running maximum is 448)
// goes to e4m3 A fragments straight from the S accumulators, in the key order in which the
// transposed V was written; O += P V is 4 FP8 wgmmas reading V^T K-major from two 64-key
// sub-tiles of 128 channels x 64 bytes (64-byte swizzle); the epilogue multiplies each channel by
// its V scale. The FP8 variants (kernel_variant.h): kPolyExp2 computes an eighth of the P values'
// exp2 with a polynomial on the FMA units instead of the MUFU unit; kLazyRescale (also a 16-bit
// variant) keeps a row's stale maximum (and skips rescaling O) until the row max grows past
// kRescaleThreshold; ping-pong as for 16-bit operands. With K smoothing the quantizer hands the kernel each row's LSE shift.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/flash_forward_kernel.cuh"
#include "cuda/flash_params.h"
#include "cuda/hopper/async_copy.cuh"
#include "cuda/hopper/fp8_operands.h"
#include "cuda/hopper/work_items.h"
#include "cuda/wgmma.cuh"

namespace tessel::cuda::detail {

namespace hopper {

inline constexpr int kSubTile = 64;
inline constexpr int kThreads = 384;   // producer warpgroup + two consumer warpgroups
inline constexpr int kConsumerThreads = 256;
inline constexpr int kProducerRegisters = 40;
inline constexpr int kConsumerRegisters = 232;
// The registers the three warpgroups hold after setmaxnreg must fit the multiprocessor's 64K.
static_assert(128 * (kProducerRegisters + 2 * kConsumerRegisters) <= 65536);

// Kept block ids of a mask row staged in shared memory (the rest are read from global memory):
// what fits beside the stages.
inline constexpr int kIndexCacheEntries = 256;

// A 64-column half of the 128-row Q tile (128 rows x 128 bytes); a box is 64 rows of it.
inline constexpr uint32_t kQHalfBytes = 128 * 128;
inline constexpr uint32_t kBoxBytes = 64 * 128;
// Dynamic shared memory one CTA may use on compute capability 9.0, and the slack the launch adds
// to align the base to 1024 bytes.
inline constexpr uint32_t kMaxSharedBytes = 227 * 1024;
inline constexpr uint32_t kAlignmentSlack = 1024;

// What the producer tells the consumers about a stage (next to the barriers).
struct StageInfo {
  int32_t n0, n1;  // key offsets of the two sub-tiles; n1 = -1: none; n0 = -1: the item has no tiles
  int32_t item;    // the work item the stage belongs to; -1: no more items, the consumers exit
  int32_t last;    // 1 on the item's last stage
};

// Tile shapes and the shared-memory layout for a head dim padded to kPaddedD (64, 128, 192, 256),
// from a 1024-byte aligned base: the Q buffers, the K stages, the V stages, then the barriers, the
// stages' StageInfo and the cache of a mask row's kept block ids.
//  - D <= 128: stages of 128 keys (two sub-tiles), three of them; a second Q buffer (the next
//    item's Q loads while the current item runs) where it fits (D = 64).
//  - D = 192 and 256: a 128-key stage of K and V is 96 / 128 KB, so stages hold one 64-key
//    sub-tile (48 / 64 KB): three stages beside the 48 KB Q tile at 192, two beside the 64 KB one
//    at 256 (three would need 256 KB). The consumers' registers bound them too: O is 64 x D fp32
//    per warpgroup (128 registers a thread at 256) beside S of 64 x 64 (32) and P (16).
//  - FP8 (D = 128 only): Q, K rows are 128 bytes (one box wide), a V stage is 128 channels x 128
//    key bytes: 16 KB Q tiles and 32 KB stages, so four stages and two Q buffers fit.
//  - kNarrow (D <= 128, a tile shape the plan-time tuning may pick): stages of one 64-key sub-tile,
//    half the bytes, so up to five of them and two Q buffers fit: the next item's Q loads during the
//    current one and more K/V loads are in flight, for the price of S products half as wide.
template <int kPaddedD, bool kFp8 = false, bool kNarrow = false>
struct HopperConfig {
  static_assert(kPaddedD % 64 == 0 && kPaddedD >= 64 && kPaddedD <= 256, "head dims up to 256");
  static_assert(!kFp8 || kPaddedD == 128, "the FP8 mode has head dim 128");
  static_assert(!kNarrow || (!kFp8 && kPaddedD <= 128), "narrow stages: 16-bit operands, head dims up to 128");
  static constexpr int kBoxColumns = kFp8 ? 128 : 64;  // elements of a 128-byte box row
  static constexpr int kHalves = kPaddedD / kBoxColumns;  // 128-byte column boxes of a Q or K row
  static constexpr int kBlockN = kPaddedD <= 128 && !kNarrow ? 128 : 64;  // keys per stage
  static constexpr int kSubTiles = kBlockN / kSubTile;
  static constexpr uint32_t kQTileBytes = kHalves * kQHalfBytes;  // 128 rows x D columns
  static constexpr uint32_t kStageHalfBytes = kBlockN * 128;      // kBlockN keys x one column box
  static constexpr uint32_t kStageBytes = kHalves * kStageHalfBytes;  // the K of a stage
  // The V of a stage: as K, or (FP8) V^T, kSubTiles pieces of 128 channels x 64 key bytes.
  static constexpr uint32_t kVSubTileBytes = kFp8 ? 128 * kSubTile : 0;
  static constexpr uint32_t kVStageBytes = kFp8 ? kSubTiles * kVSubTileBytes : kStageBytes;
  static constexpr uint32_t bytes_with(int q_buffers, int stages) {
    return q_buffers * kQTileBytes + stages * (kStageBytes + kVStageBytes) + 16 * q_buffers + 16 * stages +
           16 * stages + kIndexCacheEntries * 4;
  }
  static constexpr bool fits(int q_buffers, int stages) {
    return bytes_with(q_buffers, stages) + kAlignmentSlack <= kMaxSharedBytes;
  }
  static constexpr int kStages = kNarrow ? (fits(2, 5) ? 5 : fits(2, 4) ? 4 : 3) : kFp8 && fits(2, 4) ? 4 : fits(1, 3) ? 3 : 2;
  static constexpr int kQBuffers = fits(2, kStages) ? 2 : 1;
  static_assert(fits(1, kStages), "Q and two stages exceed shared memory");

  static constexpr uint32_t q = 0;
  static constexpr uint32_t k = q + kQBuffers * kQTileBytes;
  static constexpr uint32_t v = k + kStages * kStageBytes;
  static constexpr uint32_t q_full = v + kStages * kVStageBytes;  // [kQBuffers]
  static constexpr uint32_t q_empty = q_full + 8 * kQBuffers;    // [kQBuffers]
  static constexpr uint32_t full = q_empty + 8 * kQBuffers;
  static constexpr uint32_t empty = full + 8 * kStages;
  static constexpr uint32_t info = empty + 8 * kStages;  // StageInfo [kStages]
  static constexpr uint32_t index_cache = info + sizeof(StageInfo) * kStages;
  static constexpr uint32_t bytes(bool sparse) { return index_cache + (sparse ? kIndexCacheEntries * 4 : 0); }
  static_assert(bytes(true) + kAlignmentSlack <= kMaxSharedBytes, "Q, the stages and the mask cache exceed shared memory");
  static_assert(bytes(true) <= bytes_with(kQBuffers, kStages), "bytes_with() must bound the layout");
  static_assert(info % 16 == 0 && full % 8 == 0);

  // O as chunks of one PV instruction's N columns: one n64 or n128 chunk up to D = 128, three n64
  // chunks at 192, two n128 chunks at 256 (each chunk an instruction per k16 slice of keys).
  static constexpr int kOChunkN = kPaddedD % 128 == 0 ? 128 : 64;
  static constexpr int kOChunks = kPaddedD / kOChunkN;
};

// 2^x from the FMA and integer units (FlashAttention-4's exp2 emulation), for the FP8 mode's P,
// which e4m3 then rounds to 2^-4 relative: Cody-Waite range reduction x = n + f with n = round(x)
// (adding 1.5 * 2^23 leaves n in the low mantissa bits of y), a degree-3 fit of 2^f on
// [-0.5, 0.5] (relative error 7.5e-5, minimax on the relative error), then n added to the
// exponent bits (y's bits shifted by 23 are n * 2^23 modulo 2^32). x is clamped at -126 (the
// masked -inf): the result is then at most 2^-126, which e4m3 rounds to 0 and a row sum of at least
// one never notices. x <= 127.
__device__ __forceinline__ float exp2_polynomial(float x) {
  x = fmaxf(x, -126.f);
  const float y = __fadd_rn(x, 12582912.f);  // the _rn intrinsics are never reassociated away
  const float f = __fsub_rn(x, __fsub_rn(y, 12582912.f));
  const float p = fmaf(fmaf(fmaf(0.05517134f, f, 0.24261034f), f, 0.69326097f), f, 0.99992812f);
  return __uint_as_float(__float_as_uint(p) + (__float_as_uint(y) << 23));
}

// kLazyRescale: a row keeps its maximum (and O its scale) until a stage's scores exceed it by more
// than this many powers of two (FlashAttention-4's rule). P values then reach up to
// 2^kRescaleThreshold: harmless in bf16/fp16 (P <= 256, O and the sums in fp32); in FP8, P is
// scaled to put the kept maximum at 448 / 2^kRescaleThreshold, so e4m3 never saturates, for the
// price of that many fewer exponent steps above e4m3's subnormals (2^-6), which bounds the
// threshold (docs/cuda-kernels.md, "FP8 attention", has the measured trade-off).
inline constexpr float kRescaleThreshold = 8.0f;

}  // namespace hopper

// kPingPong: the two consumer warpgroups take turns issuing their GEMMs (two named barriers, as
// FlashAttention-3 schedules its warpgroups), so one warpgroup's softmax, first product of an item
// and epilogue run while the other's GEMMs hold the tensor cores; without it both issue at once and
// their softmaxes coincide. Whether that pays depends on the shape: the plan-time tuning decides.
// kTmaStore (16-bit operands, wide stages): the epilogue writes each warpgroup's normalized O tile
// into shared memory, in the K half of the item's last stage (free once both warpgroups' last
// products on it are done), and one thread stores it with the copy engine through o_map (the
// output as a (D, S_q, H, B) map of 64 x 64 boxes, 128-byte swizzle; unused otherwise): full
// 128-byte rows instead of 4-byte stores from the accumulator layout, and the warpgroup goes on
// to the next item while the copy engine writes. That thread hands the stage back to the producer
// only once the copy engine has read the tile, after the next item's first QK^T is issued.
// kOverlapEpilogue (with kTmaStore): the next item's first QK^T is issued right after the current
// item's last PV product, before its epilogue, so that it runs on the tensor cores during the
// epilogue and the wait for the next Q overlaps the last PV product (the tile is then handed back
// after the next item's first softmax).
// fp8_lse_shift (FP8 with K smoothing, else nullptr): per (batch, head, row), what the LSE lost
// when the quantizer subtracted K's channel means (softmax scale x q . mean), added back.
template <typename T, int D, bool kSparse, bool kFp8 = false, bool kNarrow = false, bool kPingPong = false,
          bool kPolyExp2 = false, bool kLazyRescale = false, bool kTmaStore = false, bool kOverlapEpilogue = false>
__global__ void __launch_bounds__(hopper::kThreads, 1)
    flash_forward_hopper_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map,
                                const FlashParams p, int batch_count, const WorkOrder work_order,
                                const float* __restrict__ fp8_lse_shift) {
#if TESSEL_WGMMA_AVAILABLE
  using namespace hopper;
  using Operands = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, Bf16Operands, F16Operands>;
  constexpr int kPaddedD = (D + 63) / 64 * 64;
  static_assert(D % 16 == 0 && kPaddedD <= 256, "head dims 64, 96, 128, 192 and 256");
  using SharedLayout = hopper::HopperConfig<kPaddedD, kFp8, kNarrow>;
  static_assert(kFp8 || !kPolyExp2, "polynomial exp2: FP8 mode only");
  static_assert(!kTmaStore || (!kFp8 && !kNarrow && kPaddedD == D && D <= 128),
                "O through shared memory: 16-bit operands, wide stages, head dims 64 and 128");
  static_assert(!kTmaStore || 2 * (kPaddedD / 64) * kBoxBytes <= SharedLayout::kStageBytes,
                "the two warpgroups' O tiles fit in the K half of a stage");
  static_assert(!kOverlapEpilogue || kTmaStore, "the early QK^T relies on the tile's late hand-back");
  constexpr uint32_t kQTileBytes = SharedLayout::kQTileBytes;
  constexpr uint32_t kStageBytes = SharedLayout::kStageBytes;
  constexpr uint32_t kStageHalfBytes = SharedLayout::kStageHalfBytes;
  constexpr uint32_t kVStageBytes = SharedLayout::kVStageBytes;
  constexpr uint32_t kVSubTileBytes = SharedLayout::kVSubTileBytes;
  constexpr int kBoxColumns = SharedLayout::kBoxColumns;
  constexpr int kQBuffers = SharedLayout::kQBuffers;
  constexpr int kStages = SharedLayout::kStages;
  constexpr int kBlockN = SharedLayout::kBlockN;
  constexpr int kSubTiles = SharedLayout::kSubTiles;
  constexpr int kHalves = SharedLayout::kHalves;
  constexpr int kOChunkN = SharedLayout::kOChunkN;
  constexpr int kOChunks = SharedLayout::kOChunks;
  constexpr int kOutTiles = D / 8;  // n8 tiles of an O row slab that are stored
  constexpr int kSTiles = kBlockN / 8;  // n8 tiles of an S row slab
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // The swizzled boxes need a 1024-byte aligned base; the launch adds that much slack.
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw + 1023) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t s_q = base + SharedLayout::q;
  const uint32_t s_k = base + SharedLayout::k;
  const uint32_t s_v = base + SharedLayout::v;
  const uint32_t bar_q_full = base + SharedLayout::q_full;
  const uint32_t bar_q_empty = base + SharedLayout::q_empty;
  const uint32_t bar_full = base + SharedLayout::full;
  const uint32_t bar_empty = base + SharedLayout::empty;
  volatile StageInfo* stage_info = reinterpret_cast<volatile StageInfo*>(smem + SharedLayout::info);

  const int tid = threadIdx.x;
  const int warpgroup = tid / 128;
  const int q_blocks = (p.seq_q + kBlockM - 1) / kBlockM;
  const int items = q_blocks * p.heads_q * batch_count;

  if (tid == 0) {
    for (int b = 0; b < kQBuffers; ++b) {
      mbarrier_init(bar_q_full + 8 * b, 1);
      mbarrier_init(bar_q_empty + 8 * b, kConsumerThreads);
    }
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(bar_full + 8 * s, 1);
      mbarrier_init(bar_empty + 8 * s, kConsumerThreads);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (tid >= 32) return;
    if (tid == 0) {
      prefetch_tensor_map(&q_map);
      prefetch_tensor_map(&k_map);
      prefetch_tensor_map(&v_map);
    }
    int iteration = 0;  // stages issued so far
    int q_loads = 0;    // Q tiles loaded so far (items with no tiles load none)
    // Publishes a stage that carries no bytes: an item without tiles, or (item -1) the end.
    auto publish_empty_stage = [&](int item) {
      const int stage = iteration % kStages;
      mbarrier_wait(bar_empty + 8 * stage, ((iteration / kStages) & 1) ^ 1);
      stage_info[stage].n0 = -1;
      stage_info[stage].n1 = -1;
      stage_info[stage].item = item;
      stage_info[stage].last = 1;
      mbarrier_arrive(bar_full + 8 * stage);
      ++iteration;
    };
    for (int step = 0;; ++step) {
      // Thread 0 picks the item; the warp stages its mask row's block ids once thread 0 is done
      // with the previous item's (the barrier waits for it).
      __syncwarp();
      int item = -1;
      if (tid == 0) {
        if (work_order.enabled()) {
          const int rank = atomicAdd(work_order.next_rank, 1);
          item = rank < items ? work_order.order[rank] : -1;
        } else {
          const int64_t strided = blockIdx.x + static_cast<int64_t>(step) * gridDim.x;
          item = strided < items ? static_cast<int>(strided) : -1;
        }
      }
      item = __shfl_sync(0xffffffffu, item, 0);
      if (item < 0) {
        if (tid == 0) publish_empty_stage(-1);
        break;
      }
      const WorkItem w = work_item_at(item, q_blocks, p.heads_q);
      const int kv_head = w.head / p.group;
      TileWalk<kSparse> walk = make_tile_walk<kSparse>(p, w.batch, w.head, w.m0, min(w.m0 + kBlockM, p.seq_q) - 1);
      if constexpr (kSparse) {
        int32_t* cache = reinterpret_cast<int32_t*>(smem + SharedLayout::index_cache);
        walk.cached_count = min(walk.row_blocks, kIndexCacheEntries);
        for (int i = tid; i < walk.cached_count; i += 32) cache[i] = walk.row_indices[i];
        walk.cached = cache;
        __syncwarp();
      }
      if (tid != 0) continue;

      int tile = walk.next(0);
      const int end = walk.end();
      if (tile >= end) {  // nothing to attend to: no Q, one stage that says so
        publish_empty_stage(item);
        continue;
      }
      // The item's Q goes into L2 now; it is copied into shared memory after the first stage.
      for (int half = 0; half < kHalves; ++half)
        for (int rows = 0; rows < 2; ++rows)
          tma_prefetch_l2_4d(&q_map, half * kBoxColumns, w.m0 + rows * 64, w.head, w.batch);
      bool q_loaded = false;
      while (tile < end) {
        const int stage = iteration % kStages;
        mbarrier_wait(bar_empty + 8 * stage, ((iteration / kStages) & 1) ^ 1);
        const int n0 = walk.tile_start(tile);
        int n1 = -1;
        if constexpr (kSubTiles == 2) {
          const int second = walk.next(tile + 1);
          n1 = second < end ? walk.tile_start(second) : -1;
          tile = second < end ? walk.next(second + 1) : end;
        } else {
          tile = walk.next(tile + 1);
        }
        stage_info[stage].n0 = n0;
        stage_info[stage].n1 = n1;
        stage_info[stage].item = item;
        stage_info[stage].last = tile >= end ? 1 : 0;
        const uint32_t bar = bar_full + 8 * stage;
        mbarrier_arrive_expect_tx(bar, kStageBytes + kVStageBytes);
        const uint32_t k_stage = s_k + stage * kStageBytes, v_stage = s_v + stage * kVStageBytes;
        // A missing second sub-tile reloads the first: finite values under masked columns.
        const int keys1 = n1 >= 0 ? n1 : n0;
        for (int half = 0; half < kHalves; ++half) {
          const uint32_t k_half = k_stage + half * kStageHalfBytes;
          tma_load_4d(k_half, &k_map, bar, half * kBoxColumns, n0, kv_head, w.batch);
          if constexpr (kSubTiles == 2) tma_load_4d(k_half + kBoxBytes, &k_map, bar, half * kBoxColumns, keys1, kv_head, w.batch);
        }
        if constexpr (kFp8) {
          // V^T: (keys, channels, kv head, batch) boxes of 64 keys x 128 channels.
          tma_load_4d(v_stage, &v_map, bar, n0, 0, kv_head, w.batch);
          tma_load_4d(v_stage + kVSubTileBytes, &v_map, bar, keys1, 0, kv_head, w.batch);
        } else {
          for (int half = 0; half < kHalves; ++half) {
            const uint32_t v_half = v_stage + half * kStageHalfBytes;
            tma_load_4d(v_half, &v_map, bar, half * 64, n0, kv_head, w.batch);
            if constexpr (kSubTiles == 2) tma_load_4d(v_half + kBoxBytes, &v_map, bar, half * 64, keys1, kv_head, w.batch);
          }
        }
        ++iteration;
        if (!q_loaded) {
          // Q once the consumers have issued their last product with the buffer's previous Q
          // (after the item's first stage, whose slot frees before that).
          const int buffer = q_loads % kQBuffers;
          mbarrier_wait(bar_q_empty + 8 * buffer, ((q_loads / kQBuffers) & 1) ^ 1);
          const uint32_t q_bar = bar_q_full + 8 * buffer;
          mbarrier_arrive_expect_tx(q_bar, kQTileBytes);
          for (int half = 0; half < kHalves; ++half)
            for (int rows = 0; rows < 2; ++rows)
              tma_load_4d(s_q + buffer * kQTileBytes + half * kQHalfBytes + rows * kBoxBytes, &q_map, q_bar,
                          half * kBoxColumns, w.m0 + rows * 64, w.head, w.batch);
          ++q_loads;
          q_loaded = true;
        }
      }
    }
    return;
  }

  // Consumers.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
  const int consumer = warpgroup - 1;  // which 64 rows
  const int ctid = tid - 128 * warpgroup;
  const int warp = ctid >> 5, lane = ctid & 31;
  const int group = lane >> 2, quad = lane & 3;
  // Ping-pong turns: named barrier kTurnBarrier + w is warpgroup w's turn to issue; it waits there
  // (bar.sync) for the other warpgroup's arrival (bar.arrive) after that one's GEMMs were issued.
  // Both warpgroups take a turn at every stage of every item, so the turns alternate for the whole
  // kernel; warpgroup 1 first gives warpgroup 0 its first turn.
  constexpr int kTurnBarrier = 1;  // 0 is __syncthreads'
  auto wait_turn = [&] {
    if constexpr (kPingPong) asm volatile("bar.sync %0, %1;\n" ::"r"(kTurnBarrier + consumer), "n"(kConsumerThreads));
  };
  auto pass_turn = [&] {
    if constexpr (kPingPong) asm volatile("bar.arrive %0, %1;\n" ::"r"(kTurnBarrier + (consumer ^ 1)), "n"(kConsumerThreads));
  };
  if (consumer == 1) pass_turn();
  if (kTmaStore && ctid == 0) prefetch_tensor_map(&o_map);
  // kTmaStore: named barrier kStageDrainedBarrier (both warpgroups, 256 threads) says both are
  // done with the item's last stage; kTileWrittenBarrier + w (warpgroup w's 128 threads) that its
  // O tile is in shared memory.
  constexpr int kStageDrainedBarrier = 3, kTileWrittenBarrier = 4;
  // The stage holding O tiles the copy engine may still be reading (-1: none): this warpgroup's
  // thread 0, which issued the store, arrives at its "empty" barrier once they are read.
  int stored_stage = -1;
  auto release_stored_stage = [&] {
    if constexpr (kTmaStore) {
      if (ctid == 0 && stored_stage >= 0) {
        bulk_wait_group_read();
        mbarrier_arrive(bar_empty + 8 * stored_stage);
      }
      stored_stage = -1;
    }
  };
  // The current item's rows: [wg_row0, wg_row0 + 63] for this warpgroup; keys in
  // [all_rows_lo, all_rows_hi] are visible to all of them (tiles inside need no mask).
  int wg_row0 = 0, all_rows_lo = 0, all_rows_hi = 0;

  float o_acc[kOChunks][kOChunkN / 2];
  float s_acc[kBlockN / 2];
  constexpr int kPSlices = kBlockN / (kFp8 ? 32 : 16);  // k slices of the PV product
  uint32_t p_frag[kPSlices][4];
  // FP8: the current item's row-block q scale and the kv head's scale rows (fp8_operands.h).
  float q_dequant = 1.f;
  const float* k_scales = nullptr;
  // The current stage's sub-tiles: q scale x k scale x scale log2(e); 1 for a missing second
  // sub-tile, whose masked -inf scores must stay -inf (not NaN) through the products.
  float k_factor[2] = {1.f, 1.f};
  // Loaded as soon as a stage's offsets are known, so the loads overlap its QK^T product.
  auto load_k_factors = [&](int n0, int n1) {
    if constexpr (kFp8) {
      k_factor[0] = q_dequant * __ldg(k_scales + n0 / kFp8ScaleBlock) * p.scale_log2;
      k_factor[1] = n1 >= 0 ? q_dequant * __ldg(k_scales + n1 / kFp8ScaleBlock) * p.scale_log2 : 1.f;
    }
  };
  float row_max[2];
  float row_sum[2];

  uint64_t q_desc = 0;  // this warpgroup's 64 rows of the current item's Q buffer
  // S = Q K^T of a stage: D / 16 k16 slices, 4 per column half of Q and K; committed, not waited
  // for.
  auto issue_scores = [&](int stage) {
    const uint64_t k_desc = wgmma_desc_k_major_sw128(s_k + stage * kStageBytes);
    wgmma_fence_operands(s_acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D * (kFp8 ? 1 : 2) / 32; ++kk) {  // 32-byte k slices
      const uint64_t q_step = (kk >> 2) * (kQHalfBytes >> 4) + (kk & 3) * 2;
      const uint64_t k_step = (kk >> 2) * (kStageHalfBytes >> 4) + (kk & 3) * 2;
      if constexpr (kFp8)
        wgmma_ss_e4m3(s_acc, q_desc + q_step, k_desc + k_step, kk > 0);
      else
        wgmma_ss(s_acc, q_desc + q_step, k_desc + k_step, kk > 0, Operands{});
    }
    wgmma_commit();
  };
  // O += P V of a stage: kBlockN / 16 k16 slices of keys per O chunk, V read MN-major (column
  // halves kStageHalfBytes apart).
  auto issue_values = [&](int stage) {
#pragma unroll
    for (int c = 0; c < kOChunks; ++c) wgmma_fence_operands(o_acc[c]);
    wgmma_fence();
    if constexpr (kFp8) {
      // V^T K-major: k32 slice t is 32 key bytes of sub-tile t / 2.
#pragma unroll
      for (int t = 0; t < kPSlices; ++t) {
        const uint64_t v_desc = wgmma_desc_k_major_sw64(s_v + stage * kVStageBytes + (t >> 1) * kVSubTileBytes);
        wgmma_rs_e4m3(o_acc[0], p_frag[t], v_desc + (t & 1) * 2);
      }
    } else {
#pragma unroll
      for (int c = 0; c < kOChunks; ++c) {
        const uint32_t chunk = s_v + stage * kVStageBytes + c * (kOChunkN / 64) * kStageHalfBytes;
        const uint64_t v_desc = wgmma_desc_mn_major_sw128(chunk, kStageHalfBytes);
#pragma unroll
        for (int kk = 0; kk < kPSlices; ++kk)
          wgmma_rs_trans_b(o_acc[c], p_frag[kk], v_desc + kk * (16 * 128 >> 4), Operands{});
      }
    }
    wgmma_commit();
  };
  // O's n8 tile j of the accumulator layout: element 4j + 2h + e of the chunk holding it.
  auto o_at = [&](int j, int index) -> float& {
    return o_acc[j / (kOChunkN / 8)][4 * (j % (kOChunkN / 8)) + index];
  };
  // Masks S where a sub-tile is missing or crosses the sequence end or a causal/window edge, then
  // turns it into unnormalized probabilities against the new running max; returns each row's
  // rescale factor for O. s_acc[4j + 2h + e] is row group + 8h, column 8j + 2 quad + e.
  // FP8: each sub-tile's scores carry the factor q scale x k scale x scale log2(e) (k_factor,
  // positive), folded into the row max (each sub-tile's max of the raw products, then scaled) and
  // into the exponent's FFMA rather than multiplied into S first (one instruction less per score
  // on the softmax chain); row_max is in the log2 domain. P comes out times 448 (e4m3's largest
  // value at a row's maximum; the row sums carry the same factor, so the normalization removes
  // it), or times 448 / 2^kRescaleThreshold with kLazyRescale (P may exceed the kept maximum by
  // that much).
  const float score_scale = kFp8 ? 1.f : p.scale_log2;
  constexpr float kLog2PFactor = kFp8 ? 8.807354922057604f - (kLazyRescale ? kRescaleThreshold : 0.f) : 0.f;
  // The factor of n8 tile j's raw products in the exponent (FP8: its sub-tile's k_factor).
  auto exponent_scale = [&](int j) { return kFp8 ? k_factor[j < 8 ? 0 : 1] : score_scale; };
  auto softmax = [&](int n0, int n1, float (&alpha)[2]) {
    const bool mask0 = n0 + kSubTile - 1 > all_rows_hi || n0 < all_rows_lo;
    const bool mask1 = kSubTiles == 2 && (n1 < 0 || n1 + kSubTile - 1 > all_rows_hi || n1 < all_rows_lo);
    if (mask0 || mask1) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = wg_row0 + warp * 16 + group + 8 * h;
        const int hi = p.has_hi ? min(p.seq_kv - 1, i + p.hi_offset) : p.seq_kv - 1;
        const int lo = p.has_lo ? i + p.lo_offset : -kNoLimit;
#pragma unroll
        for (int j = 0; j < kSTiles; ++j) {
          const int start = j < 8 ? n0 : n1;
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = start + (j & 7) * 8 + 2 * quad + e;
            if (start < 0 || key > hi || key < lo) s_acc[4 * j + 2 * h + e] = -INFINITY;
          }
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = row_max[h];
      if constexpr (kFp8) {
        // Each sub-tile's max as a tree (depth 4, not a chain of 8): FP8's softmax meets half the
        // tensor time of bf16's, so its dependency chains are what the warps stall on (Nsight
        // Compute: "wait" is the first stall). max is exact in any order: the same bits.
        float m[kSTiles];
#pragma unroll
        for (int j = 0; j < kSTiles; ++j) m[j] = fmaxf(s_acc[4 * j + 2 * h], s_acc[4 * j + 2 * h + 1]);
#pragma unroll
        for (int w = 1; w < 8 && w < kSTiles; w *= 2)
#pragma unroll
          for (int j = 0; j + w < kSTiles; j += 2 * w) m[j] = fmaxf(m[j], m[j + w]);
        const float sub_max0 = m[0], sub_max1 = kSTiles > 8 ? m[kSTiles / 2] : -INFINITY;
        mx = fmaxf(mx, fmaxf(sub_max0 * k_factor[0], sub_max1 * k_factor[1]));
      } else {
#pragma unroll
        for (int j = 0; j < kSTiles; ++j) mx = fmaxf(mx, fmaxf(s_acc[4 * j + 2 * h], s_acc[4 * j + 2 * h + 1]));
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A small growth (log2 units) keeps the stale maximum (the first stage's -inf always moves;
      // NaN compares false).
      if constexpr (kLazyRescale)
        if ((mx - row_max[h]) * score_scale <= kRescaleThreshold) mx = row_max[h];
      const float shift = mx == -INFINITY ? 0.f : mx * score_scale;
      alpha[h] = mx == row_max[h] ? 1.f : fast_exp2(row_max[h] * score_scale - shift);
      row_max[h] = mx;
      const float p_shift = shift - kLog2PFactor;
      // FP8: four partial sums (a chain of 4 additions instead of 16, as for the max above); the
      // 16-bit modes keep one chain and so their bits.
      constexpr int kPartialSums = kFp8 ? 4 : 1;
      float sums[kPartialSums] = {};
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) {
        // kPolyExp2: every eighth n8 tile on the FMA units. Per warp-wide score instruction the
        // MUFU takes 8 cycles and the softmax issues about 6 instructions (5 with lazy
        // rescaling), so moving a fraction r to the polynomial's 9 instructions balances the two
        // at r = 1/8 (3/16 with lazy rescaling); more would make issue the limit.
        auto exp2_of = [&](float x) { return kPolyExp2 && (j & 7) == 7 ? exp2_polynomial(x) : fast_exp2(x); };
        const float scale = exponent_scale(j);
        const float p0 = exp2_of(fmaf(s_acc[4 * j + 2 * h], scale, -p_shift));
        const float p1 = exp2_of(fmaf(s_acc[4 * j + 2 * h + 1], scale, -p_shift));
        s_acc[4 * j + 2 * h] = p0;
        s_acc[4 * j + 2 * h + 1] = p1;
        sums[j % kPartialSums] += p0 + p1;
      }
      float sum = sums[0];
#pragma unroll
      for (int i = 1; i < kPartialSums; ++i) sum += sums[i];
      row_sum[h] = row_sum[h] * alpha[h] + sum;
    }
  };
  // Columns 16kk..16kk+15 are n8 tiles 2kk and 2kk+1: the m16n8k16 A layout. FP8: k32 slice t
  // takes n8 tiles 4t..4t+3 as they lie (slot 4 quad + i of each 16 holds the thread's columns
  // 2 quad, 2 quad + 1 of the first tile, then of the second: fp8_key_order, which the transposed
  // V follows).
  auto pack_probabilities = [&] {
    if constexpr (kFp8) {
      auto fp8x4 = [](float a, float b, float c, float d) {
        return static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3)) |
               (static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3)) << 16);
      };
#pragma unroll
      for (int t = 0; t < kPSlices; ++t) {
        const float* x = s_acc + 16 * t;
        p_frag[t][0] = fp8x4(x[0], x[1], x[4], x[5]);
        p_frag[t][1] = fp8x4(x[2], x[3], x[6], x[7]);
        p_frag[t][2] = fp8x4(x[8], x[9], x[12], x[13]);
        p_frag[t][3] = fp8x4(x[10], x[11], x[14], x[15]);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kPSlices; ++kk) {
        p_frag[kk][0] = MmaType<T>::pack(s_acc[8 * kk + 0], s_acc[8 * kk + 1]);
        p_frag[kk][1] = MmaType<T>::pack(s_acc[8 * kk + 2], s_acc[8 * kk + 3]);
        p_frag[kk][2] = MmaType<T>::pack(s_acc[8 * kk + 4], s_acc[8 * kk + 5]);
        p_frag[kk][3] = MmaType<T>::pack(s_acc[8 * kk + 6], s_acc[8 * kk + 7]);
      }
    }
  };
  struct Stage {
    int n0, n1, item;
    bool last;
  };
  auto wait_stage = [&](int iteration) {
    const int stage = iteration % kStages;
    mbarrier_wait(bar_full + 8 * stage, (iteration / kStages) & 1);
    return Stage{stage_info[stage].n0, stage_info[stage].n1, stage_info[stage].item, stage_info[stage].last != 0};
  };

  // Epilogue: row sums across the quad, LSE, normalized O stored from registers (kTmaStore:
  // written to this warpgroup's tile in stage `held`, kHalves boxes of 64 rows x 128 bytes in the
  // copy engine's 128-byte swizzle, where a row's 16-byte chunk c sits at c ^ (row % 8): a warp's
  // 4-byte writes of one n8 tile hit 32 different banks).
  auto store_output = [&](const WorkItem& w, int held) {
    T* out = static_cast<T*>(p.out) + w.batch * p.o_stride_b + w.head * p.o_stride_h;
    const uint32_t o_tile = s_k + held * kStageBytes + consumer * kHalves * kBoxBytes;
    if constexpr (kTmaStore) asm volatile("bar.sync %0, %1;\n" ::"n"(kStageDrainedBarrier), "n"(kConsumerThreads));
    // FP8: the channel maxima of the item's kv head (the V scales).
    const uint32_t* v_channels =
        kFp8 ? p.fp8_v_absmax + (static_cast<int64_t>(w.batch) * (p.heads_q / p.group) + w.head / p.group) * D : nullptr;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum[h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      const int r = warp * 16 + group + 8 * h;  // the row in this warpgroup's tile
      const int i = wg_row0 + r;
      // Rows past the sequence end: kTmaStore writes them to the tile, which the copy engine clips.
      if (!kTmaStore && i >= p.seq_q) continue;
      if (p.lse != nullptr && quad == 0 && i < p.seq_q) {
        const int64_t lse_index = (static_cast<int64_t>(w.batch) * p.heads_q + w.head) * p.seq_q + i;
        float lse =
            sum > 0.f ? (row_max[h] * score_scale + __log2f(sum) - kLog2PFactor) * 0.69314718055994531f : -INFINITY;
        if (kFp8 && fp8_lse_shift != nullptr) lse += fp8_lse_shift[lse_index];  // -inf stays
        p.lse[lse_index] = lse;
      }
      T* row = out + static_cast<int64_t>(i) * p.o_stride_s;
#pragma unroll
      for (int j = 0; j < kOutTiles; ++j) {
        float scale0 = inv, scale1 = inv;
        if constexpr (kFp8) {
          scale0 *= fp8_dequantization(__uint_as_float(__ldg(v_channels + 8 * j + 2 * quad)));
          scale1 *= fp8_dequantization(__uint_as_float(__ldg(v_channels + 8 * j + 2 * quad + 1)));
        }
        const uint32_t packed = MmaType<T>::pack(o_at(j, 2 * h) * scale0, o_at(j, 2 * h + 1) * scale1);
        if constexpr (kTmaStore) {
          const uint32_t at = o_tile + (j / 8) * kBoxBytes + r * 128 + (((j & 7) ^ group) << 4) + quad * 4;
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(packed) : "memory");
        } else {
          *reinterpret_cast<uint32_t*>(row + 8 * j + 2 * quad) = packed;
        }
      }
    }
    if constexpr (kTmaStore) {
      fence_proxy_async_shared();
      asm volatile("bar.sync %0, %1;\n" ::"r"(kTileWrittenBarrier + consumer), "n"(128));
      if (ctid == 0) {
        for (int half = 0; half < kHalves; ++half)
          tma_store_4d(&o_map, o_tile + half * kBoxBytes, half * 64, wg_row0, w.head, w.batch);
        bulk_commit_group();
      } else {
        mbarrier_arrive(bar_empty + 8 * held);
      }
      stored_stage = held;
    }
  };

  // Software pipeline inside the warpgroup: the scores of stage j+1 and the PV product of stage j
  // are issued together; the softmax of j+1 runs while the PV product is on the tensor cores.
  int iteration = 0;  // stages consumed so far
  int q_loads = 0;    // Q tiles consumed so far
  // kOverlapEpilogue: the previous item's tail has already waited for this item's first stage
  // (next_info) and, where the item has tiles, issued its first QK^T.
  bool next_waited = false, scores_issued = false;
  Stage next_info{};
  for (;;) {
    Stage info = next_waited ? next_info : wait_stage(iteration);
    next_waited = false;
    if (info.item < 0) {  // the producer has no more items
      release_stored_stage();
      if (kTmaStore && ctid == 0) bulk_wait_group();  // the output tiles are written before the CTA ends
      break;
    }
    const WorkItem w = work_item_at(info.item, q_blocks, p.heads_q);
    wg_row0 = w.m0 + 64 * consumer;
    const int wg_row_last = min(wg_row0 + 63, p.seq_q - 1);
    all_rows_lo = p.has_lo ? wg_row_last + p.lo_offset : -kNoLimit;
    all_rows_hi = p.has_hi ? min(p.seq_kv - 1, wg_row0 + p.hi_offset) : p.seq_kv - 1;
    if constexpr (kFp8) {
      const int q_blocks64 = (p.seq_q + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
      const int kv_blocks64 = (p.seq_kv + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
      // A second warpgroup wholly past the sequence end computes rows that are never stored: it
      // reads the last block's scale rather than past the row of scales.
      const int q_block = min(wg_row0 / kFp8ScaleBlock, q_blocks64 - 1);
      q_dequant = p.fp8_q_scale[(static_cast<int64_t>(w.batch) * p.heads_q + w.head) * q_blocks64 + q_block];
      k_scales = p.fp8_k_scale + (static_cast<int64_t>(w.batch) * (p.heads_q / p.group) + w.head / p.group) * kv_blocks64;
    }
#pragma unroll
    for (int c = 0; c < kOChunks; ++c)
#pragma unroll
      for (int i = 0; i < kOChunkN / 2; ++i) o_acc[c][i] = 0.f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;

    int held = iteration % kStages;  // the stage whose V the pending PV product reads
    if (info.n0 < 0) {
      // No tiles (and no Q): the epilogue writes output 0 and LSE -inf (kTmaStore: through the
      // stage, which carries no bytes, and hands it back then).
      release_stored_stage();
      if constexpr (!kTmaStore) mbarrier_arrive(bar_empty + 8 * held);
      ++iteration;
    } else {
      const int q_buffer = q_loads % kQBuffers;
      if (!scores_issued) {
        mbarrier_wait(bar_q_full + 8 * q_buffer, (q_loads / kQBuffers) & 1);
        q_desc = wgmma_desc_k_major_sw128(s_q + q_buffer * kQTileBytes + consumer * kBoxBytes);
        wait_turn();
        issue_scores(iteration % kStages);
        pass_turn();
        // The previous item's tiles: read while this QK^T runs (kOverlapEpilogue: their store
        // was issued after it, so after this item's first softmax).
        if constexpr (!kOverlapEpilogue) release_stored_stage();
        load_k_factors(info.n0, info.n1);
        wgmma_wait<0>();
        wgmma_fence_operands(s_acc);
      }
      scores_issued = false;
      // The last product with this Q is done: the producer may load another item's into it
      // while this one's softmax, PV product and epilogue run.
      if (info.last) mbarrier_arrive(bar_q_empty + 8 * q_buffer);
      float alpha[2];
      softmax(info.n0, info.n1, alpha);  // O is still zero: nothing to rescale
      if constexpr (kOverlapEpilogue) release_stored_stage();
      pack_probabilities();
      while (!info.last) {
        info = wait_stage(++iteration);
        const int stage = iteration % kStages;
        wait_turn();
        issue_scores(stage);
        issue_values(held);
        pass_turn();
        load_k_factors(info.n0, info.n1);
        wgmma_wait<1>();
        wgmma_fence_operands(s_acc);
        if (info.last) mbarrier_arrive(bar_q_empty + 8 * q_buffer);
        softmax(info.n0, info.n1, alpha);
        wgmma_wait<0>();
#pragma unroll
        for (int c = 0; c < kOChunks; ++c) wgmma_fence_operands(o_acc[c]);
#pragma unroll
        for (int kk = 0; kk < kPSlices; ++kk) wgmma_fence_operands(p_frag[kk]);
        mbarrier_arrive(bar_empty + 8 * held);
        // kLazyRescale: most stages keep every row's maximum, and the warp (16 rows) skips O's
        // multiplies, which sit between the PV product's end and the next stage's issue.
        if (!kLazyRescale || __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
          for (int j = 0; j < kOutTiles; ++j) {
            o_at(j, 0) *= alpha[0];
            o_at(j, 1) *= alpha[0];
            o_at(j, 2) *= alpha[1];
            o_at(j, 3) *= alpha[1];
          }
        }
        pack_probabilities();
        held = stage;
      }
      wait_turn();
      issue_values(held);
      pass_turn();
      ++iteration;
      ++q_loads;
      if constexpr (kOverlapEpilogue) {
        // The next item's first QK^T, if it has tiles, once its stage and Q are in (its Q loads
        // since this item's last QK^T completed): it runs during the last PV product's tail and
        // this epilogue, which touches O, not S.
        next_info = wait_stage(iteration);
        next_waited = true;
        if (next_info.item >= 0 && next_info.n0 >= 0) {
          const int next_buffer = q_loads % kQBuffers;
          mbarrier_wait(bar_q_full + 8 * next_buffer, (q_loads / kQBuffers) & 1);
          q_desc = wgmma_desc_k_major_sw128(s_q + next_buffer * kQTileBytes + consumer * kBoxBytes);
          wait_turn();
          issue_scores(iteration % kStages);
          pass_turn();
          scores_issued = true;
          wgmma_wait<1>();  // the last PV product; the next QK^T may still run
#pragma unroll
          for (int c = 0; c < kOChunks; ++c) wgmma_fence_operands(o_acc[c]);
#pragma unroll
          for (int kk = 0; kk < kPSlices; ++kk) wgmma_fence_operands(p_frag[kk]);
          store_output(w, held);
          // No product in flight where the paths join (the compiler would serialize the products
          // otherwise): the next item starts from its finished scores.
          wgmma_wait<0>();
          wgmma_fence_operands(s_acc);
          continue;
        }
      }
      wgmma_wait<0>();
#pragma unroll
      for (int c = 0; c < kOChunks; ++c) wgmma_fence_operands(o_acc[c]);
      if constexpr (!kTmaStore) mbarrier_arrive(bar_empty + 8 * held);
    }

    store_output(w, held);
  }
#else
  __trap();  // selected only on compute capability 9.0 devices of a build with sm_90a code
#endif
}

}  // namespace tessel::cuda::detail
