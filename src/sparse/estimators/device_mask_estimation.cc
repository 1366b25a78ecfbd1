// Host side of the device estimators: argument checks, workspace, launches (CUDA builds); a clear
// error otherwise.
#include "tessel/sparse/estimators/device_mask_estimation.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tessel/core/error.h"

#ifdef TESSEL_WITH_CUDA
#include "tessel/kernels/cuda/launch_check.h"
#include "tessel/kernels/cuda/topk_estimation.h"
#include "tessel/kernels/cuda/xattention_estimation.h"
#endif

namespace tessel {

const char* xattention_device_limit(int64_t head_dim, int64_t stride, int64_t block_q, int64_t block_kv) {
  if (head_dim != 64 && head_dim != 128) return "head dim 64 or 128";
  if (stride < 2 || stride > 64) return "a stride from 2 to 64";
  if (block_q < 1 || block_kv < 1 || block_q % stride != 0 || block_kv % stride != 0)
    return "block sizes that are multiples of the stride";
  // One 128-group column tile holds whole kv blocks, and a unit of up to 8 groups (one mma
  // n-tile) never straddles two blocks.
  const int64_t groups = block_kv / stride;
  if (groups < 4 || groups > 128 || (groups & (groups - 1)) != 0) return "block_kv / stride a power of two from 4 to 128";
  return nullptr;
}

#ifdef TESSEL_WITH_CUDA

DeviceEstimatedMask::DeviceEstimatedMask(const BlockMaskShape& shape, int64_t kv_heads, int64_t head_dim,
                                         Device device, int64_t xattention_stride)
    : shape_(shape), kv_heads_(kv_heads), head_dim_(head_dim), device_(device) {
  if (!device.is_cuda()) fail_argument("device", "a CUDA device", device.str());
  if (shape.block_q < 1 || shape.block_kv < 1 || shape.seq_q < 1 || shape.seq_kv < 1)
    fail_argument("shape", "positive sequence lengths and block sizes",
                  detail::concat(shape.seq_q, "x", shape.seq_kv, " blocks ", shape.block_q, "x", shape.block_kv));
  if (kv_heads < 1 || shape.mask_heads % kv_heads != 0)
    fail_argument("kv_heads", detail::concat("a divisor of mask_heads ", shape.mask_heads), kv_heads);
  if (head_dim < 32 || head_dim > 256 || head_dim % 32 != 0)
    fail_argument("head_dim", "a multiple of 32 up to 256 on CUDA", head_dim);
  if (shape.kv_blocks() > cuda::detail::kTopkMaxKvBlocks)
    fail_argument("shape", detail::concat("at most ", cuda::detail::kTopkMaxKvBlocks, " kv blocks"), shape.kv_blocks());
  const int64_t rows = shape.num_rows(), kvb = shape.kv_blocks(), qb = shape.q_blocks();
  indptr_ = Tensor::empty({rows + 1}, DType::kI32, device);
  indices_ = Tensor::empty({rows * kvb}, DType::kI32, device);
  k_mean_ = Tensor::empty({(1 + cuda::detail::kTopkMeanChunks) * shape.mask_batch * kv_heads, head_dim}, DType::kF32,
                          device);
  pooled_q_ = Tensor::empty({rows, head_dim}, DType::kF32, device);
  similar_q_ = Tensor::empty({rows}, DType::kU8, device);
  pooled_k_ = Tensor::empty({shape.mask_batch * kv_heads * kvb, head_dim}, DType::kF32, device);
  similar_k_ = Tensor::empty({shape.mask_batch * kv_heads * kvb}, DType::kU8, device);
  row_counts_ = Tensor::empty({rows}, DType::kI32, device);
  row_blocks_ = Tensor::empty({rows * kvb}, DType::kI32, device);
  mass_ = Tensor::empty({rows * kvb}, DType::kF32, device);
  zero_group_mass_ = Tensor::empty({rows}, DType::kF32, device);
  head_n_topk_ = Tensor::empty({shape.mask_heads}, DType::kI32, device);
  head_value_ = Tensor::empty({shape.mask_heads}, DType::kF32, device);
  (void)qb;
  if (xattention_stride < 0) fail_argument("xattention_stride", ">= 0", xattention_stride);
  if (xattention_stride > 0) reserve_xattention_workspace(nullptr, xattention_stride);
}

// block_lse2 (B, H_q, ceil(S_q / stride), kv blocks): one fp32 per group row and kv block.
void DeviceEstimatedMask::reserve_xattention_workspace(StreamHandle stream, int64_t stride) {
  const int64_t needed = shape_.mask_batch * shape_.mask_heads * ((shape_.seq_q + stride - 1) / stride) * shape_.kv_blocks();
  if (block_lse2_.defined() && block_lse2_.numel() >= needed) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess && capture != cudaStreamCaptureStatusNone)
    fail_argument("mask", detail::concat("a DeviceEstimatedMask constructed with xattention_stride ", stride,
                                         " (its workspace cannot be allocated inside a CUDA graph capture)"),
                  "a mask without a threshold workspace for this stride");
  block_lse2_ = Tensor::empty({needed}, DType::kF32, device_);
}

BlockMaskView DeviceEstimatedMask::view() const {
  return make_block_mask_view(shape_, indptr_.data_as<const int32_t>(), indices_.data_as<const int32_t>(), device_);
}

BlockMask DeviceEstimatedMask::to_host() const {
  const Tensor indptr = indptr_.to(Device::cpu());
  const Tensor indices = indices_.to(Device::cpu());
  const int32_t* p = indptr.data_as<const int32_t>();
  const int64_t rows = shape_.num_rows();
  std::vector<int32_t> host_indptr(p, p + rows + 1);
  const int32_t* i = indices.data_as<const int32_t>();
  std::vector<int32_t> host_indices(i, i + host_indptr.back());
  return BlockMask::from_csr(shape_, std::move(host_indptr), std::move(host_indices));
}

namespace {
void check_cuda_call(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(detail::concat(what, ": ", cudaGetErrorString(status)));
}
}  // namespace

int64_t DeviceEstimatedMask::kept_blocks(StreamHandle stream) const {
  int32_t kept = 0;
  check_cuda_call(cudaMemcpyAsync(&kept, indptr_.data_as<const int32_t>() + shape_.num_rows(), sizeof(int32_t),
                              cudaMemcpyDeviceToHost, stream),
              "DeviceEstimatedMask::kept_blocks copy");
  check_cuda_call(cudaStreamSynchronize(stream), "DeviceEstimatedMask::kept_blocks synchronize");
  return kept;
}

std::vector<int32_t> DeviceEstimatedMask::row_offsets(StreamHandle stream) const {
  std::vector<int32_t> offsets(static_cast<size_t>(shape_.num_rows() + 1));
  check_cuda_call(cudaMemcpyAsync(offsets.data(), indptr_.data_as<const int32_t>(), offsets.size() * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, stream),
                  "DeviceEstimatedMask::row_offsets copy");
  check_cuda_call(cudaStreamSynchronize(stream), "DeviceEstimatedMask::row_offsets synchronize");
  return offsets;
}

namespace {
// Per-query-head selection values: `heads` entries in (0, 1], named `option` in errors.
void check_head_values(const std::vector<double>& values, int64_t heads, const char* option) {
  if (static_cast<int64_t>(values.size()) != heads)
    fail_argument(option, detail::concat(heads, " values (one per query head)"), values.size());
  for (size_t h = 0; h < values.size(); ++h)
    if (!(values[h] > 0.0 && values[h] <= 1.0)) fail_argument(detail::concat(option, "[", h, "]"), "in (0, 1]", values[h]);
}

// Copies host values into a device array of their length on `stream`. The pageable source is
// staged by the copy before it returns, so the caller's vector may go right after.
template <typename T>
const T* upload(const std::vector<T>& values, const Tensor& device_array, StreamHandle stream) {
  T* dst = device_array.data_as<T>();
  check_cuda_call(cudaMemcpyAsync(dst, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice, stream),
              "per-head values upload");
  return dst;
}

void check_operand(const TensorView& t, const char* name) {
  if (!t.device().is_cuda()) fail_argument(name, "a CUDA tensor", t.describe());
  if (t.dim() != 4) fail_argument(name, "rank 4 (B, S, H, D)", t.describe());
  if (t.dtype() != DType::kBF16 && t.dtype() != DType::kF16)
    fail_argument(name, "dtype bf16 or fp16 on CUDA", dtype_name(t.dtype()));
  if (t.stride(3) != 1) fail_argument(name, "unit stride along the head dim", t.stride(3));
  // The kernels copy 16-byte pieces of rows: every row must start on a 16-byte boundary.
  if (reinterpret_cast<uintptr_t>(t.data()) % 16 != 0 || t.stride(0) % 8 != 0 || t.stride(1) % 8 != 0 ||
      t.stride(2) % 8 != 0)
    fail_argument(name, "16-byte aligned rows (data pointer aligned, strides multiples of 8 elements)", t.describe());
}
// q and k as the device estimators take them, and a mask allocated for exactly their shapes.
void check_estimate_arguments(const TensorView& q, const TensorView& k, int64_t block_q, int64_t block_kv,
                              Device mask_device, const BlockMaskShape& mask_shape, int64_t mask_kv_heads,
                              int64_t mask_head_dim) {
  check_operand(q, "q");
  check_operand(k, "k");
  if (k.dtype() != q.dtype()) fail_argument("k", detail::concat("the dtype of q (", dtype_name(q.dtype()), ")"), dtype_name(k.dtype()));
  if (k.device() != q.device() || mask_device != q.device())
    fail_argument("k, mask", "the device of q (" + q.device().str() + ")", k.device().str() + ", " + mask_device.str());
  if (k.size(0) != q.size(0) || k.size(3) != q.size(3) || q.size(2) % k.size(2) != 0)
    fail_argument("k", "the batch and head dim of q and a divisor of its heads", k.describe());
  const BlockMaskShape want{q.size(0), q.size(2), q.size(1), k.size(1), block_q, block_kv};
  if (!(mask_shape == want) || mask_kv_heads != k.size(2) || mask_head_dim != q.size(3))
    fail_argument("mask", "a DeviceEstimatedMask allocated for these q, k and block sizes",
                  detail::concat("mask for ", mask_shape.mask_batch, "x", mask_shape.mask_heads, " S ", mask_shape.seq_q,
                                 "/", mask_shape.seq_kv, " blocks ", mask_shape.block_q, "x", mask_shape.block_kv));
}

}  // namespace

namespace {
// The q/k pointers, strides and sizes both estimator launches read (their params share these names).
template <typename Params>
void set_qk_geometry(Params& p, const TensorView& q, const TensorView& k) {
  p.q = q.data();
  p.k = k.data();
  p.q_stride_b = q.stride(0), p.q_stride_s = q.stride(1), p.q_stride_h = q.stride(2);
  p.k_stride_b = k.stride(0), p.k_stride_s = k.stride(1), p.k_stride_h = k.stride(2);
  p.batch = static_cast<int>(q.size(0));
  p.seq_q = static_cast<int>(q.size(1));
  p.seq_kv = static_cast<int>(k.size(1));
  p.heads_q = static_cast<int>(q.size(2));
  p.heads_kv = static_cast<int>(k.size(2));
}

// The block grid of the mask and its fixed-capacity rows and CSR arrays, which both estimator
// launches write (their params share these names).
template <typename Params>
void set_mask_outputs(Params& p, const BlockMaskShape& shape, const Tensor& row_counts, const Tensor& row_blocks,
                      const Tensor& indptr, const Tensor& indices) {
  p.block_q = static_cast<int>(shape.block_q);
  p.block_kv = static_cast<int>(shape.block_kv);
  p.q_blocks = static_cast<int>(shape.q_blocks());
  p.kv_blocks = static_cast<int>(shape.kv_blocks());
  p.row_counts = row_counts.data_as<int32_t>();
  p.row_blocks = row_blocks.data_as<int32_t>();
  p.indptr = indptr.data_as<int32_t>();
  p.indices = indices.data_as<int32_t>();
}
}  // namespace

void estimate_topk_mask_device(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TopkEstimatorOptions& options,
                               DeviceEstimatedMask& mask) {
  check_estimate_arguments(q, k, options.block_q, options.block_kv, mask.device_, mask.shape_, mask.kv_heads_,
                           mask.head_dim_);
  const BlockMaskShape want = mask.shape_;
  if (options.cdf_threshold > 1.0 || std::isnan(options.cdf_threshold))
    fail_argument("topk.cdf_threshold", "<= 1 (<= 0 for top-k mode)", options.cdf_threshold);
  if (options.cdf_threshold <= 0.0 && !(options.topk_ratio > 0.0 && options.topk_ratio <= 1.0))
    fail_argument("topk.topk_ratio", "in (0, 1]", options.topk_ratio);
  if (options.keep.sink_blocks < 0) fail_argument("topk.keep.sink_blocks", ">= 0", options.keep.sink_blocks);

  const int64_t kvb = want.kv_blocks();
  cuda::detail::TopkParams p{};
  set_qk_geometry(p, q, k);
  set_mask_outputs(p, mask.shape_, mask.row_counts_, mask.row_blocks_, mask.indptr_, mask.indices_);
  p.dim = static_cast<int>(q.size(3));
  p.scale = options.scale != 0.0f ? options.scale : 1.0f / std::sqrt(static_cast<float>(q.size(3)));
  p.similarity_threshold = static_cast<float>(options.similarity_threshold);
  p.n_topk = static_cast<int>(topk_count(options.rule, options.topk_ratio, kvb));
  p.cdf_threshold = static_cast<float>(options.cdf_threshold);
  p.cdf_at_most = options.rule == TopkRule::kSpargeAttn;
  p.whole_blocks_only = options.rule == TopkRule::kSpargeAttn;
  p.k_mean = options.smooth_k ? mask.k_mean_.data_as<float>() : nullptr;
  p.keep_diagonal = options.keep.diagonal;
  p.sink_blocks = static_cast<int>(std::min<int64_t>(options.keep.sink_blocks, kvb));
  p.pooled_q = mask.pooled_q_.data_as<float>();
  p.similar_q = mask.similar_q_.data_as<uint8_t>();
  p.pooled_k = mask.pooled_k_.data_as<float>();
  p.similar_k = mask.similar_k_.data_as<uint8_t>();
  if (!options.per_head.empty()) {
    check_head_values(options.per_head, q.size(2), "topk.per_head");
    if (options.cdf_threshold > 0.0) {
      std::vector<float> cdf(options.per_head.begin(), options.per_head.end());
      p.head_cdf = upload(cdf, mask.head_value_, ctx.stream);
    } else {
      std::vector<int32_t> counts;
      for (double ratio : options.per_head) counts.push_back(static_cast<int32_t>(topk_count(options.rule, ratio, kvb)));
      p.head_n_topk = upload(counts, mask.head_n_topk_, ctx.stream);
    }
  }
  cuda::detail::launch_topk_estimation(p, q.dtype(), ctx.stream);
  cuda::check_launch("estimate_topk_mask_device");
}

void estimate_xattention_mask_device(const ExecContext& ctx, const TensorView& q, const TensorView& k, const XAttentionOptions& options,
                                     DeviceEstimatedMask& mask) {
  check_estimate_arguments(q, k, options.block_q, options.block_kv, mask.device_, mask.shape_, mask.kv_heads_,
                           mask.head_dim_);
  const int64_t s = options.stride, dim = q.size(3);
  if (const char* limit = xattention_device_limit(dim, s, options.block_q, options.block_kv))
    fail_argument("xattention.stride with head dim and block sizes", detail::concat(limit, " on CUDA"),
                  detail::concat("stride ", s, ", head dim ", dim, ", blocks ", options.block_q, "x", options.block_kv));
  if (!(options.threshold > 0.0 && options.threshold <= 1.0))
    fail_argument("xattention.threshold", "in (0, 1]", options.threshold);
  if (options.vote != XAttentionVote::kNone || options.gqa_any)
    fail_argument("xattention.vote / gqa_any", "none / false on CUDA (the aggregated masks are CPU-only)",
                  options.gqa_any ? "gqa_any" : "a vote");
  cuda::detail::XAttentionParams p{};
  set_qk_geometry(p, q, k);
  set_mask_outputs(p, mask.shape_, mask.row_counts_, mask.row_blocks_, mask.indptr_, mask.indices_);
  p.dim = static_cast<int>(dim);
  p.stride = static_cast<int>(s);
  p.groups_q = static_cast<int>((q.size(1) + s - 1) / s);
  p.groups_kv = static_cast<int>((k.size(1) + s - 1) / s);
  const float scale = options.scale != 0.0f ? options.scale : 1.0f / std::sqrt(static_cast<float>(dim));
  p.logit_scale_log2 = scale / static_cast<float>(s) * 1.4426950408889634f;
  p.threshold = static_cast<float>(options.threshold);
  p.keep_diagonal = options.keep_diagonal;
  p.keep_first = options.keep_first;
  if (options.padding == XAttentionPadding::kChunk) {
    // Zero key groups up to the padded length (a multiple of the chunk, a power of two >= 2048).
    if ((s & (s - 1)) != 0) fail_argument("xattention.stride", "a power of two with padding kChunk on CUDA", s);
    const int64_t groups_per_block = options.block_kv / s, groups = p.groups_kv;
    const int64_t padded_groups = xattention_padded_length(k.size(1)) / s;
    const int64_t real_end = std::min<int64_t>(padded_groups, int64_t{p.kv_blocks} * groups_per_block);
    const int64_t past = padded_groups - real_end;
    p.zero_groups_total = static_cast<int>(padded_groups - groups);
    p.zero_groups_last_block = static_cast<int>(real_end - groups);
    p.pad_blocks = static_cast<int>((past + groups_per_block - 1) / groups_per_block);
    p.zero_groups_last_pad = static_cast<int>(past - (int64_t{p.pad_blocks} - 1) * groups_per_block);
    if (p.kv_blocks + p.pad_blocks > cuda::detail::kTopkMaxKvBlocks)
      fail_argument("shape", detail::concat("at most ", cuda::detail::kTopkMaxKvBlocks, " kv blocks with the padding blocks"),
                    p.kv_blocks + p.pad_blocks);
    p.zero_group_mass = mask.zero_group_mass_.data_as<float>();
  }
  mask.reserve_xattention_workspace(ctx.stream, s);
  p.kv_valid_groups = nullptr;
  p.block_lse2 = mask.block_lse2_.data_as<float>();
  p.mass = mask.mass_.data_as<float>();
  if (!options.per_head_threshold.empty()) {
    check_head_values(options.per_head_threshold, q.size(2), "xattention.per_head_threshold");
    const std::vector<float> thresholds(options.per_head_threshold.begin(), options.per_head_threshold.end());
    p.head_threshold = upload(thresholds, mask.head_value_, ctx.stream);
  }
  cuda::detail::launch_xattention_estimation(p, q.dtype(), ctx.stream);
  cuda::check_launch("estimate_xattention_mask_device");
}

#else

DeviceEstimatedMask::DeviceEstimatedMask(const BlockMaskShape&, int64_t, int64_t, Device device, int64_t) {
  fail_argument("device", "a CUDA device in a tessel built with CUDA", device.str() + " (built without CUDA)");
}
BlockMaskView DeviceEstimatedMask::view() const { return {}; }
BlockMask DeviceEstimatedMask::to_host() const { return {}; }
int64_t DeviceEstimatedMask::kept_blocks(StreamHandle) const { return 0; }
std::vector<int32_t> DeviceEstimatedMask::row_offsets(StreamHandle) const { return {}; }
void estimate_topk_mask_device(const ExecContext&, const TensorView&, const TensorView&, const TopkEstimatorOptions&, DeviceEstimatedMask&) {
  throw Error("estimate_topk_mask_device: tessel was built without CUDA (configure with -DTESSEL_CUDA=ON)");
}
void estimate_xattention_mask_device(const ExecContext&, const TensorView&, const TensorView&, const XAttentionOptions&,
                                     DeviceEstimatedMask&) {
  throw Error("estimate_xattention_mask_device: tessel was built without CUDA (configure with -DTESSEL_CUDA=ON)");
}

#endif

}  // namespace tessel
