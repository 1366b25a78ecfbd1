// Per-request LoRA kernels (see wan_lora_kernels.h). Both halves of the update are one kind of
// product, out (rows, n) (+)= alpha * x (rows, k) · w (n, k)^T with a weight, n, k and alpha of each
// segment's own: the shrink (w = down, n = rank, k = in, into the bf16 scratch) and the expand
// (w = up, n = out, k = rank, added into y). One launch covers every segment of a batch: each
// block takes one 64-row tile of one segment (found from the tiles the segments before it take)
// and one 64-column tile of its n, stages x and w in shared memory as bf16 (any width: the edges
// are zero-filled), multiplies on tensor cores (WMMA 16x16x16, fp32 accumulators) and adds into
// the output in fp32, rounding once.
#include "cuda/wan_lora_kernels.h"

#include <mma.h>

#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/kernels/cuda/launch_check.h"

namespace tessel::dit::cuda {
namespace {

using bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;

constexpr int kTileRows = 64, kTileCols = 64, kTileDepth = 32, kThreads = 128;
constexpr int kPad = 8;  // keeps WMMA's leading dimensions multiples of 8 and staggers the banks
// Segments per launch: their table is a kernel parameter (a batch has at most one per entry; more
// go in further launches).
constexpr int kMaxProblems = 32;

struct Problem {
  int64_t row_begin, rows;
  const bf16* weight;  // (n, k) row-major
  int32_t n, k;
  float alpha;
  int32_t first_tile;  // the first row tile of this problem in the launch's grid
};

struct Problems {
  Problem problem[kMaxProblems];
  int32_t count;
  int64_t x_stride, y_stride;  // row strides of x and of the output, in elements
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename In, typename Out>
__global__ void __launch_bounds__(kThreads) segmented_product_kernel(const Problems problems, const In* __restrict__ x, Out* y,
                                                                     bool accumulate) {
  int index = 0;
  while (index + 1 < problems.count && static_cast<int32_t>(blockIdx.x) >= problems.problem[index + 1].first_tile) ++index;
  const Problem problem = problems.problem[index];
  const int64_t row0 = static_cast<int64_t>(blockIdx.x - problem.first_tile) * kTileRows;
  const int col0 = static_cast<int>(blockIdx.y) * kTileCols;
  if (col0 >= problem.n) return;  // the grid covers the widest problem of the launch

  __shared__ __align__(128) bf16 x_tile[kTileRows][kTileDepth + kPad];
  __shared__ __align__(128) bf16 w_tile[kTileCols][kTileDepth + kPad];
  __shared__ __align__(128) float out_tile[kTileRows][kTileCols + 4];

  // Four warps, each a 32 x 32 quarter of the tile as 2 x 2 fragments.
  const int warp = static_cast<int>(threadIdx.x) / 32, warp_row = (warp / 2) * 32, warp_col = (warp % 2) * 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> sum[2][2];
  for (auto& row : sum)
    for (auto& fragment : row) wmma::fill_fragment(fragment, 0.0f);

  const int64_t rows_left = problem.rows - row0;
  const In* x_rows = x + (problem.row_begin + row0) * problems.x_stride;
  const bf16* w_rows = problem.weight + static_cast<int64_t>(col0) * problem.k;
  for (int depth0 = 0; depth0 < problem.k; depth0 += kTileDepth) {
    for (int i = static_cast<int>(threadIdx.x); i < kTileRows * kTileDepth; i += kThreads) {
      const int r = i / kTileDepth, d = i % kTileDepth;
      const bool inside = r < rows_left && depth0 + d < problem.k;
      x_tile[r][d] = __float2bfloat16_rn(inside ? to_float(x_rows[r * problems.x_stride + depth0 + d]) : 0.0f);
    }
    for (int i = static_cast<int>(threadIdx.x); i < kTileCols * kTileDepth; i += kThreads) {
      const int c = i / kTileDepth, d = i % kTileDepth;
      const bool inside = col0 + c < problem.n && depth0 + d < problem.k;
      w_tile[c][d] = inside ? w_rows[static_cast<int64_t>(c) * problem.k + depth0 + d] : __float2bfloat16_rn(0.0f);
    }
    __syncthreads();
    for (int d = 0; d < kTileDepth; d += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b[2];
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], &x_tile[warp_row + 16 * i][d], kTileDepth + kPad);
      // w_tile[c][d] read column-major is the (depth, column) matrix w^T.
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], &w_tile[warp_col + 16 * j][d], kTileDepth + kPad);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::mma_sync(sum[i][j], a[i], b[j], sum[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&out_tile[warp_row + 16 * i][warp_col + 16 * j], sum[i][j], kTileCols + 4, wmma::mem_row_major);
  __syncthreads();
  Out* y_rows = y + (problem.row_begin + row0) * problems.y_stride + col0;
  for (int i = static_cast<int>(threadIdx.x); i < kTileRows * kTileCols; i += kThreads) {
    const int r = i / kTileCols, c = i % kTileCols;
    if (r >= rows_left || col0 + c >= problem.n) continue;
    Out* target = y_rows + r * problems.y_stride + c;
    float value = problem.alpha * out_tile[r][c];
    if (accumulate) value += to_float(*target);
    *target = from_float<Out>(value);
  }
}

// One grouped product over `problems` (filled but for first_tile), in launches of kMaxProblems.
template <typename In, typename Out>
void launch_products(std::vector<Problem>& problems, const In* x, int64_t x_stride, Out* y, int64_t y_stride, bool accumulate,
                     cudaStream_t stream) {
  for (size_t first = 0; first < problems.size(); first += kMaxProblems) {
    Problems launch{};
    launch.count = static_cast<int32_t>(std::min<size_t>(kMaxProblems, problems.size() - first));
    launch.x_stride = x_stride;
    launch.y_stride = y_stride;
    int64_t tiles = 0;
    int32_t widest = 0;
    for (int32_t i = 0; i < launch.count; ++i) {
      Problem problem = problems[first + static_cast<size_t>(i)];
      problem.first_tile = static_cast<int32_t>(tiles);
      tiles += (problem.rows + kTileRows - 1) / kTileRows;
      widest = std::max(widest, problem.n);
      launch.problem[i] = problem;
    }
    if (tiles > 0x7fffffff) fail_argument("LoRA rows in one batch", "fewer than 2^31 tiles of 64 rows", tiles);
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>((widest + kTileCols - 1) / kTileCols));
    segmented_product_kernel<In, Out><<<grid, kThreads, 0, stream>>>(launch, x, y, accumulate);
  }
}

}  // namespace

void launch_lora_segments(const std::vector<LoraSegment>& segments, const void* x, bool x_bf16, int64_t in, void* y, bool y_bf16,
                          int64_t out, bf16* shrunk, int64_t shrunk_stride, cudaStream_t stream) {
  std::vector<Problem> shrink, expand;
  for (const LoraSegment& segment : segments) {
    if (segment.rows <= 0 || segment.rank <= 0) continue;
    if (segment.rank > shrunk_stride) fail_argument("LoRA scratch stride", detail::concat("at least the rank ", segment.rank), shrunk_stride);
    if (in > 0x7fffffff || out > 0x7fffffff) fail_argument("LoRA layer width", "below 2^31", std::max(in, out));
    const auto rank = static_cast<int32_t>(segment.rank);
    shrink.push_back(Problem{segment.row_begin, segment.rows, segment.down, rank, static_cast<int32_t>(in), 1.0f, 0});
    expand.push_back(Problem{segment.row_begin, segment.rows, segment.up, static_cast<int32_t>(out), rank, segment.scale, 0});
  }
  if (shrink.empty()) return;
  if (x_bf16)
    launch_products(shrink, static_cast<const bf16*>(x), in, shrunk, shrunk_stride, false, stream);
  else
    launch_products(shrink, static_cast<const float*>(x), in, shrunk, shrunk_stride, false, stream);
  if (y_bf16)
    launch_products(expand, static_cast<const bf16*>(shrunk), shrunk_stride, static_cast<bf16*>(y), out, true, stream);
  else
    launch_products(expand, static_cast<const bf16*>(shrunk), shrunk_stride, static_cast<float*>(y), out, true, stream);
  tessel::cuda::check_launch("LoRA segments");
}

}  // namespace tessel::dit::cuda
